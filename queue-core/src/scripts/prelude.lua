-- Shared helpers, prepended to every queue script (see scripts/mod.rs).
-- Every script reads and validates first (key types, numbers), then writes the
-- destination before it removes from the source, counters last: a Lua error
-- after a write is not rolled back, so nothing may fail half-way.

-- Milliseconds since the epoch from the Redis server clock (DESIGN rule 2: never a worker's clock).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A count as stored or passed (attempts, max_attempts, fence, a limit): the
-- number when it is a finite non-negative integer, else nil (nan, inf, -1, 'x').
local function as_count(v)
  local n = tonumber(v)
  if n and n >= 0 and n <= 9007199254740991 and n == math.floor(n) then return n end
  return nil
end

-- A numeric argument of the caller; anything else refuses the call before any write.
local function arg_count(v, name)
  local n = as_count(v)
  if not n then error({err = 'ERR invalid argument ' .. name .. ': ' .. tostring(v)}) end
  return n
end

-- Refuses the call, before any write, when a queue key holds another type than
-- expected. Arguments: key, type, key, type, ... (a missing key is fine).
local function expect_types(...)
  local a = {...}
  for i = 1, #a, 2 do
    local t = redis.call('TYPE', a[i])['ok']
    if t ~= 'none' and t ~= a[i + 1] then
      error({err = 'WRONGTYPE queue key ' .. a[i] .. ' holds a ' .. t .. ', not a ' .. a[i + 1]
        .. ': refused before any write'})
    end
  end
end

-- A lifetime counter. Counters come last and never block a move: a corrupt
-- field or a stats key of another type is skipped (pcall).
local function bump(stats, field, n)
  redis.pcall('HINCRBY', stats, field, n or 1)
end

-- HMGET of a job's fields. A job key of another type gives nil and the
-- dead-letter reason naming it, instead of aborting the script.
local function read_job(jobkey, ...)
  local h = redis.pcall('HMGET', jobkey, ...)
  if h['err'] then
    return nil, 'corrupt job key: holds a ' .. redis.call('TYPE', jobkey)['ok'] .. ', not a hash'
  end
  return h
end

-- The dead-letter reason of a corrupt stored count, naming the field.
local function corrupt_field(name, v)
  return 'corrupt field ' .. name .. ": '" .. string.sub(tostring(v), 1, 64)
    .. "' is not a non-negative integer"
end

-- Validated attempts and max_attempts (missing: 0 and 1), or nil, nil and the
-- dead-letter reason naming the corrupt field.
local function job_counts(attempts_raw, max_raw)
  local attempts, max = 0, 1
  if attempts_raw then
    attempts = as_count(attempts_raw)
    if not attempts then return nil, nil, corrupt_field('attempts', attempts_raw) end
  end
  if max_raw then
    max = as_count(max_raw)
    if not max then return nil, nil, corrupt_field('max_attempts', max_raw) end
    if max < 1 then max = 1 end
  end
  return attempts, max
end

-- Dead-letters job `id`: pushes it on the dead list and keeps the hash (a
-- minimal one is created when it was missing; a job key of another type is
-- replaced by one) so its reason, attempts and timestamps stay readable. The
-- caller removes the id from its source afterwards.
local function dead_letter(jobkey, dead, stats, id, reason, now)
  local t = redis.call('TYPE', jobkey)['ok']
  if t ~= 'hash' and t ~= 'none' then redis.call('DEL', jobkey) end
  redis.call('LPUSH', dead, id)
  redis.call('HSET', jobkey, 'id', id, 'state', 'dead', 'dead_reason', reason, 'dead_at', now)
  redis.call('HDEL', jobkey, 'token', 'lease_until')
  bump(stats, 'dead', 1)
end

-- The job fields claim() reads, in this order.
local CLAIM_FIELDS = {'state', 'type', 'v', 'payload', 'attempts', 'max_attempts', 'enqueued_at',
  'token', 'delivered_at', 'lease_until', 'fence'}

-- The claim row of a delivery already made with `token` (a retry whose first
-- reply was lost gets the same answer), or nil when `h` is not that delivery.
local function same_claim(id, token, h)
  if h[1] ~= 'active' or h[8] ~= token then return nil end
  return {'claimed', id, token, h[2] or '', h[3] or '0', h[4] or '', h[5] or '0', h[6] or '1',
    h[7] or '0', h[9] or '0', h[10] or '0', h[11] or '0'}
end

-- Writes the completion record of a cancelled job (status `cancelled`, kept
-- for `retention` ms like any record, step results expire with it). The
-- caller then removes the id from where it was, drops the hash and counts.
local function cancel_record(donekey, stepskey, attempts, jobtype, enqueued_at, from, retention, now)
  redis.call('HSET', donekey, 'status', 'cancelled', 'finished_at', now, 'attempts', attempts or '0',
    'type', jobtype or '', 'enqueued_at', enqueued_at or '0', 'cancelled_from', from)
  redis.call('PEXPIRE', donekey, retention)
  redis.call('PEXPIRE', stepskey, retention)
end

-- Claims `id`, which the caller knows sits in the processing list: attempts+1,
-- delivered_at, a fresh lease token and the next fencing token (`fence`, +1 on
-- every delivery and never reset, so a later delivery always carries a larger
-- number), lease registered in the leases zset. Called again with the same
-- token, it answers the same row and changes nothing. Corrupt job data
-- (counts, a job key that is not a hash) is dead-lettered with the field named.
-- `worker` (optional: nil or '' from an older caller) is the claiming worker's
-- name, kept in the hash's `worker` field for this delivery.
local function claim(id, processing, leases, dead, stats, jobprefix, doneprefix, lease_ms, token, now, worker)
  local jobkey = jobprefix .. id
  if redis.call('EXISTS', doneprefix .. id) == 1 then
    -- Completion record exists: the job already ran; ack without running it.
    redis.call('LREM', processing, 1, id)
    redis.call('ZREM', leases, id)
    redis.call('DEL', jobkey)
    bump(stats, 'skipped_done', 1)
    return {'done', id}
  end
  local h, bad = read_job(jobkey, unpack(CLAIM_FIELDS))
  if h and not h[1] then
    dead_letter(jobkey, dead, stats, id, 'job hash missing (key deleted or evicted)', now)
    redis.call('LREM', processing, 1, id)
    redis.call('ZREM', leases, id)
    return {'missing', id}
  end
  if h then
    local again = same_claim(id, token, h)
    if again then
      -- Our own delivery, answered again only while its counts still read;
      -- corrupted since the first claim: dead-lettered below like any claim.
      local _, _, bad_again = job_counts(h[5], h[6])
      if not bad_again then return again end
      bad = bad_again
    elseif h[1] ~= 'queued' then
      -- Another delivery owns this id (e.g. a late claim after a watchdog return).
      return {'busy', id}
    end
  end
  local attempts, max, fence
  if not bad then attempts, max, bad = job_counts(h[5], h[6]) end
  if not bad then
    fence = 0
    if h[11] then
      fence = as_count(h[11])
      if not fence then bad = corrupt_field('fence', h[11]) end
    end
  end
  if bad then
    dead_letter(jobkey, dead, stats, id, bad, now)
    redis.call('LREM', processing, 1, id)
    redis.call('ZREM', leases, id)
    return {'corrupt', id, bad}
  end
  attempts = attempts + 1
  fence = fence + 1
  local lease_until = now + lease_ms
  redis.call('ZADD', leases, lease_until, id)
  redis.call('HSET', jobkey, 'state', 'active', 'attempts', attempts, 'delivered_at', now,
    'token', token, 'lease_until', lease_until, 'fence', fence, 'worker', worker or '')
  return {'claimed', id, token, h[2] or '', h[3] or '0', h[4] or '', attempts, max,
    h[7] or '0', now, lease_until, fence}
end

-- Promoter wake-up (background/promoter.rs): true when a job due at `score`
-- is sooner than the head of `delayed` (or the set is empty). Read it before
-- the ZADD; after the writes, `wake_promoter` tells one sleeping promoter.
local function sooner_than_head(delayed, score)
  local head = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  return head[2] == nil or tonumber(head[2]) > score
end

-- Wakes one promoter blocked on `wake` (BLPOP): a one-element list, so a
-- wake nobody takes costs one small key. Called last, it is only a hint: a
-- nil key (a producer that does not declare it) or a key of another type is
-- skipped, and a promoter never sleeps longer than its bounded maximum.
local function wake_promoter(wake)
  if not wake then return end
  local t = redis.call('TYPE', wake)['ok']
  if t ~= 'none' and t ~= 'list' then return end
  redis.call('LPUSH', wake, '1')
  redis.call('LTRIM', wake, 0, 0)
end

-- ==== limits (docs/LIMITS.md) ====
-- The limits hash `q:{Q}:limits` (QueueKeys::limits): fields `rate` ("N/W":
-- at most N starts per W ms), `concurrency` (N running), `key_rate` and
-- `key_concurrency` (defaults for every rate key), `key_rate:<k>` and
-- `key_concurrency:<k>` (one key's override; "none": that key is unlimited).
-- Starts are logged in zsets (token -> start ms) `<limits>:started` and
-- `<limits>:started:<k>`; a key's running ids in `<limits>:running:<k>`
-- (counted against the leases zset, so finished or expired deliveries free
-- their slot with no release step); `<limits>:next:<k>` spreads a key's
-- deferred jobs over the coming windows.

-- How long a fetcher at a concurrency cap waits before it looks again (ms).
local LIMITS_BUSY_MS = 100
-- Most jobs one fetch defers for their key before it returns.
local LIMITS_MAX_DEFERRED = 100

-- A rate "N/W" as {N, W}; nil for nil, 'none' or a value that does not parse.
local function limit_rate(v)
  if not v or v == 'none' then return nil end
  local n, w = string.match(v, '^(%d+)/(%d+)$')
  n, w = as_count(n), as_count(w)
  if n and w and w >= 1 then return {n, w} end
  return nil
end

-- The queue's limits, or nil when it has none (one EXISTS: the whole cost
-- for a queue without limits). A queue-level field that does not parse, or
-- a limits or delayed key of another type, refuses the call: run it before
-- the script's first write.
local function limits_load(limkey, delayed)
  if redis.call('EXISTS', limkey) == 0 then return nil end
  expect_types(limkey, 'hash', delayed, 'zset')
  local f = redis.call('HMGET', limkey, 'rate', 'concurrency', 'key_rate', 'key_concurrency')
  local lim = {key = limkey, rate = limit_rate(f[1]), conc = as_count(f[2]),
    key_rate = limit_rate(f[3]), key_conc = as_count(f[4])}
  for i, name in ipairs({'rate', 'concurrency', 'key_rate', 'key_concurrency'}) do
    local parsed = (i == 1 and lim.rate) or (i == 2 and lim.conc) or (i == 3 and lim.key_rate)
      or (i == 4 and lim.key_conc)
    if f[i] and f[i] ~= 'none' and not parsed then
      error({err = 'ERR corrupt limits field ' .. name .. ": '" .. string.sub(f[i], 1, 64)
        .. "' (want N/W_ms or N): refused before any write"})
    end
  end
  return lim
end

-- Starts left in a sliding window log `log` of `rate` {N, W}, after dropping
-- starts older than the window; and when none is left, the ms until one is.
local function limits_window(log, rate, now)
  redis.call('ZREMRANGEBYSCORE', log, '-inf', now - rate[2])
  local used = redis.call('ZCARD', log)
  if used < rate[1] then return rate[1] - used, 0 end
  local frees = redis.call('ZRANGE', log, used - rate[1], used - rate[1], 'WITHSCORES')
  return 0, math.max(tonumber(frees[2] or now) + rate[2] - now, 1)
end

-- How many jobs the queue-level limits let start now (count when none
-- applies) and, when 0, the ms to wait before looking again.
local function limits_room(lim, leases, count, now)
  if not lim then return count, 0 end
  local room, wait = count, 0
  if lim.rate then
    local left, w = limits_window(lim.key .. ':started', lim.rate, now)
    room, wait = math.min(room, left), w
  end
  if lim.conc then
    local left = lim.conc - redis.call('ZCOUNT', leases, '(' .. now, '+inf')
    if left <= 0 then room, wait = 0, math.max(wait, LIMITS_BUSY_MS) end
    room = math.max(math.min(room, left), 0)
  end
  return room, wait
end

-- The rate key of job `jobkey` when it is waiting ('queued') and limits
-- exist, with its limits {key, rate, conc}; nil otherwise.
local function limits_job_key(lim, jobkey)
  if not lim then return nil end
  local h = redis.pcall('HMGET', jobkey, 'state', 'rate_key')
  if h['err'] or h[1] ~= 'queued' or not h[2] or h[2] == '' then return nil end
  local o = redis.call('HMGET', lim.key, 'key_rate:' .. h[2], 'key_concurrency:' .. h[2])
  local rate, conc = lim.key_rate, lim.key_conc
  if o[1] then rate = limit_rate(o[1]) end
  if o[2] then conc = as_count(o[2]) end
  if not rate and not conc then return nil end
  return {key = h[2], rate = rate, conc = conc}
end

-- Ms until key `k` may start a job (0: now). Running ids whose lease is
-- gone or expired leave the key's running set here.
local function limits_key_wait(lim, k, leases, now)
  local wait = 0
  if k.rate then
    local _, w = limits_window(lim.key .. ':started:' .. k.key, k.rate, now)
    wait = w
  end
  if k.conc then
    local running = lim.key .. ':running:' .. k.key
    for _, rid in ipairs(redis.call('ZRANGE', running, 0, -1)) do
      local until_ms = tonumber(redis.call('ZSCORE', leases, rid))
      if not until_ms or until_ms <= now then redis.call('ZREM', running, rid) end
    end
    if redis.call('ZCARD', running) >= k.conc then wait = math.max(wait, LIMITS_BUSY_MS) end
  end
  return wait
end

-- Defers waiting job `id` (in `processing`) whose key `k` is over its limit:
-- to the delayed set at the key's next free start, spread one step apart
-- from its other deferred jobs. No attempt is used. Returns the row.
local function limits_defer(lim, k, id, jobkey, processing, leases, delayed, wake, wait, now)
  local nextkey = lim.key .. ':next:' .. k.key
  local step = (k.rate and math.ceil(k.rate[2] / math.max(k.rate[1], 1)))
    or math.ceil(LIMITS_BUSY_MS / math.max(k.conc or 1, 1))
  local run_at = now + wait
  local booked = redis.pcall('GET', nextkey)
  booked = type(booked) == 'string' and tonumber(booked)
  if booked and booked > run_at then run_at = booked end
  local wake_it = sooner_than_head(delayed, run_at)
  redis.call('ZADD', delayed, run_at, id)
  redis.call('HSET', jobkey, 'state', 'delayed', 'run_at', run_at)
  redis.call('LREM', processing, 1, id)
  redis.call('ZREM', leases, id)
  redis.pcall('SET', nextkey, run_at + step, 'PX', run_at + step - now + (k.rate and k.rate[2] or LIMITS_BUSY_MS))
  if wake_it then wake_promoter(wake) end
  return {'deferred', id, run_at}
end

-- Records a start of `id` claimed with `token` in the queue's and its key's
-- logs, and its key's running set (k: limits_job_key's answer, or nil).
local function limits_started(lim, k, id, token, lease_until, now)
  if not lim then return end
  if lim.rate then
    redis.call('ZADD', lim.key .. ':started', now, token)
    redis.call('PEXPIRE', lim.key .. ':started', lim.rate[2])
  end
  if not k then return end
  if k.rate then
    local log = lim.key .. ':started:' .. k.key
    redis.call('ZADD', log, now, token)
    redis.call('PEXPIRE', log, k.rate[2])
  end
  if k.conc then redis.call('ZADD', lim.key .. ':running:' .. k.key, lease_until, id) end
end

-- claim() under the limits `lim` (nil: plain claim()): a waiting job whose
-- key is over its limit is deferred instead (row {'deferred', id, run_at}).
-- Queue-level room is the caller's (limits_room).
local function limits_claim(lim, delayed, wake, id, processing, leases, dead, stats, jobprefix,
                            doneprefix, lease_ms, token, now, worker)
  local k = limits_job_key(lim, jobprefix .. id)
  if k then
    local wait = limits_key_wait(lim, k, leases, now)
    if wait > 0 then
      return limits_defer(lim, k, id, jobprefix .. id, processing, leases, delayed, wake, wait, now)
    end
  end
  local row = claim(id, processing, leases, dead, stats, jobprefix, doneprefix, lease_ms, token,
    now, worker)
  if lim and row[1] == 'claimed' then limits_started(lim, k, id, token, row[11], now) end
  return row
end

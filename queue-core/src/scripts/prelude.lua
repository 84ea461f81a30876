-- Shared helpers, prepended to every queue script (see scripts/mod.rs).
-- Every script reads and validates first (key types, numbers), then writes the
-- destination before it removes from the source, counters last: a Lua error
-- after a write is not rolled back, so nothing may fail half-way.

-- Event stream and job history hooks, defined under `==== events ====` below.
local ev, ev_hist

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
  ev_hist(stats, id, jobkey, 'dead', reason, now)
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
  ev(stats, 'started', id, now, 'attempt', attempts, 'worker', worker or '')
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

-- ==== events ====
-- The per-queue event stream `q:{Q}:events` (XADD MAXLEN ~ N, written only
-- while `q:{Q}:events:on` holds N > 0) and the per-job history
-- `q:{Q}:hist:<id>` (a list capped at HIST_CAP entries, written only on the
-- unusual transitions: the happy path enqueue -> claim -> ack is read back
-- from the job hash and the completion record). See docs/EVENTS.md. Both
-- derive their keys from the queue's stats key (same hash tag) and never
-- block a state change: every write is a pcall.
local HIST_CAP = 50
-- The stream cap, read once per script call: nil not read yet, false off.
local ev_maxlen

-- 'q:{Q}:stats' -> 'q:{Q}:'
local function ev_base(stats)
  return string.sub(stats, 1, #stats - 5)
end

-- Appends event `kind` of job `id` at `now` (Redis clock, ms) to the stream,
-- with extra name, value pairs, when the queue's events are on.
ev = function(stats, kind, id, now, ...)
  if ev_maxlen == nil then
    local v = redis.pcall('GET', ev_base(stats) .. 'events:on')
    ev_maxlen = (type(v) == 'string' and as_count(v)) or false
    if ev_maxlen == 0 then ev_maxlen = false end
  end
  if not ev_maxlen then return end
  redis.pcall('XADD', ev_base(stats) .. 'events', 'MAXLEN', '~', ev_maxlen, '*',
    'event', kind, 'id', id, 'at', now, ...)
end

-- Appends `kind` (retried, reclaimed, deferred, dead, replayed, cancelled,
-- cancel_requested) with `detail` to job `id`'s history, and emits it as an
-- event. Called before the transition's writes: when the hash says `active`,
-- the entry carries the delivery it ends (attempt, worker, start). Marks the
-- hash (`hist`) so that ack gives the history the completion retention;
-- `ttl` (optional, ms; 0 deletes) expires it now (the job ends here).
ev_hist = function(stats, id, jobkey, kind, detail, now, ttl)
  local hkey = ev_base(stats) .. 'hist:' .. id
  local h = redis.pcall('HMGET', jobkey, 'state', 'attempts', 'worker', 'delivered_at')
  if type(h) ~= 'table' or h['err'] then h = {} end
  local e = {e = kind, t = now, a = as_count(h[2]), d = detail}
  if h[1] == 'active' then
    e.w = h[3] or nil
    e.s = as_count(h[4])
  end
  redis.pcall('RPUSH', hkey, cjson.encode(e))
  redis.pcall('LTRIM', hkey, -HIST_CAP, -1)
  if h[1] then redis.pcall('HSET', jobkey, 'hist', '1') end
  if ttl then
    if ttl > 0 then redis.pcall('PEXPIRE', hkey, ttl) else redis.pcall('DEL', hkey) end
  end
  ev(stats, kind, id, now, 'attempt', e.a or 0, 'worker', e.w or '', 'detail', detail or '')
end

-- The end of a job's history with the job: kept `ttl` ms (a completion
-- record's retention; 0 deletes it), or deleted when `ttl` is nil (purge,
-- dead-list trim).
local function hist_close(stats, id, ttl)
  local hkey = ev_base(stats) .. 'hist:' .. id
  if ttl and ttl > 0 then redis.pcall('PEXPIRE', hkey, ttl) else redis.pcall('DEL', hkey) end
end

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

-- Defined under `-- ==== deadlines, progress, results ====` at the end.
local deadline_check, results_wake
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
  results_wake(jobkey, id)
end

-- The job fields claim() reads, in this order.
local CLAIM_FIELDS = {'state', 'type', 'v', 'payload', 'attempts', 'max_attempts', 'enqueued_at',
  'token', 'delivered_at', 'lease_until', 'fence', 'expires_at', 'expires_after', 'first_started_at'}

-- The claim row of a delivery already made with `token` (a retry whose first
-- reply was lost gets the same answer), or nil when `h` is not that delivery.
local function same_claim(id, token, h)
  if h[1] ~= 'active' or h[8] ~= token then return nil end
  return {'claimed', id, token, h[2] or '', h[3] or '0', h[4] or '', h[5] or '0', h[6] or '1',
    h[7] or '0', h[9] or '0', h[10] or '0', h[11] or '0', h[14] or h[9] or '0'}
end

-- Writes the completion record of a cancelled job (status `cancelled`, kept
-- for `retention` ms like any record, step results expire with it). The
-- caller then removes the id from where it was, drops the hash and counts.
local function cancel_record(donekey, stepskey, attempts, jobtype, enqueued_at, from, retention, now)
  redis.call('HSET', donekey, 'status', 'cancelled', 'finished_at', now, 'attempts', attempts or '0',
    'type', jobtype or '', 'enqueued_at', enqueued_at or '0', 'cancelled_from', from)
  redis.call('PEXPIRE', donekey, retention)
  redis.call('PEXPIRE', stepskey, retention)
  results_wake(donekey)
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
  local expired = deadline_check(jobkey, dead, stats, id, h, now)
  if expired then
    redis.call('LREM', processing, 1, id)
    redis.call('ZREM', leases, id)
    return {expired == true and 'expired' or 'corrupt', id, expired}
  end
  attempts = attempts + 1
  fence = fence + 1
  local lease_until = now + lease_ms
  redis.call('ZADD', leases, lease_until, id)
  redis.call('HSET', jobkey, 'state', 'active', 'attempts', attempts, 'delivered_at', now,
    'token', token, 'lease_until', lease_until, 'fence', fence, 'worker', worker or '',
    'first_started_at', h[14] or now)
  return {'claimed', id, token, h[2] or '', h[3] or '0', h[4] or '', attempts, max,
    h[7] or '0', now, lease_until, fence, h[14] or now}
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

-- ==== deadlines, progress, results ====
-- docs/RESULTS.md. Job fields: `expires_at` (ms, absolute: EnqueueOptions::deadline),
-- `expires_after` (ms after `enqueued_at`: EnqueueOptions::expires_in), `first_started_at`
-- (Redis time of the first claim, set by claim()), `notify` (someone may wait for the outcome).

-- Called by claim() with the CLAIM_FIELDS row `h`, before the claim writes anything: a job
-- past its start deadline is dead-lettered with reason `expired: ...` (counter `expired` too)
-- and true is returned; a deadline field that is not a count is dead-lettered as corrupt and
-- its reason returned; nil when the job may start. claim() then removes it from processing
-- and leases.
deadline_check = function(jobkey, dead, stats, id, h, now)
  if not h[12] and not h[13] then return nil end
  local at
  local bad
  if h[12] then
    at = as_count(h[12])
    if not at then bad = corrupt_field('expires_at', h[12]) end
  end
  local after = h[13] and as_count(h[13])
  if h[13] and not after then bad = corrupt_field('expires_after', h[13]) end
  if bad then
    dead_letter(jobkey, dead, stats, id, bad, now)
    return bad
  end
  if after then
    local rel = (as_count(h[7]) or now) + after
    if not at or rel < at then at = rel end
  end
  if now < at then return nil end
  dead_letter(jobkey, dead, stats, id, 'expired: not started before its deadline ('
    .. at .. ' ms, Redis clock)', now)
  bump(stats, 'expired', 1)
  return true
end

-- Wakes whoever waits for the outcome of a job (Queue::wait_result): when the job hash has
-- `notify` (the number of waiters, result_wait.lua), pushes that many elements (at most 100)
-- on `q:{Q}:notify:<id>`, which expires after 60 s (a waiter re-reads the state before and
-- after blocking, so a wake nobody takes is only a small key for a minute).
-- `key` is the job hash or the completion record (`q:{Q}:job:<id>` / `q:{Q}:done:<id>`).
results_wake = function(key, id)
  local base, kind, rest = string.match(key, '^(.-}:)(%a+):(.*)$')
  if not base then return end
  id = id or rest
  local jobkey = base .. 'job:' .. id
  if kind ~= 'job' and kind ~= 'done' then return end
  local flag = redis.pcall('HGET', jobkey, 'notify')
  if type(flag) ~= 'string' then return end
  local notify = base .. 'notify:' .. id
  local t = redis.call('TYPE', notify)['ok']
  if t ~= 'none' and t ~= 'list' then return end
  local wakes = {}
  for i = 1, math.min(as_count(flag) or 1, 100) do wakes[i] = '1' end
  if #wakes == 0 then return end
  redis.call('LPUSH', notify, unpack(wakes))
  redis.call('PEXPIRE', notify, 60000)
end

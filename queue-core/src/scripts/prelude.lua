-- Shared helpers, prepended to every script (see scripts/mod.rs).

-- Milliseconds since the epoch from the Redis server clock (DESIGN rule 2: never a worker's clock).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Dead-letters job `id`: the hash is kept (a minimal one is created when it
-- was missing) so its reason, attempts and timestamps stay readable.
local function dead_letter(jobkey, dead, stats, id, reason, now)
  redis.call('HSET', jobkey, 'id', id, 'state', 'dead', 'dead_reason', reason, 'dead_at', now)
  redis.call('HDEL', jobkey, 'token', 'lease_until')
  redis.call('LPUSH', dead, id)
  redis.call('HINCRBY', stats, 'dead', 1)
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
-- number), lease registered in the leases zset.
local function claim(id, processing, leases, dead, stats, jobprefix, doneprefix, lease_ms, token, now)
  local jobkey = jobprefix .. id
  if redis.call('EXISTS', doneprefix .. id) == 1 then
    -- Completion record exists: the job already ran; ack without running it.
    redis.call('LREM', processing, 1, id)
    redis.call('ZREM', leases, id)
    redis.call('DEL', jobkey)
    redis.call('HINCRBY', stats, 'skipped_done', 1)
    return {'done', id}
  end
  local h = redis.call('HMGET', jobkey, 'state', 'type', 'v', 'payload', 'attempts', 'max_attempts', 'enqueued_at')
  if not h[1] then
    redis.call('LREM', processing, 1, id)
    redis.call('ZREM', leases, id)
    dead_letter(jobkey, dead, stats, id, 'job hash missing (key deleted or evicted)', now)
    return {'missing', id}
  end
  if h[1] ~= 'queued' then
    -- Another delivery owns this id (e.g. a late claim after a watchdog return).
    return {'busy', id}
  end
  local attempts = (tonumber(h[5]) or 0) + 1
  local lease_until = now + lease_ms
  redis.call('HSET', jobkey, 'state', 'active', 'attempts', attempts, 'delivered_at', now,
    'token', token, 'lease_until', lease_until)
  local fence = redis.call('HINCRBY', jobkey, 'fence', 1)
  redis.call('ZADD', leases, lease_until, id)
  return {'claimed', id, token, h[2] or '', h[3] or '0', h[4] or '', attempts, h[6] or '1',
    h[7] or '0', now, lease_until, fence}
end

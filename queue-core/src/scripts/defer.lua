-- A delivery whose payload schema version is newer than the worker's handler
-- goes back without using an attempt, only while the token matches: to the
-- delayed set for delay_ms (attempts - 1, lease dropped), so that an upgraded
-- worker can run it. The job hash keeps `newer_since`: the Redis time since
-- which no live worker has announced the version (reset while one has). Once
-- that is wait_ms ago, the job is dead-lettered with a reason saying so.
-- Validates first; destination before source, counters last. Idempotent for
-- its token (`failed_token`): a retry whose reply was lost gets the same answer.
-- KEYS: 1 processing, 2 leases, 3 job hash, 4 delayed, 5 dead, 6 stats, 7 versions hash,
--       8 promoter wake list (a give-back due sooner than the delayed head wakes a
--         sleeping promoter, as a retry's does)
-- ARGV: 1 id, 2 token, 3 versions field (`type:version`), 4 delay_ms, 5 wait_ms,
--       6 the handler's version (for the reason)
-- Returns, like fail.lua, {'retry', run_at} (given back) | {'dead', reason} | {'lost'}
-- | {'cancel_requested'} (nothing written).
local delay = arg_count(ARGV[4], 'delay_ms')
local wait = arg_count(ARGV[5], 'wait_ms')
expect_types(KEYS[1], 'list', KEYS[2], 'zset', KEYS[4], 'zset', KEYS[5], 'list', KEYS[7], 'hash')
local early, h, bad = failing_delivery(KEYS[3], KEYS[1], ARGV[1], ARGV[2], 'newer_since')
if early then return early end
local attempts, _max
if not bad then attempts, _max, bad = job_counts(h[3], nil) end
local now = now_ms()
local reason = bad
if not bad then
  -- The handler never ran: this delivery's attempt is given back.
  if attempts > 0 then attempts = attempts - 1 end
  local announced = as_count(redis.call('HGET', KEYS[7], ARGV[3]))
  -- A corrupt `newer_since` (our own bookkeeping) restarts the wait.
  local since = as_count(h[8]) or now
  if announced and announced > now then since = now end
  if now - since < wait then
    local run_at = now + delay
    ev_hist(KEYS[6], ARGV[1], KEYS[3], 'deferred', 'payload version ' .. ARGV[3] .. ' newer than the handler', now)
    local wake = sooner_than_head(KEYS[4], run_at)
    redis.call('ZADD', KEYS[4], int_str(run_at), ARGV[1])
    redis.call('HSET', KEYS[3], 'state', 'delayed', 'run_at', run_at, 'attempts', attempts,
      'newer_since', since, 'failed_token', ARGV[2])
    redis.call('HDEL', KEYS[3], 'token', 'lease_until')
    redis.call('LREM', KEYS[1], 1, ARGV[1])
    redis.call('ZREM', KEYS[2], ARGV[1])
    bump(KEYS[6], 'deferred', 1)
    if wake then wake_promoter(KEYS[8]) end
    return {'retry', run_at}
  end
  reason = 'payload schema version ' .. ARGV[3] .. ' is newer than this worker\'s handler (version '
    .. ARGV[6] .. ') and no live worker has announced it for ' .. (now - since) .. ' ms (wait '
    .. wait .. ' ms)'
end
local member = dead_letter(KEYS[3], KEYS[5], KEYS[6], ARGV[1], reason, now)
if attempts then redis.call('HSET', KEYS[3], 'attempts', attempts) end
redis.call('HSET', KEYS[3], 'failed_at', now, 'failed_token', ARGV[2])
redis.call('LREM', KEYS[1], 1, ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if dead_member(member, ARGV[1], reason, now, KEYS[6]) then
  return {'dead', reason, 'relay'}
end
return {'dead', reason}

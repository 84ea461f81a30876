-- KEYS: 1 lock key, 2 fencing counter
-- ARGV: 1 owner token, 2 ttl_ms, 3 fencing counter ttl_ms
-- Returns the fencing number (increasing per acquisition), or 0 when held by another owner.
-- The counter expires `fence_ttl_ms` after the last acquisition (so unused
-- lock names leave nothing behind); a counter created anew starts at the
-- Redis time in microseconds, above any number an earlier counter of this
-- name can have reached (one per acquisition), so fencing numbers only grow.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
  end
  local fence = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
  return fence
end
return 0

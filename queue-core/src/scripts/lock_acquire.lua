-- KEYS: 1 lock key, 2 fencing counter
-- ARGV: 1 owner token, 2 ttl_ms
-- Returns the fencing number (increasing per acquisition), or 0 when held by another owner.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then
  return redis.call('INCR', KEYS[2])
end
return 0

-- KEYS: 1 lock key
-- ARGV: 1 owner token, 2 ttl_ms
-- Returns 1 when extended, 0 when the caller no longer owns the lock.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
  return 1
end
return 0

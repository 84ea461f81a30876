-- KEYS: 1 lock key
-- ARGV: 1 owner token
-- Returns 1 when released, 0 when the caller no longer owned the lock.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0

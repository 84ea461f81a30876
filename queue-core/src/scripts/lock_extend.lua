-- KEYS: 1 lock key
-- ARGV: 1 owner token, 2 ttl_ms
-- Returns 1 when extended, 0 when the caller no longer owns the lock.
-- The TTL is checked first, as lock_acquire.lua checks it: `PEXPIRE key 0`
-- (a TTL below 1 ms sent as 0) deletes the lock, and the owner was told it
-- was extended.
local ttl = tonumber(ARGV[2])
if not ttl or ttl < 1 or ttl ~= math.floor(ttl) or ttl > 9007199254740991 then
  error({err = 'ERR invalid argument ttl_ms: ' .. tostring(ARGV[2])})
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
return 0

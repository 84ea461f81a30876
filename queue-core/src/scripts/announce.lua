-- A worker announces the (job type, schema version) pairs it handles on one
-- queue: each field `type:version` of the versions hash is set to now + ttl
-- (Redis time), never lowered (another worker may have announced it for
-- longer). Fields whose expiry has passed are removed, so the hash stays
-- as small as the set of versions live workers handle.
-- KEYS: 1 versions hash
-- ARGV: 1 ttl_ms, then the fields `type:version` (repeated)
-- Returns the number of fields removed as expired.
local ttl = arg_count(ARGV[1], 'ttl_ms')
expect_types(KEYS[1], 'hash')
local now = now_ms()
local until_ms = now + ttl
local mine = {}
for i = 2, #ARGV do
  mine[ARGV[i]] = true
  local cur = as_count(redis.call('HGET', KEYS[1], ARGV[i]))
  if not cur or cur < until_ms then
    redis.call('HSET', KEYS[1], ARGV[i], until_ms)
  end
end
local all = redis.call('HGETALL', KEYS[1])
local removed = 0
for i = 1, #all, 2 do
  local exp = as_count(all[i + 1])
  if not mine[all[i]] and (not exp or exp <= now) then
    redis.call('HDEL', KEYS[1], all[i])
    removed = removed + 1
  end
end
return removed

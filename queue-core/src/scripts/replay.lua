-- Returns a dead-lettered job to main.
-- KEYS: 1 dead, 2 main, 3 job hash, 4 stats
-- ARGV: 1 id, 2 reset attempts ('1' | '0')
-- Returns 1 when replayed, 0 when the id is not in the dead-letter list.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
local now = now_ms()
local reason = redis.call('HGET', KEYS[3], 'dead_reason')
if reason then redis.call('HSET', KEYS[3], 'previous_dead_reason', reason) end
redis.call('HSET', KEYS[3], 'state', 'queued', 'replayed_at', now)
redis.call('HDEL', KEYS[3], 'dead_reason', 'dead_at')
if ARGV[2] == '1' then redis.call('HSET', KEYS[3], 'attempts', 0) end
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[4], 'replayed', 1)
return 1

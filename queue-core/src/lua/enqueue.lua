-- KEYS: 1 main, 2 job hash, 3 completion record, 4 delayed, 5 stats
-- ARGV: 1 id, 2 type, 3 schema version, 4 payload, 5 max_attempts, 6 delay_ms
-- Returns {'new', run_at} | {'exists', state} | {'done'}
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {'done'}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'exists', redis.call('HGET', KEYS[2], 'state') or ''}
end
local now = now_ms()
local delay = tonumber(ARGV[6])
local state = 'queued'
if delay > 0 then state = 'delayed' end
redis.call('HSET', KEYS[2], 'id', ARGV[1], 'type', ARGV[2], 'v', ARGV[3], 'payload', ARGV[4],
  'max_attempts', ARGV[5], 'attempts', 0, 'enqueued_at', now, 'state', state)
if delay > 0 then
  redis.call('HSET', KEYS[2], 'run_at', now + delay)
  redis.call('ZADD', KEYS[4], now + delay, ARGV[1])
else
  redis.call('LPUSH', KEYS[1], ARGV[1])
end
redis.call('HINCRBY', KEYS[5], 'enqueued', 1)
return {'new', now + delay}

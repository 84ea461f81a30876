-- Read-only: where job `id` is now.
-- KEYS: 1 main, 2 processing, 3 delayed, 4 dead, 5 leases
-- ARGV: 1 id
-- Returns {now_ms, index in main (-1: absent), main length, index in processing,
--          delayed run_at ('' absent), index in dead, lease expiry ('' none)}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
return {now,
  redis.call('LPOS', KEYS[1], id) or -1, redis.call('LLEN', KEYS[1]),
  redis.call('LPOS', KEYS[2], id) or -1,
  redis.call('ZSCORE', KEYS[3], id) or '',
  redis.call('LPOS', KEYS[4], id) or -1,
  redis.call('ZSCORE', KEYS[5], id) or ''}

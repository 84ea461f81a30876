-- Success: drop from processing and leases, write the completion record, drop the hash.
-- Only while the delivery's lease token still matches.
-- KEYS: 1 processing, 2 leases, 3 job hash, 4 completion record, 5 stats, 6 step results
-- ARGV: 1 id, 2 token, 3 retention_ms (0: no record), 4 result reference ('' for none),
--       5 throughput key prefix (a per-minute counter `<prefix><minute>` that expires)
-- Returns 1, or 0 when the lease was lost.
local h = redis.call('HMGET', KEYS[3], 'token', 'state', 'attempts', 'type', 'enqueued_at')
if h[2] ~= 'active' or h[1] ~= ARGV[2] then
  return 0
end
local now = now_ms()
redis.call('LREM', KEYS[1], 1, ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local retention = tonumber(ARGV[3])
if retention > 0 then
  redis.call('HSET', KEYS[4], 'status', 'done', 'finished_at', now, 'attempts', h[3] or '0',
    'type', h[4] or '', 'enqueued_at', h[5] or '0')
  if ARGV[4] ~= '' then redis.call('HSET', KEYS[4], 'result', ARGV[4]) end
  redis.call('PEXPIRE', KEYS[4], retention)
  redis.call('PEXPIRE', KEYS[6], retention)
else
  redis.call('DEL', KEYS[6])
end
redis.call('DEL', KEYS[3])
redis.call('HINCRBY', KEYS[5], 'completed', 1)
local minute_key = ARGV[5] .. math.floor(now / 60000)
if redis.call('INCR', minute_key) == 1 then redis.call('PEXPIRE', minute_key, 180000) end
return 1

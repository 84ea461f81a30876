-- PROTOTYPE (queue-bench only): ack.lua for many deliveries in one call, to
-- measure what batched acks would gain. Same effects per job as ack.lua.
-- KEYS: 1 processing, 2 leases, 3 stats
-- ARGV: 1 job prefix, 2 done prefix, 3 steps prefix, 4 retention_ms,
--       5 throughput key prefix, then (id, token) pairs
-- Returns one 1 (acked) or 0 (lease lost) per pair.
local now = now_ms()
local retention = tonumber(ARGV[4])
local acked = 0
local out = {}
for i = 6, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local jobkey = ARGV[1] .. id
  local h = redis.call('HMGET', jobkey, 'token', 'state', 'attempts', 'type', 'enqueued_at')
  if h[2] == 'active' and h[1] == token then
    redis.call('LREM', KEYS[1], 1, id)
    redis.call('ZREM', KEYS[2], id)
    if retention > 0 then
      local done = ARGV[2] .. id
      redis.call('HSET', done, 'status', 'done', 'finished_at', now, 'attempts', h[3] or '0',
        'type', h[4] or '', 'enqueued_at', h[5] or '0')
      redis.call('PEXPIRE', done, retention)
      redis.call('PEXPIRE', ARGV[3] .. id, retention)
    else
      redis.call('DEL', ARGV[3] .. id)
    end
    redis.call('DEL', jobkey)
    acked = acked + 1
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if acked > 0 then
  redis.call('HINCRBY', KEYS[3], 'completed', acked)
  local minute_key = ARGV[5] .. math.floor(now / 60000)
  if redis.call('INCRBY', minute_key, acked) == acked then redis.call('PEXPIRE', minute_key, 180000) end
end
return out

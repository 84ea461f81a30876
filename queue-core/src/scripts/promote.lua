-- Moves due delayed jobs (retries, scheduled jobs, watchdog returns) to main.
-- KEYS: 1 delayed, 2 main, 3 dead, 4 stats, 5 guard (never written: see keys.rs)
-- ARGV: 1 job prefix, 2 limit
-- Returns the number of ids moved.
local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local jobkey = ARGV[1] .. id
  if redis.call('EXISTS', jobkey) == 1 then
    redis.call('HSET', jobkey, 'state', 'queued')
    redis.call('HDEL', jobkey, 'run_at')
    redis.call('LPUSH', KEYS[2], id)
  else
    dead_letter(jobkey, KEYS[3], KEYS[4], id, 'job hash missing (key deleted or evicted)', now)
  end
end
return #ids

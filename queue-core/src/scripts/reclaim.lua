-- Watchdog pass: return jobs whose lease expired (jittered backoff) or
-- dead-letter them when attempts are exhausted; give a provisional lease to
-- ids in processing that have none (a worker died between BLMOVE and claim).
-- KEYS: 1 processing, 2 leases, 3 delayed, 4 dead, 5 stats, 6 guard (never written: see keys.rs)
-- ARGV: 1 job prefix, 2 limit, 3 orphan grace ms, 4 backoff base ms, 5 backoff cap ms,
--       6 random seed, 7 orphan scan length
-- Returns {reclaimed, dead_lettered, adopted}
local now = now_ms()
math.randomseed(tonumber(ARGV[6]))
local reclaimed, dead, adopted = 0, 0, 0
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[2], id)
  if redis.call('LREM', KEYS[1], 1, id) > 0 then
    local jobkey = ARGV[1] .. id
    local h = redis.call('HMGET', jobkey, 'state', 'attempts', 'max_attempts')
    if not h[1] then
      dead_letter(jobkey, KEYS[4], KEYS[5], id, 'job hash missing (key deleted or evicted)', now)
      dead = dead + 1
    else
      local attempts = tonumber(h[2]) or 0
      local max = tonumber(h[3]) or 1
      local msg = 'lease expired: the worker died or stalled'
      if h[1] ~= 'active' then
        msg = 'taken from main but never claimed: the worker died between BLMOVE and claim'
      end
      redis.call('HSET', jobkey, 'last_error', msg, 'failed_at', now)
      if h[1] == 'active' and attempts >= max then
        dead_letter(jobkey, KEYS[4], KEYS[5], id,
          'attempts exhausted (' .. attempts .. ' of ' .. max .. '): ' .. msg, now)
        dead = dead + 1
      else
        local backoff = tonumber(ARGV[4]) * 2 ^ math.max(attempts - 1, 0)
        local cap = tonumber(ARGV[5])
        if backoff > cap then backoff = cap end
        local run_at = now + math.floor(backoff / 2 + math.random() * backoff / 2)
        redis.call('HSET', jobkey, 'state', 'delayed', 'run_at', run_at)
        redis.call('HDEL', jobkey, 'token', 'lease_until')
        redis.call('ZADD', KEYS[3], run_at, id)
        reclaimed = reclaimed + 1
      end
    end
  end
end
local tail = redis.call('LRANGE', KEYS[1], -tonumber(ARGV[7]), -1)
for _, id in ipairs(tail) do
  if not redis.call('ZSCORE', KEYS[2], id) then
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), id)
    adopted = adopted + 1
  end
end
if reclaimed > 0 then redis.call('HINCRBY', KEYS[5], 'reclaimed', reclaimed) end
if adopted > 0 then redis.call('HINCRBY', KEYS[5], 'adopted', adopted) end
return {reclaimed, dead, adopted}

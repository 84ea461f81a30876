-- Failure: retry later (delayed zset) or dead-letter, only while the token matches.
-- KEYS: 1 processing, 2 leases, 3 job hash, 4 delayed, 5 dead, 6 stats
-- ARGV: 1 id, 2 token, 3 kind ('retry' | 'permanent'), 4 message, 5 delay_ms
-- Returns {'retry', run_at} | {'dead', reason} | {'lost'} | {'cancel_requested'}
-- (nothing written: the worker ends the job with finish_cancel.lua).
local h = redis.call('HMGET', KEYS[3], 'token', 'state', 'attempts', 'max_attempts', 'cancel_requested')
if h[2] ~= 'active' or h[1] ~= ARGV[2] then
  return {'lost'}
end
if h[5] then return {'cancel_requested'} end
local now = now_ms()
redis.call('LREM', KEYS[1], 1, ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[6], 'failed', 1)
local attempts = tonumber(h[3]) or 0
local max = tonumber(h[4]) or 1
redis.call('HSET', KEYS[3], 'last_error', ARGV[4], 'failed_at', now)
if ARGV[3] == 'retry' and attempts < max then
  local run_at = now + tonumber(ARGV[5])
  redis.call('HSET', KEYS[3], 'state', 'delayed', 'run_at', run_at)
  redis.call('HDEL', KEYS[3], 'token', 'lease_until')
  redis.call('ZADD', KEYS[4], run_at, ARGV[1])
  redis.call('HINCRBY', KEYS[6], 'retried', 1)
  return {'retry', run_at}
end
local reason = ARGV[4]
if ARGV[3] == 'retry' then
  reason = 'attempts exhausted (' .. attempts .. ' of ' .. max .. '): ' .. ARGV[4]
end
dead_letter(KEYS[3], KEYS[5], KEYS[6], ARGV[1], reason, now)
return {'dead', reason}

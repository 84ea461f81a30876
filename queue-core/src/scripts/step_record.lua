-- Records one `ctx.step` result of a running delivery, only while the job is
-- active under this delivery's lease token (DESIGN rule 3): a stale worker
-- (reclaimed, or woken after the job completed) stores nothing.
-- The step results always carry a TTL; the ack later sets the retention.
-- KEYS: 1 job hash, 2 step results
-- ARGV: 1 token, 2 step name, 3 MessagePack result, 4 ttl_ms
-- Returns 1 when stored, 0 when the delivery no longer owns the job.
local ttl = tonumber(ARGV[4])
if not ttl or ttl ~= ttl or ttl < 1 or ttl > 9007199254740991 then
  return redis.error_reply('ERR step_record: ttl_ms must be a positive integer, got ' .. tostring(ARGV[4]))
end
local h = redis.call('HMGET', KEYS[1], 'token', 'state')
if h[2] ~= 'active' or h[1] ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], math.floor(ttl))
return 1

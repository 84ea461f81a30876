-- Heartbeat: push the lease forward, only while the token matches.
-- KEYS: 1 leases, 2 job hash
-- ARGV: 1 id, 2 token, 3 lease_ms
-- Returns {new lease expiry (ms), 1 if an operator asked to cancel the job else 0},
-- or {0, 0} when the lease was lost.
local h = redis.call('HMGET', KEYS[2], 'token', 'state', 'cancel_requested')
local lease_ms = arg_count(ARGV[3], 'lease_ms')
if h[2] ~= 'active' or h[1] ~= ARGV[2] then
  return {0, 0}
end
local lease_until = now_ms() + lease_ms
-- The zset first: a leases key of another type fails here, before any write.
redis.call('ZADD', KEYS[1], lease_until, ARGV[1])
redis.call('HSET', KEYS[2], 'lease_until', lease_until)
return {lease_until, h[3] and 1 or 0}

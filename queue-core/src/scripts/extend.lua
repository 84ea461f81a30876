-- Heartbeat: push the lease forward, only while the token matches.
-- KEYS: 1 leases, 2 job hash, 3 the queue's limits hash
-- ARGV: 1 id, 2 token, 3 lease_ms
-- Returns {new lease expiry (ms), 1 if an operator asked to cancel the job else 0},
-- or {0, 0} when the lease was lost.
local h = redis.call('HMGET', KEYS[2], 'token', 'state', 'cancel_requested', 'lease_until', 'rate_key')
local lease_ms = arg_count(ARGV[3], 'lease_ms')
if h[2] ~= 'active' or h[1] ~= ARGV[2] then
  return {0, 0}
end
local now = now_ms()
local lease_until = now + lease_ms
-- The zset first: a leases key of another type fails here, before any write.
redis.call('ZADD', KEYS[1], lease_until, ARGV[1])
redis.call('HSET', KEYS[2], 'lease_until', lease_until)
-- A late beat (the lease had passed; the watchdog had not reclaimed the job
-- yet) holds the lease again: the job counts again under its key's cap.
if h[5] and h[5] ~= '' and (tonumber(h[4]) or 0) <= now then
  limits_revived(KEYS[3], h[5], ARGV[1], lease_until)
end
return {lease_until, h[3] and 1 or 0}

-- Read-only: lease and delay health of one queue, for stats and the dashboard.
-- KEYS: 1 processing, 2 leases, 3 delayed, 4 guard (never written: see keys.rs)
-- ARGV: 1 job prefix
-- Returns {now_ms, expired leases, leases, delayed due, delivered_at of the
--          oldest processing entry (0: none, or unknown: no hash, or a job
--          key of another type, read through read_job so that one corrupt key
--          does not fail every queue's stats), next delayed run_at (0: none)}
local now = now_ms()
local expired = redis.call('ZCOUNT', KEYS[2], '-inf', now)
local leased = redis.call('ZCARD', KEYS[2])
local due = redis.call('ZCOUNT', KEYS[3], '-inf', now)
local oldest = 0
local tail = redis.call('LINDEX', KEYS[1], -1)
if tail then
  local h = read_job(ARGV[1] .. tail, 'delivered_at')
  if h then oldest = tonumber(h[1]) or 0 end
end
local nxt = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
return {now, expired, leased, due, oldest, tonumber(nxt[2]) or 0}

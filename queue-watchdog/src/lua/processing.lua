-- Read-only: the oldest `limit` entries of the processing list with their lease.
-- KEYS: 1 processing, 2 leases
-- ARGV: 1 job prefix, 2 limit
-- Returns {now_ms, processing length, rows}, oldest first; a row is
--   {id, lease expiry ('' when none), state, type, attempts, max_attempts, delivered_at}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('LRANGE', KEYS[1], -tonumber(ARGV[2]), -1)
local rows = {}
for i = #ids, 1, -1 do
  local id = ids[i]
  local lease = redis.call('ZSCORE', KEYS[2], id)
  local h = redis.call('HMGET', ARGV[1] .. id, 'state', 'type', 'attempts', 'max_attempts', 'delivered_at')
  rows[#rows + 1] = {id, lease or '', h[1] or '', h[2] or '', h[3] or '', h[4] or '', h[5] or ''}
end
return {now, redis.call('LLEN', KEYS[1]), rows}

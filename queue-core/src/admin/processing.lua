-- Read-only: a page of the processing list, oldest delivery first, with leases.
-- KEYS: 1 processing, 2 leases, 3 guard (never written: see keys.rs)
-- ARGV: 1 job prefix, 2 offset, 3 limit
-- Returns {now_ms, processing length, rows}; a row is
--   {id, lease expiry ('' when none), state, type, attempts, max_attempts, delivered_at}
local now = now_ms()
local offset, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local rows = {}
if limit > 0 then
  -- The oldest entry is at the tail (workers LMOVE to the head).
  local ids = redis.call('LRANGE', KEYS[1], -(offset + limit), -(offset + 1))
  for i = #ids, 1, -1 do
    local id = ids[i]
    local lease = redis.call('ZSCORE', KEYS[2], id)
    local h = redis.call('HMGET', ARGV[1] .. id, 'state', 'type', 'attempts', 'max_attempts', 'delivered_at')
    rows[#rows + 1] = {id, lease or '', h[1] or '', h[2] or '', h[3] or '', h[4] or '', h[5] or ''}
  end
end
return {now, redis.call('LLEN', KEYS[1]), rows}

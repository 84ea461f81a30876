-- Read-only: a page of the processing list, oldest delivery first, with leases.
-- KEYS: 1 processing, 2 leases, 3 guard (never written: see keys.rs)
-- ARGV: 1 job prefix, 2 offset, 3 limit
-- Returns {now_ms, processing length, rows}; a row is
--   {id, lease expiry ('' when none), state, type, attempts, max_attempts, delivered_at,
--    unreadable} ('' for a missing field; unreadable: '' or why the job key
--   cannot be read, e.g. a key of another type, with the job's fields '':
--   one corrupt key must not fail the page, as in dead_scan.lua)
-- A leftover reclaim mark (`\0reclaimed`, left by a reclaim call that failed
-- half-way; the watchdog's reclaim removes it) is no job: it has no row (it
-- counts in the length, so a page may have fewer rows than `limit`).
local now = now_ms()
local offset, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local rows = {}
if limit > 0 then
  -- The oldest entry is at the tail (workers LMOVE to the head).
  local ids = redis.call('LRANGE', KEYS[1], -(offset + limit), -(offset + 1))
  for i = #ids, 1, -1 do
    local id = ids[i]
    if id ~= '\0reclaimed' then
      local lease = redis.call('ZSCORE', KEYS[2], id)
      local h, bad = read_job(ARGV[1] .. id, 'state', 'type', 'attempts', 'max_attempts', 'delivered_at')
      h = h or {}
      rows[#rows + 1] = {id, lease or '', h[1] or '', h[2] or '', h[3] or '', h[4] or '', h[5] or '', bad or ''}
    end
  end
end
return {now, redis.call('LLEN', KEYS[1]), rows}

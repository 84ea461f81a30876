-- Read-only: a page of the main list, next to run first.
-- KEYS: 1 main, 2 guard (never written: see keys.rs)
-- ARGV: 1 job prefix, 2 offset, 3 limit
-- Returns {now_ms, main length, rows}; a row is
--   {id, enqueued_at, type, attempts, last_error, unreadable} ('' for a missing
--   field; unreadable: '' or why the job key cannot be read, e.g. a key of
--   another type, with the job's fields '': one corrupt key must not fail
--   the page, as in dead_scan.lua)
local now = now_ms()
local offset, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local rows = {}
if limit > 0 then
  -- Workers take from the tail: the next to run is the last element.
  local ids = redis.call('LRANGE', KEYS[1], -(offset + limit), -(offset + 1))
  for i = #ids, 1, -1 do
    local h, bad = read_job(ARGV[1] .. ids[i], 'enqueued_at', 'type', 'attempts', 'last_error')
    h = h or {}
    rows[#rows + 1] = {ids[i], h[1] or '', h[2] or '', h[3] or '', h[4] or '', bad or ''}
  end
end
return {now, redis.call('LLEN', KEYS[1]), rows}

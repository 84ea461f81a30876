-- Read-only: a page of the delayed set (retries and scheduled jobs), soonest first.
-- KEYS: 1 delayed, 2 guard (never written: see keys.rs)
-- ARGV: 1 job prefix, 2 offset, 3 limit
-- Returns {now_ms, delayed size, rows}; a row is
--   {id, run_at, type, attempts, last_error, unreadable} ('' for a missing
--   field; unreadable: '' or why the job key cannot be read, e.g. a key of
--   another type, with the job's fields '': one corrupt key must not fail
--   the page, as in dead_scan.lua)
local now = now_ms()
local offset, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local rows = {}
if limit > 0 then
  local d = redis.call('ZRANGE', KEYS[1], offset, offset + limit - 1, 'WITHSCORES')
  for i = 1, #d, 2 do
    local h, bad = read_job(ARGV[1] .. d[i], 'type', 'attempts', 'last_error')
    h = h or {}
    rows[#rows + 1] = {d[i], d[i + 1], h[1] or '', h[2] or '', h[3] or '', bad or ''}
  end
end
return {now, redis.call('ZCARD', KEYS[1]), rows}

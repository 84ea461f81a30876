-- Read-only: one chunk of the dead-letter list, filtered in Redis, for
-- paging and bulk selection over long lists (dead_scan.rs).
-- KEYS: 1 dead, 2 guard (never written: see keys.rs)
-- ARGV: 1 job prefix, 2 from (list position), 3 count (at most 1000 read),
--       4 type ('' = any, else exact), 5 error text, lowercase ('' = any,
--       else contained in dead_reason, case-insensitive), 6 want (stop after
--       this many matches)
-- Returns {list length, entries read, rows}; a row is
--   {id, type, dead_reason, dead_at, attempts, unreadable} ('' for a missing
--   field; unreadable: '' or why the job key cannot be read, e.g. a key of
--   another type: such a row is returned whatever the filter, since its type
--   and reason are unknown, so that the caller can report it)
local from, count, want = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[6])
if not from or from < 0 or not count or count < 1 or not want or want < 1 then
  return redis.error_reply('ERR dead_scan: from >= 0, count >= 1 and want >= 1 required')
end
if count > 1000 then count = 1000 end
local job_type, needle = ARGV[4], ARGV[5]
local ids = redis.call('LRANGE', KEYS[1], from, from + count - 1)
local rows, read = {}, 0
for i = 1, #ids do
  read = i
  local h, bad = read_job(ARGV[1] .. ids[i], 'type', 'dead_reason', 'dead_at', 'attempts')
  if not h then
    rows[#rows + 1] = {ids[i], '', '', '', '', bad}
  elseif (job_type == '' or h[1] == job_type)
    and (needle == '' or (h[2] and string.find(string.lower(h[2]), needle, 1, true) ~= nil)) then
    rows[#rows + 1] = {ids[i], h[1] or '', h[2] or '', h[3] or '', h[4] or '', ''}
  end
  if #rows >= want then break end
end
return {redis.call('LLEN', KEYS[1]), read, rows}

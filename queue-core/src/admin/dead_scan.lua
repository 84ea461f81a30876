-- Read-only: one chunk of the dead-letter list, filtered in Redis, for
-- paging and bulk selection over long lists (dead_scan.rs).
-- KEYS: 1 dead, 2 guard (never written: see keys.rs)
-- ARGV: 1 job prefix, 2 from (list position), 3 count (at most 1000 read),
--       4 type ('' = any, else exact), 5 error text, lowercase ('' = any,
--       else contained in dead_reason, case-insensitive), 6 want (stop after
--       this many matches), 7 reason characters (optional; '' or absent: each
--       reason whole; 0: none sent; n: each reason cut to its first n UTF-8
--       characters, '…' appended when cut). The filter reads the whole
--       reason either way: only what is sent back is cut, so a caller that
--       needs ids and dead_at, or a preview, does not receive every error
--       text in full (up to 4 KB each, 1000 per chunk)
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
local reason_max = nil
if ARGV[7] and ARGV[7] ~= '' then
  reason_max = tonumber(ARGV[7])
  if not reason_max or reason_max < 0 then
    return redis.error_reply('ERR dead_scan: reason characters >= 0 required, got ' .. ARGV[7])
  end
  reason_max = math.floor(reason_max)
end
-- The reason as sent back (see ARGV 7): its first `reason_max` characters
-- (the byte before the start of the next one, found by each character's
-- first byte: any but a continuation byte 0x80-0xBF).
local function shown(reason)
  if not reason then return '' end
  if not reason_max or #reason <= reason_max then return reason end
  if reason_max == 0 then return '' end
  local at = 0
  for _ = 1, reason_max + 1 do
    at = string.find(reason, '[^\128-\191]', at + 1)
    if not at then return reason end
  end
  return string.sub(reason, 1, at - 1) .. '\226\128\166'
end
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
    rows[#rows + 1] = {ids[i], h[1] or '', shown(h[2]), h[3] or '', h[4] or '', ''}
  end
  if #rows >= want then break end
end
return {redis.call('LLEN', KEYS[1]), read, rows}

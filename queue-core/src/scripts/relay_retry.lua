-- Relay, by an operator (Queue::relay_retry_dead), on the members' queue C:
-- moves notices that relay_done.lua set aside in C's dead-notice list back to
-- the tail of C's relay list, without the reason line relay_done put in front
-- of each, so that the next relay run applies them again (e.g. once a corrupt
-- batch count was repaired). Applying again is idempotent: relay_apply.lua
-- skips a notice whose seq is not above the member's last applied one, and a
-- finish counts once by the batch's `:done` set.
-- Works from the dead-notice list's oldest end (its tail: relay_done pushes at
-- the head), oldest first, so a member's notices keep their order; at most
-- `limit` entries per call, after leaving the `skip` entries nearest the tail
-- (those an earlier call of the same run kept). An entry with no readable
-- notice after a reason line (written by hand) is kept where it is and counted
-- as kept: moved back, it would only be set aside again.
-- Each notice is pushed to the relay list before its entry is removed.
-- KEYS: 1 dead-notice list, 2 relay list
-- ARGV: 1 limit (entries examined by this call), 2 skip (entries left at the tail)
-- Returns {moved, kept, left}: left is the number of entries before the
-- examined ones (newer), not examined yet.
local limit = arg_count(ARGV[1], 'limit')
local skip = arg_count(ARGV[2], 'skip')
expect_types(KEYS[1], 'list', KEYS[2], 'list')
local len = redis.call('LLEN', KEYS[1])
local n = math.min(limit, math.max(len - skip, 0))
if n == 0 then return {0, 0, math.max(len - skip, 0)} end
-- In list order: newest of the range first, the oldest last.
local entries = redis.call('LRANGE', KEYS[1], -(skip + n), -(skip + 1))
-- The notice of an entry `<reason>\n<notice>`: what follows the first line
-- break after which a notice parses (a reason holds no line break as
-- relay_done writes it; the search also takes one that does).
local function notice_of(e)
  local from = 1
  while true do
    local nl = string.find(e, '\n', from, true)
    if not nl then return nil end
    local rest = string.sub(e, nl + 1)
    if wf_parse_notice(rest) then return rest end
    from = nl + 1
  end
end
local moved, kept = 0, 0
for i = #entries, 1, -1 do
  local e = entries[i]
  local notice = notice_of(e)
  if notice then
    redis.call('RPUSH', KEYS[2], notice)
    redis.call('LREM', KEYS[1], -1, e)
    moved = moved + 1
  else
    kept = kept + 1
  end
end
return {moved, kept, math.max(len - skip - n, 0)}

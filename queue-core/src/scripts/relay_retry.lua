-- Relay, by an operator (Queue::relay_retry_dead), on the members' queue C:
-- moves notices that relay_done.lua set aside in C's dead-notice list back to
-- the tail of C's relay list, without the reason line relay_done put in front
-- of each, so that the next relay run applies them again (e.g. once a corrupt
-- batch count was repaired). Applying again is idempotent: relay_apply.lua
-- skips a notice whose seq is not above the member's last applied one, and a
-- finish counts once by the batch's `:done` set.
-- A notice without a seq (seq 0: wf_notice found `relay:seq` corrupt) gets a
-- fresh one from `INCR relay:seq` as it moves back: with seq 0 relay_apply
-- sets it aside (code 5), and no seq of that member can be below it. While
-- `relay:seq` is still corrupt (another type, or not a count: checked before
-- the first write) such an entry is kept where it is and counted as kept.
-- Works from the dead-notice list's oldest end (its tail: relay_done pushes at
-- the head), oldest first, so a member's notices keep their order; at most
-- `limit` entries per call, after leaving the `skip` entries nearest the tail
-- (those an earlier call of the same run kept). An entry with no readable
-- notice after its reason line (written by hand) is kept where it is and
-- counted as kept: moved back, it would only be set aside again.
-- Each notice is pushed to the relay list before its entry is removed.
-- KEYS: 1 dead-notice list, 2 relay list, 3 relay:seq
-- ARGV: 1 limit (entries examined by this call), 2 skip (entries left at the tail)
-- Returns {moved, kept, left}: left is the number of entries before the
-- examined ones (newer), not examined yet.
local limit = arg_count(ARGV[1], 'limit')
local skip = arg_count(ARGV[2], 'skip')
expect_types(KEYS[1], 'list', KEYS[2], 'list')
-- Whether INCR of relay:seq gives a seq (1 or more) without failing.
local seq_t = redis.call('TYPE', KEYS[3])['ok']
local seq_ok = seq_t == 'none'
  or (seq_t == 'string' and not wf_bad_count('relay:seq', redis.call('GET', KEYS[3])))
local len = redis.call('LLEN', KEYS[1])
local n = math.min(limit, math.max(len - skip, 0))
if n == 0 then return {0, 0, math.max(len - skip, 0)} end
-- In list order: newest of the range first, the oldest last.
local entries = redis.call('LRANGE', KEYS[1], -(skip + n), -(skip + 1))
-- The notice of an entry `<reason>\n<notice>` and its seq: what follows the
-- entry's first line break, when it parses (relay_done writes a reason
-- without line breaks). Only that one line break is tried: one search and one
-- copy per entry, whatever its length (trying each line break copied the
-- rest of the entry at each: an entry of 1 MB of line breaks held the server
-- for minutes).
local function notice_of(e)
  local nl = string.find(e, '\n', 1, true)
  if not nl then return nil end
  local rest = string.sub(e, nl + 1)
  local seq = wf_parse_notice(rest)
  if seq then return rest, seq end
  return nil
end
local moved, kept = 0, 0
for i = #entries, 1, -1 do
  local e = entries[i]
  local notice, seq = notice_of(e)
  if notice and seq == 0 then
    if seq_ok then
      local digits = string.find(notice, '\n', 1, true)
      notice = redis.call('INCR', KEYS[3]) .. string.sub(notice, digits)
    else
      notice = nil
    end
  end
  if notice then
    redis.call('RPUSH', KEYS[2], notice)
    redis.call('LREM', KEYS[1], -1, e)
    moved = moved + 1
  else
    kept = kept + 1
  end
end
return {moved, kept, math.max(len - skip - n, 0)}

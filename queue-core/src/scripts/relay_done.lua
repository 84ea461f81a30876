-- Relay, step 2 of 2, on the members' queue C: removes notices the relay
-- applied (or found already applied) from C's relay list, and moves those it
-- could not apply (no such batch, corrupt batch, unreadable notice) to C's
-- dead-notice list with the reason, where `check` and `stats` show them.
-- Each notice is removed exactly once (LREM 1 of its text, unique by its
-- seq): a second relayer that applied the same notice removes nothing and
-- moves nothing. The dead-notice list's type is checked only when a notice
-- has to move there: one of another type (corrupt data) keeps those notices
-- in the relay list (counted as kept, logged) and the applied ones are still
-- removed. Before, it refused the whole call, even when every notice was
-- applied: the relay re-applied the same first notices for ever and never
-- reached the later ones.
-- A notice whose batch is gone (expired or deleted) is dropped: removed and
-- counted in stats (`relay_dropped`), as a member on the batch's own queue
-- whose batch is gone is skipped (wf_finished). Before, it went to the
-- dead-notice list, from where nothing could ever apply it.
-- KEYS: 1 relay list, 2 dead-notice list, 3 stats
-- ARGV: then per notice: its text, and '' (applied: remove), '-' (its batch is
-- gone: drop) or the reason it is dead
-- Returns {removed, moved to the dead-notice list, kept in the relay list, dropped}
if #ARGV % 2 ~= 0 then
  return redis.error_reply('relay_done: the notices must be (notice, reason) pairs')
end
expect_types(KEYS[1], 'list')
local removed, dead, kept, dropped = 0, 0, 0, 0
local dead_bad
for i = 1, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    if redis.call('LREM', KEYS[1], 1, ARGV[i]) == 1 then removed = removed + 1 end
  elseif ARGV[i + 1] == '-' then
    if redis.call('LREM', KEYS[1], 1, ARGV[i]) == 1 then dropped = dropped + 1 end
  elseif redis.call('LPOS', KEYS[1], ARGV[i]) then
    if dead_bad == nil then dead_bad = key_type_bad(KEYS[2], 'list') or false end
    if dead_bad then
      kept = kept + 1
    else
      -- The dead-notice list first, then the removal (insert before remove).
      redis.call('LPUSH', KEYS[2], ARGV[i + 1] .. '\n' .. ARGV[i])
      redis.call('LREM', KEYS[1], 1, ARGV[i])
      dead = dead + 1
    end
  end
end
if kept > 0 then
  redis.log(redis.LOG_WARNING, 'relay: ' .. kept .. ' notice(s) that cannot be applied kept in ' .. KEYS[1]
    .. ' (' .. dead_bad .. ')')
end
if removed > 0 then bump(KEYS[3], 'relayed', removed) end
if dead > 0 then bump(KEYS[3], 'relay_dead', dead) end
if dropped > 0 then bump(KEYS[3], 'relay_dropped', dropped) end
return {removed, dead, kept, dropped}

-- Repair (checker): puts a group whose waiting list has jobs back at the
-- ring's tail when it is neither in the ring nor paused (an older version's
-- resume during a rolling deploy deleted the pause entry only, after a fetch
-- had taken the paused group out of the ring: no fetch would visit it again).
-- Only while that is still so: a group a fetch, an enqueue or a resume put
-- back meanwhile, a paused one, or one whose list emptied is left alone.
-- KEYS: 1 ring, 2 paused-groups hash, 3 the group's list
-- ARGV: 1 group
-- Returns 'ring' | 'changed'
local group = ARGV[1]
if group == '' or redis.call('TYPE', KEYS[3])['ok'] ~= 'list' then return 'changed' end
-- Both written or read below; checked before the first write.
expect_types(KEYS[1], 'list', KEYS[2], 'hash')
if redis.call('LLEN', KEYS[3]) == 0 or redis.call('HEXISTS', KEYS[2], group) == 1
    or redis.call('LPOS', KEYS[1], group) then
  return 'changed'
end
ring_add(KEYS[1], group)
return 'ring'

-- Deletes one dead-lettered job for good: off the dead list, its hash and its
-- step results, in one step (DESIGN rule 1). Only while the job is dead: a
-- live job that reuses the id (state other than `dead`) is never deleted, and
-- when `expected dead_at` is given and differs (the job was replayed and died
-- again since), nothing changes. A dead-list entry whose hash is gone is removed.
-- KEYS: 1 dead, 2 job hash, 3 step results, 4 stats, 5 guard (never written: see
--       keys.rs; the script deletes the job's history)
-- ARGV: 1 id, 2 expected dead_at ('' = any)
-- Returns 1 purged, 0 not dead-lettered, -1 changed since listed.
local h = redis.call('HMGET', KEYS[2], 'state', 'dead_at')
if h[1] and h[1] ~= 'dead' then
  return 0
end
if ARGV[2] ~= '' and h[2] ~= ARGV[2] then
  if redis.call('LPOS', KEYS[1], ARGV[1]) then return -1 end
  return 0
end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3])
hist_close(KEYS[4], ARGV[1])
bump(KEYS[4], 'purged', 1)
return 1

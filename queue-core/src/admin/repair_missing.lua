-- Repair (checker): entries whose job hash is gone. A job that completed
-- (its completion record exists, as a hash or a compact string) only loses
-- its stale entries; any other is dead-lettered with the reason (a minimal
-- hash, as claim() does for a missing hash; its step results lose their TTL,
-- as dead_letter() does), so an operator sees it. The dead
-- entry is written before the others are removed; the counter last. Every
-- entry goes (LREM 0): with no hash, each of them is stale. Only while the
-- hash is still missing.
-- KEYS: 1 main, 2 processing, 3 delayed, 4 dead, 5 leases, 6 job hash, 7 completion record, 8 stats
-- ARGV: 1 id, 2 reason
-- Returns 'removed' | 'dead' | 'changed'
local id = ARGV[1]
expect_types(KEYS[1], 'list', KEYS[2], 'list', KEYS[3], 'zset', KEYS[4], 'list', KEYS[5], 'zset')
if redis.call('EXISTS', KEYS[6]) == 1 then
  return 'changed'
end
-- Only a record key that is a record (a hash, or a compact record's string)
-- says the job completed: a key of a third type is corrupt data, and taking
-- it for a record would remove the entries and lose the job silently.
local completed = redis.call('EXISTS', KEYS[7]) == 1 and not record_type_bad(KEYS[7])
local listed_dead = redis.call('LPOS', KEYS[4], id)
if not completed then
  redis.call('HSET', KEYS[6], 'id', id, 'state', 'dead', 'dead_reason', ARGV[2], 'dead_at', now_ms())
  if not listed_dead then redis.call('LPUSH', KEYS[4], id) end
  -- Its step results live as long as the dead entry, as dead_letter() keeps
  -- them (replay gives them their TTL back): expiring while it stays dead,
  -- a replay ran the handler's completed steps again.
  redis.pcall('PERSIST', ev_base(KEYS[8]) .. 'steps:' .. id)
end
redis.call('LREM', KEYS[1], 0, id)
redis.call('LREM', KEYS[2], 0, id)
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[5], id)
if completed then
  redis.call('LREM', KEYS[4], 0, id)
  return 'removed'
end
if not listed_dead then bump(KEYS[8], 'dead', 1) end
return 'dead'

-- Claim after a BLMOVE (which cannot run inside a script). Idempotent for its
-- token: a retry whose first reply was lost gets the same claimed row.
-- KEYS: 1 processing, 2 leases, 3 dead, 4 stats, 5 guard (never written: see keys.rs)
-- ARGV: 1 id, 2 job prefix, 3 done prefix, 4 lease_ms, 5 token
-- Returns a claim row, or {'gone', id} when the watchdog already returned the id.
local lease_ms = arg_count(ARGV[4], 'lease_ms')
expect_types(KEYS[2], 'zset', KEYS[3], 'list') -- LPOS checks processing itself
if not redis.call('LPOS', KEYS[1], ARGV[1]) then
  return {'gone', ARGV[1]}
end
return claim(ARGV[1], KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3],
  lease_ms, ARGV[5], now_ms())

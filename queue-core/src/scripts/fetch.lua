-- Non-blocking fetch: LMOVE main -> processing and claim, in one atomic step
-- (no crash window), for up to `count` jobs.
-- KEYS: 1 main, 2 processing, 3 leases, 4 dead, 5 stats, 6 guard (never written: see keys.rs),
--       7 paused flag
-- ARGV: 1 job prefix, 2 done prefix, 3 lease_ms, 4 token base, 5 count
-- Returns a list of claim rows (see claim() in the prelude), or 'paused' (nothing moved).
if redis.call('EXISTS', KEYS[7]) == 1 then return 'paused' end
local now = now_ms()
local out = {}
for i = 1, tonumber(ARGV[5]) do
  local id = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  if not id then break end
  out[#out + 1] = claim(id, KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2],
    tonumber(ARGV[3]), ARGV[4] .. ':' .. i, now)
end
return out

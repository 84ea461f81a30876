-- Claim after a BLMOVE (which cannot run inside a script). Idempotent for its
-- token: a retry whose first reply was lost gets the same claimed row.
-- KEYS: 1 processing, 2 leases, 3 dead, 4 stats, 5 guard (never written: see keys.rs),
--       6 paused flag, 7 main, 8 limits, 9 delayed, 10 promoter wake
-- ARGV: 1 id, 2 job prefix, 3 done prefix, 4 lease_ms, 5 token,
--       6 worker name (optional: absent from older callers; kept in the job's `worker`),
--       7 '1' when the worker is shutting down (optional): the id goes back, unclaimed
-- Returns a claim row (a claimed row is one string, claimed_row() in the
-- prelude), {'gone', id} when the watchdog already returned the id,
-- {'stopping', id} when the worker is shutting down (the id went back to the head of
-- main, unclaimed: no attempt, no lease; DESIGN rule 10),
-- or {'paused', id} when the queue is paused (the id went back to main, unclaimed),
-- {'limited', id, ms} when a queue limit lets no job start for ms (the same),
-- {'deferred', id, run_at} when its rate key is over its limit (docs/LIMITS.md).
local lease_ms = arg_count(ARGV[4], 'lease_ms')
expect_types(KEYS[2], 'zset', KEYS[3], 'list', KEYS[7], 'list') -- LPOS checks processing itself
local lim = limits_load(KEYS[8], KEYS[9])
local at = redis.call('LPOS', KEYS[1], ARGV[1])
if not at then
  return {'gone', ARGV[1]}
end
local now = now_ms()
local room, wait = limits_room(lim, KEYS[2], 1, now)
local stopping = ARGV[7] == '1'
local paused = redis.call('EXISTS', KEYS[6]) == 1
if stopping or paused or room == 0 then
  -- Stopping, paused or limited: only a job nobody has claimed goes back (a retry of our
  -- own claim, or another delivery's, is answered by claim() below as usual).
  local h = read_job(ARGV[2] .. ARGV[1], 'state')
  if h and h[1] == 'queued' then
    redis.call('RPUSH', KEYS[7], ARGV[1])
    redis.call('LREM', KEYS[1], 1, ARGV[1])
    -- A provisional lease the watchdog may have given it meanwhile.
    redis.call('ZREM', KEYS[2], ARGV[1])
    if stopping then return {'stopping', ARGV[1]} end
    if paused then return {'paused', ARGV[1]} end
    return {'limited', ARGV[1], wait}
  end
end
-- The row says whether the delivery is far from the tail of processing, for
-- its ack (claimed_row): its distance is the list's length less its index
-- from the head, less one.
return limits_claim(lim, KEYS[9], KEYS[10], ARGV[1], KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2],
  ARGV[3], lease_ms, ARGV[5], now, ARGV[6], redis.call('LLEN', KEYS[1]) - 1 - at)

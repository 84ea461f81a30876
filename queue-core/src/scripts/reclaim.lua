-- Watchdog pass: return jobs whose lease expired (jittered backoff) or
-- dead-letter them when attempts are exhausted; give a provisional lease to
-- ids in processing that have none (a worker died between BLMOVE and claim).
-- Validates first (queue key types, arguments, each job's counts: corrupt job
-- data is dead-lettered with the field named); destination before source,
-- counters last.
-- KEYS: 1 processing, 2 leases, 3 delayed, 4 dead, 5 stats, 6 guard (never written: see keys.rs),
--       7 promoter wake list
-- ARGV: 1 job prefix, 2 limit, 3 orphan grace ms, 4 backoff base ms, 5 backoff cap ms,
--       6 random seed, 7 orphan scan length
-- Returns {reclaimed, dead_lettered, adopted}
local limit = arg_count(ARGV[2], 'limit')
local grace = arg_count(ARGV[3], 'orphan grace')
local base = arg_count(ARGV[4], 'backoff base')
local cap = arg_count(ARGV[5], 'backoff cap')
local seed = arg_count(ARGV[6], 'seed')
local scan = arg_count(ARGV[7], 'orphan scan')
-- LRANGE of the last 0 entries would be `LRANGE processing -0 -1`, which
-- Redis refuses ("-0" is not an integer) after the pass's moves.
if scan < 1 then error({err = 'ERR invalid argument orphan scan: must be at least 1, got ' .. ARGV[7]}) end
expect_types(KEYS[1], 'list', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'list')
local now = now_ms()
math.randomseed(seed)
local reclaimed, dead, adopted = 0, 0, 0
local wake = false
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(expired) do
  local member, member_reason
  -- From the tail (ids are unique, DESIGN rule 5): an expired delivery is
  -- old, near the tail; from the head this walked the whole list per id.
  if redis.call('LPOS', KEYS[1], id, 'RANK', -1) then
    local jobkey = ARGV[1] .. id
    local h, bad = read_job(jobkey, 'state', 'attempts', 'max_attempts')
    local attempts, max
    if h and not h[1] then bad = 'job hash missing (key deleted or evicted)' end
    if not bad then attempts, max, bad = job_counts(h[2], h[3]) end
    if bad then
      member, member_reason = dead_letter(jobkey, KEYS[4], KEYS[5], id, bad, now), bad
      dead = dead + 1
    else
      local msg = 'lease expired: the worker died or stalled'
      if h[1] ~= 'active' then
        msg = 'taken from main but never claimed: the worker died between BLMOVE and claim'
      end
      if h[1] == 'active' and attempts >= max then
        member_reason = 'attempts exhausted (' .. attempts .. ' of ' .. max .. '): ' .. msg
        member = dead_letter(jobkey, KEYS[4], KEYS[5], id, member_reason, now)
        redis.call('HSET', jobkey, 'last_error', msg, 'failed_at', now)
        dead = dead + 1
      else
        -- The exponent is capped as the Rust side caps it (40): with a base
        -- of 0 and 1,025 attempts or more, 0 * 2^1024 is NaN, which ZADD
        -- refuses half-way through the pass (and at every pass after it).
        local backoff = base * 2 ^ math.min(math.max(attempts - 1, 0), 40)
        if backoff > cap then backoff = cap end
        local run_at = now + math.floor(backoff / 2 + math.random() * backoff / 2)
        ev_hist(KEYS[5], id, jobkey, 'reclaimed', msg, now)
        wake = wake or sooner_than_head(KEYS[3], run_at)
        redis.call('ZADD', KEYS[3], run_at, id)
        redis.call('HSET', jobkey, 'state', 'delayed', 'run_at', run_at, 'last_error', msg,
          'failed_at', now)
        redis.call('HDEL', jobkey, 'token', 'lease_until')
        reclaimed = reclaimed + 1
      end
    end
    -- From the tail: a finished or expired delivery is old, near the tail (see ack.lua).
    redis.call('LREM', KEYS[1], -1, id)
  end
  redis.call('ZREM', KEYS[2], id)
  -- The batch counts last, after the job's own move (dead list, out of
  -- processing and leases): when they came first, a failure in them left a
  -- dead-lettered job in processing and leases, to run again.
  dead_member(member, id, member_reason, now, KEYS[5])
end
local tail = redis.call('LRANGE', KEYS[1], -scan, -1)
for _, id in ipairs(tail) do
  if not redis.call('ZSCORE', KEYS[2], id) then
    redis.call('ZADD', KEYS[2], now + grace, id)
    adopted = adopted + 1
  end
end
if reclaimed > 0 then bump(KEYS[5], 'reclaimed', reclaimed) end
if adopted > 0 then bump(KEYS[5], 'adopted', adopted) end
if wake then wake_promoter(KEYS[7]) end
return {reclaimed, dead, adopted}

-- Watchdog pass: return jobs whose lease expired (jittered backoff) or
-- dead-letter them when attempts are exhausted; give a provisional lease to
-- ids in processing that have none (a worker died between BLMOVE and claim).
-- Validates first (queue key types, arguments, each job's counts: corrupt job
-- data is dead-lettered with the field named); destination before source,
-- counters last.
-- Only an `active` job (its delivery's lease expired) or a `queued` one (taken
-- from main, never claimed) is returned or dead-lettered. The processing entry
-- of a job in another state is stale (a hand edit, e.g. a dead id pushed on
-- main, which fetch answers busy and leaves in processing): a `dead` or
-- `delayed` job is left where it is (relisted on the dead list, or in delayed
-- at its own run_at, when it is missing there) and only the entry and lease
-- are dropped; so is the entry of a job whose hash is gone but whose
-- completion record exists (it completed). Any other state is corrupt data:
-- dead-lettered naming it. An expired lease with no processing entry is the
-- lost delivery of an `active` job when the job's lease_until is the lease's
-- score (returned like any), else a stale lease, dropped. Every dropped entry
-- is logged and answered.
-- KEYS: 1 processing, 2 leases, 3 delayed, 4 dead, 5 stats, 6 guard (never written: see keys.rs),
--       7 promoter wake list
-- ARGV: 1 job prefix, 2 limit, 3 orphan grace ms, 4 backoff base ms, 5 backoff cap ms,
--       6 random seed, 7 orphan scan length,
--       8 completion record prefix (optional: absent from older callers, whose missing hashes are dead-lettered)
-- Returns {reclaimed, dead_lettered, adopted,
--          {id, state or 'completed' or 'lease only (<state>)', ...} of the entries dropped}
local limit = arg_count(ARGV[2], 'limit')
local grace = arg_count(ARGV[3], 'orphan grace')
local base = arg_count(ARGV[4], 'backoff base')
local cap = arg_count(ARGV[5], 'backoff cap')
local seed = arg_count(ARGV[6], 'seed')
local scan = arg_count(ARGV[7], 'orphan scan')
local doneprefix = ARGV[8]
if doneprefix == '' then doneprefix = nil end
-- LRANGE of the last 0 entries would be `LRANGE processing -0 -1`, which
-- Redis refuses ("-0" is not an integer) after the pass's moves.
if scan < 1 then error({err = 'ERR invalid argument orphan scan: must be at least 1, got ' .. ARGV[7]}) end
expect_types(KEYS[1], 'list', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'list')
local now = now_ms()
math.randomseed(seed)
local reclaimed, dead, adopted = 0, 0, 0
local dropped = {}
local wake = false
local EXPIRED_MSG = 'lease expired: the worker died or stalled'
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
for i = 1, #expired, 2 do
  local id, score = expired[i], expired[i + 1]
  local jobkey = ARGV[1] .. id
  local member, member_reason
  -- From the tail (ids are unique, DESIGN rule 5): an expired delivery is
  -- old, near the tail; from the head this walked the whole list per id.
  local listed = redis.call('LPOS', KEYS[1], id, 'RANK', -1)
  -- Read and decide first, write after.
  local h, bad = read_job(jobkey, 'state', 'attempts', 'max_attempts', 'run_at', 'lease_until')
  local msg        -- set: return the job (or dead-letter it when its attempts are exhausted)
  local stale      -- set: drop the entry and lease, leave the job where it is
  local relist_dead, relist_at
  local attempts, max
  if listed then
    if h and not h[1] then
      -- Only a record key that is a record says the job completed (a key of
      -- a third type is corrupt data: the job is dead-lettered as before).
      if doneprefix and redis.call('EXISTS', jobkey) == 0 and redis.call('EXISTS', doneprefix .. id) == 1
          and not record_type_bad(doneprefix .. id) then
        stale = 'completed'
      else
        bad = 'job hash missing (key deleted or evicted)'
      end
    elseif h then
      local state = h[1]
      if state == 'active' then
        msg = EXPIRED_MSG
      elseif state == 'queued' then
        msg = 'taken from main but never claimed: the worker died between BLMOVE and claim'
      elseif state == 'dead' then
        stale = 'dead'
        -- A rare path (a stale entry): a walk of the dead list is affordable.
        relist_dead = not redis.call('LPOS', KEYS[4], id)
      elseif state == 'delayed' then
        stale = 'delayed'
        if not redis.call('ZSCORE', KEYS[3], id) then
          relist_at = as_count(h[4])
          if not relist_at then
            stale, bad = nil, corrupt_field('run_at', h[4])
          end
        end
      else
        bad = "corrupt field state: '" .. utf8_cut(state, 64) .. "'"
      end
    end
  elseif h and h[1] == 'active' and h[5] and as_count(h[5]) == tonumber(score) then
    -- The lease of this delivery, whose processing entry was lost.
    msg = EXPIRED_MSG .. ' (its processing entry was lost)'
  else
    -- A lease with no processing entry and no matching active delivery:
    -- nothing of it runs; a corrupt job key is left to `check` (no entry).
    stale = 'lease only (' .. ((h and h[1]) or (h and 'no job hash') or 'corrupt job key') .. ')'
    bad = nil
  end
  if msg and not bad then attempts, max, bad = job_counts(h[2], h[3]) end
  if bad then
    member, member_reason = dead_letter(jobkey, KEYS[4], KEYS[5], id, bad, now), bad
    dead = dead + 1
  elseif stale then
    if relist_dead then
      redis.call('LPUSH', KEYS[4], id)
    elseif relist_at then
      wake = wake or sooner_than_head(KEYS[3], relist_at)
      redis.call('ZADD', KEYS[3], int_str(relist_at), id)
    end
    redis.log(redis.LOG_WARNING, 'reclaim: dropped the stale processing entry or lease of job ' .. id
      .. ' (' .. stale .. ') in ' .. KEYS[1] .. (relist_dead and '; relisted on the dead list' or '')
      .. (relist_at and '; relisted in delayed at its run_at' or '') .. '; the job is left where it is')
    dropped[#dropped + 1] = id
    dropped[#dropped + 1] = stale
  elseif h[1] == 'active' and attempts >= max then
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
    local run_at = math.min(now + math.floor(backoff / 2 + math.random() * backoff / 2), 9007199254740991)
    ev_hist(KEYS[5], id, jobkey, 'reclaimed', msg, now)
    wake = wake or sooner_than_head(KEYS[3], run_at)
    redis.call('ZADD', KEYS[3], run_at, id)
    redis.call('HSET', jobkey, 'state', 'delayed', 'run_at', run_at, 'last_error', msg,
      'failed_at', now)
    redis.call('HDEL', jobkey, 'token', 'lease_until')
    reclaimed = reclaimed + 1
  end
  -- From the tail: a finished or expired delivery is old, near the tail (see ack.lua).
  if listed then redis.call('LREM', KEYS[1], -1, id) end
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
return {reclaimed, dead, adopted, dropped}

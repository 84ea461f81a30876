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
-- Each expired id's processing entry is found by one walk of the list from
-- its tail (`locate`), marked in place (`LSET` to a tombstone) after the
-- job's destination is written, and all marks are removed by one `LREM`
-- from the tail at the end: O(list + batch) a call, where one `LPOS` and one
-- `LREM` per id cost O(list · batch) when the expired deliveries sit near
-- the head behind long-running ones (100,000 running and 500 expired: 1.7 s
-- in one script).
-- The orphan scan looks at `scan` entries from a rotating position (KEYS[8],
-- counted from the tail, advanced by `scan` a call, back to the tail past
-- the head), so every entry is looked at within len / scan calls; before,
-- only the oldest `scan` were, and an orphan behind that many long-running
-- deliveries waited for them to finish.
-- A mark is never a job: one left in processing (a call that failed
-- half-way between its LSETs and its LREM: Redis keeps a script's writes
-- up to an error) is skipped by the orphan scan and removed (one `LREM` of
-- the mark, counted in the reply and logged), and a lease on one (adopted
-- by an older reclaim) is dropped; before, the scan adopted the mark as an
-- orphan and the next pass dead-lettered a junk job `\0reclaimed`.
-- KEYS: 1 processing, 2 leases, 3 delayed, 4 dead, 5 stats, 6 guard (never written: see keys.rs),
--       7 promoter wake list,
--       8 orphan scan position (optional: absent from older callers, who scan the oldest entries)
-- ARGV: 1 job prefix, 2 limit, 3 orphan grace ms, 4 backoff base ms, 5 backoff cap ms,
--       6 random seed, 7 orphan scan length,
--       8 completion record prefix (optional: absent from older callers, whose missing hashes are dead-lettered)
-- Returns {reclaimed, dead_lettered, adopted,
--          {id, state or 'completed' or 'lease only (<state>)', ...} of the entries dropped,
--          leftover marks removed (entries and leases),
--          1 when the call stopped before an entry whose dead-list lookup needed
--          more whole walks than a call allows (call again), else 0}
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
-- What marks a taken entry until the one LREM at the end: a job id has no
-- control characters (JobId::validate, PROTOCOL.md section 1).
local TAKEN = '\0reclaimed'
-- One LPOS (a C comparison per entry) against the walk's LRANGE (a Lua
-- string and a table lookup per entry): about 16 times cheaper per entry
-- (measured, 100,000 ids of 41 bytes); 8 leans to the walk, whose cost is
-- bounded whatever the batch. A batch of at most this many is looked up
-- and removed one id at a time, as before the walk (no LLEN, no marks):
-- at most 2 * WALK_COST walks of the list.
local WALK_COST = 8

-- The position of each of `ids` in `list`, or false when it is not listed,
-- for a batch of more than WALK_COST ids (a shorter one is looked up id by
-- id in the loop below: `LPOS … RANK -1`, from the tail, where expired
-- deliveries are: they are old). Ids are unique (DESIGN rule 5); with a
-- duplicate (corrupt data) the entry nearest the tail is the one found, as
-- `LPOS … RANK -1` finds it. One walk of the list from the tail, in chunks
-- growing from twice the ids (ids near the tail cost a chunk or two; the
-- whole list is read at most once), gives negative indexes; once few ids
-- are left, one `LPOS` each (from the head: positive indexes) costs less
-- than reading the rest of the list (e.g. a lease whose entry is gone: it
-- is nowhere).
local function locate(list, ids)
  local at, left = {}, #ids
  for _, id in ipairs(ids) do at[id] = false end
  local len = redis.call('LLEN', list)
  local seen, chunk = 0, math.max(2 * left, 64)
  while left > 0 and seen < len do
    if left * len <= (len - seen) * WALK_COST then
      for _, id in ipairs(ids) do
        if at[id] == false then at[id] = redis.call('LPOS', list, id, 'RANK', -1) end
      end
      break
    end
    local part = redis.call('LRANGE', list, -(seen + chunk), -(seen + 1))
    local n = #part
    for j = n, 1, -1 do
      if at[part[j]] == false then
        at[part[j]] = -(seen + n - j + 1)
        left = left - 1
      end
    end
    seen = seen + n
    chunk = math.min(2 * chunk, 8192)
  end
  return at
end

local expired = {}
-- A lease on a mark (adopted by an older reclaim) is no job's: dropped
-- after the batch, never looked up as one.
local mark_leased = false
do
  local all = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #all, 2 do
    if all[i] == TAKEN then
      mark_leased = true
    else
      expired[#expired + 1] = all[i]
      expired[#expired + 1] = all[i + 1]
    end
  end
end
-- Read before any write. After a walk nothing below moves an entry of
-- processing until the LREM after the loop (LSET replaces in place), so the
-- positions hold; a short batch's ids are looked up and removed by value.
local position
if #expired > 2 * WALK_COST then
  local ids = {}
  for i = 1, #expired, 2 do ids[#ids + 1] = expired[i] end
  position = locate(KEYS[1], ids)
end
local taken = 0
-- The dead-list lookups of stale entries of dead jobs (a rare path): each
-- bounded as promote's (dead_listed: 1,000 entries from the head, where
-- recent dead letters are, then from the tail); the entry whose
-- lookup needs a whole walk past STALE_WALKS waits, before its writes, for
-- the next call (`cut`, answered so that the watchdog calls again at once).
local walks, cut = {left = STALE_WALKS}, false
for i = 1, #expired, 2 do
  local id, score = expired[i], expired[i + 1]
  local jobkey = ARGV[1] .. id
  local member, member_reason
  local listed
  if position then
    listed = position[id]
  else
    listed = redis.call('LPOS', KEYS[1], id, 'RANK', -1)
  end
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
        bad = stateless_reason(jobkey)
      end
    elseif h then
      local state = h[1]
      if state == 'active' then
        msg = EXPIRED_MSG
      elseif state == 'queued' then
        msg = 'taken from main but never claimed: the worker died between BLMOVE and claim'
      elseif state == 'dead' then
        stale = 'dead'
        local d = dead_listed(KEYS[4], id, walks)
        if d == nil then
          cut = true
          break
        end
        relist_dead = d == false
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
  -- Out of processing, after the job's destination: marked, and all marks
  -- go with one LREM after the loop; or, for a short batch, removed.
  if listed and position then
    redis.call('LSET', KEYS[1], listed, TAKEN)
    taken = taken + 1
  elseif listed then
    -- From the tail: a finished or expired delivery is old, near the tail.
    redis.call('LREM', KEYS[1], -1, id)
  end
  redis.call('ZREM', KEYS[2], id)
  -- The batch counts last, after the job's own move (dead list, out of
  -- processing and leases): when they came first, a failure in them left a
  -- dead-lettered job in processing and leases, to run again.
  dead_member(member, id, member_reason, now, KEYS[5])
end
-- From the tail, where they are: it stops at the deepest mark.
if taken > 0 then redis.call('LREM', KEYS[1], -taken, TAKEN) end
-- The orphan scan: `scan` entries from the stored position (entries from the
-- tail), which moves on by `scan` a call and back to the tail past the head.
-- The position is a hint, absent while it is the tail: one that is no
-- count, or another type (corrupt), reads as the tail and is replaced. A
-- list no longer than the scan is seen whole from the tail: nothing is read
-- or written for it.
local len = redis.call('LLEN', KEYS[1])
local rotate = KEYS[8] and len > scan
local from, stored, present = 0, nil, false
if rotate then
  local v = redis.pcall('GET', KEYS[8])
  present = v ~= false
  if type(v) == 'string' then stored = as_count(v) end
  if stored and stored < len then from = stored end
end
local window = redis.call('LRANGE', KEYS[1], -(from + scan), -(from + 1))
if rotate then
  local next_from = from + scan
  if next_from >= len then
    if present then redis.call('DEL', KEYS[8]) end
  elseif next_from ~= stored then
    redis.call('SET', KEYS[8], int_str(next_from))
  end
end
local marks_seen = false
for _, id in ipairs(window) do
  if id == TAKEN then
    marks_seen = true
  elseif not redis.call('ZSCORE', KEYS[2], id) then
    redis.call('ZADD', KEYS[2], now + grace, id)
    adopted = adopted + 1
  end
end
-- Leftover marks (see the header): rare, so one LREM of the whole list.
local marks = 0
if marks_seen then marks = redis.call('LREM', KEYS[1], 0, TAKEN) end
if mark_leased then marks = marks + redis.call('ZREM', KEYS[2], TAKEN) end
if marks > 0 then
  redis.log(redis.LOG_WARNING, 'reclaim: removed ' .. marks .. ' leftover reclaim mark(s) (entries or leases, no job) from '
    .. KEYS[1] .. ' / ' .. KEYS[2])
end
if reclaimed > 0 then bump(KEYS[5], 'reclaimed', reclaimed) end
if adopted > 0 then bump(KEYS[5], 'adopted', adopted) end
if wake then wake_promoter(KEYS[7]) end
return {reclaimed, dead, adopted, dropped, marks, cut and 1 or 0}

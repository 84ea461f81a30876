-- Moves due delayed jobs (retries, scheduled jobs, watchdog returns) to main.
-- Validates first; a missing or non-hash job is dead-lettered, never dropped;
-- each id is pushed on main (or dead) before it leaves the delayed set.
-- A promoted job's `ready_at` is its due time (its delayed score, at most
-- now): stats count its waiting age from then, not from its enqueue.
-- Only a job whose state is `delayed` moves: every writer of the delayed set
-- (fail and reclaim retries, delayed enqueues, version waits, limit
-- deferrals and their release) sets that state in the same script. An
-- entry whose job is in another state (queued, active, dead: a stale entry
-- left by a hand edit or an older bug) is dropped from the set and the job
-- left where it is (moved, it ran twice or ran while dead), as long as it
-- *is* somewhere: a `queued` job found neither waiting (main, its group's
-- list) nor in processing is made waiting (moved, as a promotion); a `dead`
-- job missing from the dead list is put back on it; an `active` job neither
-- in processing nor leased, and a state that is none of the job states
-- (corrupt data), are dead-lettered naming why. Before, each of those was
-- dropped and the job left in no list (lost; reclaim already applied this
-- rule to its stale entries). An entry whose hash is gone but whose
-- completion record exists (the job completed) is dropped too, not
-- dead-lettered as "job hash missing". Both are answered. Each list lookup
-- of a stale entry searches STALE_SEARCH entries from the tail, then walks
-- a longer list whole at most STALE_WALKS times per call (prelude's
-- listed_near_tail; the dead list's head first, dead_listed): past that the
-- call ends before the entry's writes and
-- the next call goes on from it (its wait answers 0: due now).
-- KEYS: 1 delayed, 2 main, 3 dead, 4 stats, 5 guard (never written: see keys.rs),
--       6 processing, 7 leases (read only, on the rare stale path, through
--       pcall: one of another type reads as not holding the job)
-- ARGV: 1 job prefix, 2 limit, 3 completion record prefix
-- Returns {ids moved or dead-lettered, ms until the earliest remaining job is
--          due (0: due now) or -1 when the delayed set is empty,
--          {id, state or 'completed', ...} of the entries dropped}: the
--          promoter sleeps that long.
local limit = arg_count(ARGV[2], 'limit')
expect_types(KEYS[1], 'zset', KEYS[2], 'list', KEYS[3], 'list')
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
local moved, dropped = 0, {}
local walks = {left = STALE_WALKS}
for i = 1, #due, 2 do
  local id = due[i]
  local jobkey = ARGV[1] .. id
  local h, bad = read_job(jobkey, 'state', 'group')
  local stale
  if h and not h[1] then
    -- Only a record key that is a record says the job completed (a key of
    -- a third type is corrupt data: the job is dead-lettered as before).
    local record = ARGV[3] .. id
    if redis.call('EXISTS', jobkey) == 0 and redis.call('EXISTS', record) == 1
        and not record_type_bad(record) then
      stale = 'completed'
    else
      bad = stateless_reason(jobkey)
    end
  elseif h and h[1] ~= 'delayed' then
    stale = h[1]
  end
  -- A stale entry is dropped only when its job is where its state says; a
  -- rare path (a hand edit, an older bug). Each list lookup is bounded
  -- (listed_near_tail); nil: its whole walks are used up, and this entry
  -- waits for the next call (stopped before its writes, below).
  local relist_dead, requeue, unsure
  if stale == 'dead' then
    local d = dead_listed(KEYS[3], id, walks)
    relist_dead, unsure = d == false, d == nil
  elseif stale == 'queued' then
    local g = group_of(h[2])
    local waiting = g and select(2, group_keys(KEYS[2])) .. g or KEYS[2]
    local listed = queued_job_listed(waiting, KEYS[6], id, walks)
    if listed == false then
      stale, requeue = nil, true
    elseif listed == nil then
      unsure = true
    end
  elseif stale == 'active' then
    if type(redis.pcall('ZSCORE', KEYS[7], id)) ~= 'string' then
      local p = listed_near_tail(KEYS[6], id, walks)
      if p == false then
        stale, bad = nil, 'state active but neither in processing nor leased (corrupt data)'
      elseif p == nil then
        unsure = true
      end
    end
  elseif stale and stale ~= 'completed' then
    stale, bad = nil, "corrupt field state: '" .. utf8_cut(stale, 64) .. "'"
  end
  -- Main was checked above; a group's list and the ring are checked here,
  -- as a corrupt one would fail the pass after earlier jobs moved (and
  -- again every pass): the job is dead-lettered with the reason instead.
  if not bad and not stale and group_of(h[2]) then
    local why = waiting_types_bad(KEYS[2], h[2])
    if why then bad = 'cannot wait in its group: ' .. why .. ' (corrupt data)' end
  end
  if unsure then break end
  if requeue then
    redis.log(redis.LOG_WARNING, 'promote: job ' .. id .. ' in state queued was in no list ('
      .. KEYS[1] .. '): made waiting')
  end
  local member
  if stale then
    if relist_dead then redis.call('LPUSH', KEYS[3], id) end
    redis.log(redis.LOG_WARNING, 'promote: dropped the delayed entry of job ' .. id
      .. ' in state ' .. stale .. ' (' .. KEYS[1] .. '); the job is left where it is'
      .. (relist_dead and '; relisted on the dead list' or ''))
    dropped[#dropped + 1] = id
    dropped[#dropped + 1] = stale
  elseif bad then
    member = dead_letter(jobkey, KEYS[3], KEYS[4], id, bad, now)
  else
    push_waiting(KEYS[2], id, h[2]) -- main, or its group's list
    -- Due at its score; a score that is no Redis-clock ms (a hand edit) reads as now.
    local ready = due[i + 1]
    if not as_count(ready) then ready = int_str(now) end
    redis.call('HSET', jobkey, 'state', 'queued', 'ready_at', ready)
    redis.call('HDEL', jobkey, 'run_at')
  end
  if not stale then moved = moved + 1 end
  redis.call('ZREM', KEYS[1], id)
  dead_member(member, id, bad, now, KEYS[4]) -- a batch member counts as dead, last
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = -1
-- At most 2^53 - 1 ms (scripts::MAX_MS): a run_at of +inf or past 2^63 ms
-- (another producer, a hand edit) made an infinite wait, which Redis sends
-- as the most negative integer, and the caller refused the whole pass.
if head[2] then
  wait = math.min(math.max(math.floor(tonumber(head[2]) - now), 0), 9007199254740991)
end
return {moved, wait, dropped}

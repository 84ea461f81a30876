-- Read-only: where job `id` is now. The job hash's `state` says which list
-- holds it, and only that one is searched: `LPOS` is a linear scan, and a
-- search of main, processing and dead for every lookup blocked Redis for the
-- length of all three (a completed job, the usual question, was looked for
-- to the end of each). Main is searched from its tail (where the next job to
-- run is), dead from its head (newest first), processing from its head for a
-- `queued` job (just moved there by BLMOVE) and from its tail otherwise (the
-- oldest deliveries, where a long-running or lost one is), each `cap`
-- entries at most.
-- KEYS: 1 main, 2 processing, 3 delayed, 4 dead, 5 leases, 6 job hash, 7 completion record
-- ARGV: 1 id, 2 cap (entries of main, processing or dead searched at most, >= 1)
-- Returns {now_ms, index in main, main length, index in processing,
--          delayed run_at ('' absent), index in dead, lease expiry ('' none),
--          job hash exists (1/0), completion record exists (1/0)}
-- An index is -1 when the id is not in that list (or the list was not
-- searched), -2 when it is not among the `cap` entries searched of a longer
-- list (further from the tail of main, the head of dead, or the end of
-- processing searched), except for a `queued` job in processing: -1 then
-- (not taken as far as its state says: the caller reports -2 in processing
-- as a taken job whose entry was not seen).
-- state    searched
-- queued   processing (moved by BLMOVE, not claimed yet: DESIGN rule 4), then
--          main unless the job has a group (a grouped job waits in its group's list)
-- active   processing
-- delayed  (no list)
-- dead     dead
-- none     nothing: no hash (a completion record or nothing)
-- other    (no state, or a job key of another type) every list, as before
-- The delayed set and the leases are read for every job with a hash (ZSCORE).
local id, cap = ARGV[1], tonumber(ARGV[2])
if not cap or cap < 1 then
  return redis.error_reply('ERR locate: cap >= 1 required')
end
cap = math.floor(cap)

-- Index of `id` in `key`, searching at most `cap` entries from the tail
-- (rank -1) or the head (rank 1); LPOS answers indexes from the head either way.
local function find(key, rank)
  local i = redis.call('LPOS', key, id, 'RANK', rank, 'MAXLEN', cap)
  if i then return i end
  if redis.call('LLEN', key) > cap then return -2 end
  return -1
end

local in_main, in_processing, delayed, in_dead, lease = -1, -1, '', -1, ''
local has_hash, has_done = redis.call('EXISTS', KEYS[6]), redis.call('EXISTS', KEYS[7])
if has_hash == 1 then
  local h = read_job(KEYS[6], 'state', 'group')
  local state = h and h[1]
  if state == 'queued' then
    -- Not among the `cap` entries searched is not found (-1), never -2: the
    -- caller reads -2 as "its state and lease say it is taken, its entry
    -- was not seen" (unconfirmed), which a queued job's state does not say.
    in_processing = math.max(find(KEYS[2], 1), -1)
    if in_processing < 0 and not group_of(h[2]) then in_main = find(KEYS[1], -1) end
  elseif state == 'active' then
    in_processing = find(KEYS[2], -1)
  elseif state == 'dead' then
    in_dead = find(KEYS[4], 1)
  elseif state ~= 'delayed' then
    in_processing = find(KEYS[2], -1)
    in_main = find(KEYS[1], -1)
    in_dead = find(KEYS[4], 1)
  end
  delayed = redis.call('ZSCORE', KEYS[3], id) or ''
  lease = redis.call('ZSCORE', KEYS[5], id) or ''
end
local main_len = 0
if in_main ~= -1 then main_len = redis.call('LLEN', KEYS[1]) end
return {now_ms(), in_main, main_len, in_processing, delayed, in_dead, lease, has_hash, has_done}

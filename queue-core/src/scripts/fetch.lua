-- Non-blocking fetch: LMOVE main (and group lists, round-robin) -> processing and claim, in one atomic step
-- (no crash window), for up to `count` jobs. Idempotent for its token base: the
-- rows are kept in a receipt (a list of `tag:id`, expiring after `receipt_ms`),
-- and a retry whose first reply was lost gets the same deliveries again.
-- KEYS: 1 main, 2 processing, 3 leases, 4 dead, 5 stats, 6 guard (never written: see keys.rs),
--       7 receipt of this token base, 8 paused flag, 9 limits, 10 delayed, 11 promoter wake
-- ARGV: 1 job prefix, 2 done prefix, 3 lease_ms, 4 token base, 5 count, 6 receipt_ms,
--       7 worker name (optional: absent from older callers; kept in each claimed job's `worker`),
--       8 '1' when this is the first try of a fresh token base, so no receipt can exist and
--         it is not read (optional: absent or anything else, the receipt is read first)
-- Returns a list of claim rows (see claim() in the prelude: a claimed row is
-- one string, claimed_row(), saying whether the delivery was claimed far
-- from the tail of processing, for its ack), or 'paused'
-- (nothing moved; a retry of a fetch that already ran still gets its rows),
-- or 'limited:<ms>' when a queue limit lets no job start for that long
-- (docs/LIMITS.md; a job deferred for its rate key is a row {'deferred', id, run_at}).
-- The rows of one call stop growing once they hold this many bytes (the
-- job that crosses it is the last, so a call always claims one when one
-- waits): the jobs moved for the rest of the batch go back to main's tail,
-- in their order, before any reply. Before, a batch of large payloads made
-- a reply the client could not read within its response timeout; every
-- same-token retry answered it again, and the fetcher went on to claim the
-- next batch: every job spent its attempts unrun (stop 48 review).
local REPLY_BYTES = 16 * 1024 * 1024
-- Puts ids[from..] (moved into processing by move_batch, not claimed) back
-- at main's tail, ids[from] last so it is taken next: main first, then
-- processing (destination before source).
local function give_back(main, processing, ids, from)
  local back = {}
  for j = #ids, from, -1 do back[#back + 1] = ids[j] end
  call_chunked('RPUSH', main, back)
  for j = from, #ids do redis.call('LREM', processing, 1, ids[j]) end
end
local lease_ms = arg_count(ARGV[3], 'lease_ms')
local count = arg_count(ARGV[5], 'count')
local receipt_ms = arg_count(ARGV[6], 'receipt_ms')
-- LRANGE checks main and (on a retry) the receipt, LPUSH processing, before any
-- write. A first try does not read the receipt: its key names a fresh random
-- token base (122 random bits) that only the calling fetcher knows, so no other
-- writer can have made it; that it does not exist is checked in the EXISTS
-- below (corrupt data).
expect_types(KEYS[3], 'zset', KEYS[4], 'list')
-- The keys of the optional features (pause flag, limits, the groups ring,
-- the events switch) with one EXISTS: a queue that uses none of them pays
-- this one call instead of one each (issue #12); otherwise each is looked at.
-- A first try adds its receipt key to the same EXISTS; only when the count
-- is not 0 (a queue using an optional feature, or the receipt exists) does a
-- second EXISTS tell which. A receipt that exists has its type checked before
-- any write: a first try answered its rows only after moving and claiming
-- its jobs, where its RPUSH to a receipt of another type (corrupt data)
-- raised, and the jobs stayed active with no worker running them until
-- their leases expired. A list is read, as a retry's (a token base used
-- twice: the rows of its first use, not a new batch appended to them).
-- (The key given five times, which told the two apart in one call, cost
-- 0.5% of fetch and ack per job, callgrind.)
local ring = group_keys(KEYS[1])
local first_try = ARGV[8] == '1'
local present
if first_try then
  present = redis.call('EXISTS', KEYS[8], KEYS[9], ring, ev_switch(KEYS[5]), KEYS[7])
  if present > 0 and redis.call('EXISTS', KEYS[7]) == 1 then
    expect_types(KEYS[7], 'list')
    first_try, present = false, present - 1
  end
else
  present = redis.call('EXISTS', KEYS[8], KEYS[9], ring, ev_switch(KEYS[5]))
end
local optional = present > 0
if not optional then ev_off() end
local lim = optional and limits_load(KEYS[9], KEYS[10]) or nil
local out = {}
-- A retry reads the receipt; a first try of a fresh token base knows there is
-- none (above) and skips the call (one call of ~12 per one-job fetch, issue #12).
local receipt = not first_try and redis.call('LRANGE', KEYS[7], '0', '-1') or {}
if #receipt > 0 then
  -- A retry of this fetch: the same rows, re-read from the jobs (nothing written).
  for i, entry in ipairs(receipt) do
    -- An entry without its `tag:` (written by hand: corrupt data) reads as
    -- a row of nothing claimed; before, it raised a Lua error on every retry.
    local colon = string.find(entry, ':', 1, true) or 0
    local tag, id = string.sub(entry, 1, colon - 1), string.sub(entry, colon + 1)
    local row = {tag, id}
    if colon == 0 then
      row = {'busy', entry}
    elseif tag == 'claimed' then
      local jobkey = ARGV[1] .. id
      local h = read_job(jobkey, unpack(CLAIM_FIELDS))
      row = (h and same_claim(id, ARGV[4] .. ':' .. int_str(i), h, jobkey)) or {'busy', id}
    elseif tag == 'corrupt' then
      row = {tag, id, 'dead-lettered by the first run of this fetch'}
    end
    out[i] = row
  end
  return out
end
if optional and redis.call('EXISTS', KEYS[8]) == 1 then return 'paused' end
local now = now_ms()
local fair = optional and fair_state(KEYS[1]) -- groups: one id per group per round (docs/GROUPS.md)
-- Groups and/or limits take one job at a time (below): main and processing
-- are checked first, before limits_room's first write (its log trim and its
-- sweep of finished running sets), and before a group's turn may claim a job
-- ahead of main's turn touching main.
if lim or fair then expect_types(KEYS[1], 'list', KEYS[2], 'list') end
local room, wait = limits_room(lim, KEYS[3], count, now)
-- int_str: `..` formats a Lua number with '%.14g', so a wait of 1e14 ms or
-- more (a window that long is accepted) read 'limited:1e+14'.
if room == 0 and count > 0 then return 'limited:' .. int_str(wait) end
local entries = {}
if not lim and not fair then
  -- Move the batch first, then one EXISTS for all its completion records: a job
  -- already done is still skipped, without an EXISTS per job (issue #12).
  -- The batch moves with one LRANGE + LPUSH + LTRIM and its leases with one
  -- ZADD (all expire at the same time), not one LMOVE and ZADD per job.
  local ids, position = move_batch(KEYS[1], KEYS[2], count)
  local no_record = none_done(ARGV[2], ids)
  local leased, bytes = {}, 0
  for i, id in ipairs(ids) do
    local row = claim(id, KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2],
      lease_ms, ARGV[4] .. ':' .. int_str(i), now, ARGV[7], no_record, leased, position and position + i - 1)
    out[i] = row
    entries[i] = row_tag(row) .. ':' .. id
    if type(row) == 'string' then bytes = bytes + #row end
    if bytes >= REPLY_BYTES and i < #ids then
      give_back(KEYS[1], KEYS[2], ids, i + 1)
      break
    end
  end
  lease_batch_add(KEYS[3], leased, now + lease_ms)
else
  -- Groups and/or limits (docs/GROUPS.md, docs/LIMITS.md): one job at a time,
  -- in ring order; a job over its rate key's limit is deferred, until `room`
  -- jobs started (main and processing were checked above).
  local i, taken, bytes = 0, 0, 0
  while taken < room and i < room + LIMITS_MAX_DEFERRED and bytes < REPLY_BYTES do
    i = i + 1
    local id = next_waiting(KEYS[1], KEYS[2], fair)
    if not id then break end
    -- Just pushed at the head: its distance from the tail (claimed_row).
    local row = limits_claim(lim, KEYS[10], KEYS[11], id, KEYS[2], KEYS[3], KEYS[4], KEYS[5],
      ARGV[1], ARGV[2], lease_ms, ARGV[4] .. ':' .. int_str(i), now, ARGV[7],
      redis.call('LLEN', KEYS[2]) - 1)
    local tag = row_tag(row)
    if tag ~= 'deferred' then taken = taken + 1 end
    if tag == 'claimed' then bytes = bytes + #row end
    out[i] = row
    entries[i] = tag .. ':' .. id
  end
end
if #entries > 0 then
  call_chunked('RPUSH', KEYS[7], entries)
  redis.call('PEXPIRE', KEYS[7], int_str(math.max(receipt_ms, 1)))
end
return out

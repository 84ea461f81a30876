-- Success, for a batch of deliveries of one queue: for each (id, token) whose lease token still
-- matches (DESIGN rule 3: every token is checked), write the completion record, then drop the
-- job from processing; then, once per batch, from leases, and drop the hashes (variadic ZREM and
-- DEL). Counters once per batch, last.
-- KEYS: 1 processing, 2 leases, 3 stats, 4 guard (never written: see keys.rs)
-- ARGV: 1 job prefix, 2 done prefix, 3 steps prefix, 4 retention_ms (0: no record),
--       5 throughput key prefix (a per-minute counter `<prefix><minute>` that expires),
--       6 record format: 'hash' | 'compact' (one string, see `completion records` in the prelude),
--       7 the worker that claimed the deliveries (its name, as the claim wrote it into `worker`),
--       then per delivery: id, token, result reference ('' for none), and the delivery's
--       attempts, type, enqueued_at, delivered_at as its claim answered them, for the record
--       (attempts '': not known to the caller; these four and the worker are then read from the
--       job, as they are when a sent number is not a count), and its claim row's `far`
--       ('1': claimed far from the tail of processing; '' not, or not known: a hint for
--       finding it in processing, unlist_delivery in the prelude)
-- The record's delivery fields come from the caller instead of the job hash: the token check
-- proves the delivery is the one claimed, and none of them changes while it runs. Reading
-- them cost a field read each, ~9% of this script per job (issue #12).
-- Returns one code per delivery, in order, as one string of digits (one reply value per call
-- instead of one per job: each costs Redis a reply value and the worker a parse, issue #12):
-- 1 acked now; 2 already acked by this same token (a retried call whose first reply was lost:
-- the completion record carries the token); 0 lease lost; 3 the job hash is unreadable (wrong
-- type): nothing written for it; 4 acked now, and the job's batch is on another queue (a relay
-- notice was written).
-- A count of at most 2^53 - 1 (arg_count): a larger one would fail PEXPIRE
-- or SET PX after the record was written (callers clamp to it).
local retention = arg_count(ARGV[4], 'retention_ms')
local retention_str = int_str(retention)
local compact = ARGV[6] == 'compact'
if not compact and ARGV[6] ~= 'hash' then
  return redis.error_reply('ack: the record format must be hash or compact, got ' .. tostring(ARGV[6]))
end
if (#ARGV - 7) % 8 ~= 0 then
  return redis.error_reply('ack: the deliveries must be (id, token, result, attempts, type, enqueued_at, '
    .. 'delivered_at, far) groups of 8')
end
-- Read and check every delivery (and the types of the lists the ack edits)
-- before the first write. `h`: token, state, batch, hist, notify, then, for a
-- delivery whose record fields are read from the job (`from_job`: the caller
-- sent none, or sent numbers that are not counts), attempts, type,
-- enqueued_at, delivered_at, worker. A sent number must be digits; each
-- distinct one is checked once (`counted`): the deliveries of one fetch share
-- delivered_at, the jobs of one enqueue call enqueued_at (a pattern match is
-- cheaper than `as_count`'s strtod, and the three checks written out cheaper
-- than a loop: 7.8% against 6.1% of an ack, issue #12).
expect_types(KEYS[1], 'list', KEYS[2], 'zset')
local fields, from_job, counted = {}, {}, {}
for i = 8, #ARGV, 8 do
  local sent = ARGV[i + 3] ~= ''
  if sent then
    local x = ARGV[i + 3]
    if not counted[x] then if string.find(x, '^%d+$') then counted[x] = true else sent = false end end
    x = ARGV[i + 5]
    if not counted[x] then if string.find(x, '^%d+$') then counted[x] = true else sent = false end end
    x = ARGV[i + 6]
    if not counted[x] then if string.find(x, '^%d+$') then counted[x] = true else sent = false end end
  end
  local h
  if sent then
    h = redis.pcall('HMGET', ARGV[1] .. ARGV[i], 'token', 'state', 'batch', 'hist', 'notify')
  else
    h = redis.pcall('HMGET', ARGV[1] .. ARGV[i], 'token', 'state', 'batch', 'hist', 'notify', 'attempts', 'type',
      'enqueued_at', 'delivered_at', 'worker')
    from_job[#fields + 1] = true
  end
  if h['err'] then
    fields[#fields + 1] = false
  elseif h[2] == 'active' and h[1] == ARGV[i + 1] then
    fields[#fields + 1] = h
  else
    fields[#fields + 1] = 0
  end
end

-- One clock read per batch, as an integer string (no float formatting).
local t = redis.call('TIME')
local now = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
local out = {}
local acked = {}
local found -- the end of processing that held the last far delivery
for n, h in ipairs(fields) do
  local i = 8 * n
  local id, token, result = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if h == false then
    out[n] = '3'
  elseif h == 0 then
    if retention > 0 and record_field(ARGV[2] .. id, 'token') == token then
      out[n] = '2'
    else
      out[n] = '0'
    end
  else
    local attempts, jtype, enqueued_at, delivered_at, worker
    if from_job[n] then
      attempts, jtype, enqueued_at, delivered_at, worker = h[6] or '0', h[7] or '', h[8] or '0', h[9] or '0', h[10] or ''
      -- A count the job holds that is not one (corrupt data) is recorded as
      -- 0: packed as is, the compact record did not parse and read as
      -- `status done` alone (its result and token lost with it).
      if not string.find(attempts, '^%d+$') then attempts = '0' end
      if not string.find(enqueued_at, '^%d+$') then enqueued_at = '0' end
      if not string.find(delivered_at, '^%d+$') then delivered_at = '0' end
    else
      attempts, jtype, enqueued_at, delivered_at, worker = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[7]
    end
    if retention > 0 then
      local done = ARGV[2] .. id
      local written
      if compact then
        redis.call('SET', done, record_pack(now, attempts, enqueued_at, delivered_at, token, jtype,
          worker, result), 'PX', retention_str)
      elseif result ~= '' then
        written = redis.pcall('HSET', done, 'status', 'done', 'finished_at', now, 'attempts', attempts,
          'type', jtype, 'enqueued_at', enqueued_at, 'token', token, 'result', result,
          'delivered_at', delivered_at, 'worker', worker)
      else
        written = redis.pcall('HSET', done, 'status', 'done', 'finished_at', now, 'attempts', attempts,
          'type', jtype, 'enqueued_at', enqueued_at, 'token', token,
          'delivered_at', delivered_at, 'worker', worker)
      end
      if type(written) == 'table' then
        -- The record key held another type: corrupt data (a live delivery has
        -- no record; the claim checked). Replaced by the compact form, which
        -- every reader of this version reads, instead of failing the batch
        -- half-way (the deliveries after this one would run again).
        record_replace(done, record_pack(now, attempts, enqueued_at, delivered_at, token, jtype,
          worker, result), retention_str)
      elseif written then
        redis.call('PEXPIRE', done, retention_str)
      end
    end
    -- With or without a record (retention 0): a waiter re-checks and finds
    -- the record, or nothing (NotFound). The job hash, whose `notify`
    -- results_wake reads, is deleted after this loop.
    if h[5] then results_wake(ARGV[2] .. id) end
    -- Acks come for old deliveries, near the tail (fetches push at the head):
    -- from the tail, O(1) for them instead of O(jobs in flight); from the head
    -- when it was claimed far from the tail and longer deliveries stay there.
    -- (The usual near one without the function call: 1.3% of an ack.)
    if ARGV[i + 7] == '' then
      redis.call('LREM', KEYS[1], '-1', id)
    else
      found = unlist_delivery(KEYS[1], id, ARGV[i + 7], found)
    end
    acked[#acked + 1] = id
    if h[4] then hist_close(KEYS[3], id, retention) end
    ev(KEYS[3], 'completed', id, now, 'attempt', attempts)
    out[n] = '1'
    if h[3] and wf_member_finished(h[3], id, 'succeeded', result, now, KEYS[3]) then out[n] = '4' end
  end
end

-- The rest of the removal once per batch (variadic ZREM and DEL, chunked to
-- stay far below Lua's unpack limit): per-job calls are the cost (issue #12).
if #acked > 0 then
  for first = 1, #acked, 500 do
    local last = math.min(first + 499, #acked)
    local ids, jobs, steps = {}, {}, {}
    for j = first, last do
      ids[#ids + 1] = acked[j]
      jobs[#jobs + 1] = ARGV[1] .. acked[j]
      steps[#steps + 1] = ARGV[3] .. acked[j]
    end
    redis.call('ZREM', KEYS[2], unpack(ids))
    if retention > 0 then
      -- Step results expire with the record; most handlers keep none, so one
      -- EXISTS for the batch usually saves a PEXPIRE per job.
      if redis.call('EXISTS', unpack(steps)) > 0 then
        for _, s in ipairs(steps) do redis.call('PEXPIRE', s, retention_str) end
      end
      redis.call('DEL', unpack(jobs))
    else
      for _, s in ipairs(steps) do jobs[#jobs + 1] = s end
      redis.call('DEL', unpack(jobs))
    end
  end
  -- Counters last, and never an error (pcall): the jobs are acked.
  bump(KEYS[3], 'completed', #acked)
  local minute_key = ARGV[5] .. int_str(math.floor(tonumber(t[1]) / 60))
  if redis.pcall('INCRBY', minute_key, int_str(#acked)) == #acked then redis.pcall('PEXPIRE', minute_key, '180000') end
end
return table.concat(out)

-- Success, for a batch of deliveries of one queue: for each (id, token) whose lease token still
-- matches (DESIGN rule 3: every token is checked), write the completion record, then drop the
-- job from processing; then, once per batch, from leases, and drop the hashes (variadic ZREM and
-- DEL). Counters once per batch, last.
-- KEYS: 1 processing, 2 leases, 3 stats, 4 guard (never written: see keys.rs)
-- ARGV: 1 job prefix, 2 done prefix, 3 steps prefix, 4 retention_ms (0: no record),
--       5 throughput key prefix (a per-minute counter `<prefix><minute>` that expires),
--       6 record format: 'hash' | 'compact' (one string, see `completion records` in the prelude)
--       then per delivery: id, token, result reference ('' for none)
-- Returns one code per delivery, in order: 1 acked now; 2 already acked by this same token (a
-- retried call whose first reply was lost: the completion record carries the token); 0 lease
-- lost; 3 the job hash is unreadable (wrong type): nothing written for it.
local retention = tonumber(ARGV[4])
if not retention or retention < 0 or retention ~= math.floor(retention) then
  return redis.error_reply('ack: retention_ms must be a non-negative integer, got ' .. tostring(ARGV[4]))
end
local retention_str = int_str(retention)
local compact = ARGV[6] == 'compact'
if not compact and ARGV[6] ~= 'hash' then
  return redis.error_reply('ack: the record format must be hash or compact, got ' .. tostring(ARGV[6]))
end
if (#ARGV - 6) % 3 ~= 0 then
  return redis.error_reply('ack: the deliveries must be (id, token, result) triples')
end

-- Read and check every delivery (and the types of the lists the ack edits)
-- before the first write.
expect_types(KEYS[1], 'list', KEYS[2], 'zset')
local fields = {}
for i = 7, #ARGV, 3 do
  local h = redis.pcall('HMGET', ARGV[1] .. ARGV[i], 'token', 'state', 'attempts', 'type', 'enqueued_at',
    'batch', 'delivered_at', 'worker', 'hist', 'notify')
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
for n, h in ipairs(fields) do
  local i = 4 + 3 * n
  local id, token, result = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if h == false then
    out[n] = 3
  elseif h == 0 then
    if retention > 0 and record_field(ARGV[2] .. id, 'token') == token then
      out[n] = 2
    else
      out[n] = 0
    end
  else
    if retention > 0 then
      local done = ARGV[2] .. id
      local written
      if compact then
        redis.call('SET', done, record_pack(now, h[3] or '0', h[5] or '0', h[7] or '0', token, h[4] or '',
          h[8] or '', result), 'PX', retention_str)
      elseif result ~= '' then
        written = redis.pcall('HSET', done, 'status', 'done', 'finished_at', now, 'attempts', h[3] or '0',
          'type', h[4] or '', 'enqueued_at', h[5] or '0', 'token', token, 'result', result,
          'delivered_at', h[7] or '0', 'worker', h[8] or '')
      else
        written = redis.pcall('HSET', done, 'status', 'done', 'finished_at', now, 'attempts', h[3] or '0',
          'type', h[4] or '', 'enqueued_at', h[5] or '0', 'token', token,
          'delivered_at', h[7] or '0', 'worker', h[8] or '')
      end
      if type(written) == 'table' then
        -- The record key held another type: corrupt data (a live delivery has
        -- no record; the claim checked). Replaced by the compact form, which
        -- every reader of this version reads, instead of failing the batch
        -- half-way (the deliveries after this one would run again).
        record_replace(done, record_pack(now, h[3] or '0', h[5] or '0', h[7] or '0', token, h[4] or '',
          h[8] or '', result), retention_str)
      elseif written then
        redis.call('PEXPIRE', done, retention_str)
      end
      if h[10] then results_wake(done) end
    end
    -- Acks come for old deliveries, near the tail (fetches push at the head):
    -- LREM from the tail (-1) is O(1) for them instead of O(jobs in flight).
    redis.call('LREM', KEYS[1], '-1', id)
    acked[#acked + 1] = id
    if h[9] then hist_close(KEYS[3], id, retention) end
    ev(KEYS[3], 'completed', id, now, 'attempt', h[3] or '0')
    out[n] = 1
    if h[6] and wf_member_finished(h[6], id, 'succeeded', result, now, KEYS[3]) then out[n] = 4 end
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
return out

-- KEYS: 1 main, 2 delayed, 3 stats, 4 promoter wake list, 5 guard (OPTIONAL, never read
--       or written: declared, it keeps the script from running on a migrating cluster
--       slot, where the job hashes and group lists it reaches undeclared may have moved;
--       see keys.rs)
-- ARGV: 1 job hash prefix, 2 completion record prefix, 3 once-marker prefix,
--       4 mode: 'all' refuses the whole call (an error reply, nothing written) when one
--       job is invalid (but for a fresh id whose job key holds another type, corrupt
--       data: answered {'invalid', reason} alone, see below); 'each' answers
--       {'invalid', reason} for that job and writes the others;
--       'all:int' and 'each:int' the same, but a job written now answers its run_at as a
--       bare integer instead of {'new', run_at} (what Queue sends: a table in a script's
--       reply costs Redis ~4k instructions to send, 7% of this script per job, issue #12)
-- then per job, repeated: id, type, schema version (a decimal integer 0..4294967295, else
-- the job is invalid), payload, max_attempts, delay_ms,
-- run_at_ms (absolute, Redis clock; 0: use the delay), once-marker ttl_ms (0: none),
-- enqueue token ('' none), fresh ('1': a generated id, which cannot exist, so the
-- dedupe reads are skipped; a retry sends '0'; one whose job key holds another type,
-- corrupt data, is refused as an invalid job is, nothing of it written), n, then n
-- extra field name, value pairs.
-- Returns one reply per job, in order: {'new', run_at} (run_at alone in the ':int'
-- modes) | {'exists', state} | {'done'} | {'invalid', reason}, each as enqueue.lua
-- answers for one job (same checks: enqueue token, once-marker, completion record,
-- job hash).
-- The multi-job form of enqueue.lua (Queue's batches and group commit): every job
-- is parsed and validated before the first write; one TIME and one stats HINCRBY
-- per call. Jobs are written in order, so a second job of the call with an id
-- already written by the call answers 'exists'.
local mode = ARGV[4]
local int_reply = mode == 'all:int' or mode == 'each:int'
if int_reply then mode = string.sub(mode, 1, -5) end
if mode ~= 'all' and mode ~= 'each' then
  return redis.error_reply('ERR invalid argument mode: ' .. tostring(ARGV[4]))
end
-- The reply of a job written (or, on a retry, found written by this call's token).
local function new_reply(run_at)
  if int_reply then return run_at end
  return {'new', run_at}
end

-- Parse and validate every job before anything is read or written. A job is
-- kept as the index of its first argument (`starts`), read again from ARGV
-- when it is written: no table per job (issue #12). `invalid[k]`: why job k
-- is refused (mode 'each'), nil when it is valid.
local starts, invalid = {}, {}
-- Whether some job has a stable id (not fresh: its keys are read below), and
-- the jobs with a `group` extra field (their lists' types are read below; nil
-- when none: no table for the usual call). Nothing else is added per job: the
-- usual job (fresh, no extra field) pays one comparison for these checks.
local stable, grouped = false, nil
local i = 5
while i <= #ARGV do
  local n = ARGV[i + 10] and as_count(ARGV[i + 10])
  if not n or i + 10 + 2 * n > #ARGV then
    return redis.error_reply('ERR invalid argument job ' .. (#starts + 1) .. ': truncated')
  end
  local bad
  if ARGV[i] == '' then bad = 'empty id' end
  if not (as_count(ARGV[i + 4]) and as_count(ARGV[i + 5]) and as_count(ARGV[i + 6]) and as_count(ARGV[i + 7])) then
    bad = 'max_attempts, delay_ms, run_at_ms and once ttl_ms must be counts'
  end
  -- The schema version is stored unread, and read by every claim of the job.
  if not is_version(ARGV[i + 2]) then
    bad = 'schema version: ' .. utf8_cut(ARGV[i + 2], 64) .. ' is not an integer 0..4294967295'
  end
  -- A name given twice is refused, as enqueue.lua does (a second `group`
  -- would route the job by the first and record the last); the names seen
  -- are kept only for a job with more than one extra field.
  local seen = n > 1 and {} or nil
  for k = i + 11, i + 10 + 2 * n, 2 do
    if CORE_JOB_FIELDS[ARGV[k]] or ARGV[k] == '' then
      bad = 'extra field name: ' .. ARGV[k] .. ' is empty or a core job field'
    elseif seen and seen[ARGV[k]] then
      bad = 'extra field name: ' .. ARGV[k] .. ' given twice'
    elseif COUNT_EXTRA_FIELDS[ARGV[k]] and not as_count(ARGV[k + 1]) then
      bad = 'extra field ' .. ARGV[k] .. ': ' .. utf8_cut(ARGV[k + 1], 64) .. ' is not a non-negative integer'
    elseif ARGV[k] == 'group' then
      grouped = grouped or {}
      grouped[#grouped + 1] = #starts + 1
    end
    if seen then seen[ARGV[k]] = true end
  end
  if bad and mode == 'all' then
    return redis.error_reply('ERR invalid argument job ' .. ARGV[i] .. ': ' .. bad)
  end
  starts[#starts + 1] = i
  invalid[#starts] = bad
  if ARGV[i + 9] ~= '1' then stable = true end
  i = i + 11 + 2 * n
end

-- Main and delayed are written below: of another type, the call is refused
-- now, before any write (not half-way, after some jobs' hashes). Below, the
-- job keys of stable ids and the group lists are read, still before any write:
-- after this, no write of the call can raise.
expect_types(KEYS[1], 'list', KEYS[2], 'zset')
local now = now_ms()
local now_s = int_str(now)

-- A job with a stable id (not fresh): whether its job hash or completion
-- record exists, or an earlier job of the call has its id (`was_known[i]`, by
-- the index of its first argument), read now, before the first write: write()
-- then reads the job's keys when this says so, as the EXISTS at its turn did
-- before. A job key of another type (corrupt data) refuses that job here, not
-- half-way through the writes (its HMGET / HGET in write() raised after the
-- earlier jobs' hashes were written, before their LPUSH). A job refused here
-- is refused as the parse above refuses one: the call in mode 'all' (nothing
-- is written yet), {'invalid', reason} for that job in mode 'each'. No read
-- and no table when every id is fresh.
local was_known
if stable then
  was_known = {}
  local earlier = {}
  for k, i in ipairs(starts) do
    local id = ARGV[i]
    if not invalid[k] and ARGV[i + 9] ~= '1' then
      local jobkey = ARGV[1] .. id
      local present = redis.call('EXISTS', jobkey, ARGV[2] .. id)
      if present > 0 then
        was_known[i] = true
        local t = redis.call('TYPE', jobkey)['ok']
        local why
        if t ~= 'hash' and t ~= 'none' then
          why = 'corrupt job key: holds a ' .. t .. ', not a hash'
        elseif t == 'none' or present == 2 then
          -- The record key exists (the EXISTS counted it): a third type is
          -- not a record.
          why = record_type_bad(ARGV[2] .. id)
        end
        if why then
          if mode == 'all' then
            return redis.error_reply('ERR invalid argument job ' .. id .. ': ' .. why)
          end
          invalid[k] = why
        end
      elseif earlier[id] then
        was_known[i] = true
      end
    end
    earlier[id] = true
  end
end

-- A fresh (generated) id is not read: its key cannot exist. Corrupt data (a
-- string written at that job key) makes its HSET raise; write() sends it
-- through pcall and refuses that job alone, undoing its own once-marker, in
-- either mode: {'invalid', reason} for it, the other jobs of the call written
-- whole (in mode 'all' too, where a job refused by the checks above refuses
-- the call: only this one, found by its first write, cannot be; a call of
-- one job, a group commit's job sent alone, answers an error reply). Before,
-- the HSET raised after the earlier jobs' hashes were written and before the
-- LPUSH of the call: they were in no list, and a retry answered 'new' for
-- them. A check of every fresh key before the writes cost 7% of the script
-- at 64 jobs a call (callgrind) for data nobody can have written there.

-- A grouped job due now goes to its group list (push_waiting): that list and
-- the ring are checked now, once per group; of another type, the job is
-- refused, as above (mode 'each': the other jobs of the call are written).
if grouped then
  local checked = {}
  for _, k in ipairs(grouped) do
    local i = starts[k]
    local g
    if not invalid[k] then
      for f = i + 11, i + 10 + 2 * as_count(ARGV[i + 10]), 2 do
        if ARGV[f] == 'group' then
          g = group_of(ARGV[f + 1]) -- the first `group` pair, as extra_group reads it
          break
        end
      end
    end
    if g then
      local delay, run_at = as_count(ARGV[i + 5]), as_count(ARGV[i + 6])
      if run_at > 0 then delay = math.max(run_at - now, 0) end
      if delay == 0 then
        local why = checked[g]
        if why == nil then
          local bad = waiting_types_bad(KEYS[1], g)
          why = bad and wrongtype_refusal(bad) or false
          checked[g] = why
        end
        if why then
          if mode == 'all' then
            return redis.error_reply('ERR invalid argument job ' .. ARGV[i] .. ': ' .. why)
          end
          invalid[k] = why
        end
      end
    end
  end
end
local created = 0
-- Ids for main, pushed with one LPUSH per call after the loop (in job order,
-- as one LPUSH each would): the per-job LPUSH was a redis.call per job.
local to_main = {}
local wake = false
-- The head of `delayed` (read once, before the first ZADD of the call): a
-- delayed job due sooner than it wakes the promoter, as in sooner_than_head.
local head
-- The reply of every job that waits from now on: one value for all of them.
local new_now = new_reply(now)

-- A job whose HSET raised (its job key holds another type: a fresh id is not
-- checked before, see above) is refused by the prelude's fresh_key_refused
-- (defined there once: a closure made here by each call cost 1.3% of a
-- one-job call, callgrind); `refusal` is its error reply for a call of one
-- job in mode 'all', which the call answers instead.
local refusal

-- Writes the job whose arguments start at ARGV[i]. Its HSET is the job's first
-- write but its once-marker, and goes through pcall (fresh_key_refused).
local function write(i)
  local id, jtype, token = ARGV[i], ARGV[i + 1], ARGV[i + 8]
  local jobkey = ARGV[1] .. id
  local n = as_count(ARGV[i + 10])
  local delay, run_at, once = as_count(ARGV[i + 5]), as_count(ARGV[i + 6]), as_count(ARGV[i + 7])
  if run_at > 0 then delay = math.max(run_at - now, 0) end
  -- The run time at most 2^53 - 1, as enqueue.lua caps it (compared, not
  -- math.min: no call for the usual job, due now).
  if delay > 9007199254740991 - now then delay = 9007199254740991 - now end
  local max_attempts = int_str(math.max(as_count(ARGV[i + 4]), 1))
  -- A generated id sent for the first time (fresh) cannot exist: no reads.
  -- Otherwise what the validation pass read.
  local donekey
  local known = false
  if ARGV[i + 9] ~= '1' then
    donekey = ARGV[2] .. id
    known = was_known[i] or false
  end
  if known and token ~= '' then
    local own = redis.call('HMGET', jobkey, 'enq_token', 'run_at', 'enqueued_at')
    if own[1] == token then
      return new_reply(tonumber(own[2] or own[3]) or 0)
    end
  end
  if once > 0 then
    if not redis.call('SET', ARGV[3] .. id, '1', 'NX', 'PX', int_str(once)) then
      return {'exists', 'scheduled'}
    end
  end
  if known and redis.call('EXISTS', donekey) == 1 then
    return {'done'}
  end
  if known and redis.call('EXISTS', jobkey) == 1 then
    return {'exists', redis.call('HGET', jobkey, 'state') or ''}
  end
  if delay == 0 and n == 0 then
    -- The usual job: due now, no extra field (no table for its fields); the
    -- Queue's group commit sends an enqueue token with each.
    local r
    if token ~= '' then
      r = redis.pcall('HSET', jobkey, 'id', id, 'type', jtype, 'v', ARGV[i + 2], 'payload', ARGV[i + 3],
        'max_attempts', max_attempts, 'attempts', '0', 'enqueued_at', now_s, 'state', 'queued',
        'enq_token', token)
    else
      r = redis.pcall('HSET', jobkey, 'id', id, 'type', jtype, 'v', ARGV[i + 2], 'payload', ARGV[i + 3],
        'max_attempts', max_attempts, 'attempts', '0', 'enqueued_at', now_s, 'state', 'queued')
    end
    -- A new hash answers its field count (9 with the token, 8 without):
    -- anything else is looked at (type() per job cost 1.3%, callgrind).
    if r ~= 9 and r ~= 8 and type(r) == 'table' then
      local reply
      reply, refusal = fresh_key_refused(ARGV[3], id, jobkey, once, mode == 'all' and #starts == 1)
      return reply
    end
    created = created + 1
    to_main[#to_main + 1] = id
    ev(KEYS[3], 'enqueued', id, now, 'type', jtype, 'run_at', now)
    return new_now
  end
  local fields = {'id', id, 'type', jtype, 'v', ARGV[i + 2], 'payload', ARGV[i + 3],
    'max_attempts', max_attempts, 'attempts', '0', 'enqueued_at', now_s,
    'state', delay > 0 and 'delayed' or 'queued'}
  if token ~= '' then
    fields[#fields + 1] = 'enq_token'
    fields[#fields + 1] = token
  end
  if delay > 0 then
    fields[#fields + 1] = 'run_at'
    fields[#fields + 1] = int_str(now + delay)
  end
  local extra = {}
  for k = i + 11, i + 10 + 2 * n do
    extra[#extra + 1] = ARGV[k]
    fields[#fields + 1] = ARGV[k]
  end
  if delay > 0 and head == nil then
    local h = redis.call('ZRANGE', KEYS[2], '0', '0', 'WITHSCORES')
    head = tonumber(h[2]) or math.huge
  end
  -- The first 1,000 values through pcall (the key is then a hash: the
  -- chunks after it cannot raise), as call_chunked sends them.
  local nf = #fields
  if type(redis.pcall('HSET', jobkey, unpack(fields, 1, math.min(nf, 1000)))) == 'table' then
    local reply
    reply, refusal = fresh_key_refused(ARGV[3], id, jobkey, once, mode == 'all' and #starts == 1)
    return reply
  end
  for first = 1001, nf, 1000 do
    redis.call('HSET', jobkey, unpack(fields, first, math.min(first + 999, nf)))
  end
  created = created + 1
  if delay > 0 then
    if now + delay < head then
      wake = true
      head = now + delay
    end
    redis.call('ZADD', KEYS[2], int_str(now + delay), id)
  else
    local group = extra_group(extra)
    if group then
      push_waiting(KEYS[1], id, group) -- a `group` extra field: its group list
    else
      to_main[#to_main + 1] = id
    end
  end
  ev(KEYS[3], 'enqueued', id, now, 'type', jtype, 'run_at', now + delay)
  return new_reply(now + delay)
end

local out = {}
for k, start in ipairs(starts) do
  if invalid[k] then out[k] = {'invalid', invalid[k]} else out[k] = write(start) end
  -- fresh_key_refused's error reply (mode 'all', a call of one job).
  if refusal then return refusal end
end
call_chunked('LPUSH', KEYS[1], to_main)
if created > 0 then bump(KEYS[3], 'enqueued', created) end
if wake then wake_promoter(KEYS[4]) end
return out

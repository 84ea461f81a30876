-- KEYS: 1 main, 2 delayed, 3 stats, 4 promoter wake list
-- ARGV: 1 job hash prefix, 2 completion record prefix, 3 once-marker prefix,
--       4 mode: 'all' refuses the whole call (an error reply, nothing written) when one
--       job is invalid; 'each' answers {'invalid', reason} for that job and writes the others
-- then per job, repeated: id, type, schema version, payload, max_attempts, delay_ms,
-- run_at_ms (absolute, Redis clock; 0: use the delay), once-marker ttl_ms (0: none),
-- enqueue token ('' none), fresh ('1': a generated id, which cannot exist, so the
-- dedupe reads are skipped; a retry sends '0'), n, then n extra field name, value pairs.
-- Returns one reply per job, in order: {'new', run_at} | {'exists', state} | {'done'}
-- | {'invalid', reason}, each as enqueue.lua answers for one job (same checks:
-- enqueue token, once-marker, completion record, job hash).
-- The multi-job form of enqueue.lua (Queue's batches and group commit): every job
-- is parsed and validated before the first write; one TIME and one stats HINCRBY
-- per call. Jobs are written in order, so a second job of the call with an id
-- already written by the call answers 'exists'.
local CORE_JOB_FIELDS = {}
for _, f in ipairs({'id', 'type', 'v', 'payload', 'max_attempts', 'attempts', 'enqueued_at',
  'state', 'delivered_at', 'token', 'lease_until', 'fence', 'last_error', 'failed_at',
  'failed_token', 'run_at', 'dead_reason', 'dead_at', 'replayed_at', 'enq_token', 'worker',
  'cancel_requested'}) do CORE_JOB_FIELDS[f] = true end
local mode = ARGV[4]
if mode ~= 'all' and mode ~= 'each' then
  return redis.error_reply('ERR invalid argument mode: ' .. tostring(mode))
end

-- Parse and validate every job before anything is read or written.
local jobs = {}
local i = 5
while i <= #ARGV do
  local n = ARGV[i + 10] and as_count(ARGV[i + 10])
  if not n or i + 10 + 2 * n > #ARGV then
    return redis.error_reply('ERR invalid argument job ' .. (#jobs + 1) .. ': truncated')
  end
  local j = {id = ARGV[i], type = ARGV[i + 1], v = ARGV[i + 2], payload = ARGV[i + 3],
    max = as_count(ARGV[i + 4]), delay = as_count(ARGV[i + 5]), run_at = as_count(ARGV[i + 6]),
    once = as_count(ARGV[i + 7]), token = ARGV[i + 8], fresh = ARGV[i + 9] == '1', extra = {}}
  if j.id == '' then j.invalid = 'empty id' end
  if not (j.max and j.delay and j.run_at and j.once) then
    j.invalid = 'max_attempts, delay_ms, run_at_ms and once ttl_ms must be counts'
  end
  for k = i + 11, i + 10 + 2 * n, 2 do
    if CORE_JOB_FIELDS[ARGV[k]] or ARGV[k] == '' then
      j.invalid = 'extra field name: ' .. ARGV[k] .. ' is empty or a core job field'
    end
    j.extra[#j.extra + 1] = ARGV[k]
    j.extra[#j.extra + 1] = ARGV[k + 1]
  end
  if j.invalid and mode == 'all' then
    return redis.error_reply('ERR invalid argument job ' .. j.id .. ': ' .. j.invalid)
  end
  jobs[#jobs + 1] = j
  i = i + 11 + 2 * n
end

-- Main and delayed are written below: of another type, the call is refused
-- now, before any write (not half-way, after some jobs' hashes).
expect_types(KEYS[1], 'list', KEYS[2], 'zset')
local now = now_ms()
local now_s = int_str(now)
local created = 0
-- Ids for main, pushed with one LPUSH per call after the loop (in job order,
-- as one LPUSH each would): the per-job LPUSH was a redis.call per job.
local to_main = {}
local wake = false
-- The head of `delayed` (read once, before the first ZADD of the call): a
-- delayed job due sooner than it wakes the promoter, as in sooner_than_head.
local head

local function write(j)
  local jobkey, donekey = ARGV[1] .. j.id, ARGV[2] .. j.id
  -- One EXISTS for the job hash and the completion record, none for a fresh id.
  local known = not j.fresh and redis.call('EXISTS', jobkey, donekey) > 0
  if known and j.token ~= '' then
    local own = redis.call('HMGET', jobkey, 'enq_token', 'run_at', 'enqueued_at')
    if own[1] == j.token then
      return {'new', tonumber(own[2] or own[3]) or 0}
    end
  end
  if j.once > 0 then
    if not redis.call('SET', ARGV[3] .. j.id, '1', 'NX', 'PX', int_str(j.once)) then
      return {'exists', 'scheduled'}
    end
  end
  if known and redis.call('EXISTS', donekey) == 1 then
    return {'done'}
  end
  if known and redis.call('EXISTS', jobkey) == 1 then
    return {'exists', redis.call('HGET', jobkey, 'state') or ''}
  end
  local delay = j.delay
  if j.run_at > 0 then delay = math.max(j.run_at - now, 0) end
  local state = 'queued'
  if delay > 0 then state = 'delayed' end
  local fields = {'id', j.id, 'type', j.type, 'v', j.v, 'payload', j.payload,
    'max_attempts', int_str(math.max(j.max, 1)), 'attempts', '0', 'enqueued_at', now_s, 'state', state}
  if j.token ~= '' then
    fields[#fields + 1] = 'enq_token'
    fields[#fields + 1] = j.token
  end
  if delay > 0 then
    fields[#fields + 1] = 'run_at'
    fields[#fields + 1] = int_str(now + delay)
  end
  for _, v in ipairs(j.extra) do fields[#fields + 1] = v end
  if delay > 0 and head == nil then
    local h = redis.call('ZRANGE', KEYS[2], '0', '0', 'WITHSCORES')
    head = tonumber(h[2]) or math.huge
  end
  redis.call('HSET', jobkey, unpack(fields))
  if delay > 0 then
    if now + delay < head then
      wake = true
      head = now + delay
    end
    redis.call('ZADD', KEYS[2], int_str(now + delay), j.id)
  else
    local group = extra_group(j.extra)
    if group then
      push_waiting(KEYS[1], j.id, group) -- a `group` extra field: its group list
    else
      to_main[#to_main + 1] = j.id
    end
  end
  created = created + 1
  ev(KEYS[3], 'enqueued', j.id, now, 'type', j.type, 'run_at', now + delay)
  return {'new', now + delay}
end

local out = {}
for k, j in ipairs(jobs) do
  if j.invalid then out[k] = {'invalid', j.invalid} else out[k] = write(j) end
end
for first = 1, #to_main, 500 do
  redis.call('LPUSH', KEYS[1], unpack(to_main, first, math.min(first + 499, #to_main)))
end
if created > 0 then redis.call('HINCRBY', KEYS[3], 'enqueued', int_str(created)) end
if wake then wake_promoter(KEYS[4]) end
return out

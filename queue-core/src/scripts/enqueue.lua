-- KEYS: 1 main, 2 job hash, 3 completion record, 4 delayed, 5 stats, 6 once-marker,
--       7 promoter wake list (OPTIONAL, below),
--       8 guard (OPTIONAL, below; never read or written)
-- Without the wake list a delayed job waits for the promoter's bounded sleep instead
-- of waking it. The guard `q:{Q}:guard` (see keys.rs) is only declared: it keeps the
-- script from running on a migrating cluster slot, where the group list and event
-- stream it reaches undeclared may have moved (docs/SCALE-OUT.md, "Live resharding").
-- ARGV: 1 id, 2 type, 3 schema version, 4 payload, 5 max_attempts, 6 delay_ms,
--       7 run_at_ms (absolute, Redis clock; 0: use the delay), 8 once-marker ttl_ms (0: none),
--       9 enqueue token (OPTIONAL: producers that send 8 arguments keep working),
--       10.. extra job fields as name, value pairs (OPTIONAL: features such as
--       deadlines, groups and trace context store their enqueue options on the job
--       hash this way; a name of a core field, or a name given twice, or a value
--       of `expires_at` / `expires_after` that is not a count, is refused before
--       any write)
-- ARGV 6-8 are non-negative integers, ARGV 3 a decimal integer 0..4294967295 (is_version):
-- anything else refuses the call before any write.
-- Returns {'new', run_at} | {'exists', state} | {'done'}
-- The once-marker makes an id enqueueable once per marker lifetime even after
-- its completion record is gone (periodic jobs fire once per period).
-- The enqueue token is unique per enqueue call and stored on the job
-- (`enq_token`): a retry of a call whose reply was lost finds its own token
-- and answers 'new' again, while any other call with the same id still gets
-- 'exists'.
local enq_token = ARGV[9] or ''
-- Numbers first: a max_attempts, delay, run time or marker ttl that is not a
-- count refuses the call before anything is read or written (a max_attempts
-- below 1 is stored as 1, as enqueue_many does).
local max_attempts = int_str(math.max(arg_count(ARGV[5], 'max_attempts'), 1))
local delay = arg_count(ARGV[6], 'delay_ms')
local run_at = arg_count(ARGV[7], 'run_at_ms')
local once = arg_count(ARGV[8], 'once ttl_ms')
-- The schema version, stored unread here and read by every claim of the job.
if not is_version(ARGV[3]) then
  return redis.error_reply('ERR invalid argument schema version: ' .. utf8_cut(tostring(ARGV[3]), 64)
    .. ' is not an integer 0..4294967295')
end
-- Extra fields: validated before anything is read or written. The names the
-- core scripts own are refused.
local extra = {}
if #ARGV > 9 then
  if (#ARGV - 9) % 2 ~= 0 then
    return redis.error_reply('ERR invalid argument extra fields: name, value pairs expected')
  end
  -- A name given twice is refused: the job would wait in the first `group`
  -- pair's list (extra_group) while its hash records the last one.
  local seen = {}
  for i = 10, #ARGV, 2 do
    if CORE_JOB_FIELDS[ARGV[i]] or ARGV[i] == '' then
      return redis.error_reply('ERR invalid argument extra field name: ' .. ARGV[i]
        .. ' is empty or a core job field')
    end
    if seen[ARGV[i]] then
      return redis.error_reply('ERR invalid argument extra field name: ' .. ARGV[i]
        .. ' given twice')
    end
    if COUNT_EXTRA_FIELDS[ARGV[i]] and not as_count(ARGV[i + 1]) then
      return redis.error_reply('ERR invalid argument extra field ' .. ARGV[i] .. ': '
        .. utf8_cut(ARGV[i + 1], 64) .. ' is not a non-negative integer')
    end
    seen[ARGV[i]] = true
    extra[#extra + 1] = ARGV[i]
    extra[#extra + 1] = ARGV[i + 1]
  end
end
-- One EXISTS for the job hash and the completion record: a new id (the usual
-- case) needs no other read; the checks below run only when one exists.
local known = redis.call('EXISTS', KEYS[2], KEYS[3]) > 0
if known and enq_token ~= '' then
  local own = redis.call('HMGET', KEYS[2], 'enq_token', 'run_at', 'enqueued_at')
  if own[1] == enq_token then
    return {'new', tonumber(own[2] or own[3]) or 0}
  end
end
-- The answer for an id that exists, read before the once-marker's SET (a job
-- key of another type raises in HGET here, before any write).
local answer
if known then
  if redis.call('EXISTS', KEYS[3]) == 1 then
    local corrupt = record_type_bad(KEYS[3])
    if corrupt then
      return redis.error_reply('WRONGTYPE ' .. corrupt .. ': ' .. KEYS[3] .. ', refused before any write')
    end
    answer = {'done'}
  elseif redis.call('EXISTS', KEYS[2]) == 1 then
    answer = {'exists', redis.call('HGET', KEYS[2], 'state') or ''}
  end
end
local now, wake, group
if not answer then
  now = now_ms()
  if run_at > 0 then delay = math.max(run_at - now, 0) end
  -- The run time at most 2^53 - 1 (a count, as every reader of run_at and
  -- the delayed score takes it): a delay near the largest one stored a
  -- run_at the promoter and the checker took as corrupt.
  if delay > 9007199254740991 - now then delay = 9007199254740991 - now end
  group = extra_group(extra) -- a `group` extra field: its group list
  if delay > 0 then
    -- Reads delayed: of another type, it raises here, before any write.
    wake = sooner_than_head(KEYS[4], now + delay)
  elseif once > 0 or group then
    -- The lists the push writes, checked before the marker's SET (the first
    -- write) or before a group list's LPUSH (push_waiting's RPUSH of the
    -- ring comes after it). A plain job needs no check: its LPUSH main is the
    -- first write.
    expect_waiting_types(KEYS[1], group)
  end
end
if once > 0 then
  if not redis.call('SET', KEYS[6], '1', 'NX', 'PX', int_str(once)) then
    return {'exists', 'scheduled'}
  end
end
if answer then return answer end
local state = 'queued'
if delay > 0 then state = 'delayed' end
-- One HSET for the whole hash (core fields, token, run time, extra fields).
local fields = {'id', ARGV[1], 'type', ARGV[2], 'v', ARGV[3], 'payload', ARGV[4],
  'max_attempts', max_attempts, 'attempts', '0', 'enqueued_at', int_str(now), 'state', state}
if enq_token ~= '' then
  fields[#fields + 1] = 'enq_token'
  fields[#fields + 1] = enq_token
end
if delay > 0 then
  fields[#fields + 1] = 'run_at'
  fields[#fields + 1] = int_str(now + delay)
end
for _, v in ipairs(extra) do fields[#fields + 1] = v end
-- The push first, then the hash: the push is the write that can meet a key of
-- another type (it raises before any write, or was checked above), the job
-- hash is new (its key does not exist) and cannot fail.
if delay > 0 then
  redis.call('ZADD', KEYS[4], int_str(now + delay), ARGV[1])
else
  push_waiting(KEYS[1], ARGV[1], group)
end
call_chunked('HSET', KEYS[2], fields)
bump(KEYS[5], 'enqueued', 1)
ev(KEYS[5], 'enqueued', ARGV[1], now, 'type', ARGV[2], 'run_at', now + delay)
if wake then wake_promoter(KEYS[7]) end
return {'new', now + delay}

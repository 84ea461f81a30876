-- Shared helpers, prepended to every queue script (see scripts/mod.rs).
-- Every script reads and validates first (key types, numbers), then writes the
-- destination before it removes from the source, counters last: a Lua error
-- after a write is not rolled back, so nothing may fail half-way.

-- Event stream and job history hooks, defined under `==== events ====` below.
local ev, ev_hist
-- Batch members' outcomes, defined under `==== workflows ====` below.
local wf_finished, wf_member_finished

-- Milliseconds since the epoch from the Redis server clock (DESIGN rule 2: never a worker's clock).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An integer (a Redis-clock ms, a lease expiry, a count) as the string HSET
-- and ZADD store. A Lua number handed to redis.call (or joined with `..`) is
-- formatted by snprintf('%.17g') at every use: about 6% of an ack's and 5% of
-- a fetch's instructions (callgrind, issue #12). Small counts (attempts, fence,
-- a batch index below 1024) are formatted once per library load and kept
-- (the library's load code cannot call `string`, so the table fills as they are
-- first used); larger values are formatted once per script call and value.
local small_strs = {}
local int_strs = {}
local function int_str(n)
  local s = small_strs[n] or int_strs[n]
  if not s then
    s = string.format('%d', n)
    if n >= 0 and n < 1024 and n == math.floor(n) then small_strs[n] = s else int_strs[n] = s end
  end
  return s
end

-- The job hash fields the core scripts own: an extra field (an enqueue
-- option stored on the job, enqueue.lua / enqueue_many.lua) may not take one
-- of these names. Every field a script writes into a job hash is here, but
-- `group` and `batch`, which producers set as extra fields. Built when the
-- library loads, not per call.
local CORE_JOB_FIELDS = {id = true, type = true, v = true, payload = true, max_attempts = true,
  attempts = true, enqueued_at = true, state = true, delivered_at = true, token = true, lease_until = true,
  fence = true, last_error = true, failed_at = true, failed_token = true, run_at = true, dead_reason = true,
  dead_at = true, replayed_at = true, enq_token = true, worker = true, cancel_requested = true,
  limit_slot = true, ready_at = true, repaired_at = true, first_started_at = true, newer_since = true,
  previous_dead_reason = true, progress = true, progress_message = true, progress_at = true,
  notify = true, hist = true, batch_of = true, newer_attempts = true, deferrals = true}

-- The extra fields (set by producers, enqueue.lua / enqueue_many.lua) that
-- scripts read as counts (deadline_check): a value that is not one is
-- refused at enqueue, as the Rust side refuses it (check_extra_fields).
-- Stored, it got the job dead-lettered as corrupt at its first claim.
local COUNT_EXTRA_FIELDS = {expires_at = true, expires_after = true}

-- A count as stored or passed (attempts, max_attempts, fence, a limit): the
-- number when it is a finite non-negative integer, else nil (nan, inf, -1, 'x').
-- Short strings of small counts are parsed once per library load and kept
-- (`tonumber` is a strtod: 3% of a one-job fetch's instructions, issue #12).
local small_counts = {}
local function as_count(v)
  local n = small_counts[v]
  if n then return n end
  n = tonumber(v)
  if n and n >= 0 and n <= 9007199254740991 and n == math.floor(n) then
    if n < 1024 and type(v) == 'string' and #v <= 4 then small_counts[v] = n end
    return n
  end
  return nil
end

-- A numeric argument of the caller; anything else refuses the call before any write.
local function arg_count(v, name)
  local n = as_count(v)
  if not n then error({err = 'ERR invalid argument ' .. name .. ': ' .. tostring(v)}) end
  return n
end

-- Whether `v` is a schema version as a worker reads it from the claim row (a
-- u32): decimal digits only, at most 4294967295 ('1.0', 'v2', '-1', '1e3' and
-- '' are not; as_count takes '1.0'). enqueue.lua and enqueue_many.lua store
-- it unread: before, a version a worker could not read was stored, and every
-- claim of the job dead-lettered it as an unreadable claim row. Short
-- versions that pass are kept, as small_counts keeps counts (no pattern match
-- per job of a call).
local good_versions = {}
local function is_version(v)
  if good_versions[v] then return true end
  if type(v) ~= 'string' or not string.find(v, '^%d+$') or tonumber(v) > 4294967295 then
    return false
  end
  if #v <= 4 then good_versions[v] = true end
  return true
end

-- Why `key` cannot be used as a `want` ("<key> holds a <type>, not a
-- <want>"), or nil when it is one or is missing. One TYPE call. A script
-- that has written already uses the reason (a dead-letter reason, a log
-- line); one that has not refuses the call with it (expect_types).
local function key_type_bad(key, want)
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' or t == want then return nil end
  return key .. ' holds a ' .. t .. ', not a ' .. want
end

-- The error text that refuses a call for key_type_bad's reason `bad`.
local function wrongtype_refusal(bad)
  return 'WRONGTYPE queue key ' .. bad .. ': refused before any write'
end

-- The O(1) command of each type that answers an integer for a key of that
-- type or a missing one, and an error for a key of another type.
local TYPE_PROBES = {list = 'LLEN', zset = 'ZCARD', hash = 'HLEN', set = 'SCARD', string = 'STRLEN',
  stream = 'XLEN'}

-- Refuses the call, before any write, when a queue key holds another type than
-- expected. Arguments: key, type, key, type, ... (a missing key is fine).
-- Each key is probed with its type's O(1) count (LLEN, ZCARD, ...) through
-- pcall: an integer reply is a key of that type or none; a WRONGTYPE error is
-- another type. TYPE's status reply cost Lua a table per call (~2.5k
-- instructions, against ~60 for an integer: callgrind, issue #12). The test
-- is inline (a function call per key measured +0.5% of a one-job fetch);
-- only a refusal reads the reason from key_type_bad.
local function expect_types(...)
  local a = {...}
  for i = 1, #a, 2 do
    local probe = TYPE_PROBES[a[i + 1]]
    if not probe then error({err = 'ERR expect_types: no probe for type ' .. tostring(a[i + 1])}) end
    if type(redis.pcall(probe, a[i])) == 'table' then
      error({err = wrongtype_refusal(key_type_bad(a[i], a[i + 1]))})
    end
  end
end

-- `cmd key args...` (HSET of field/value pairs, LPUSH, RPUSH) with `args` of
-- any length: one call per 1,000 values, none for no values. `unpack` of
-- ~8,000 values or more raises ("too many results to unpack"), which after a
-- write would leave the script half-applied. 1,000 keeps HSET's pairs whole;
-- LPUSH in chunks pushes in the order one LPUSH of all would.
local function call_chunked(cmd, key, args)
  local n, reply = #args, nil
  for first = 1, n, 1000 do
    reply = redis.call(cmd, key, unpack(args, first, math.min(first + 999, n)))
  end
  return reply
end

-- A lifetime counter. Counters come last and never block a move: a corrupt
-- field or a stats key of another type is skipped (pcall).
local function bump(stats, field, n)
  redis.pcall('HINCRBY', stats, field, int_str(n or 1))
end

-- A completion record key that held another type (corrupt data: only these
-- scripts write records, and a job that may still finish has none) is
-- replaced by the record, `value` (a string: a compact record) or
-- {field, value, ...} (a hash), kept `retention` ms, and the replacement is
-- logged: a script that has written already must not fail half-way.
local function record_replace(key, value, retention)
  redis.log(redis.LOG_WARNING, 'completion record key ' .. key .. ' held a '
    .. redis.call('TYPE', key)['ok'] .. ' (corrupt data): replaced')
  redis.call('DEL', key)
  if type(value) == 'table' then
    redis.call('HSET', key, unpack(value))
    redis.call('PEXPIRE', key, retention)
  else
    redis.call('SET', key, value, 'PX', retention)
  end
end

-- nil when the completion record key `key` (known to exist) is a record (a
-- hash, or a compact record's string), else the reason: a key of a third
-- type is corrupt data, not a record, so a job is never taken for done
-- because of it (read only when a record key exists: a rare path).
local function record_type_bad(key)
  local t = redis.call('TYPE', key)['ok']
  if t == 'hash' or t == 'string' then return nil end
  return 'completion record key holds a ' .. t .. ' (corrupt data)'
end

-- HMGET of a job's fields. A job key of another type gives nil and the
-- dead-letter reason naming it, instead of aborting the script.
local function read_job(jobkey, ...)
  local h = redis.pcall('HMGET', jobkey, ...)
  if h['err'] then
    return nil, 'corrupt job key: holds a ' .. redis.call('TYPE', jobkey)['ok'] .. ', not a hash'
  end
  return h
end

-- The first `n` bytes of `s` at most, backed up to a UTF-8 character
-- boundary: a cut inside a multi-byte character left broken bytes that
-- cjson wrote into the job's history (its reader failed on them). At most 3
-- bytes are dropped (a character has at most 4); bytes that are not UTF-8
-- to begin with are the reader's to decode lossily. Any value is read as
-- its `tostring` (never an error on a number or a false).
-- A stale entry is one whose job's state says it is elsewhere (dead_trim,
-- promote): the job is put back only when it is in none of the lists its
-- state names. Each lookup first searches STALE_SEARCH entries from the
-- tail; a longer list is then walked whole, at most STALE_WALKS times per
-- call (`walks.left`), after which the lookup answers nil and the caller
-- stops before that entry's writes, leaving it for its next call. A call's
-- cost stays bounded (a whole walk per stale entry made 500 of them over a
-- main of 200,500 block Redis for 1.5 s) and no job is left in no list or
-- listed twice.
local STALE_SEARCH, STALE_WALKS = 1000, 4
-- Whether `id` is in list `key`: true or false (a key of another type reads
-- as not holding it), or nil when the answer needs a whole walk and `walks`
-- has none left.
local function listed_near_tail(key, id, walks)
  local i = redis.pcall('LPOS', key, id, 'RANK', -1, 'MAXLEN', STALE_SEARCH)
  if type(i) == 'number' then return true end
  if type(i) == 'table' then return false end
  local n = redis.pcall('LLEN', key)
  if type(n) ~= 'number' or n <= STALE_SEARCH then return false end
  if walks.left <= 0 then return nil end
  walks.left = walks.left - 1
  return type(redis.pcall('LPOS', key, id, 'RANK', -1)) == 'number'
end
-- Whether dead job `id` is on dead list `dead`: as listed_near_tail, after
-- a search of STALE_SEARCH entries from the head, where dead letters are
-- pushed (a job dead-lettered lately). Without it a stale entry of a recent
-- dead letter walked the whole list from the tail: 500 of them over a dead
-- list of 1,000,000 cost reclaim 125 calls and 19.8 s of Redis, where an
-- LPOS from the head had stopped at once (stop 46 review).
local function dead_listed(dead, id, walks)
  local i = redis.pcall('LPOS', dead, id, 'MAXLEN', STALE_SEARCH)
  if type(i) == 'number' then return true end
  return listed_near_tail(dead, id, walks)
end
-- Whether a stale entry's `queued` job is waiting (`waiting`: main or its
-- group's list) or taken (`processing`): true, false (in neither), or nil
-- when a lookup needs a whole walk and `walks` has none left.
local function queued_job_listed(waiting, processing, id, walks)
  local w = listed_near_tail(waiting, id, walks)
  if w then return true end
  local p = listed_near_tail(processing, id, walks)
  if p ~= false then return p end
  return w
end

-- enqueue_many: a fresh (generated) id whose first write, its HSET, raised
-- (its job key holds another type, corrupt data): nothing of the job is left
-- (its once-marker, set by this job, deleted) and it is refused:
-- {'invalid', reason}, and for a call of one job in mode 'all'
-- (`whole_call`) the error reply the call answers instead.
local function fresh_key_refused(once_prefix, id, jobkey, once, whole_call)
  if once > 0 then redis.call('DEL', once_prefix .. id) end
  local why = 'corrupt job key: holds a ' .. redis.call('TYPE', jobkey)['ok'] .. ', not a hash'
  return {'invalid', why},
    whole_call and redis.error_reply('ERR invalid argument job ' .. id .. ': ' .. why) or nil
end
local function utf8_cut(s, n)
  s = tostring(s)
  if #s <= n then return s end
  local cut = n
  for _ = 1, 3 do
    local b = string.byte(s, cut + 1)
    if cut == 0 or b < 0x80 or b >= 0xC0 then break end
    cut = cut - 1
  end
  return string.sub(s, 1, cut)
end

-- A handler's error text (or a reason built from stored data) as the scripts
-- store it: in `last_error`, the history, the event stream, `dead_reason`, a
-- batch's failure detail. At most ERROR_MAX bytes: a longer one is cut at a
-- UTF-8 boundary and says how long it was, as the worker cuts it
-- (scripts::cut_error). Uncut, a 1 MB error went whole into every history
-- entry and stream entry of each retry, and Redis ran out of memory.
local ERROR_MAX = 4096
local function error_cut(s)
  s = tostring(s)
  if #s <= ERROR_MAX then return s end
  local suffix = '\226\128\166 (' .. #s .. ' bytes)'
  return utf8_cut(s, ERROR_MAX - #suffix) .. suffix
end

-- The dead-letter reason of a corrupt stored count, naming the field.
local function corrupt_field(name, v)
  return 'corrupt field ' .. name .. ": '" .. utf8_cut(tostring(v), 64)
    .. "' is not a non-negative integer"
end

-- Validated attempts and max_attempts (missing: 0 and 1), or nil, nil and the
-- dead-letter reason naming the corrupt field.
local function job_counts(attempts_raw, max_raw)
  local attempts, max = 0, 1
  if attempts_raw then
    attempts = as_count(attempts_raw)
    if not attempts then return nil, nil, corrupt_field('attempts', attempts_raw) end
  end
  if max_raw then
    max = as_count(max_raw)
    if not max then return nil, nil, corrupt_field('max_attempts', max_raw) end
    if max < 1 then max = 1 end
  end
  return attempts, max
end

-- Defined under `-- ==== deadlines, progress, results ====` at the end.
local deadline_check, results_wake

-- Wakes the producers waiting on notification list `notify` (`q:{Q}:notify:<id>`):
-- one element per waiter counted in `count` (the text of a `notify` count; not a
-- count: one), at most 100 (a woken waiter passes its wake on, result_wait.lua);
-- the list expires after 60 s. A key of another type (corrupt) is left alone.
local function notify_wake(notify, count)
  local t = redis.call('TYPE', notify)['ok']
  if t ~= 'none' and t ~= 'list' then return end
  local wakes = {}
  for i = 1, math.min(as_count(count) or 1, 100) do wakes[i] = '1' end
  if #wakes == 0 then return end
  redis.call('LPUSH', notify, unpack(wakes))
  redis.call('PEXPIRE', notify, 60000)
end
-- Dead-letters job `id`: pushes it on the dead list and keeps the hash (a
-- minimal one is created when it was missing; a job key of another type is
-- replaced by one) so its reason, attempts and timestamps stay readable. The
-- caller removes the id from its source afterwards. Returns the job's
-- `batch` field (nil when it has none, or the job key was not a hash): the
-- caller then counts the member as dead in its batch, last
-- (wf_member_finished, after its own removals), whichever script
-- dead-letters it (fail, defer, the watchdog, a claim that finds corrupt
-- data or a passed deadline, the promoter).
-- The job's step results (`q:{Q}:steps:<id>`, `ctx.step`) lose their TTL:
-- they live as long as the dead entry (dead_trim.lua and purge.lua delete
-- them with it; replay.lua gives them their TTL back). Expiring 7 days
-- after the last step while the dead entry lived on, a replay ran the
-- handler's completed steps again.
local function dead_letter(jobkey, dead, stats, id, reason, now)
  ev_hist(stats, id, jobkey, 'dead', reason, now)
  local t = redis.call('TYPE', jobkey)['ok']
  if t ~= 'hash' and t ~= 'none' then redis.call('DEL', jobkey) end
  redis.call('LPUSH', dead, id)
  redis.call('HSET', jobkey, 'id', id, 'state', 'dead', 'dead_reason', reason, 'dead_at', now)
  redis.call('HDEL', jobkey, 'token', 'lease_until')
  redis.pcall('PERSIST', string.sub(stats, 1, #stats - 5) .. 'steps:' .. id)
  bump(stats, 'dead', 1)
  results_wake(jobkey, id)
  if t == 'hash' then return redis.call('HGET', jobkey, 'batch') or nil end
  return nil
end

-- The dead-letter reason of a job whose hash has no `state`: the key is gone
-- (deleted, evicted), or it is a hash that lost the field (corrupt data:
-- named as such, not as "missing", which sent an operator looking for a
-- key that exists).
local function stateless_reason(jobkey)
  if redis.call('EXISTS', jobkey) == 1 then return 'corrupt field state: missing' end
  return 'job hash missing (key deleted or evicted)'
end

-- Counts dead-lettered member `id` in its batch: `member` is what
-- dead_letter() returned (nil: not a member). Called last, after the
-- caller's own removals. True when it wrote a relay notice.
local function dead_member(member, id, reason, now, stats)
  if not member then return false end
  return wf_member_finished(member, id, 'dead', reason, now, stats)
end

-- The job fields claim() reads, in this order. The fields of a running
-- delivery (`token`, `delivered_at`) are not among them: a job waiting to be
-- claimed has none, and each field a hash lacks costs HMGET a scan of the
-- whole listpack (issue #12); same_claim() reads them when the job is active.
local CLAIM_FIELDS = {'state', 'type', 'v', 'payload', 'attempts', 'max_attempts', 'enqueued_at',
  'fence', 'traceparent', 'expires_at', 'expires_after', 'first_started_at'}

-- Below this distance from the tail of processing a finished delivery is
-- looked for from the tail alone (unlist_delivery): a scan of at most FAR
-- entries (~3.6 µs) costs about what the LPOS calls that would look from the
-- head cost.
local FAR = 256

-- The row of a claimed delivery, as the reply carries it: one string of
-- thirteen fields, each written as its length in decimal, ':' and its bytes
-- (id, token, type, v, attempts, max_attempts, enqueued_at, delivered_at,
-- fence, traceparent, first_started_at, far, payload). Every argument but
-- `position` is a string. The traceparent is '' when the job has none,
-- first_started_at '' on a first delivery (it is then delivered_at).
-- `position` (a number; nil: not known) is the delivery's distance from the
-- tail of processing when it was claimed; the row's `far` is '1' when it is
-- at least FAR, '' otherwise, and the delivery's ack and fail send it back
-- (unlist_delivery): a flag, not the number, so no formatting per job.
-- One reply value per job instead of 11-13: each value cost Redis ~0.8k
-- instructions to reply and the worker's RESP parser ~1.3k to read (issue
-- #12). One concatenation, with the lengths' text from int_str's cache (no
-- formatting for lengths under 1024). Every other row stays a table led by
-- its tag (row_tag()). Decoded by `ClaimRow::decode_owned` (claim.rs).
local function claimed_row(id, token, jtype, v, attempts, max, enqueued_at, delivered_at, fence,
                           traceparent, first_started_at, payload, position)
  if first_started_at == delivered_at then first_started_at = '' end
  local n = small_strs
  return (n[#id] or int_str(#id)) .. ':' .. id .. (n[#token] or int_str(#token)) .. ':' .. token
    .. (n[#jtype] or int_str(#jtype)) .. ':' .. jtype .. (n[#v] or int_str(#v)) .. ':' .. v
    .. (n[#attempts] or int_str(#attempts)) .. ':' .. attempts .. (n[#max] or int_str(#max)) .. ':' .. max
    .. (n[#enqueued_at] or int_str(#enqueued_at)) .. ':' .. enqueued_at
    .. (n[#delivered_at] or int_str(#delivered_at)) .. ':' .. delivered_at
    .. (n[#fence] or int_str(#fence)) .. ':' .. fence
    .. (n[#traceparent] or int_str(#traceparent)) .. ':' .. traceparent
    .. (n[#first_started_at] or int_str(#first_started_at)) .. ':' .. first_started_at
    .. ((position or 0) >= FAR and '1:1' or '0:')
    .. (n[#payload] or int_str(#payload)) .. ':' .. payload
end

-- The outcome of a claim row: 'claimed' for a claimed delivery (a string),
-- else the tag that leads the row's table.
local function row_tag(row)
  if type(row) == 'string' then return 'claimed' end
  return row[1]
end

-- The claim row of a delivery already made with `token` (a retry whose first
-- reply was lost gets the same answer), or nil when `h` (the CLAIM_FIELDS of
-- hash `jobkey`) is not that delivery.
local function same_claim(id, token, h, jobkey)
  if h[1] ~= 'active' then return nil end
  local d = redis.call('HMGET', jobkey, 'token', 'delivered_at')
  if d[1] ~= token then return nil end
  local delivered_at = d[2] or '0'
  return claimed_row(id, token, h[2] or '', h[3] or '0', h[5] or '0', h[6] or '1', h[7] or '0', delivered_at,
    h[8] or '0', h[9] or '', h[12] or delivered_at, h[4] or '')
end

-- Writes the completion record of a cancelled job (status `cancelled`, kept
-- for `retention` ms like any record, step results expire with it). The
-- caller then removes the id from where it was, drops the hash and counts.
-- `token` (optional): the delivery that ended it (finish_cancel.lua), kept so
-- that its retry after a lost reply answers cancelled, not lost.
local function cancel_record(donekey, stepskey, attempts, jobtype, enqueued_at, from, retention, now, token)
  local rec = {'status', 'cancelled', 'finished_at', now, 'attempts', attempts or '0',
    'type', jobtype or '', 'enqueued_at', enqueued_at or '0', 'cancelled_from', from}
  if token then
    rec[#rec + 1] = 'token'
    rec[#rec + 1] = token
  end
  local r = redis.pcall('HSET', donekey, unpack(rec))
  if type(r) == 'table' then record_replace(donekey, rec, retention) else redis.call('PEXPIRE', donekey, retention) end
  redis.call('PEXPIRE', stepskey, retention)
  results_wake(donekey)
end

-- Takes a just-delivered `id` out of `processing` (from the head, where the
-- fetch put it) and drops its lease: a delivery that ends without a claim.
local function drop_delivery(processing, leases, id)
  redis.call('LREM', processing, 1, id)
  redis.call('ZREM', leases, id)
end

-- Takes a finished delivery `id` out of `processing` (ack, fail,
-- finish_cancel). Fetches push at the head, so a delivery is usually old by
-- the time it ends, near the tail: `LREM -1` finds it in O(1). Not when
-- deliveries that run long sit between it and the tail: each of them cost
-- the scan ~14 ns (1,000 long deliveries: 14 µs per ack; 100,000: 1.5 ms).
-- `far` is the claim row's (claimed_row), sent back by the worker: '' when
-- the delivery had fewer than FAR entries between it and the tail when it
-- was claimed (or when not known). Entries only ever join processing at the
-- head, so that distance can only have shrunk since: `LREM -1` at once, as
-- before, at most FAR compares. A far one is looked for from both ends in
-- growing windows (NEAR, then 4× each round up to NEAR_MOST), one `LPOS`
-- each, and removed from the end that holds it: the compares are a small
-- multiple of its distance from the nearer end, whichever end that is (the
-- older deliveries ended: the tail; they still run: the head). Beyond both
-- largest windows, the old scan from the tail: at most ~2 × 11k compares
-- over the old cost, however the list looks. Always removes one entry of
-- `id` when there is one (`far` is only a hint).
-- `found` (optional): the end that held the previous far delivery of the
-- same call, which this one returns ('1' the head, '-1' the tail):
-- deliveries acked together mostly ended the same way, so that end is
-- looked at first.
local NEAR, NEAR_MOST = 128, 8192
local function unlist_delivery(processing, id, far, found)
  if far == '' then
    redis.call('LREM', processing, '-1', id)
    return found
  end
  local first, second = '-1', '1'
  if found == '1' then first, second = '1', '-1' end
  local window = NEAR
  while window <= NEAR_MOST do
    local w = int_str(window)
    if redis.call('LPOS', processing, id, 'RANK', first, 'MAXLEN', w) then
      redis.call('LREM', processing, first, id)
      return first
    end
    if redis.call('LPOS', processing, id, 'RANK', second, 'MAXLEN', w) then
      redis.call('LREM', processing, second, id)
      return second
    end
    window = window * 4
  end
  redis.call('LREM', processing, '-1', id)
  return found
end

-- Claims `id`, which the caller knows sits in the processing list: attempts+1,
-- delivered_at, a fresh lease token and the next fencing token (`fence`, +1 on
-- every delivery and never reset, so a later delivery always carries a larger
-- number), lease registered in the leases zset. Called again with the same
-- token, it answers the same row and changes nothing. Corrupt job data
-- (counts, a job key that is not a hash) is dead-lettered with the field named.
-- `worker` (optional: nil or '' from an older caller) is the claiming worker's
-- name, kept in the hash's `worker` field for this delivery. `no_record` (optional):
-- true when the caller already knows no completion record exists (fetch.lua checks
-- its whole batch with one EXISTS). `lease_batch` (optional): a list the caller
-- registers in the leases zset itself, with one variadic ZADD after the batch
-- (`lease_batch_add`); a claimed id is appended to it instead of its own ZADD.
-- `position` (optional): the id's distance from the tail of processing, for
-- the row (claimed_row).
local function claim(id, processing, leases, dead, stats, jobprefix, doneprefix, lease_ms, token, now, worker,
  no_record, lease_batch, position)
  local jobkey = jobprefix .. id
  if not no_record and redis.call('EXISTS', doneprefix .. id) == 1 then
    local corrupt = record_type_bad(doneprefix .. id)
    if corrupt then
      -- Not a record: the job is dead-lettered naming the key, never
      -- dropped as done without running.
      local member = dead_letter(jobkey, dead, stats, id, corrupt, now)
      drop_delivery(processing, leases, id)
      dead_member(member, id, corrupt, now, stats)
      return {'corrupt', id, corrupt}
    end
    -- Completion record exists: the job already ran; ack without running it.
    drop_delivery(processing, leases, id)
    redis.call('DEL', jobkey)
    bump(stats, 'skipped_done', 1)
    return {'done', id}
  end
  local h, bad = read_job(jobkey, unpack(CLAIM_FIELDS))
  if h and not h[1] then
    -- A hash without `state` (corrupt data) is named as such, and counted
    -- in its batch like any dead-lettered member (dead_letter answers the
    -- batch of a hash; nil for a missing key). Before, the reason said
    -- "missing" of a hash that exists, and the batch never fired.
    local why = stateless_reason(jobkey)
    local member = dead_letter(jobkey, dead, stats, id, why, now)
    drop_delivery(processing, leases, id)
    dead_member(member, id, why, now, stats)
    return {'missing', id}
  end
  if h then
    local again = same_claim(id, token, h, jobkey)
    if again then
      -- Our own delivery, answered again only while its counts still read;
      -- corrupted since the first claim: dead-lettered below like any claim.
      local _, _, bad_again = job_counts(h[5], h[6])
      if not bad_again then return again end
      bad = bad_again
    elseif h[1] ~= 'queued' then
      -- Another delivery owns this id (e.g. a late claim after a watchdog return).
      return {'busy', id}
    end
  end
  local attempts, max, fence
  if not bad then attempts, max, bad = job_counts(h[5], h[6]) end
  if not bad then
    fence = 0
    if h[8] then
      fence = as_count(h[8])
      if not fence then bad = corrupt_field('fence', h[8]) end
    end
  end
  if bad then
    local member = dead_letter(jobkey, dead, stats, id, bad, now)
    drop_delivery(processing, leases, id)
    dead_member(member, id, bad, now, stats)
    return {'corrupt', id, bad}
  end
  local expired, member, why = deadline_check(jobkey, dead, stats, id, h, now)
  if expired then
    drop_delivery(processing, leases, id)
    dead_member(member, id, why, now, stats)
    return {expired == true and 'expired' or 'corrupt', id, expired}
  end
  attempts = attempts + 1
  fence = fence + 1
  local lease_until = now + lease_ms
  local attempts_s, now_s, fence_s = int_str(attempts), int_str(now), int_str(fence)
  if lease_batch then
    lease_batch[#lease_batch + 1] = id
  else
    redis.call('ZADD', leases, int_str(lease_until), id)
  end
  redis.call('HSET', jobkey, 'state', 'active', 'attempts', attempts_s, 'delivered_at', now_s,
    'token', token, 'lease_until', int_str(lease_until), 'fence', fence_s, 'worker', worker or '',
    'first_started_at', h[12] or now_s)
  ev(stats, 'started', id, now, 'attempt', attempts, 'worker', worker or '')
  return claimed_row(id, token, h[2] or '', h[3] or '0', attempts_s, int_str(max), h[7] or '0', now_s,
    fence_s, h[9] or '', h[12] or now_s, h[4] or '', position)
end

-- The leases of a fetch batch's claimed ids (`claim(..., lease_batch)`), all
-- expiring at `lease_until`: one ZADD per 500 ids instead of one per job. Until
-- it runs those jobs are active without a lease, as after a BLMOVE before its
-- claim (DESIGN rule 4); a fetch calls it in the same script, before any reply.
local function lease_batch_add(leases, lease_batch, lease_until)
  local score = int_str(lease_until)
  for first = 1, #lease_batch, 500 do
    local args = {}
    for j = first, math.min(first + 499, #lease_batch) do
      args[#args + 1] = score
      args[#args + 1] = lease_batch[j]
    end
    redis.call('ZADD', leases, unpack(args))
  end
end

-- Moves up to `count` ids from the tail of `main` to the head of `processing`,
-- in the order `count` LMOVE RIGHT LEFT calls would (oldest first), with three
-- calls per 1,000 ids instead of one per id: LRANGE, then LPUSH into processing
-- (the destination first), then LTRIM of main. Two ids or fewer: LMOVE each
-- (cheaper than three calls). Returns the ids, oldest first, and the first
-- one's distance from the tail of processing (ids[i]'s is that + i - 1):
-- the LPUSH answers processing's length; after LMOVEs, one LLEN.
local function move_batch(main, processing, count)
  local ids = {}
  if count <= 2 then
    for i = 1, count do
      local id = redis.call('LMOVE', main, processing, 'RIGHT', 'LEFT')
      if not id then break end
      ids[i] = id
    end
    -- One LLEN for the distance (+2.2% of a one-job fetch): a worker whose
    -- slots long-running jobs hold fetches one or two jobs at a time, the
    -- case the distance is for.
    if #ids == 0 then return ids end
    return ids, redis.call('LLEN', processing) - #ids
  end
  local moved = redis.call('LRANGE', main, int_str(-count), '-1')
  for i = #moved, 1, -1 do ids[#ids + 1] = moved[i] end
  local len = call_chunked('LPUSH', processing, ids)
  if #ids > 0 then redis.call('LTRIM', main, '0', int_str(-#ids - 1)) end
  return ids, (len or 0) - #ids
end

-- Promoter wake-up (background/promoter.rs): true when a job due at `score`
-- is sooner than the head of `delayed` (or the set is empty). Read it before
-- the ZADD; after the writes, `wake_promoter` tells one sleeping promoter.
local function sooner_than_head(delayed, score)
  local head = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  return head[2] == nil or tonumber(head[2]) > score
end

-- Wakes one promoter blocked on `wake` (BLPOP): a one-element list, so a
-- wake nobody takes costs one small key. Called last, it is only a hint: a
-- nil key (a producer that does not declare it) or a key of another type is
-- skipped, and a promoter never sleeps longer than its bounded maximum.
local function wake_promoter(wake)
  if not wake then return end
  local t = redis.call('TYPE', wake)['ok']
  if t ~= 'none' and t ~= 'list' then return end
  redis.call('LPUSH', wake, '1')
  redis.call('LTRIM', wake, 0, 0)
end

-- The checks that every end of a delivery without success (fail.lua,
-- defer.lua) makes before it writes: returns the reply to answer at once, or
-- nil, the job's fields (token, state, attempts, failed_token, run_at,
-- dead_reason, cancel_requested, then `...`) and the dead-letter
-- reason of a job key that is not a hash. At once means: the same outcome
-- again for a retried call whose first reply was lost (`failed_token`, not
-- 'lost'); 'lost' when the token no longer matches; 'cancel_requested'
-- (nothing written: the worker ends the job with finish_cancel.lua); 'lost'
-- for a job key of another type whose id is no longer in `processing` (it
-- has no token to check, so a stale delivery must not dead-letter it twice).
local function failing_delivery(jobkey, processing, id, token, ...)
  local h, bad = read_job(jobkey, 'token', 'state', 'attempts', 'failed_token', 'run_at', 'dead_reason',
    'cancel_requested', ...)
  if h and h[4] == token then
    if h[2] == 'dead' then return {'dead', h[6] or ''} end
    return {'retry', as_count(h[5]) or now_ms()}
  end
  if h and (h[2] ~= 'active' or h[1] ~= token) then return {'lost'} end
  if h and h[7] then return {'cancel_requested'} end
  if bad and not redis.call('LPOS', processing, id) then return {'lost'} end
  return nil, h, bad
end

-- ==== perf (issue #12) ====

-- True when none of the completion records of `ids` exists: one variadic
-- EXISTS per 500 ids (far below Lua's unpack limit) instead of one per job.
local function none_done(doneprefix, ids)
  for first = 1, #ids, 500 do
    local keys = {}
    for j = first, math.min(first + 499, #ids) do keys[#keys + 1] = doneprefix .. ids[j] end
    if redis.call('EXISTS', unpack(keys)) > 0 then return false end
  end
  return true
end

-- ==== limits (docs/LIMITS.md) ====
-- The limits hash `q:{Q}:limits` (QueueKeys::limits): fields `rate` ("N/W":
-- at most N starts per W ms), `concurrency` (N running), `key_rate` and
-- `key_concurrency` (defaults for every rate key), `key_rate:<k>` and
-- `key_concurrency:<k>` (one key's override; "none": that key is unlimited).
-- Starts are logged in zsets (token -> start ms) `<limits>:started` and
-- `<limits>:started:<k>`; a key's running ids in `<limits>:running:<k>`
-- (id -> the lease it was claimed with; counted against the leases zset, so
-- finished or expired deliveries free their slot with no release step);
-- `<limits>:runkeys` indexes the running sets (rate key -> the latest lease
-- recorded in its set) so that a set whose ids all finished is swept even if
-- its key never runs again (limits_sweep); `<limits>:next:<k>` spreads a
-- key's deferred jobs over the coming windows. A deferred job carries its
-- booked start in its `limit_slot` field (until claimed) and is indexed in
-- `<limits>:deferred:<k>` (id -> the time it was deferred; a TTL past its
-- last booking), the keys with such an index in `<limits>:deferkeys` (key ->
-- the index's expiry), so that a change of a key's limits can release the
-- jobs deferred under the old ones: `<limits>:releasing` (key -> release
-- the jobs deferred up to this time) is drained by limits_release. Its
-- entry '' (no rate key is empty) stands for every key of `deferkeys` (a
-- change of the every-key defaults): limits_walk marks them a chunk per
-- call, resuming at the ZSCAN cursor kept in `<limits>:walk`.

-- How long a fetcher at a concurrency cap waits before it looks again (ms).
local LIMITS_BUSY_MS = 100
-- Most jobs one fetch defers for their key before it returns.
local LIMITS_MAX_DEFERRED = 100
-- Most running ids and sets one call's sweep looks at (limits_sweep).
local LIMITS_SWEEP = 64
-- Most stale entries one call drops from a key's running set
-- (limits_key_running) or from a deferral index (limits_index): after a
-- quiet spell, dropping them all in one call stalled Redis (200,000 stale
-- running ids: 0.5 s). What is left is dropped by later calls.
local LIMITS_TRIM = 256
-- A key's booked next start further ahead than this is corrupt data (a
-- booking is a few windows ahead at most) and is ignored: 7 days.
local LIMITS_MAX_BOOKING_MS = 604800000
-- Most deferred jobs one call of set_limits.lua re-schedules (limits_release).
local LIMITS_RELEASE = 500
-- The ZSCAN COUNT of one call's walk of `<limits>:deferkeys` (limits_walk):
-- about that many keys (a few more when a hash bucket holds several).
local LIMITS_WALK = 250

-- A rate "N/W" as {N, W}; nil for nil, 'none' or a value that does not parse.
local function limit_rate(v)
  if not v or v == 'none' then return nil end
  local n, w = string.match(v, '^(%d+)/(%d+)$')
  n, w = as_count(n), as_count(w)
  if n and w and w >= 1 then return {n, w} end
  return nil
end

-- The queue's limits, or nil when it has none (one EXISTS: the whole cost
-- for a queue without limits). A queue-level field that does not parse, or
-- a limits or delayed key of another type, refuses the call: run it before
-- the script's first write.
local function limits_load(limkey, delayed)
  if redis.call('EXISTS', limkey) == 0 then return nil end
  expect_types(limkey, 'hash', delayed, 'zset')
  local f = redis.call('HMGET', limkey, 'rate', 'concurrency', 'key_rate', 'key_concurrency')
  local lim = {key = limkey, rate = limit_rate(f[1]), conc = as_count(f[2]),
    key_rate = limit_rate(f[3]), key_conc = as_count(f[4]),
    -- per call, by rate key: the running count and a found wait
    -- (limits_key_wait), a returner deferred again (limits_claim), the
    -- index trimmed (limits_index)
    running = {}, waits = {}, returned = {}, trimmed = {}}
  for i, name in ipairs({'rate', 'concurrency', 'key_rate', 'key_concurrency'}) do
    local parsed = (i == 1 and lim.rate) or (i == 2 and lim.conc) or (i == 3 and lim.key_rate)
      or (i == 4 and lim.key_conc)
    if f[i] and f[i] ~= 'none' and not parsed then
      error({err = 'ERR corrupt limits field ' .. name .. ": '" .. utf8_cut(f[i], 64)
        .. "' (want N/W_ms or N): refused before any write"})
    end
  end
  -- The queue's start log: limits_room reads it after limits_sweep's writes,
  -- limits_started writes it after a claim. Of another type, the call is
  -- refused here, naming it, before any write.
  if lim.rate then expect_types(limkey .. ':started', 'zset') end
  return lim
end

-- Starts left in a sliding window log `log` of `rate` {N, W}, after dropping
-- starts older than the window; and when none is left, the ms until one is.
local function limits_window(log, rate, now)
  redis.call('ZREMRANGEBYSCORE', log, '-inf', now - rate[2])
  local used = redis.call('ZCARD', log)
  if used < rate[1] then return rate[1] - used, 0 end
  local frees = redis.call('ZRANGE', log, used - rate[1], used - rate[1], 'WITHSCORES')
  return 0, math.max(tonumber(frees[2] or now) + rate[2] - now, 1)
end

-- The first `n` of `ids`, ids of running set `running` whose recorded lease
-- has passed: one whose real lease is live (a heartbeat extended it) is
-- re-scored to it, the others (finished, or a dead worker's) leave the set.
local function limits_prune(running, leases, ids, n, now)
  for i = 1, n do
    local until_ms = redis.call('ZSCORE', leases, ids[i])
    if until_ms and tonumber(until_ms) > now then
      redis.call('ZADD', running, 'XX', until_ms, ids[i])
    else
      redis.call('ZREM', running, ids[i])
    end
  end
end

-- Sweeps the running sets whose latest recorded lease has passed (index
-- `<limits>:runkeys`), at most LIMITS_SWEEP ids and sets per call: their
-- finished ids leave, so a set whose ids all finished disappears even if its
-- key never runs again (otherwise one set stayed for every rate key ever
-- used). A set with live ids is re-indexed at its latest lease. A running
-- set or index of another type (corrupt data) is skipped, never an error.
local function limits_sweep(lim, leases, now)
  local index = lim.key .. ':runkeys'
  local now_s = int_str(now)
  local due = redis.pcall('ZRANGEBYSCORE', index, '-inf', now_s, 'LIMIT', '0', int_str(LIMITS_SWEEP))
  if due['err'] then return end
  local budget = LIMITS_SWEEP
  for _, k in ipairs(due) do
    if budget <= 0 then return end
    budget = budget - 1
    local running = lim.key .. ':running:' .. k
    local ids = redis.pcall('ZRANGEBYSCORE', running, '-inf', now_s, 'LIMIT', '0', int_str(budget + 1))
    if ids['err'] then
      redis.call('ZREM', index, k)
    else
      local n = math.min(#ids, budget)
      limits_prune(running, leases, ids, n, now)
      budget = budget - n
      if n == #ids then
        local last = redis.call('ZRANGE', running, '-1', '-1', 'WITHSCORES')
        if #last == 0 then redis.call('ZREM', index, k) else redis.call('ZADD', index, last[2], k) end
      end
    end
  end
end

-- How many jobs the queue-level limits let start now (count when none
-- applies) and, when 0, the ms to wait before looking again. Sweeps the
-- keys' finished running sets first (limits_sweep).
local function limits_room(lim, leases, count, now)
  if not lim then return count, 0 end
  limits_sweep(lim, leases, now)
  local room, wait = count, 0
  if lim.rate then
    local left, w = limits_window(lim.key .. ':started', lim.rate, now)
    room, wait = math.min(room, left), w
  end
  if lim.conc then
    local left = lim.conc - redis.call('ZCOUNT', leases, '(' .. now, '+inf')
    if left <= 0 then room, wait = 0, math.max(wait, LIMITS_BUSY_MS) end
    room = math.max(math.min(room, left), 0)
  end
  return room, wait
end

-- A key's limit: its override `v` read with `parse`, or the every-key
-- `default`. An override 'none' makes the key unlimited; one that does not
-- parse (set by hand) is ignored and the every-key default applies.
local function key_limit(v, parse, default)
  if v == 'none' then return nil end
  if v then return parse(v) or default end
  return default
end

-- The rate key of job `jobkey` when it is waiting ('queued') and limits
-- exist, with its limits {key, rate, conc, slot}; nil otherwise. `slot`: the
-- booked start the job carries in `limit_slot` (it was deferred for its key),
-- nil when it has none or one that is not a count. Second answer: the job's
-- rate key when it carries `limit_slot` (any value), whose claim (or other
-- exit) must clear it (limits_unmark), whether or not a limit still applies
-- to the key.
local function limits_job_key(lim, jobkey)
  if not lim then return nil end
  local h = redis.pcall('HMGET', jobkey, 'state', 'rate_key', 'limit_slot')
  if h['err'] or h[1] ~= 'queued' or not h[2] or h[2] == '' then return nil end
  local marked = h[3] and h[2] or nil
  local o = redis.call('HMGET', lim.key, 'key_rate:' .. h[2], 'key_concurrency:' .. h[2])
  local rate = key_limit(o[1], limit_rate, lim.key_rate)
  local conc = key_limit(o[2], as_count, lim.key_conc)
  if not rate and not conc then return nil, marked end
  -- The key's logs are written after the claim: a log of another type
  -- (corrupt data) would fail the fetch after it claimed jobs. The key's
  -- limits are skipped for this job instead, and the Redis log says so.
  local logs = {}
  if rate then logs[#logs + 1] = lim.key .. ':started:' .. h[2] end
  if conc then logs[#logs + 1] = lim.key .. ':running:' .. h[2] end
  for _, log in ipairs(logs) do
    local bad = key_type_bad(log, 'zset')
    if bad then
      redis.log(redis.LOG_WARNING, 'limits: ' .. bad .. ' (corrupt data): the limits of rate key '
        .. h[2] .. ' are skipped for ' .. jobkey)
      return nil, marked
    end
  end
  return {key = h[2], rate = rate, conc = conc, slot = h[3] and as_count(h[3])}, marked
end

-- The ids of key `k` counted as running now: those of its running set
-- that still hold a lease. A running id's score is the lease it was claimed
-- (or last seen) with, so only ids whose score has passed are looked at: one
-- whose lease a heartbeat extended is re-scored to it, one whose lease is
-- gone or expired leaves the set, LIMITS_TRIM of them per call at most (one
-- left for a later call counts only while it is in the leases zset: not once
-- acked or reclaimed; while expired and not reclaimed yet, conservatively).
-- The rest are counted by one ZINTERCARD with
-- the leases zset (an acked, failed or reclaimed delivery has no lease), not
-- one ZSCORE per running id (which cost a fetch work in proportion to the
-- cap, for every waiting job of the key it looked at). Once per key per call
-- (the count is kept in `lim.running`; limits_started adds this call's
-- claims to it).
local function limits_key_running(lim, k, leases, now)
  local n = lim.running[k.key]
  if n then return n end
  local running = lim.key .. ':running:' .. k.key
  local ids = redis.call('ZRANGEBYSCORE', running, '-inf', int_str(now), 'LIMIT', '0', int_str(LIMITS_TRIM))
  limits_prune(running, leases, ids, #ids, now)
  n = redis.call('ZINTERCARD', '2', running, leases)
  lim.running[k.key] = n
  return n
end

-- Ms until key `k` may start a job (0: now). A key found waiting stays so
-- for the rest of the call (a call only adds starts and running ids): its
-- wait is kept in `lim.waits`.
local function limits_key_wait(lim, k, leases, now)
  local wait = lim.waits[k.key]
  if wait then return wait end
  wait = 0
  if k.rate then
    local _, w = limits_window(lim.key .. ':started:' .. k.key, k.rate, now)
    wait = w
  end
  if k.conc and limits_key_running(lim, k, leases, now) >= k.conc then
    wait = math.max(wait, LIMITS_BUSY_MS)
  end
  if wait > 0 then lim.waits[k.key] = wait end
  return wait
end

-- Drops at most LIMITS_TRIM members of zset `key` scored up to `max` (a
-- ZRANGEBYSCORE bound), the lowest first. A hint's upkeep: pcalls.
local function limits_trim(key, max)
  local old = redis.pcall('ZRANGEBYSCORE', key, '-inf', max, 'LIMIT', '0', int_str(LIMITS_TRIM))
  if not old['err'] and #old > 0 then redis.pcall('ZREM', key, unpack(old)) end
end

-- Indexes job `id`, deferred now for rate key `key` until `until_ms` (its
-- run_at plus one window), for limits_release: `<limits>:deferred:<key>` (id
-- -> now, the time it was deferred) lives a booking's longest reach
-- (LIMITS_MAX_BOOKING_MS) past that, so it outlives every run_at it holds
-- under the same limits; `<limits>:deferkeys` keeps its expiry, and drops the
-- keys whose index expired once per call (LIMITS_TRIM of them at most). Once
-- per call and key, the index drops (LIMITS_TRIM at most of) the entries
-- deferred more than LIMITS_MAX_BOOKING_MS + `window`
-- ago: a run_at is at most that far after its deferral, so their jobs are
-- due already (or left without a claim: cancelled, purged); each deferral
-- pushes the index's TTL on, so on a key always over its limit they would
-- pile up. Only hints (a lost index loses no job, it only cannot release it
-- early): every write is a pcall.
local function limits_index(lim, key, id, until_ms, window, now)
  local index, keys = lim.key .. ':deferred:' .. key, lim.key .. ':deferkeys'
  local ttl = until_ms - now + LIMITS_MAX_BOOKING_MS
  if not lim.deferkeys_swept then
    lim.deferkeys_swept = true
    limits_trim(keys, int_str(now))
  end
  if not lim.trimmed[key] then
    lim.trimmed[key] = true
    limits_trim(index, '(' .. int_str(now - LIMITS_MAX_BOOKING_MS - math.max(window, LIMITS_BUSY_MS)))
  end
  redis.pcall('ZADD', index, int_str(now), id)
  redis.pcall('PEXPIRE', index, int_str(ttl))
  redis.pcall('ZADD', keys, 'GT', int_str(now + ttl), key)
end

-- Clears the mark of job `id` (key `jobkey`) of rate key `key`, claimed
-- now or gone (dead-lettered at its claim, already done): its `limit_slot`
-- (when the hash is left) and its entry in the key's index; the key leaves
-- `deferkeys` with its index's last entry once its booking is gone too (a
-- key with a booking stays, so that a change of the every-key limits still
-- reaches it and drops the booking: limits_walk). `unbook`: the job leaves
-- without a start (cancelled, cancel.lua): with the index's last entry the
-- key's booking goes too, as no deferred job of the key waits on its chain
-- any more (kept, the key's next job was deferred to the end of the chain
-- of jobs that no longer exist: +16.7 h after 1,000 cancelled at 1/60 s).
-- Every write is a pcall (the caller has written already).
local function limits_unmark(lim, key, id, jobkey, unbook)
  redis.pcall('HDEL', jobkey, 'limit_slot')
  local index, nextkey = lim.key .. ':deferred:' .. key, lim.key .. ':next:' .. key
  if redis.pcall('ZREM', index, id) == 1 and redis.call('EXISTS', index) == 0 then
    if unbook then redis.pcall('DEL', nextkey) end
    if redis.call('EXISTS', nextkey) == 0 then redis.pcall('ZREM', lim.key .. ':deferkeys', key) end
  end
end

-- A rate step of key `k`'s limits (k: limits_job_key's answer): W/N, or for
-- a key at a concurrency cap only, LIMITS_BUSY_MS / cap.
local function limits_step(k)
  if k.rate then return math.ceil(k.rate[2] / math.max(k.rate[1], 1)) end
  return math.ceil(LIMITS_BUSY_MS / math.max(k.conc or 1, 1))
end

-- Defers waiting job `id` (in `processing`) whose key `k` is over its limit
-- for `wait` ms. A first deferral goes to the key's next free start, one step
-- after the key's other deferred jobs: the booking `<limits>:next:<k>`,
-- which it extends. A job `returning` from its own booking (limits_claim:
-- back within one step of it, and the key's rate window is still full when
-- it is claimed: its claim came a few ms sooner after its booking than the
-- start it follows) goes to now + wait, the window's own wait: behind the
-- key's whole backlog (the end of the booking) it ran last, and its slot
-- stayed empty. Only a first deferral extends the booking. No attempt is
-- used. The job carries its booked start in `limit_slot` and is indexed
-- (limits_index). A booking further ahead than the key's indexed jobs can
-- fill (one window, then a step per job in the index and one for this job)
-- is stale, its jobs gone without a claim (deleted by hand, evicted, or
-- cancelled by an older version): it is not followed, and this job starts
-- the chain again at now + wait. Returns the row.
local function limits_defer(lim, k, id, jobkey, processing, leases, delayed, wake, wait, now,
                            returning)
  local nextkey = lim.key .. ':next:' .. k.key
  local window = k.rate and k.rate[2] or LIMITS_BUSY_MS
  local step = limits_step(k)
  local run_at = now + wait
  if not returning then
    local booked = redis.pcall('GET', nextkey)
    booked = type(booked) == 'string' and as_count(booked)
    if booked and booked > run_at and booked - now <= LIMITS_MAX_BOOKING_MS then
      local indexed = redis.pcall('ZCARD', lim.key .. ':deferred:' .. k.key)
      if type(indexed) ~= 'number' then indexed = 0 end
      if booked - now <= window + (indexed + 1) * step then run_at = booked end
    end
  end
  local wake_it = sooner_than_head(delayed, run_at)
  redis.call('ZADD', delayed, run_at, id)
  redis.call('HSET', jobkey, 'state', 'delayed', 'run_at', run_at, 'limit_slot', run_at)
  drop_delivery(processing, leases, id)
  if not returning then
    redis.pcall('SET', nextkey, run_at + step, 'PX', run_at + step - now + window)
  end
  limits_index(lim, k.key, id, run_at + window, window, now)
  if wake_it then wake_promoter(wake) end
  return {'deferred', id, run_at}
end

-- Records a start of `id` claimed with `token` in the queue's and its key's
-- logs, and its key's running set (k: limits_job_key's answer, or nil).
local function limits_started(lim, k, id, token, lease_until, now)
  if not lim then return end
  if lim.rate then
    redis.call('ZADD', lim.key .. ':started', now, token)
    redis.call('PEXPIRE', lim.key .. ':started', lim.rate[2])
  end
  if not k then return end
  if k.rate then
    local log = lim.key .. ':started:' .. k.key
    redis.call('ZADD', log, now, token)
    redis.call('PEXPIRE', log, k.rate[2])
  end
  if k.conc then
    redis.call('ZADD', lim.key .. ':running:' .. k.key, lease_until, id)
    redis.pcall('ZADD', lim.key .. ':runkeys', 'GT', lease_until, k.key)
    local n = lim.running[k.key]
    if n then lim.running[k.key] = n + 1 end
  end
end

-- A delivery of `id` whose lease had passed and which a late heartbeat holds
-- again (extend.lua, until `lease_until`): a fetch since may have dropped it
-- from its rate key `key`'s running set (an expired lease is a free slot),
-- and it runs on: it counts there again when the key has a concurrency cap
-- (limits `limkey`, read as limits_job_key reads them: key_limit). Hints, as
-- the running sets are: data that does not read (corrupt) skips it, never
-- failing the heartbeat.
local function limits_revived(limkey, key, id, lease_until)
  local f = redis.pcall('HMGET', limkey, 'key_concurrency', 'key_concurrency:' .. key)
  if f['err'] then return end
  local conc = key_limit(f[2], as_count, as_count(f[1]))
  if not conc then return end
  redis.pcall('ZADD', limkey .. ':running:' .. key, lease_until, id)
  redis.pcall('ZADD', limkey .. ':runkeys', 'GT', lease_until, key)
end

-- claim() under the limits `lim` (nil: plain claim()): a waiting job whose
-- key is over its limit is deferred instead (row {'deferred', id, run_at}).
-- Queue-level room is the caller's (limits_room).
local function limits_claim(lim, delayed, wake, id, processing, leases, dead, stats, jobprefix,
                            doneprefix, lease_ms, token, now, worker, position)
  local k, marked = limits_job_key(lim, jobprefix .. id)
  if k then
    local wait = limits_key_wait(lim, k, leases, now)
    if wait > 0 then
      -- Back from its own booking: claimed less than one step after the
      -- start it booked (a job back late, after an outage, a pause or a
      -- backlog, books on the chain: the returners' now + wait depends on
      -- the key's start log only, so all the key's overdue jobs would get
      -- the same time, none extending the booking, and bounce together
      -- again); the first of its key in this call (the others book on); and
      -- held by the key's rate window only (a key at its concurrency cap
      -- books on: its jobs come back one step apart instead of all together
      -- every LIMITS_BUSY_MS).
      local returning = k.slot and now < k.slot + limits_step(k) and not lim.returned[k.key]
        and not (k.conc and (lim.running[k.key] or 0) >= k.conc)
      if returning then lim.returned[k.key] = true end
      return limits_defer(lim, k, id, jobprefix .. id, processing, leases, delayed, wake, wait, now,
        returning)
    end
  end
  local row = claim(id, processing, leases, dead, stats, jobprefix, doneprefix, lease_ms, token,
    now, worker, nil, nil, position)
  if lim and row_tag(row) == 'claimed' then limits_started(lim, k, id, token, now + lease_ms, now) end
  -- Claimed, or gone without a delivery (dead-lettered expired or corrupt,
  -- already done: the other rows leave `marked` nil): the mark goes.
  if marked then limits_unmark(lim, marked, id, jobprefix .. id) end
  return row
end

-- Marks the jobs of rate key `key` deferred up to now for release (its
-- limits changed: set_limits.lua) and drops its booking, so that its next
-- deferrals are booked from now under the new limits.
local function limits_release_key(limkey, key, now)
  redis.call('ZADD', limkey .. ':releasing', 'GT', int_str(now), key)
  redis.call('DEL', limkey .. ':next:' .. key)
end

-- Marks every key of `<limits>:deferkeys` for release (a change of the
-- every-key defaults, clear_all, release_all): the entry '' of `releasing`
-- (set_limits.lua, with the walk's cursor `<limits>:walk` dropped). A
-- whole-set pass was one call of two writes per key (301,500 keys blocked
-- Redis a second; ~1.5 M reached the busy-script limit): each call walks
-- one ZSCAN step of LIMITS_WALK (about that many keys), keeps the cursor
-- and leaves '' in `releasing` (counted as pending) until the scan ends. A
-- key is marked when the walk reaches it, with its booking dropped then:
-- its jobs deferred up to that time are released, those deferred meanwhile
-- on its old booking too. A key whose index is gone (its jobs claimed,
-- released or expired) leaves `deferkeys` instead. ZSCAN returns every key
-- present for the whole walk (a key that leaves meanwhile has no deferred
-- job left; one that comes in was deferred after the change); a key seen
-- twice is marked again, to no harm. The caller checked `releasing` and
-- `deferkeys` (zsets); a cursor that does not read restarts the walk.
local function limits_walk(limkey, now)
  local releasing, deferkeys, walk = limkey .. ':releasing', limkey .. ':deferkeys', limkey .. ':walk'
  if not redis.call('ZSCORE', releasing, '') then return end
  -- Only a cursor ZSCAN reads (digits, below 2^64: 19 digits at most);
  -- anything else (`1e2`, `0x10`, `7 `: numbers to as_count, refused by
  -- ZSCAN after this call's writes) restarts the walk.
  local cursor = redis.pcall('GET', walk)
  if type(cursor) ~= 'string' or #cursor > 19 or not string.find(cursor, '^%d+$') then cursor = '0' end
  local r = redis.call('ZSCAN', deferkeys, cursor, 'COUNT', int_str(LIMITS_WALK))
  local found = r[2]
  for i = 1, #found, 2 do
    local key = found[i]
    if redis.call('EXISTS', limkey .. ':deferred:' .. key) == 1 then
      limits_release_key(limkey, key, now)
    else
      redis.call('DEL', limkey .. ':next:' .. key)
      redis.call('ZREM', deferkeys, key)
    end
  end
  if r[1] == '0' then
    redis.call('ZREM', releasing, '')
    redis.call('DEL', walk)
  else
    redis.call('SET', walk, r[1])
  end
end

-- Releases jobs deferred under limits that changed since: for each key of
-- `<limits>:releasing` (key -> the time up to which its deferred jobs are
-- released; the entry '' is limits_walk's), each job of its index deferred
-- at or before that time that is still delayed at its booked start is made
-- due now (run_at now, the promoter woken); every job looked at loses its
-- `limit_slot` (its next deferral is a first one, booked on the key's new
-- chain) and leaves the index. A job deferred after that time, under the
-- new limits, is not touched. At most LIMITS_RELEASE jobs per call; a key leaves `releasing`
-- once none is left up to its time (and `deferkeys` once its index is
-- empty). The caller checked `releasing`, `deferkeys` and `delayed`
-- (zsets); a job or an index of another type (corrupt data) is skipped.
-- Returns the jobs made due and the keys left to release.
local function limits_release(limkey, delayed, wake, jobprefix, now)
  local releasing, deferkeys = limkey .. ':releasing', limkey .. ':deferkeys'
  local budget, released, now_s = LIMITS_RELEASE, 0, int_str(now)
  local todo = redis.call('ZRANGE', releasing, '0', int_str(LIMITS_RELEASE - 1), 'WITHSCORES')
  for i = 1, #todo, 2 do
    if budget <= 0 then break end
    local key, upto = todo[i], todo[i + 1]
    if key ~= '' then
      local index = limkey .. ':deferred:' .. key
      local ids = redis.pcall('ZRANGEBYSCORE', index, '-inf', upto, 'LIMIT', '0', int_str(budget))
      if ids['err'] then ids = {} end
      for _, id in ipairs(ids) do
        local jobkey = jobprefix .. id
        local h = redis.pcall('HMGET', jobkey, 'state', 'run_at', 'limit_slot')
        if not h['err'] then
          if h[1] == 'delayed' and h[3] and h[2] == h[3] and (as_count(h[2]) or 0) > now then
            redis.call('ZADD', delayed, 'XX', now_s, id)
            redis.call('HSET', jobkey, 'run_at', now_s)
            released = released + 1
          end
          if h[3] then redis.call('HDEL', jobkey, 'limit_slot') end
        end
        redis.call('ZREM', index, id)
      end
      budget = budget - #ids
      if budget > 0 then
        redis.call('ZREM', releasing, key)
        if redis.call('EXISTS', index) == 0 then redis.call('ZREM', deferkeys, key) end
      end
    end
  end
  if released > 0 then wake_promoter(wake) end
  return released, redis.call('ZCARD', releasing)
end

-- ==== groups (fair queuing between groups, docs/GROUPS.md) ====
-- A job enqueued with a group (job field `group`) waits in its group's list
-- `q:{Q}:g:<group>` instead of main. The ring `q:{Q}:groups` holds '' (main's
-- turn) and every group with waiting jobs that is not paused (a non-empty list
-- of a group not paused is always in it; a paused group leaves it when a fetch
-- meets it and is put back by its resume, group_pause.lua); the ring exists
-- only while some group has (or just had) jobs, so a queue without groups pays
-- one EXISTS per fetch batch. `q:{Q}:gpaused` is the hash group -> Redis time
-- of its pause. All derive from main's name (same hash tag).

-- Ring, group list prefix and group pause hash of the queue whose main is `main`.
local function group_keys(main)
  local base = string.sub(main, 1, -5)
  return base .. 'groups', base .. 'g:', base .. 'gpaused'
end

-- The group named by a job's `group` field: nil when absent or empty.
local function group_of(v)
  if not v or v == '' then return nil end
  return v
end

-- The value of the `group` pair among enqueue's extra fields (name, value, ...).
local function extra_group(extra)
  for i = 1, #extra, 2 do
    if extra[i] == 'group' then return group_of(extra[i + 1]) end
  end
  return nil
end

-- nil when push_waiting(main, _, group) cannot raise, else the reason (a
-- list it writes or reads holds another type: main, or the group's list and
-- the ring), for a script that has written already and must not fail
-- half-way.
local function waiting_types_bad(main, group)
  group = group_of(group)
  if not group then return key_type_bad(main, 'list') end
  local ring, prefix = group_keys(main)
  return key_type_bad(prefix .. group, 'list') or key_type_bad(ring, 'list')
end

-- Refuses the call (before any write) for waiting_types_bad's reason: a
-- script that writes before its push_waiting calls this first.
local function expect_waiting_types(main, group)
  local bad = waiting_types_bad(main, group)
  if bad then error({err = wrongtype_refusal(bad)}) end
end

-- Appends `group` to the ring's tail (served within one round), creating
-- the ring with main's turn '' first. For a group whose list just went from
-- empty to one job (push_waiting): a fetch takes a group out of the ring when
-- it empties the group's list, and a cancel when it does, so such a group is
-- not in the ring, and no O(groups) LPOS is needed to keep it there once
-- (stop 46 review: one promote of 1,000 due grouped retries into a ring of
-- 100,000 groups made 1,000 whole LPOS walks, 6 s with Redis blocked). A
-- group left in the ring with an empty list (its list deleted by hand, or
-- emptied by an older version's cancel) is appended a second time: it then
-- gets two turns a round until a fetch finds its list empty at one of its
-- entries and takes that entry out (ring_remove), and the next.
local function ring_append(ring, group)
  if redis.call('EXISTS', ring) == 0 then redis.call('RPUSH', ring, '') end
  redis.call('RPUSH', ring, group)
end

-- Adds `group` to the ring's tail unless it is there already: O(groups), for
-- a group whose list may have had jobs (a resume).
local function ring_add(ring, group)
  if redis.call('LPOS', ring, group) then return end
  ring_append(ring, group)
end

-- Puts waiting job `id` where it waits: main when it has no group, else its
-- group list (LPUSH: FIFO like main), adding the group to the ring when its
-- list was empty, unless the group is paused (its resume adds it). Used by
-- every script that makes a job waiting again. A pause hash of another type
-- (corrupt) reads as no group paused, with a warning in the Redis log, as a
-- fetch reads it (fair_state): the call comes after the push, a write.
local function push_waiting(main, id, group)
  group = group_of(group)
  if not group then
    redis.call('LPUSH', main, id)
    return
  end
  local ring, prefix, paused = group_keys(main)
  if redis.call('LPUSH', prefix .. group, id) == 1 then
    local p = redis.pcall('HEXISTS', paused, group)
    if p == 1 then return end
    if type(p) == 'table' then
      redis.log(redis.LOG_WARNING, 'group pause hash ' .. paused
        .. ' holds another type, not a hash (corrupt data): read as no group paused')
    end
    ring_append(ring, group)
  end
end

-- The fetch state of one batch: nil when no group has jobs (the one LLEN a
-- queue without groups pays: 0 for no ring), else the keys next_waiting
-- needs. A group-side key of another type (corrupt data) never refuses the
-- fetch, which keeps serving main: a ring of another type answers nil (main
-- only; the groups wait), a pause hash of another type reads as no group
-- paused (`paused` nil), as push_waiting reads it; each with a warning in the
-- Redis log, and `check` reports them (corrupt_group_ring /
-- corrupt_group_pause). Reads only (pcall): nothing can raise here.
local function fair_state(main)
  local ring, prefix, paused = group_keys(main)
  local n = redis.pcall('LLEN', ring)
  if n == 0 then return nil end
  if type(n) == 'table' then
    redis.log(redis.LOG_WARNING, 'fetch: group ring ' .. ring
      .. ' holds another type, not a list (corrupt data): main is served, the groups are not')
    return nil
  end
  if type(redis.pcall('HLEN', paused)) == 'table' then
    redis.log(redis.LOG_WARNING, 'fetch: group pause hash ' .. paused
      .. ' holds another type, not a hash (corrupt data): read as no group paused')
    paused = nil
  end
  return {ring = ring, prefix = prefix, paused = paused}
end

-- Takes group `g` out of the ring (just rotated to its tail), and the ring
-- away when only main's turn is left.
local function ring_remove(ring, g)
  redis.call('LREM', ring, -1, g)
  if redis.call('LLEN', ring) <= 1 then redis.call('DEL', ring) end
end

-- Moves the next waiting id to `processing` and returns it (nil: none).
-- Without groups: the tail of main. With groups: one id per ring entry in
-- ring order ('' is main's turn), rotating the ring, so each group (and main)
-- gets one job per round whatever the others' backlogs; a paused group, and a
-- group whose list ran empty, leave the ring (a paused group's resume puts it
-- back: passed over but kept, each paused group cost two calls per job
-- taken), and the ring goes when only main's turn is left.
local function next_waiting(main, processing, fair)
  if fair then
    local left = redis.call('LLEN', fair.ring)
    while left > 0 do
      left = left - 1
      local g = redis.call('LMOVE', fair.ring, fair.ring, 'LEFT', 'RIGHT')
      if not g then break end
      if g == '' then
        local id = redis.call('LMOVE', main, processing, 'RIGHT', 'LEFT')
        if id then return id end
      elseif fair.paused and redis.call('HEXISTS', fair.paused, g) == 1 then
        ring_remove(fair.ring, g)
      else
        local list = fair.prefix .. g
        -- A group key of another type (corrupt data) must not abort a fetch
        -- that already claimed jobs (no rollback): it is skipped, and left
        -- in the ring for `check` to report (`corrupt_group_list`).
        local id = redis.pcall('LMOVE', list, processing, 'RIGHT', 'LEFT')
        if type(id) == 'table' and id['err'] then
          id = false
        elseif redis.call('LLEN', list) == 0 then
          ring_remove(fair.ring, g)
        end
        if id then return id end
      end
    end
    if redis.call('EXISTS', fair.ring) == 1 then return nil end
  end
  return redis.call('LMOVE', main, processing, 'RIGHT', 'LEFT')
end

-- Jobs waiting in the group lists of the ring and of the paused groups (a
-- paused group may be out of the ring), each group once (stats), reading at
-- most `limit` group lists (nil: every one): O(min(groups, limit)) calls.
-- Returns the count, the number of group keys left out because they hold
-- another type (corrupt data: skipped with a warning in the Redis log, as a
-- fetch skips them): group lists, the ring (its groups are then not read;
-- a fetch serves main only) and the pause hash (its groups are then not
-- read; a fetch reads it as no group paused), and true when the limit left
-- groups unread (the count is then a lower bound).
local function grouped_waiting(main, limit)
  local ring, prefix, paused = group_keys(main)
  local n, unreadable, partial, read, seen = 0, 0, false, 0, {['']= true}
  local function count(groups)
    for _, g in ipairs(groups) do
      if not seen[g] then
        if limit and read >= limit then
          partial = true
          return
        end
        seen[g] = true
        read = read + 1
        local len = redis.pcall('LLEN', prefix .. g)
        if type(len) == 'number' then
          n = n + len
        else
          unreadable = unreadable + 1
          redis.log(redis.LOG_WARNING, 'stats: group key ' .. prefix .. g
            .. ' holds another type, not a list (corrupt data): its jobs are not counted')
        end
      end
    end
  end
  local function corrupt(key, want)
    unreadable = unreadable + 1
    redis.log(redis.LOG_WARNING, 'stats: group key ' .. key .. ' holds another type, not a '
      .. want .. ' (corrupt data): the groups it lists are not counted')
  end
  local t = redis.call('TYPE', ring)['ok']
  if t == 'list' then
    -- main's turn '' and at most `limit` groups
    if limit and redis.call('LLEN', ring) > limit + 1 then partial = true end
    count(redis.call('LRANGE', ring, 0, limit or -1))
  elseif t ~= 'none' then
    corrupt(ring, 'list')
  end
  t = redis.call('TYPE', paused)['ok']
  if t == 'hash' then
    if limit and redis.call('HLEN', paused) > limit then
      partial = true
    else
      count(redis.call('HKEYS', paused))
    end
  elseif t ~= 'none' then
    corrupt(paused, 'hash')
  end
  return n, unreadable, partial
end

-- The group list a waiting grouped job `id` sits in (cancel), or nil.
local function waiting_group_list(main, id, group)
  group = group_of(group)
  if not group then return nil end
  local _, prefix = group_keys(main)
  if redis.call('LPOS', prefix .. group, id) then return prefix .. group end
  return nil
end

-- A cancel emptied `group`'s list: the group leaves the ring (every entry of
-- it: O(groups), a cancel's rare path) and the ring goes when only main's
-- turn is left, so that the group's next job is appended to it once
-- (ring_append). Reads and writes with pcall: a ring of another type
-- (corrupt data, which `check` reports) must not fail a cancel that has
-- written already.
local function ring_drop(main, group)
  local ring = group_keys(main)
  redis.pcall('LREM', ring, 0, group)
  local n = redis.pcall('LLEN', ring)
  if type(n) == 'number' and n <= 1 then redis.call('DEL', ring) end
end

-- ==== workflows ====
-- Batches and flows (docs/WORKFLOWS.md). A member job carries `batch`: the
-- full key of its batch hash `q:{Q}:batch:<id>` (the producer checked that it
-- shares the member's cluster slot). The batch hash holds `state` (open,
-- sealed, fired), `total`, `succeeded`, `dead`, `cancelled`, `failed`
-- (members under the `fail` policy that did not succeed), `policy` and
-- `policy:<id>`, and the callbacks' job specs (`s_*` on success, `c_*` on
-- complete / the flow's parent). `<batch>:done` is the set of finished member
-- ids (a member re-run after a crash counts once), `<batch>:results` member id
-- -> 'ok:<result>' | 'err:<reason>' (flows only).

-- How long a fired batch's keys stay readable (the callbacks read them).
local WF_KEEP_MS = 604800000
local WF_SPEC = {'base', 'id', 'type', 'v', 'payload', 'max', 'member'}

-- ==== cross-queue relay ====
-- A member on queue C of a batch on queue P (another hash tag, so another
-- cluster slot) cannot count itself in P's batch: the script ending it
-- appends a notice to C's relay list `q:{C}:relay` (oldest first), each
-- `<seq>\n<kind>\n<batch key>\n<member id>\n<outcome>\n<detail>` with
-- kind `f` (finished) or `u` (unfinished: replayed), seq from
-- `q:{C}:relay:seq` (increasing). The relay (workflow/relay.rs) applies it
-- to P with relay_apply.lua (idempotent by member id and seq: the batch hash
-- keeps `relay:<id>` = the last seq applied) and then removes it from C with
-- relay_done.lua.

-- The queue base `q:{Q}:` of one of its keys (nil for another shape).
local function wf_base(key)
  return string.match(key, '^(q:{[^}]*}:)')
end

-- Appends a relay notice to the relay list of the queue with base `base`.
-- A relay list of another type, or a `relay:seq` that INCR refuses (another
-- type, not an integer: corrupt data), cannot take it: the notice goes to
-- the dead-notice list, counted in stats (`relay_dead`), and is logged,
-- never dropped silently. A notice without a seq (seq 0) goes there only,
-- never to the relay list: it could not be told from one already applied
-- (relay_apply.lua sets a seq-0 notice aside; relay_retry.lua numbers it
-- once `relay:seq` is repaired).
local function wf_notice(base, kind, bkey, id, outcome, detail)
  local seq = redis.pcall('INCR', base .. 'relay:seq')
  if type(seq) ~= 'number' or seq < 1 then seq = 0 end
  local n = seq .. '\n' .. kind .. '\n' .. bkey .. '\n' .. id .. '\n' .. outcome .. '\n' .. (detail or '')
  local why
  if seq == 0 then
    why = 'no seq: ' .. base .. 'relay:seq is corrupt (another type, or not a count)'
  elseif type(redis.pcall('RPUSH', base .. 'relay', n)) ~= 'number' then
    why = 'relay list unwritable'
  end
  if why then
    redis.log(redis.LOG_WARNING, 'relay notice for batch ' .. bkey .. ' member ' .. id ..
      ' could not be queued (' .. why .. '): kept in ' .. base .. 'relay:dead')
    redis.pcall('LPUSH', base .. 'relay:dead', why .. '\n' .. n)
    redis.pcall('HINCRBY', base .. 'stats', 'relay_dead', 1)
  end
end

-- Parses a relay notice: seq, kind, batch key, member id, outcome, detail
-- (nil for a notice of another shape).
local function wf_parse_notice(n)
  local seq, kind, bkey, id, outcome, detail =
    string.match(n, '^(%d+)\n([fu])\n([^\n]+)\n([^\n]+)\n([^\n]*)\n(.*)$')
  if not seq then return nil end
  return tonumber(seq), kind, bkey, id, outcome, detail
end

-- A workflow failure that must not fail the script (the caller has written
-- already): kept visible in field `field` of batch hash `bkey` (appended,
-- one line each), in the batch queue's stats (`workflow_errors`) and in the
-- Redis log. `bkey` is a hash (the callers checked).
local function wf_error(bkey, field, msg)
  redis.log(redis.LOG_WARNING, 'batch ' .. bkey .. ': ' .. msg)
  local prev = redis.call('HGET', bkey, field)
  redis.call('HSET', bkey, field, prev and (prev .. '\n' .. msg) or msg)
  local base = wf_base(bkey)
  if base then bump(base .. 'stats', 'workflow_errors', 1) end
end

-- Creates callback job `s` (a spec read from the batch hash and checked by
-- wf_spec) in its queue, queued, or dead-lettered with `dead_reason`; once:
-- an existing job or completion record under its id is left alone. Returns
-- true when created; false and why when another job holds its id (false
-- alone when this batch created it already). Never raises: wf_spec checked the spec and the types of
-- the lists this writes before the batch was marked fired (a spec that
-- cannot be queued comes with a `dead_reason`; its missing fields are stored
-- empty). An existing job this batch did not spawn (`batch_of` names
-- another batch, or none), or a completion record, means the callback is
-- not created: kept visible (wf_error, field `fire_error`), never skipped
-- silently (before, the batch said `fired` with no callback and no error).
local function wf_spawn(bkey, s, now, dead_reason)
  local base, id = s[1], s[2]
  local jobkey = base .. 'job:' .. id
  local taken
  if redis.call('EXISTS', jobkey) == 1 then
    local of = redis.pcall('HGET', jobkey, 'batch_of')
    if of == bkey then return false end
    taken = 'a job of that id exists (' .. (type(of) == 'string' and ('spawned by ' .. utf8_cut(of, 200))
      or 'not spawned by this batch') .. ')'
  elseif redis.call('EXISTS', base .. 'done:' .. id) == 1 then
    taken = 'a completion record of that id exists'
  end
  if taken then
    taken = "callback '" .. utf8_cut(id, 200) .. "' not created: " .. taken
      .. '; give callbacks and flow parents ids no other job uses'
    wf_error(bkey, 'fire_error', taken)
    return false, taken
  end
  redis.call('HSET', jobkey, 'id', id, 'type', s[3] or '', 'v', s[4] or '', 'payload', s[5] or '',
    'max_attempts', s[6] or '1', 'attempts', 0, 'enqueued_at', now, 'state', 'queued', 'batch_of', bkey)
  if s[7] and s[7] ~= '' then redis.call('HSET', jobkey, 'batch', s[7]) end
  -- Producers that waited for the callback before it existed (result_wait.lua counted them
  -- in `notify:<id>` of the batch hash) now wait for the job: the script finishing it wakes
  -- them (the dead-letter below too).
  local waiters = as_count(redis.call('HGET', bkey, 'notify:' .. id))
  if waiters and waiters > 0 then
    redis.call('HSET', jobkey, 'notify', math.min(waiters, 1000))
    redis.call('HDEL', bkey, 'notify:' .. id)
  end
  bump(base .. 'stats', 'enqueued', 1)
  if dead_reason then
    dead_letter(jobkey, base .. 'dead', base .. 'stats', id, dead_reason, now)
  else
    redis.call('LPUSH', base .. 'main', id)
  end
  return true
end

-- Callback spec `p` ('s_' or 'c_') of batch `bkey`, read and checked before
-- the batch is marked fired: its WF_SPEC fields (nil: the batch has none);
-- why it cannot be queued (nil: it can), and why it cannot be dead-lettered
-- either (nil: it can). A callback lives on the batch's queue (the producer
-- checks; another would be another cluster slot).
local function wf_spec(bkey, p)
  local f = {}
  for i, n in ipairs(WF_SPEC) do f[i] = p .. n end
  local s = redis.call('HMGET', bkey, unpack(f))
  if not (s[1] or s[2] or s[3]) then return nil end
  local base, id = s[1], s[2]
  if not base or base ~= wf_base(bkey) then
    local why = p .. "base '" .. utf8_cut(tostring(base), 64) .. "' is not the batch's queue"
    return s, why, why
  end
  if not id or id == '' then return s, p .. 'id missing', p .. 'id missing' end
  local dead_bad = key_type_bad(base .. 'dead', 'list')
  for i = 3, 6 do
    if not s[i] then return s, p .. WF_SPEC[i] .. ' missing', dead_bad end
  end
  for _, i in ipairs({4, 6}) do
    if not as_count(s[i]) then
      return s, p .. WF_SPEC[i] .. " '" .. utf8_cut(s[i], 64) .. "' is not a count", dead_bad
    end
  end
  return s, key_type_bad(base .. 'main', 'list'), dead_bad
end

-- Creates callback `s` of batch `bkey` (wf_spec's `problem` and `dead_bad`
-- with it), dead-lettered with `reason` when there is one. One that cannot
-- be queued is dead-lettered naming why (an operator replays it once the
-- cause is repaired); one that cannot be dead-lettered either is not
-- created. Either is reported (wf_error, field `fire_error`), never raised.
-- A callback that is itself a member of other batches (`s[7]`: a nested
-- flow's parent is a child of the outer flow) and was dead-lettered, or not
-- created at all, is counted there as dead: the outer batch fires on it.
-- Before, a nested parent that was not created (its id taken) was never
-- counted, and the outer flow never fired.
-- That count is not made here: it is appended to `after` (wf_cascade's
-- work list: {batch field, member id, outcome, detail, here}), which the
-- caller's cascade runs once this fire's own writes are done.
local function wf_fire(bkey, p, s, problem, dead_bad, reason, now, after)
  if problem then
    reason = 'callback not queued: ' .. problem .. (reason and ('; ' .. reason) or '')
  end
  local what = 'callback ' .. p .. " '" .. utf8_cut(tostring(s[2]), 200) .. "'"
  local outer = s[7] and s[7] ~= '' and s[7]
  if reason and dead_bad then
    local msg = what .. ' not created: ' .. reason .. '; cannot be dead-lettered: ' .. dead_bad
    wf_error(bkey, 'fire_error', msg)
    if outer then after[#after + 1] = {outer, s[2], 'dead', msg, bkey} end
    return
  end
  if problem then wf_error(bkey, 'fire_error', what .. ' dead-lettered: ' .. problem) end
  local created, taken = wf_spawn(bkey, s, now, reason)
  if outer and (taken or (created and reason)) then
    after[#after + 1] = {outer, s[2], 'dead', taken or reason, bkey}
  end
end

-- Batch `bkey` fired: its callbacks leave its queue's pending hash (`q:{Q}:pending`,
-- callback id -> batch key, written by batch_seal.lua): each was created now, or never
-- will be. Producers still counted as waiting for one (`notify:<id>` of the batch hash,
-- result_wait.lua; wf_spawn moved the count of each callback it created into the job)
-- are woken (at most 100 pushes; a woken waiter passes its wake on) to check again: they
-- find the job, its record, or nothing (NotFound). Never raises.
local function wf_unpend(bkey)
  local base = wf_base(bkey)
  if not base then return end
  local ids = redis.call('HMGET', bkey, 's_id', 'c_id')
  for i = 1, 2 do
    local id = ids[i]
    if id and id ~= '' then
      -- Only its own entry: the same id pending for another batch (sealed first) stays.
      if redis.pcall('HGET', base .. 'pending', id) == bkey then
        redis.pcall('HDEL', base .. 'pending', id)
      end
      local n = redis.call('HGET', bkey, 'notify:' .. id)
      if n then
        redis.call('HDEL', bkey, 'notify:' .. id)
        notify_wake(base .. 'notify:' .. id, n)
      end
    end
  end
end

-- The problem with stored count `v` (field `name`) that a script would
-- HINCRBY (corrupt_field's text), or nil (missing counts from 0). Only the
-- text HINCRBY itself reads as an integer passes: digits without a leading
-- zero (or "0"), within as_count's range. as_count alone (tonumber) also
-- takes "00", "0.0", " 0", "+0", "-0", "0e0", "0x0", which HINCRBY refuses
-- ("hash value is not an integer") after the caller's writes.
local function wf_bad_count(name, v)
  if v and not ((v == '0' or string.find(v, '^[1-9]%d*$')) and as_count(v)) then
    return corrupt_field(name, v)
  end
  return nil
end

-- The child of flow `bkey` counted as failed under the `fail` policy first
-- (in the order the flow counted them: `failed_seq:<id>`, from the `fail_seq`
-- counter, wf_finished), as `failed_child` names one ('<id>: <reason>'): what
-- a fire names when `failed_child` is '' (the child it named was replayed
-- while another failure was still counted: wf_unfinish) or missing (a batch
-- an older version left so). A child counted
-- before the sequence was kept (no `failed_seq:`) comes after those with one;
-- ties go to the lowest id. Before, the first in HGETALL order was named
-- (the results hash's order: arbitrary). Reads the results hash (rare: only
-- then). Never raises; '?' when none is found.
local function wf_first_failed(bkey)
  local r = redis.pcall('HGETALL', bkey .. ':results')
  if type(r) ~= 'table' or r['err'] then return '?' end
  local default = redis.call('HGET', bkey, 'policy')
  local best, best_seq, best_reason
  for i = 1, #r, 2 do
    local id = r[i]
    if string.sub(r[i + 1], 1, 4) == 'err:' and (redis.call('HGET', bkey, 'policy:' .. id) or default) == 'fail' then
      local seq = tonumber(redis.call('HGET', bkey, 'failed_seq:' .. id)) or math.huge
      if not best or seq < best_seq or (seq == best_seq and id < best) then
        best, best_seq, best_reason = id, seq, string.sub(r[i + 1], 5)
      end
    end
  end
  if not best then return '?' end
  return best .. ': ' .. utf8_cut(best_reason, 200)
end

-- Fires batch `bkey` once it is sealed and every member finished: the
-- success callback only when all succeeded, the complete callback (a flow's
-- parent: dead-lettered when a member under the `fail` policy failed) always.
-- Reads and checks the callbacks' specs and target lists before its first
-- write; never raises (its callers have written already). A count it reads
-- that is not one HINCRBY writes (wf_bad_count: '1e3', '01', 'x') does not
-- fire the batch and is kept visible (`count_error`, once per text). Before,
-- `as_count` read '1e3' as 1000: the batch fired early; a corrupt `total`
-- kept it from firing with nothing recorded.
-- The counts its fire makes in other batches (a nested flow's parent, a DAG
-- step's dependents) are appended to `after` (wf_fire), not made here.
local function wf_try_fire(bkey, now, after)
  local b = redis.call('HMGET', bkey, 'state', 'total', 'succeeded', 'dead', 'cancelled', 'failed',
    'failed_child')
  if b[1] ~= 'sealed' then return end
  for i, name in ipairs({'total', 'succeeded', 'dead', 'cancelled'}) do
    local bad = wf_bad_count(name, b[i + 1])
    if bad then
      local msg = 'batch not fired: ' .. bad
      local prev = redis.call('HGET', bkey, 'count_error')
      if not (prev and string.find(prev, msg, 1, true)) then wf_error(bkey, 'count_error', msg) end
      return
    end
  end
  local total, ok = as_count(b[2]), as_count(b[3]) or 0
  local finished = ok + (as_count(b[4]) or 0) + (as_count(b[5]) or 0)
  if not total or finished < total then return end
  local s, s_problem, s_dead
  if ok == total then s, s_problem, s_dead = wf_spec(bkey, 's_') end
  local c, c_problem, c_dead = wf_spec(bkey, 'c_')
  redis.call('HSET', bkey, 'state', 'fired', 'fired_at', now)
  if s then wf_fire(bkey, 's_', s, s_problem, s_dead, nil, now, after) end
  if c then
    local reason
    if (as_count(b[6]) or 0) > 0 then
      local first = b[7]
      if not first or first == '' then first = wf_first_failed(bkey) end
      reason = 'flow: ' .. b[6] .. ' child(ren) failed, first ' .. first
    end
    wf_fire(bkey, 'c_', c, c_problem, c_dead, reason, now, after)
  end
  wf_unpend(bkey)
  for _, k in ipairs({bkey, bkey .. ':done', bkey .. ':members', bkey .. ':results'}) do
    redis.call('PEXPIRE', k, WF_KEEP_MS)
  end
end

-- A count of batch `bkey` that member `id` would change is not an integer
-- (corrupt data): `what` names it. Unless the member was counted already
-- (nothing to change then), the member is not counted, and that is kept
-- visible (field `count_error`, wf_error). Returns the message, or nil when
-- the member was counted already.
local function wf_count_error(bkey, id, what)
  if redis.call('SISMEMBER', bkey .. ':done', id) == 1 then return nil end
  local msg = "member '" .. utf8_cut(id, 200) .. "' not counted: " .. what
  wf_error(bkey, 'count_error', msg)
  return msg
end

-- Member `id` of batch `bkey` finished with `outcome` ('succeeded', 'dead',
-- 'cancelled'; `detail`: its result or reason). Counted once per id; a
-- missing batch (expired, deleted) or a key of another type is skipped.
-- Called by ack, fail, reclaim, cancel and finish_cancel after their own
-- writes: never raises. The counts it changes are checked before its first
-- write; a corrupt one leaves the member uncounted, reported (wf_count_error)
-- and returned. The counts a fire makes in other batches are appended to
-- `after` (wf_try_fire). wf_finished below is the entry point.
local function wf_count(bkey, id, outcome, detail, now, after)
  local t = redis.call('TYPE', bkey)['ok']
  if t ~= 'hash' then
    if t ~= 'none' then
      redis.log(redis.LOG_WARNING, 'batch ' .. bkey .. ' holds a ' .. t .. " (corrupt data): member '" .. id
        .. "' not counted")
    end
    return nil
  end
  t = redis.call('TYPE', bkey .. ':done')['ok']
  if t ~= 'set' and t ~= 'none' then
    redis.log(redis.LOG_WARNING, 'batch ' .. bkey .. ':done holds a ' .. t .. " (corrupt data): member '" .. id
      .. "' not counted")
    return nil
  end
  local p = redis.call('HMGET', bkey, outcome, 'policy:' .. id, 'policy', 'failed')
  local policy = p[2] or p[3]
  local bad = wf_bad_count(outcome, p[1])
  if not bad and policy == 'fail' and outcome ~= 'succeeded' then bad = wf_bad_count('failed', p[4]) end
  if bad then return wf_count_error(bkey, id, bad) end
  if redis.call('SADD', bkey .. ':done', id) == 0 then return nil end
  redis.call('HINCRBY', bkey, outcome, 1)
  if policy then
    if outcome == 'succeeded' then
      redis.pcall('HSET', bkey .. ':results', id, 'ok:' .. (detail or ''))
    elseif policy ~= 'ignore' then
      redis.pcall('HSET', bkey .. ':results', id, 'err:' .. (detail or outcome))
      if policy == 'fail' then
        redis.call('HINCRBY', bkey, 'failed', 1)
        redis.call('HSETNX', bkey, 'failed_child', id .. ': ' .. utf8_cut(detail or outcome, 200))
        -- Its place among the failures, for wf_first_failed (pcall: a corrupt
        -- counter leaves the child without a place, after the others).
        local seq = redis.pcall('HINCRBY', bkey, 'fail_seq', 1)
        if type(seq) == 'number' then redis.call('HSET', bkey, 'failed_seq:' .. id, seq) end
      end
    end
  end
  wf_try_fire(bkey, now, after)
  return nil
end

-- Runs the counts a member's end causes, to the last: `work` lists
-- {batch field, member id, outcome, detail, here} (as wf_member_finished
-- takes them), in order. Each batch of a field is counted in turn
-- (wf_count), or gets a relay notice when it lives on another queue than
-- `here`'s; a fire's own counts in other batches (wf_try_fire's `after`) run
-- next, before the rest of the list: the order the recursion had (a batch's
-- fire, then what it caused, then the next batch of the field), but each
-- fire finishes its own writes (unpend, expiry) first. A loop over a stack,
-- so a chain of any length (a FailParent DAG s0 -> ... -> sN on one queue,
-- whose root failed: each step's fire dead-letters the next) runs at one
-- call depth. Before, each step was four nested Lua calls (wf_member_finished
-- -> wf_finished -> wf_maybe_fire -> wf_fire): about 8,190 steps overflowed
-- the Lua stack and the script raised after dead-lettering them, the rest
-- stayed sealed for good. Returns true when it wrote a relay notice.
local function wf_cascade(work, now)
  local stack, noted = {}, false
  local function push(items)
    for i = #items, 1, -1 do
      local it, keys = items[i], {}
      for bkey in string.gmatch(it[1], '[^\n]+') do keys[#keys + 1] = bkey end
      for j = #keys, 1, -1 do stack[#stack + 1] = {keys[j], it[2], it[3], it[4], it[5]} end
    end
  end
  push(work)
  while #stack > 0 do
    local it = stack[#stack]
    stack[#stack] = nil
    local bkey, id, outcome, detail, here = it[1], it[2], it[3], it[4], it[5]
    local base = here and wf_base(here)
    if base and wf_base(bkey) ~= base then
      wf_notice(base, 'f', bkey, id, outcome, detail)
      noted = true
    else
      local after = {}
      wf_count(bkey, id, outcome, detail, now, after)
      push(after)
    end
  end
  return noted
end

-- Member `id` of batch `bkey` (on the caller's queue) finished: wf_count,
-- then what its fire causes (wf_cascade). Returns true first when it wrote a
-- relay notice; second, the message when a corrupt count left the member
-- uncounted (wf_count_error). relay_apply's entry point.
wf_finished = function(bkey, id, outcome, detail, now)
  local after = {}
  local bad = wf_count(bkey, id, outcome, detail, now, after)
  return wf_cascade(after, now), bad
end

-- Fires batch `bkey` when it is sealed and every member finished
-- (wf_try_fire), with what the fire causes (wf_cascade): batch_seal's entry
-- point. Returns true when it wrote a relay notice.
local function wf_maybe_fire(bkey, now)
  local after = {}
  wf_try_fire(bkey, now, after)
  return wf_cascade(after, now)
end

-- The one entry point of the scripts that end a job: member `id` whose job
-- hash field `batch` is `field` finished. `field` holds one batch key, or
-- several separated by '\n' (a job that feeds several batches, e.g. a DAG
-- step with several dependents; job ids and queue names hold no control
-- characters); the member is counted in each.
--
-- `here`: a key of the queue whose script this is (its stats hash). A batch
-- of another queue (another hash tag: another cluster slot) is not touched:
-- a relay notice for it is appended to this queue's relay list instead, in
-- this same script (wf_notice). Returns true when it wrote a notice (the
-- caller's reply says so, and a worker relays at once; docs/WORKFLOWS.md).
-- The counts a batch's fire causes in turn run in the same loop
-- (wf_cascade), not nested.
wf_member_finished = function(field, id, outcome, detail, now, here)
  return wf_cascade({{field, id, outcome, detail, here}}, now)
end

-- A dead member of batch `bkey` was replayed: while the batch has not fired
-- it counts as unfinished again (its next outcome is counted instead).
-- Called by replay and relay_apply after their own writes: never raises. The
-- counts it changes are checked before its first write; a corrupt one leaves
-- the member counted as finished, reported (wf_count_error) and returned.
local function wf_unfinish(bkey, id)
  if redis.call('TYPE', bkey)['ok'] ~= 'hash' then return nil end
  local p = redis.call('HMGET', bkey, 'state', 'dead', 'policy:' .. id, 'policy', 'failed')
  if p[1] == 'fired' then return nil end
  if redis.call('TYPE', bkey .. ':done')['ok'] ~= 'set' then return nil end
  local r = redis.pcall('HGET', bkey .. ':results', id)
  local failed = type(r) == 'string' and string.sub(r, 1, 4) == 'err:'
  local bad = wf_bad_count('dead', p[2])
  if not bad and failed and (p[3] or p[4]) == 'fail' then bad = wf_bad_count('failed', p[5]) end
  if bad then
    if redis.call('SISMEMBER', bkey .. ':done', id) == 0 then return nil end
    local msg = "replayed member '" .. utf8_cut(id, 200) .. "' still counted as finished: " .. bad
    wf_error(bkey, 'count_error', msg)
    return msg
  end
  if redis.call('SREM', bkey .. ':done', id) == 0 then return nil end
  redis.call('HINCRBY', bkey, 'dead', -1)
  if failed then
    redis.pcall('HDEL', bkey .. ':results', id)
    if (p[3] or p[4]) == 'fail' then
      redis.call('HINCRBY', bkey, 'failed', -1)
      redis.call('HDEL', bkey, 'failed_seq:' .. id)
      -- It is no failure any more: the parent's dead reason must not name it (before, it
      -- stayed named). While another failure is still counted the field becomes '' ("the
      -- first failure still counted: worked out at the fire", wf_first_failed there), so
      -- a later failure of another child does not take its place (wf_finished's HSETNX
      -- leaves a field that exists), and this child's next failure comes last. Before,
      -- the field was only cleared: the next failure of any child filled it, although an
      -- earlier one was still counted. Not worked out here: wf_first_failed reads the
      -- whole results hash, once per replay of a named child then (a relay_apply of 100
      -- `u` notices over a flow of 100,000 children: ~48 s); at the fire it runs once.
      local named = redis.call('HGET', bkey, 'failed_child')
      if named and string.sub(named, 1, #id + 2) == id .. ': ' then
        if (as_count(p[5]) or 0) > 1 then
          redis.call('HSET', bkey, 'failed_child', '')
        else
          redis.call('HDEL', bkey, 'failed_child')
        end
      end
    end
  end
  return nil
end

-- Replay's entry point: `field` as for wf_member_finished.
local function wf_member_unfinish(field, id, here)
  local base = here and wf_base(here)
  local noted = false
  for bkey in string.gmatch(field, '[^\n]+') do
    if base and wf_base(bkey) ~= base then
      wf_notice(base, 'u', bkey, id, 'dead', '')
      noted = true
    else
      wf_unfinish(bkey, id)
    end
  end
  return noted
end

-- ==== events ====
-- The per-queue event stream `q:{Q}:events` (XADD MAXLEN ~ N, written only
-- while `q:{Q}:events:on` holds N > 0) and the per-job history
-- `q:{Q}:hist:<id>` (a list capped at HIST_CAP entries, written only on the
-- unusual transitions: the happy path enqueue -> claim -> ack is read back
-- from the job hash and the completion record). See docs/EVENTS.md. Both
-- derive their keys from the queue's stats key (same hash tag) and never
-- block a state change: every write is a pcall.
local HIST_CAP = 50
-- The stream cap, read once per script call: nil not read yet, false off.
local ev_maxlen

-- 'q:{Q}:stats' -> 'q:{Q}:'
local function ev_base(stats)
  return string.sub(stats, 1, #stats - 5)
end

-- The key whose value N > 0 switches the queue's events on ('q:{Q}:events:on').
local function ev_switch(stats)
  return ev_base(stats) .. 'events:on'
end

-- The caller saw that the switch key does not exist (e.g. in one EXISTS with
-- other keys): no event this call, without the GET.
local function ev_off()
  ev_maxlen = false
end

-- Appends event `kind` of job `id` at `now` (Redis clock, ms) to the stream,
-- with extra name, value pairs, when the queue's events are on.
ev = function(stats, kind, id, now, ...)
  if ev_maxlen == nil then
    local v = redis.pcall('GET', ev_switch(stats))
    ev_maxlen = (type(v) == 'string' and as_count(v)) or false
    if ev_maxlen == 0 then ev_maxlen = false end
  end
  if not ev_maxlen then return end
  redis.pcall('XADD', ev_base(stats) .. 'events', 'MAXLEN', '~', ev_maxlen, '*',
    'event', kind, 'id', id, 'at', now, ...)
end

-- Appends `kind` (retried, reclaimed, deferred, dead, replayed, cancelled,
-- cancel_requested) with `detail` to job `id`'s history, and emits it as an
-- event. Called before the transition's writes: when the hash says `active`,
-- the entry carries the delivery it ends (attempt, worker, start). Marks the
-- hash (`hist`) so that ack gives the history the completion retention;
-- `ttl` (optional, ms; 0 deletes) expires it now (the job ends here).
ev_hist = function(stats, id, jobkey, kind, detail, now, ttl)
  local hkey = ev_base(stats) .. 'hist:' .. id
  local h = redis.pcall('HMGET', jobkey, 'state', 'attempts', 'worker', 'delivered_at')
  if type(h) ~= 'table' or h['err'] then h = {} end
  local e = {e = kind, t = now, a = as_count(h[2]), d = detail}
  if h[1] == 'active' then
    e.w = h[3] or nil
    e.s = as_count(h[4])
  end
  redis.pcall('RPUSH', hkey, cjson.encode(e))
  redis.pcall('LTRIM', hkey, -HIST_CAP, -1)
  if h[1] then redis.pcall('HSET', jobkey, 'hist', '1') end
  if ttl then
    if ttl > 0 then redis.pcall('PEXPIRE', hkey, ttl) else redis.pcall('DEL', hkey) end
  end
  ev(stats, kind, id, now, 'attempt', e.a or 0, 'worker', e.w or '', 'detail', detail or '')
end

-- The end of a job's history with the job: kept `ttl` ms (a completion
-- record's retention; 0 deletes it), or deleted when `ttl` is nil (purge,
-- dead-list trim).
local function hist_close(stats, id, ttl)
  local hkey = ev_base(stats) .. 'hist:' .. id
  if ttl and ttl > 0 then redis.pcall('PEXPIRE', hkey, ttl) else redis.pcall('DEL', hkey) end
end

-- ==== completion records ====
-- A completion record (`q:{Q}:done:<id>`) is a hash, or with
-- WorkerConfig::compact_records the string an ack writes with one SET ... PX
-- (issue #12: fewer instructions per ack and less memory than an 8-field hash
-- and its PEXPIRE; its status is `done`, a cancel still writes a hash):
--   c1 <finished_at> <attempts> <enqueued_at> <delivered_at> <#token>:<#type>:<#worker>:<token><type><worker><result>
-- the four times and counts in decimal, then the lengths of the three strings
-- that follow, and the result reference as the rest (any bytes). Whoever reads
-- a record's fields reads both forms (record_all, record_field; in Rust
-- src/record.rs), so the two can live side by side; EXISTS is the same for both.
local function record_pack(finished_at, attempts, enqueued_at, delivered_at, token, jtype, worker, result)
  return 'c1 ' .. finished_at .. ' ' .. attempts .. ' ' .. enqueued_at .. ' ' .. delivered_at .. ' '
    .. int_str(#token) .. ':' .. int_str(#jtype) .. ':' .. int_str(#worker) .. ':' .. token .. jtype .. worker
    .. result
end

-- {field, value, ...} of a compact record (`result` left out when empty, as a
-- hash record has none then), or {'status', 'done'} alone when the string does
-- not parse (a stored count that was not one, say): it still says that the job
-- finished.
local function record_unpack(s)
  local fin, att, enq, del, lt, ly, lw, at = string.match(s,
    '^c1 (%d+) (%d+) (%d+) (%d+) (%d+):(%d+):(%d+):()')
  if not at then return {'status', 'done'} end
  lt, ly, lw = tonumber(lt), tonumber(ly), tonumber(lw)
  if at + lt + ly + lw - 1 > #s then return {'status', 'done'} end
  local out = {'status', 'done', 'finished_at', fin, 'attempts', att, 'enqueued_at', enq, 'delivered_at', del,
    'token', string.sub(s, at, at + lt - 1), 'type', string.sub(s, at + lt, at + lt + ly - 1),
    'worker', string.sub(s, at + lt + ly, at + lt + ly + lw - 1)}
  local result = string.sub(s, at + lt + ly + lw)
  if result ~= '' then
    out[#out + 1] = 'result'
    out[#out + 1] = result
  end
  return out
end

-- The record at `key` as {field, value, ...}, empty when there is none. A key
-- of a third type fails the call (WRONGTYPE), as reading it as a hash did.
local function record_all(key)
  local rec = redis.pcall('HGETALL', key)
  if not rec['err'] then return rec end
  return record_unpack(redis.call('GET', key))
end

-- One field of the record at `key`, or false (no record, no such field, or a
-- key of a third type: never an error, so a caller that has written already
-- is not stopped half-way).
local function record_field(key, name)
  local v = redis.pcall('HGET', key, name)
  if type(v) ~= 'table' then return v end
  local s = redis.pcall('GET', key)
  if type(s) ~= 'string' then return false end
  local rec = record_unpack(s)
  for i = 1, #rec, 2 do
    if rec[i] == name then return rec[i + 1] end
  end
  return false
end

-- ==== deadlines, progress, results ====
-- docs/RESULTS.md. Job fields: `expires_at` (ms, absolute: EnqueueOptions::deadline),
-- `expires_after` (ms after `enqueued_at`: EnqueueOptions::expires_in), `first_started_at`
-- (Redis time of the first claim, set by claim()), `notify` (someone may wait for the outcome).

-- Called by claim() with the CLAIM_FIELDS row `h`, before the claim writes anything: a job
-- past its start deadline is dead-lettered with reason `expired: ...` (counter `expired` too)
-- and true is returned; a deadline field that is not a count is dead-lettered as corrupt and
-- its reason returned; nil when the job may start. With either, also dead_letter()'s return
-- (the job's batch) and the reason. claim() then removes it from processing and leases, and
-- counts a batch member as dead (dead_member).
deadline_check = function(jobkey, dead, stats, id, h, now)
  if not h[10] and not h[11] then return nil end
  local at
  local bad
  if h[10] then
    at = as_count(h[10])
    if not at then bad = corrupt_field('expires_at', h[10]) end
  end
  local after = h[11] and as_count(h[11])
  if h[11] and not after then bad = corrupt_field('expires_after', h[11]) end
  if bad then
    return bad, dead_letter(jobkey, dead, stats, id, bad, now), bad
  end
  if after then
    local rel = (as_count(h[7]) or now) + after
    if not at or rel < at then at = rel end
  end
  if now < at then return nil end
  local reason = 'expired: not started before its deadline (' .. at .. ' ms, Redis clock)'
  local member = dead_letter(jobkey, dead, stats, id, reason, now)
  bump(stats, 'expired', 1)
  return true, member, reason
end

-- Wakes whoever waits for the outcome of a job (Queue::wait_result): when the job hash has
-- `notify` (the number of waiters, result_wait.lua), pushes that many elements (at most 100)
-- on `q:{Q}:notify:<id>`, which expires after 60 s (a waiter re-reads the state before and
-- after blocking, so a wake nobody takes is only a small key for a minute).
-- `key` is the job hash or the completion record (`q:{Q}:job:<id>` / `q:{Q}:done:<id>`).
results_wake = function(key, id)
  local base, kind, rest = string.match(key, '^(.-}:)(%a+):(.*)$')
  if not base then return end
  id = id or rest
  local jobkey = base .. 'job:' .. id
  if kind ~= 'job' and kind ~= 'done' then return end
  local flag = redis.pcall('HGET', jobkey, 'notify')
  if type(flag) ~= 'string' then return end
  notify_wake(base .. 'notify:' .. id, flag)
end

-- ==== per call ====
-- Resets what a prelude local caches for one call (the `int_str` strings, the
-- events cap): in the function library (scripts/library.rs) these locals
-- live as long as the library, so every function calls this first.
local function call_begin()
  int_strs = {}
  ev_maxlen = nil
end

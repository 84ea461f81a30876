-- A delivery whose payload schema version is newer than the worker's handler,
-- or whose job type has no handler on the worker (ARGV[6] empty), goes back
-- without using an attempt, only while the token matches: to the
-- delayed set for delay_ms (attempts - 1, lease dropped), so that an upgraded
-- worker can run it. The job hash keeps `newer_since`: the Redis time since
-- which no live worker has announced the version (reset while one has). Once
-- that is wait_ms ago, the job is dead-lettered with a reason saying so.
-- `newer_attempts` (the attempts count a give-back left) and `deferrals` (the
-- give-backs of the streak) tell a streak from a job that ran in between (its
-- wait starts again), and space the give-backs: delay_ms doubling per
-- give-back, up to a minute.
-- While a live worker has announced the version the job is always given back,
-- whatever wait_ms (0 too). The handler never ran, so the delivery is not a
-- start: a `first_started_at` this delivery's claim wrote is dropped (the
-- execution deadline counts from the first delivery that runs), and its
-- rate-limit starts (`<limits>:started`, `:started:<rate_key>`) are released.
-- Validates first; destination before source, counters last. Idempotent for
-- its token (`failed_token`): a retry whose reply was lost gets the same answer.
-- KEYS: 1 processing, 2 leases, 3 job hash, 4 delayed, 5 dead, 6 stats, 7 versions hash,
--       8 promoter wake list, 9 limits hash (optional, below),
--       10 guard (never written: see keys.rs; the script reaches the rate-limit start
--         logs, the history and the batch)
-- (An older caller's 8 keys, without the limits hash, release no rate start.)
-- (A give-back due sooner than the delayed head wakes a sleeping promoter, as a
-- retry's does.)
-- ARGV: 1 id, 2 token, 3 versions field (`type:version`), 4 delay_ms, 5 wait_ms,
--       6 the handler's version, or '' when the worker has no handler for the
--         type (for the reason)
-- Returns, like fail.lua, {'retry', run_at} (given back) | {'dead', reason} | {'lost'}
-- | {'cancel_requested'} (nothing written).
local delay = arg_count(ARGV[4], 'delay_ms')
local wait = arg_count(ARGV[5], 'wait_ms')
expect_types(KEYS[1], 'list', KEYS[2], 'zset', KEYS[4], 'zset', KEYS[5], 'list', KEYS[7], 'hash')
local early, h, bad = failing_delivery(KEYS[3], KEYS[1], ARGV[1], ARGV[2], 'newer_since',
  'first_started_at', 'delivered_at', 'rate_key', 'newer_attempts', 'deferrals')
if early then return early end
-- The start logs this delivery's claim wrote to (limits_started). A log of
-- another type (corrupt data) is skipped with a warning, as fetches skip a
-- key's limits then: checked here, before the first write.
local logs = {}
if KEYS[9] then
  local candidates = {KEYS[9] .. ':started'}
  if h and h[11] and h[11] ~= '' then candidates[2] = KEYS[9] .. ':started:' .. h[11] end
  for _, log in ipairs(candidates) do
    local wrong = key_type_bad(log, 'zset')
    if wrong then
      redis.log(redis.LOG_WARNING, 'defer: ' .. wrong .. ' (corrupt data): the start of job '
        .. ARGV[1] .. ' is left in it')
    else
      logs[#logs + 1] = log
    end
  end
end
-- This delivery's claim started the job's clock (no earlier delivery did):
-- it is dropped with the delivery, so the next claim starts it.
local unstart = h and h[9] and h[9] == h[10]
-- Releases this delivery's rate-limit starts, last.
local function release_starts()
  for _, log in ipairs(logs) do redis.call('ZREM', log, ARGV[2]) end
end
local attempts, _max
if not bad then attempts, _max, bad = job_counts(h[3], nil) end
local now = now_ms()
local reason = bad
if not bad then
  -- The handler never ran: this delivery's attempt is given back.
  if attempts > 0 then attempts = attempts - 1 end
  local announced = as_count(redis.call('HGET', KEYS[7], ARGV[3]))
  -- This give-back continues the job's streak of give-backs when the
  -- attempts count the last one left (`newer_attempts`) is still the job's:
  -- no delivery ran since. When one did (a worker that has the type ran it,
  -- then it failed or was returned), or the marks are missing or corrupt
  -- (our own bookkeeping), the wait and the delays start again: a wait begun
  -- long ago must not dead-letter a job that ran in between.
  local same = as_count(h[12]) == attempts
  local since = same and as_count(h[8]) or now
  local bounces = same and as_count(h[13]) or 0
  -- An announcement live now: given back whatever the wait (0 too).
  local live = announced and announced > now
  if live then since = now end
  if live or now - since < wait then
    -- Each give-back of a streak waits twice as long as the one before, from
    -- delay_ms up to a minute (or delay_ms when longer): a job that the
    -- workers taking it cannot run, while one that can is announced but busy
    -- elsewhere, does not cycle through main every delay_ms.
    local cap = math.max(delay, 60000)
    local d = delay
    for _ = 1, math.min(bounces, 32) do
      if d >= cap then break end
      d = math.min(d * 2, cap)
    end
    local run_at = math.min(now + d, 9007199254740991)
    local why = 'payload version ' .. ARGV[3] .. ' newer than the handler'
    if ARGV[6] == '' then why = 'no handler for ' .. ARGV[3] .. ' on this worker' end
    why = error_cut(why) -- the type comes from the job: stored at most 4096 bytes
    ev_hist(KEYS[6], ARGV[1], KEYS[3], 'deferred', why, now)
    local wake = sooner_than_head(KEYS[4], run_at)
    redis.call('ZADD', KEYS[4], int_str(run_at), ARGV[1])
    redis.call('HSET', KEYS[3], 'state', 'delayed', 'run_at', run_at, 'attempts', attempts,
      'newer_since', since, 'newer_attempts', attempts, 'deferrals', bounces + 1, 'failed_token', ARGV[2])
    redis.call('HDEL', KEYS[3], 'token', 'lease_until')
    if unstart then redis.call('HDEL', KEYS[3], 'first_started_at') end
    redis.call('LREM', KEYS[1], 1, ARGV[1])
    redis.call('ZREM', KEYS[2], ARGV[1])
    bump(KEYS[6], 'deferred', 1)
    release_starts()
    if wake then wake_promoter(KEYS[8]) end
    return {'retry', run_at}
  end
  local unannounced = ' and no live worker has announced it for ' .. (now - since) .. ' ms (wait '
    .. wait .. ' ms)'
  if ARGV[6] == '' then
    local jtype, v = string.match(ARGV[3], '^(.*):(%d+)$')
    reason = 'unknown job type `' .. (jtype or ARGV[3]) .. '` (version ' .. (v or '?')
      .. '): no handler for it on the worker that took it' .. unannounced
      .. '; register it on every worker that consumes the queue, then `queue-watchdog dead replay`'
  else
    reason = 'payload schema version ' .. ARGV[3] .. ' is newer than this worker\'s handler (version '
      .. ARGV[6] .. ')' .. unannounced
  end
end
reason = error_cut(reason)
local member = dead_letter(KEYS[3], KEYS[5], KEYS[6], ARGV[1], reason, now)
if attempts then redis.call('HSET', KEYS[3], 'attempts', attempts) end
redis.call('HSET', KEYS[3], 'failed_at', now, 'failed_token', ARGV[2])
if unstart then redis.call('HDEL', KEYS[3], 'first_started_at') end
redis.call('LREM', KEYS[1], 1, ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
release_starts()
if dead_member(member, ARGV[1], reason, now, KEYS[6]) then
  return {'dead', reason, 'relay'}
end
return {'dead', reason}

-- Failure: retry later (delayed zset) or dead-letter, only while the token matches.
-- Validates first (queue key types, the job's counts); corrupt job data is
-- dead-lettered with the field named. Destination before source, counters last.
-- Idempotent for its token (`failed_token`): a retry whose first reply was
-- lost gets the same outcome, not 'lost'.
-- KEYS: 1 processing, 2 leases, 3 job hash, 4 delayed, 5 dead, 6 stats, 7 promoter wake list,
--       8 guard (never written: see keys.rs; the script reaches the history, the
--         waiters' wake list and the batch)
-- ARGV: 1 id, 2 token, 3 kind ('retry' | 'permanent'), 4 message, 5 delay_ms,
--       6 the claim row's `far` (optional: '1' claimed far from the tail of processing; ''
--         or absent, not, or not known: a hint for finding it, unlist_delivery in the prelude)
-- (the message is stored cut to 4096 bytes: error_cut)
-- Returns {'retry', run_at} | {'dead', reason} | {'lost'} | {'cancel_requested'}
-- (nothing written: the worker ends the job with finish_cancel.lua).
local delay = arg_count(ARGV[5], 'delay_ms')
-- The message cut before any write (the worker sends it cut already).
local message = error_cut(ARGV[4])
local far = ARGV[6] or ''
expect_types(KEYS[1], 'list', KEYS[2], 'zset', KEYS[4], 'zset', KEYS[5], 'list')
local early, h, bad = failing_delivery(KEYS[3], KEYS[1], ARGV[1], ARGV[2], 'max_attempts')
if early then return early end
local attempts, max
if not bad then attempts, max, bad = job_counts(h[3], h[8]) end
local now = now_ms()
local reason = bad
if not bad then
  if ARGV[3] == 'retry' and attempts < max then
    -- At most 2^53 - 1 (a count, as every reader of run_at takes it): a
    -- delay near the largest one stored a run_at the promoter took as corrupt.
    local run_at = math.min(now + delay, 9007199254740991)
    ev_hist(KEYS[6], ARGV[1], KEYS[3], 'retried', message, now)
    local wake = sooner_than_head(KEYS[4], run_at)
    redis.call('ZADD', KEYS[4], run_at, ARGV[1])
    redis.call('HSET', KEYS[3], 'last_error', message, 'failed_at', now, 'state', 'delayed',
      'run_at', run_at, 'failed_token', ARGV[2])
    redis.call('HDEL', KEYS[3], 'token', 'lease_until')
    -- A finished or expired delivery is old, near the tail (see ack.lua).
    unlist_delivery(KEYS[1], ARGV[1], far)
    redis.call('ZREM', KEYS[2], ARGV[1])
    bump(KEYS[6], 'failed', 1)
    bump(KEYS[6], 'retried', 1)
    if wake then wake_promoter(KEYS[7]) end
    return {'retry', run_at}
  end
  reason = message
  if ARGV[3] == 'retry' then
    reason = 'attempts exhausted (' .. attempts .. ' of ' .. max .. '): ' .. message
  end
end
local member = dead_letter(KEYS[3], KEYS[5], KEYS[6], ARGV[1], reason, now)
redis.call('HSET', KEYS[3], 'last_error', message, 'failed_at', now, 'failed_token', ARGV[2])
-- A finished or expired delivery is old, near the tail (see ack.lua).
unlist_delivery(KEYS[1], ARGV[1], far)
redis.call('ZREM', KEYS[2], ARGV[1])
bump(KEYS[6], 'failed', 1)
if dead_member(member, ARGV[1], reason, now, KEYS[6]) then
  return {'dead', reason, 'relay'}
end
return {'dead', reason}

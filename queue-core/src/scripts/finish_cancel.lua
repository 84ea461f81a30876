-- A running job an operator asked to cancel ends cancelled once its handler
-- returned an error: never retried, never dead-lettered. Only while the token matches.
-- KEYS: 1 processing, 2 leases, 3 job hash, 4 completion record, 5 stats, 6 step results,
--       7 guard (never written: see keys.rs; the script reaches the history and the batch)
-- ARGV: 1 id, 2 token, 3 retention_ms, 4 the handler's error,
--       5 the claim row's `far` (optional: '1' claimed far from the tail of processing;
--         '' or absent, not, or not known: a hint, unlist_delivery in the prelude)
-- (the error is stored cut to 4096 bytes: error_cut)
-- Returns 1, or 0 when the lease was lost. Idempotent for its token: the record
-- keeps it, so a retry whose first reply was lost answers 1 again.
-- At least 1 ms: PEXPIRE 0 would delete the record, and a write after it
-- would leave one without a TTL (a cancelled id answering done for ever).
local retention = math.max(arg_count(ARGV[3], 'retention_ms'), 1)
-- The error cut before any write (the worker sends it cut already).
local message = error_cut(ARGV[4])
expect_types(KEYS[1], 'list', KEYS[2], 'zset')
local h = redis.call('HMGET', KEYS[3], 'token', 'state', 'attempts', 'type', 'enqueued_at', 'batch')
if h[2] ~= 'active' or h[1] ~= ARGV[2] then
  if not h[2] and record_field(KEYS[4], 'token') == ARGV[2]
    and record_field(KEYS[4], 'status') == 'cancelled' then
    return 1
  end
  return 0
end
local now = now_ms()
ev_hist(KEYS[5], ARGV[1], KEYS[3], 'cancelled', message, now, retention)
cancel_record(KEYS[4], KEYS[6], h[3], h[4], h[5], 'active', retention, now, ARGV[2])
redis.call('HSET', KEYS[4], 'last_error', message)
-- A finished delivery is old, near the tail (see ack.lua).
unlist_delivery(KEYS[1], ARGV[1], ARGV[5] or '')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
bump(KEYS[5], 'cancelled', 1)
if h[6] then wf_member_finished(h[6], ARGV[1], 'cancelled', message, now, KEYS[5]) end
return 1

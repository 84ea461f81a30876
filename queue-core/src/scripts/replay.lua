-- Returns a dead-lettered job to main, only while its state is `dead` (a live
-- job that reuses the id is never touched). Main before the dead list.
-- KEYS: 1 dead, 2 main, 3 job hash, 4 stats, 5 guard (never written: see keys.rs; the
--       script reaches the group list, the ring, the history, the step
--       results and the batch)
-- ARGV: 1 id, 2 reset attempts ('1' | '0'), 3 step results ttl_ms (OPTIONAL),
--       4 expected dead_at (OPTIONAL; absent or '' = any)
-- ARGV 3: the job's `ctx.step` results, kept without a TTL while it was dead,
-- expire that long after the replay, as while any job lives; the next step
-- write or the ack sets it again; an older caller without it leaves them
-- without a TTL until then.
-- ARGV 4: a bulk replay passes the `dead_at` its confirmed selection read: a
-- job replayed and dead-lettered again since (another dead-lettering than the
-- one confirmed) is left alone, as purge.lua leaves it.
-- Returns 1 when replayed, 2 when replayed and it wrote a relay notice (a
-- member of a batch on another queue: the caller relays the queue at once,
-- docs/WORKFLOWS.md "Relay"), 0 when the job is not dead-lettered, -1 when
-- it is, but not the dead-lettering expected (nothing changes).
local steps_ttl = ARGV[3] and arg_count(ARGV[3], 'steps ttl_ms')
local expected = ARGV[4] or ''
local h = redis.call('HMGET', KEYS[3], 'state', 'dead_reason', 'group', 'batch', 'dead_at')
if h[1] ~= 'dead' or not redis.call('LPOS', KEYS[1], ARGV[1]) then
  return 0
end
if expected ~= '' and h[5] ~= expected then
  return -1
end
-- Where it will wait (main, or its group's list and the ring) is checked
-- before any write (push_waiting comes after the history entry).
expect_waiting_types(KEYS[2], h[3])
local now = now_ms()
ev_hist(KEYS[4], ARGV[1], KEYS[3], 'replayed', h[2] or '', now)
push_waiting(KEYS[2], ARGV[1], h[3]) -- main, or its group's list
if h[2] then redis.call('HSET', KEYS[3], 'previous_dead_reason', h[2]) end
-- Waiting from now on (`ready_at`: stats count its waiting age from here).
redis.call('HSET', KEYS[3], 'state', 'queued', 'replayed_at', now, 'ready_at', now)
-- A new life: the fail that dead-lettered it is no longer its outcome, so a
-- late retry of that fail (its token in `failed_token`) answers 'lost'; a
-- cancel asked of the old life (`cancel_requested`), the old wait for its
-- payload version (`newer_since`) and a booked start of its rate key
-- (`limit_slot`, docs/LIMITS.md: kept, its next deferral was taken for a job
-- back from its booking) are not the new life's.
redis.call('HDEL', KEYS[3], 'dead_reason', 'dead_at', 'expires_at', 'expires_after', 'first_started_at',
  'failed_token', 'cancel_requested', 'newer_since', 'newer_attempts', 'deferrals',
  'limit_slot')
if ARGV[2] == '1' then redis.call('HSET', KEYS[3], 'attempts', 0) end
if steps_ttl and steps_ttl > 0 then
  redis.pcall('PEXPIRE', ev_base(KEYS[4]) .. 'steps:' .. ARGV[1], int_str(steps_ttl))
end
redis.call('LREM', KEYS[1], 1, ARGV[1])
bump(KEYS[4], 'replayed', 1)
if h[4] and wf_member_unfinish(h[4], ARGV[1], KEYS[4]) then return 2 end
return 1

-- Repair (checker): a job hash that no structure lists goes back where its
-- state says: a dead job to the dead list, a delayed job whose run_at is
-- still ahead to the delayed set at that time (state and run_at kept), an
-- active job whose lease (in the leases zset) is its delivery's and still
-- ahead back to processing (token and lease kept: its worker is running it
-- and acks it), an active job whose attempts are exhausted (its lost
-- delivery was its last: reclaim.lua's rule) or whose counts are corrupt to
-- the dead list, any other to main (state queued, its old delivery forgotten,
-- no attempt used). Only while it is still listed nowhere: a job that moved
-- meanwhile is left alone.
-- KEYS: 1 main, 2 processing, 3 delayed, 4 dead, 5 leases, 6 job hash,
--       7 promoter wake list (below), 8 guard (never written: see keys.rs; the
--         script reaches the group list and the ring), 9 stats
-- A delayed job due before the delayed head wakes a sleeping promoter.
-- ARGV: 1 id, 2 the longest lease a worker takes (ms)
-- Returns 'main' | 'delayed' | 'processing' | 'dead' | 'exhausted' | 'changed'
local id = ARGV[1]
local max_lease = arg_count(ARGV[2], 'max_lease')
local group = redis.call('TYPE', KEYS[6])['ok'] == 'hash' and redis.call('HGET', KEYS[6], 'group')
if redis.call('TYPE', KEYS[6])['ok'] ~= 'hash' or redis.call('LPOS', KEYS[1], id)
    or waiting_group_list(KEYS[1], id, group)
    or redis.call('LPOS', KEYS[2], id) or redis.call('LPOS', KEYS[4], id)
    or redis.call('ZSCORE', KEYS[3], id) then
  return 'changed'
end
-- Every list written below (the group's list and the ring included) is
-- checked before the first write.
expect_types(KEYS[2], 'list', KEYS[3], 'zset', KEYS[4], 'list', KEYS[5], 'zset')
expect_waiting_types(KEYS[1], group)
local now = now_ms()
local h = redis.call('HMGET', KEYS[6], 'state', 'run_at', 'token', 'lease_until', 'attempts', 'max_attempts')
if h[1] == 'dead' then
  redis.call('LPUSH', KEYS[4], id)
  redis.call('HSET', KEYS[6], 'repaired_at', now)
  return 'dead'
end
-- A delayed job (a retry, a delayed enqueue, a version wait) keeps its time:
-- run now, it would run early (a week early for a job scheduled a week ahead).
local run_at = as_count(h[2])
if h[1] == 'delayed' and run_at and run_at > now then
  local wake = sooner_than_head(KEYS[3], run_at)
  redis.call('ZADD', KEYS[3], int_str(run_at), id)
  redis.call('HSET', KEYS[6], 'repaired_at', now)
  if wake then wake_promoter(KEYS[7]) end
  return 'delayed'
end
-- An active job whose lease runs is being run by a live worker (only its
-- processing entry was lost: an operator's DEL, an eviction): it goes back to
-- processing as it was. Requeued, a second worker would run it at the same
-- time and the first one's ack would answer lease lost. When the lease
-- expires the watchdog returns it as any lost delivery. Only a lease that is
-- the delivery's (claim and extend write the same time to both): a token, a
-- leases-set score equal to the hash's `lease_until`, and no further ahead
-- than the longest lease a worker takes. Restored with a score of inf,
-- 1e300 or months ahead (corrupt, hand-written), the job would stay in
-- processing for ever or for months: the watchdog returns expired leases
-- only.
local lease = tonumber(redis.call('ZSCORE', KEYS[5], id))
local lease_until = as_count(h[4])
if h[1] == 'active' and h[3] and h[3] ~= '' and lease_until and lease == lease_until
    and lease_until > now and lease_until <= now + max_lease then
  redis.call('LPUSH', KEYS[2], id)
  redis.call('HSET', KEYS[6], 'repaired_at', now)
  return 'processing'
end
-- An active job whose delivery was lost used an attempt on it: when that
-- was its last, it is dead-lettered with the watchdog's reason, as reclaim.lua
-- does with an expired lease (requeued, a max_attempts = 1 job ran twice);
-- corrupt counts are dead-lettered naming the field, as reclaim does.
if h[1] == 'active' then
  local attempts, max, bad = job_counts(h[5], h[6])
  local msg = 'lease expired: the worker died or stalled (its processing entry was lost)'
  if not bad and attempts >= max then
    bad = 'attempts exhausted (' .. attempts .. ' of ' .. max .. '): ' .. msg
  end
  if bad then
    local member = dead_letter(KEYS[6], KEYS[4], KEYS[9], id, bad, now)
    redis.call('HSET', KEYS[6], 'last_error', msg, 'failed_at', now, 'repaired_at', now)
    redis.call('ZREM', KEYS[5], id)
    dead_member(member, id, bad, now, KEYS[9])
    return 'exhausted'
  end
end
push_waiting(KEYS[1], id, group) -- main, or its group's list
-- Waiting from now on (`ready_at`: stats count its waiting age from here).
redis.call('HSET', KEYS[6], 'state', 'queued', 'repaired_at', now, 'ready_at', now)
-- A cancel asked of the lost delivery is not the next one's (extend.lua
-- would tell the next handler to cancel, fail.lua end it cancelled).
redis.call('HDEL', KEYS[6], 'token', 'lease_until', 'run_at', 'cancel_requested')
redis.call('ZREM', KEYS[5], id)
return 'main'

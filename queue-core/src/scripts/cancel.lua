-- Operator cancel of one job. Waiting (main, or moved by a BLMOVE and not yet
-- claimed) or delayed: a completion record with status `cancelled`, then the id
-- leaves its list and the hash is dropped. Running: `cancel_requested` is set on
-- the hash; the heartbeat (extend.lua) tells the handler. A job deferred for
-- its rate key (it carries `limit_slot`, docs/LIMITS.md) leaves its key's
-- index; with the index's last entry the key's booking goes too
-- (limits_unmark): kept, the key's next job waited behind the empty slots of
-- the cancelled chain. A cancel that empties a group's list takes the group
-- out of the ring (ring_drop), so that its next job joins the ring once.
-- KEYS: 1 main, 2 processing, 3 leases, 4 delayed, 5 job hash, 6 completion record,
--       7 stats, 8 step results, 9 guard (never written: see keys.rs), 10 limits hash
--   (The guard: the script reaches the group list and the ring, the history, the waiters' wake
--   list, the batch, and the rate key's index and booking named after KEYS 10.)
-- ARGV: 1 id, 2 retention_ms
-- Returns {'cancelled', state it was in} | {'requested', 1 if newly set else 0}
--   | {'finished', record status} | {'dead'} | {'not_found'} | {'unknown', state}
local id = ARGV[1]
-- At least 1 ms, as in finish_cancel.lua: PEXPIRE 0 would delete the record.
local retention = math.max(arg_count(ARGV[2], 'retention_ms'), 1)
expect_types(KEYS[1], 'list', KEYS[2], 'list', KEYS[3], 'zset', KEYS[4], 'zset')
local status = record_field(KEYS[6], 'status')
if status then return {'finished', status} end
local h = redis.call('HMGET', KEYS[5], 'state', 'attempts', 'type', 'enqueued_at', 'cancel_requested',
  'group', 'batch', 'rate_key', 'limit_slot')
local state = h[1]
if not state then return {'not_found'} end
if state == 'dead' then return {'dead'} end
local now = now_ms()
if state == 'active' then
  if h[5] then return {'requested', 0} end
  ev_hist(KEYS[7], id, KEYS[5], 'cancel_requested', '', now)
  redis.call('HSET', KEYS[5], 'cancel_requested', now)
  return {'requested', 1}
end
-- Where a queued job is: its group's list first for a grouped job (it
-- waits in no other list until a fetch takes it), then main, then
-- processing (taken by a BLMOVE, not yet claimed). Each list is looked at
-- from both ends first (SEARCH entries each: a job enqueued lately sits at
-- the head, one waiting long at the tail), walked whole only when not
-- there, and the id is removed from the end that held it. Before, main and
-- processing were each walked from the head, and then the id removed from
-- the head again: cancelling the oldest of 3,000,000 waiting jobs blocked
-- Redis for 263 ms, a grouped job 150 ms (stop 48 review).
local SEARCH = '1000'
local function find(list)
  if redis.call('LPOS', list, id, 'MAXLEN', SEARCH) then return list, 1 end
  if redis.call('LPOS', list, id, 'RANK', -1, 'MAXLEN', SEARCH) then return list, -1 end
  if redis.call('LLEN', list) <= 2 * tonumber(SEARCH) then return nil end
  if redis.call('LPOS', list, id, 'RANK', -1) then return list, -1 end
  return nil
end
local source, grouped, from_end
if state == 'queued' then
  source = waiting_group_list(KEYS[1], id, h[6])
  grouped = source ~= nil
  if not source then source, from_end = find(KEYS[1]) end
  if not source then source, from_end = find(KEYS[2]) end
elseif state == 'delayed' and redis.call('ZSCORE', KEYS[4], id) then
  source = KEYS[4]
end
if not source then return {'unknown', state} end
ev_hist(KEYS[7], id, KEYS[5], 'cancelled', 'from ' .. state, now, retention)
cancel_record(KEYS[6], KEYS[8], h[2], h[3], h[4], state, retention, now)
if source == KEYS[4] then
  redis.call('ZREM', KEYS[4], id)
else
  -- From processing: the BLMOVE's claim finds the id gone and runs nothing.
  redis.call('LREM', source, from_end or 1, id)
  redis.call('ZREM', KEYS[3], id)
  if grouped and redis.call('LLEN', source) == 0 then ring_drop(KEYS[1], h[6]) end
end
redis.call('DEL', KEYS[5])
bump(KEYS[7], 'cancelled', 1)
if h[7] then wf_member_finished(h[7], id, 'cancelled', 'cancelled', now, KEYS[7]) end
if h[9] and h[8] and h[8] ~= '' then limits_unmark({key = KEYS[10]}, h[8], id, KEYS[5], true) end
return {'cancelled', state}

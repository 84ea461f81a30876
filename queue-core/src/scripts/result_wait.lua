-- Before a producer blocks for a job's outcome (Queue::wait_result): answers the completion
-- record when the job finished, the reason when it is dead-lettered, or else sets `notify`
-- on the job hash so that the script that finishes it (ack, dead-letter, cancel) wakes the
-- waiter on `q:{Q}:notify:<id>`. One atomic step: the outcome cannot land between the check
-- and the flag, so no wake-up is lost.
-- KEYS: 1 job hash, 2 completion record
-- ARGV: none
-- Returns {'finished', field, value, ...} (the record) | {'dead', reason} | {'unknown'}
--   | {'waiting', state}
local rec = record_all(KEYS[2])
if #rec > 0 then
  local out = {'finished'}
  for i = 1, #rec do out[i + 1] = rec[i] end
  return out
end
local h = redis.call('HMGET', KEYS[1], 'state', 'dead_reason', 'notify')
if not h[1] then return {'unknown'} end
if h[1] == 'dead' then return {'dead', h[2] or ''} end
-- `notify` counts the waiters, so the finishing script wakes each one.
redis.call('HSET', KEYS[1], 'notify', math.min((as_count(h[3]) or 0) + 1, 1000))
return {'waiting', h[1]}

-- Before a producer blocks for a job's outcome (Queue::wait_result): answers the completion
-- record when the job finished, the reason when it is dead-lettered, or else sets `notify`
-- on the job hash so that the script that finishes it (ack, dead-letter, cancel) wakes the
-- waiter on `q:{Q}:notify:<id>`. One atomic step: the outcome cannot land between the check
-- and the flag, so no wake-up is lost.
-- KEYS: 1 job hash, 2 completion record, 3 the notification list `q:{Q}:notify:<id>`
-- ARGV: 1 '1' when this check follows a wake the caller took from KEYS[3], else '0'
-- Returns {'finished', field, value, ...} (the record) | {'dead', reason} | {'unknown'}
--   | {'waiting', state}
-- A woken caller that gets an answer other than 'waiting' passes its wake on (one element
-- back on KEYS[3], which expires after 60 s like results_wake's): the finishing script pushes
-- at most 100, so waiters beyond the first 100 are woken by those before them. The list
-- never grows past what results_wake pushed (each relay replaces the wake it took).
if ARGV[1] ~= '0' and ARGV[1] ~= '1' then
  return redis.error_reply('result_wait: woken must be 0 or 1, got ' .. tostring(ARGV[1]))
end
local function answer(reply)
  if ARGV[1] == '1' and type(redis.pcall('LPUSH', KEYS[3], '1')) == 'number' then
    redis.call('PEXPIRE', KEYS[3], 60000)
  end
  return reply
end
local rec = record_all(KEYS[2])
if #rec > 0 then
  local out = {'finished'}
  for i = 1, #rec do out[i + 1] = rec[i] end
  return answer(out)
end
local h = redis.call('HMGET', KEYS[1], 'state', 'dead_reason', 'notify')
if not h[1] then return answer({'unknown'}) end
if h[1] == 'dead' then return answer({'dead', h[2] or ''}) end
-- `notify` counts the waiters, so the finishing script wakes each one.
redis.call('HSET', KEYS[1], 'notify', math.min((as_count(h[3]) or 0) + 1, 1000))
return {'waiting', h[1]}

-- Before a producer blocks for a job's outcome (Queue::wait_result): answers the completion
-- record when the job finished, the reason when it is dead-lettered, or else sets `notify`
-- on the job hash so that the script that finishes it (ack, dead-letter, cancel) wakes the
-- waiter on `q:{Q}:notify:<id>`. One atomic step: the outcome cannot land between the check
-- and the flag, so no wake-up is lost.
-- A job not created yet because it is a callback of a sealed batch (a flow's parent, a
-- batch's callback, a DAG step waiting for earlier steps: the queue's pending hash maps
-- its id to the batch key, batch_seal.lua) counts the waiter in the batch hash instead
-- (`notify:<id>`), in the same atomic step; the script that fires the batch moves the
-- count to the job it creates (wf_spawn), or wakes the waiters when it creates none
-- (wf_unpend). The callback lives on the batch's queue: one slot (checked).
-- KEYS: 1 job hash, 2 completion record, 3 the notification list `q:{Q}:notify:<id>`,
--       4 the pending hash `q:{Q}:pending`, 5 `q:{Q}:guard` (never written: the batch
--       hash is reached undeclared)
-- ARGV: 1 '1' when this check follows a wake the caller took from KEYS[3], else '0',
--       2 the job id, 3 '1' when the caller's last check answered {'waiting', 'pending'}
--       (it is counted on the batch hash already), else '0'
-- A caller that was pending re-checks every few seconds (a batch fired by an older
-- queue-core version, without wf_spawn's move or wf_unpend, wakes nobody): when it then
-- finds the job or its record, a pending entry still naming the id whose batch is no
-- longer sealed (that old fire left it) is dropped.
-- Returns {'finished', field, value, ...} (the record) | {'dead', reason} | {'unknown'}
--   | {'waiting', state}
-- A woken caller that gets an answer other than 'waiting' passes its wake on (one element
-- back on KEYS[3], which expires after 60 s like results_wake's): the finishing script pushes
-- at most 100, so waiters beyond the first 100 are woken by those before them. The list
-- never grows past what results_wake pushed (each relay replaces the wake it took).
if ARGV[1] ~= '0' and ARGV[1] ~= '1' then
  return redis.error_reply('result_wait: woken must be 0 or 1, got ' .. tostring(ARGV[1]))
end
if ARGV[3] ~= '0' and ARGV[3] ~= '1' then
  return redis.error_reply('result_wait: was_pending must be 0 or 1, got ' .. tostring(ARGV[3]))
end
local id, base = ARGV[2], wf_base(KEYS[4])
if not id or id == '' or not base or KEYS[4] ~= base .. 'pending' or KEYS[1] ~= base .. 'job:' .. id then
  return redis.error_reply('result_wait: keys and id ' .. tostring(id) .. ' do not match')
end
-- Only after a pending answer (rolling deploy, see above): never raises.
local function unpend_stale()
  if ARGV[3] ~= '1' then return end
  local bkey = redis.pcall('HGET', KEYS[4], id)
  if type(bkey) ~= 'string' then return end
  local st = wf_base(bkey) == base and redis.pcall('HGET', bkey, 'state')
  if st ~= 'sealed' then redis.pcall('HDEL', KEYS[4], id) end
end
local function answer(reply)
  if ARGV[1] == '1' and type(redis.pcall('LPUSH', KEYS[3], '1')) == 'number' then
    redis.call('PEXPIRE', KEYS[3], 60000)
  end
  return reply
end
local rec = record_all(KEYS[2])
if #rec > 0 then
  unpend_stale()
  local out = {'finished'}
  for i = 1, #rec do out[i + 1] = rec[i] end
  return answer(out)
end
local h = redis.call('HMGET', KEYS[1], 'state', 'dead_reason', 'notify')
if not h[1] then
  local bkey = redis.pcall('HGET', KEYS[4], id)
  if type(bkey) ~= 'string' then return answer({'unknown'}) end
  local b = wf_base(bkey) == base and redis.pcall('HMGET', bkey, 'state', 's_id', 'c_id', 'notify:' .. id)
  if type(b) ~= 'table' or b[1] ~= 'sealed' or (b[2] ~= id and b[3] ~= id) then
    -- A stale entry (its batch gone, or fired): dropped.
    redis.call('HDEL', KEYS[4], id)
    return answer({'unknown'})
  end
  -- A pending caller re-checking after a BLPOP that timed out is counted already.
  if not (ARGV[3] == '1' and ARGV[1] == '0' and as_count(b[4])) then
    redis.call('HSET', bkey, 'notify:' .. id, math.min((as_count(b[4]) or 0) + 1, 1000))
  end
  return {'waiting', 'pending'}
end
unpend_stale()
if h[1] == 'dead' then return answer({'dead', h[2] or ''}) end
-- `notify` counts the waiters, so the finishing script wakes each one.
redis.call('HSET', KEYS[1], 'notify', math.min((as_count(h[3]) or 0) + 1, 1000))
return {'waiting', h[1]}

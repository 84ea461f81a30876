-- Seals a batch once all its members are registered and enqueued: from now
-- on it fires as soon as every member finished (at once, if they already
-- have). The open TTL (batch_open.lua) is dropped: a sealed batch waits for
-- its members as long as they take. Sealing a sealed batch again only checks
-- whether it fires (wf_maybe_fire): the operator's re-check once a count
-- that kept it from firing (`count_error` "batch not fired: ...") is
-- repaired, since nothing else would check it again (a member's end counts
-- once). Idempotent: a batch that does not fire yet, or fired already,
-- changes nothing. Before, a sealed batch was left as it was, and one held
-- back by a corrupt count never fired once repaired.
-- The batch's callbacks (not created until it fires) enter the queue's
-- pending hash, callback id -> batch key, so that a producer waiting for one
-- before then waits (result_wait.lua) instead of finding nothing; the fire
-- removes them (wf_unpend). An id already pending for another batch still sealed keeps
-- that entry. A pending hash of another type (corrupt) only
-- leaves them out (logged): the seal goes on.
-- KEYS: 1 batch hash, 2 the pending hash of the batch's queue (`q:{Q}:pending`),
--       3 its guard `q:{Q}:guard` (never written: see keys.rs; a fire reaches the batch's
--         sets, the callbacks' job hashes and lists, the waiters' wake lists)
-- ARGV: none
-- Returns {'sealed' | 'fired'} | {'missing'}; {'fired', 'relay'} when the fire wrote relay
-- notices (a dead-lettered parent or step counted in a batch on another queue): the
-- caller relays the queue at once (before, they waited for a watchdog pass).
local base = wf_base(KEYS[1])
if not base or KEYS[2] ~= base .. 'pending' then
  return redis.error_reply('ERR batch_seal: ' .. tostring(KEYS[2]) .. ' is not the pending hash of ' .. KEYS[1])
end
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'hash' then return {'missing'} end
local state = redis.call('HGET', KEYS[1], 'state')
local now = now_ms()
if state == 'open' then
  local pend_bad = key_type_bad(KEYS[2], 'hash')
  redis.call('PERSIST', KEYS[1])
  redis.call('HDEL', KEYS[1], 'expires_at')
  redis.call('HSET', KEYS[1], 'state', 'sealed', 'sealed_at', now)
  if pend_bad then
    redis.log(redis.LOG_WARNING, 'batch ' .. KEYS[1] .. ': callbacks not marked pending (' .. pend_bad ..
      '): waiting for one before it exists answers NotFound')
  else
    local cb = redis.call('HMGET', KEYS[1], 's_base', 's_id', 'c_base', 'c_id')
    for i = 1, 3, 2 do
      if cb[i] == base and cb[i + 1] and cb[i + 1] ~= '' then
        -- The same id as a callback of another batch still sealed: the first keeps the
        -- entry (its fire removes it; a waiter waits for the first job of that id).
        local other = redis.call('HGET', KEYS[2], cb[i + 1])
        if not other or other == KEYS[1] or wf_base(other) ~= base
            or redis.pcall('HGET', other, 'state') ~= 'sealed' then
          redis.call('HSET', KEYS[2], cb[i + 1], KEYS[1])
        end
      end
    end
  end
end
local relayed = false
if state == 'open' or state == 'sealed' then relayed = wf_maybe_fire(KEYS[1], now) end
local after = redis.call('HGET', KEYS[1], 'state') or 'missing'
if relayed then return {after, 'relay'} end
return {after}

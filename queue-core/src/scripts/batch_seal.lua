-- Seals a batch once all its members are registered and enqueued: from now
-- on it fires as soon as every member finished (at once, if they already
-- have). The open TTL (batch_open.lua) is dropped: a sealed batch waits for
-- its members as long as they take. Sealing again changes nothing.
-- KEYS: 1 batch hash
-- ARGV: none
-- Returns {'sealed' | 'fired'} | {'missing'}
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'hash' then return {'missing'} end
local state = redis.call('HGET', KEYS[1], 'state')
local now = now_ms()
if state == 'open' then
  redis.call('PERSIST', KEYS[1])
  redis.call('HDEL', KEYS[1], 'expires_at')
  redis.call('HSET', KEYS[1], 'state', 'sealed', 'sealed_at', now)
  wf_maybe_fire(KEYS[1], now)
end
return {redis.call('HGET', KEYS[1], 'state') or 'missing'}

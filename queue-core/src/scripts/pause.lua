-- Pauses a queue: sets its pause flag to the Redis time, unless it is already set.
-- Workers then fetch nothing from the queue (fetch.lua, claim.lua check the flag).
-- KEYS: 1 paused flag
-- ARGV: none
-- Returns {1 if it was already paused else 0, paused since (ms)}.
local since = redis.call('GET', KEYS[1])
if since then return {1, tonumber(since) or 0} end
local now = now_ms()
redis.call('SET', KEYS[1], now)
return {0, now}

-- Resumes a queue: drops its pause flag.
-- KEYS: 1 paused flag
-- ARGV: none
-- Returns {1 if it was paused else 0, paused since (ms), 0 if it was not paused}.
local since = redis.call('GET', KEYS[1])
if not since then return {0, 0} end
redis.call('DEL', KEYS[1])
return {1, tonumber(since) or 0}

-- Pauses or resumes one group of a queue (docs/GROUPS.md): the group's field in
-- the paused-groups hash holds the Redis time of its pause. Fetches skip a
-- paused group's list (next_waiting in the prelude); its jobs stay waiting.
-- KEYS: 1 paused-groups hash
-- ARGV: 1 group, 2 'pause' | 'resume'
-- Returns {1 if the group was paused before else 0, paused since (ms), 0 if it was not paused}.
expect_types(KEYS[1], 'hash')
if ARGV[1] == '' then return redis.error_reply('ERR invalid argument group: empty') end
if ARGV[2] ~= 'pause' and ARGV[2] ~= 'resume' then
  return redis.error_reply('ERR invalid argument mode: ' .. tostring(ARGV[2]))
end
local since = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == 'pause' then
  if since then return {1, tonumber(since) or 0} end
  local now = now_ms()
  redis.call('HSET', KEYS[1], ARGV[1], now)
  return {0, now}
end
if not since then return {0, 0} end
redis.call('HDEL', KEYS[1], ARGV[1])
return {1, tonumber(since) or 0}

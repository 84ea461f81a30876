-- Pauses or resumes one group of a queue (docs/GROUPS.md): the group's field in
-- the paused-groups hash holds the Redis time of its pause. Fetches skip a
-- paused group's list and take it out of the ring (next_waiting in the
-- prelude); its jobs stay waiting. A resume puts the group back in the ring
-- while its list has jobs, so they are served again (idle fetchers notice the ring),
-- and does so for a group that was not paused too: an older version's resume
-- (pause entry deleted only, during a rolling deploy) can leave a group with
-- jobs out of the ring, and a resume by this version must put it back.
-- KEYS: 1 paused-groups hash, 2 ring, 3 the group's list
-- ARGV: 1 group, 2 'pause' | 'resume'
-- Returns {1 if the group was paused before else 0, paused since (ms), 0 if it was not paused}.
expect_types(KEYS[1], 'hash', KEYS[2], 'list')
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
-- The ring before the pause entry goes (destination first), paused or not
-- (see above; ring_add is a no-op for a group already there). A group list
-- of another type (corrupt data) is left out, as a fetch skips it.
local waiting = redis.pcall('LLEN', KEYS[3])
if type(waiting) == 'number' and waiting > 0 then ring_add(KEYS[2], ARGV[1]) end
if not since then return {0, 0} end
redis.call('HDEL', KEYS[1], ARGV[1])
return {1, tonumber(since) or 0}

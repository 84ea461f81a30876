-- Watchdog pass: trims the dead-letter list from its oldest end (the tail:
-- dead_letter() pushes at the head) while it is longer than `max_len` or its
-- oldest entry died more than `retention_ms` ago, at most `limit` ids per call.
-- Each trimmed id's hash and step results are deleted with it (only while the
-- hash still says `dead`: an id whose hash says otherwise is only unlisted).
-- An entry whose hash is missing or has no readable `dead_at` counts as expired,
-- and so does a `dead_at` that is no Redis-clock ms (inf, 1e300, a fraction)
-- or more than a day ahead of the Redis clock (a hand edit): kept, it stopped
-- every later trim at the tail for good. A day tolerates a failover to a
-- server whose clock is somewhat behind without deleting recent dead letters.
-- All reads come before the writes of each id; the counter is bumped last.
-- KEYS: 1 dead, 2 stats, 3 guard
-- ARGV: 1 job key prefix, 2 step results key prefix, 3 max_len (0: no limit),
--       4 retention_ms (0: keep forever), 5 limit (ids per call)
-- Returns {trimmed, dead list length after}
local function count(v, name)
  local n = tonumber(v)
  if not n or n ~= n or n < 0 or n == math.huge then
    return nil, redis.error_reply('ERR dead_trim: ' .. name .. ' must be a non-negative integer, got ' .. tostring(v))
  end
  return math.floor(n)
end
local max_len, e1 = count(ARGV[3], 'max_len')
if e1 then return e1 end
local retention, e2 = count(ARGV[4], 'retention_ms')
if e2 then return e2 end
local limit, e3 = count(ARGV[5], 'limit')
if e3 then return e3 end
local now = now_ms()
local len = redis.call('LLEN', KEYS[1])
local trimmed = 0
while trimmed < limit and len > 0 do
  local id = redis.call('LINDEX', KEYS[1], -1)
  local jobkey = ARGV[1] .. id
  -- A job key of another type (corrupt data) is unlisted, never deleted,
  -- and does not stop the trim half-way (the RPOPs before it stay).
  local h = redis.pcall('HMGET', jobkey, 'state', 'dead_at')
  if h['err'] then h = {'corrupt'} end
  local expire = max_len > 0 and len > max_len
  if not expire and retention > 0 then
    local dead_at = as_count(h[2])
    expire = (not dead_at) or dead_at > now + 86400000 or now - dead_at > retention
  end
  if not expire then break end
  redis.call('RPOP', KEYS[1])
  if h[1] == false or h[1] == 'dead' then
    redis.call('DEL', jobkey, ARGV[2] .. id)
    hist_close(KEYS[2], id)
  end
  len = len - 1
  trimmed = trimmed + 1
end
if trimmed > 0 then
  bump(KEYS[2], 'trimmed', trimmed)
end
return {trimmed, len}

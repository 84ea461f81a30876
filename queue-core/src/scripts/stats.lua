-- A consistent snapshot of a queue's lengths, counters and ages (read-only).
-- KEYS: 1 main, 2 processing, 3 delayed, 4 dead, 5 stats, 6 guard (never written: see keys.rs),
--       7 paused flag
-- ARGV: 1 job prefix, 2 throughput key prefix,
--       3 the most group lists to read (optional: absent reads every one; 0 reads none)
-- Returns {main, processing, delayed, dead, {field, value, ...}, now_ms,
--          since when the oldest waiting job waits (its `ready_at`, else its
--          `enqueued_at`; 0 if none), completions this minute,
--          completions previous minute, paused since (ms, 0: not paused),
--          jobs waiting in group lists (docs/GROUPS.md), group keys (lists, ring, pause hash) left out
--          because they hold another type (corrupt data), 1 when the group
--          limit left groups unread (the grouped count is then a lower bound) else 0}
local limit
if ARGV[3] then limit = arg_count(ARGV[3], 'group limit') end
local now = now_ms()
local oldest = 0
local tail = redis.call('LINDEX', KEYS[1], -1)
if tail then
  -- `ready_at`: when a job that came back (promoted, replayed, repaired) last
  -- started waiting; a job waiting since its enqueue has none. A job key of
  -- another type (corrupt data) reads as none.
  local h = read_job(ARGV[1] .. tail, 'ready_at', 'enqueued_at')
  if h then oldest = as_count(h[1]) or as_count(h[2]) or 0 end
end
local minute = math.floor(now / 60000)
local cur = tonumber(redis.call('GET', ARGV[2] .. minute)) or 0
local prev = tonumber(redis.call('GET', ARGV[2] .. (minute - 1))) or 0
local grouped, unreadable, partial = grouped_waiting(KEYS[1], limit)
return {redis.call('LLEN', KEYS[1]), redis.call('LLEN', KEYS[2]), redis.call('ZCARD', KEYS[3]),
  redis.call('LLEN', KEYS[4]), redis.call('HGETALL', KEYS[5]), now, oldest, cur, prev,
  tonumber(redis.call('GET', KEYS[7]) or '0') or 0, grouped, unreadable, partial and 1 or 0}

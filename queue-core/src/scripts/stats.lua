-- A consistent snapshot of a queue's lengths, counters and ages (read-only).
-- KEYS: 1 main, 2 processing, 3 delayed, 4 dead, 5 stats, 6 guard (never written: see keys.rs),
--       7 paused flag
-- ARGV: 1 job prefix, 2 throughput key prefix
-- Returns {main, processing, delayed, dead, {field, value, ...}, now_ms,
--          oldest waiting job's enqueued_at (0 if none), completions this minute,
--          completions previous minute, paused since (ms, 0: not paused),
--          jobs waiting in group lists (docs/GROUPS.md)}
local now = now_ms()
local oldest = 0
local tail = redis.call('LINDEX', KEYS[1], -1)
if tail then oldest = tonumber(redis.call('HGET', ARGV[1] .. tail, 'enqueued_at')) or 0 end
local minute = math.floor(now / 60000)
local cur = tonumber(redis.call('GET', ARGV[2] .. minute)) or 0
local prev = tonumber(redis.call('GET', ARGV[2] .. (minute - 1))) or 0
return {redis.call('LLEN', KEYS[1]), redis.call('LLEN', KEYS[2]), redis.call('ZCARD', KEYS[3]),
  redis.call('LLEN', KEYS[4]), redis.call('HGETALL', KEYS[5]), now, oldest, cur, prev,
  tonumber(redis.call('GET', KEYS[7]) or '0') or 0, grouped_waiting(KEYS[1])}

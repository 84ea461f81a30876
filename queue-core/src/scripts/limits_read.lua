-- Reads a queue's limits and how much of them is in use (docs/LIMITS.md).
-- KEYS: 1 limits hash, 2 leases, 3 guard (never written: see keys.rs; the script reads
--       the queue rate's start log)
-- ARGV: none
-- Returns {limits hash as name/value pairs, live leases (running jobs),
--          starts in the queue rate window (0 without a queue rate)}.
expect_types(KEYS[1], 'hash', KEYS[2], 'zset')
local now = now_ms()
local fields = redis.call('HGETALL', KEYS[1])
local running = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local started = 0
local rate = limit_rate(redis.call('HGET', KEYS[1], 'rate'))
if rate then
  expect_types(KEYS[1] .. ':started', 'zset')
  started = redis.call('ZCOUNT', KEYS[1] .. ':started', now - rate[2] + 1, '+inf')
end
return {fields, running, started}

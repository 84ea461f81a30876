-- A consistent snapshot of a queue's lengths and counters (read-only).
-- KEYS: 1 main, 2 processing, 3 delayed, 4 dead, 5 stats
-- Returns {main, processing, delayed, dead, {field, value, ...}}
return {redis.call('LLEN', KEYS[1]), redis.call('LLEN', KEYS[2]), redis.call('ZCARD', KEYS[3]),
  redis.call('LLEN', KEYS[4]), redis.call('HGETALL', KEYS[5])}

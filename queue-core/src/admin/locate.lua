-- Read-only: where job `id` is now.
-- KEYS: 1 main, 2 processing, 3 delayed, 4 dead, 5 leases, 6 job hash, 7 completion record
-- ARGV: 1 id
-- Returns {now_ms, index in main (-1: absent), main length, index in processing,
--          delayed run_at ('' absent), index in dead, lease expiry ('' none),
--          job hash exists (1/0), completion record exists (1/0)}
local id = ARGV[1]
return {now_ms(),
  redis.call('LPOS', KEYS[1], id) or -1, redis.call('LLEN', KEYS[1]),
  redis.call('LPOS', KEYS[2], id) or -1,
  redis.call('ZSCORE', KEYS[3], id) or '',
  redis.call('LPOS', KEYS[4], id) or -1,
  redis.call('ZSCORE', KEYS[5], id) or '',
  redis.call('EXISTS', KEYS[6]), redis.call('EXISTS', KEYS[7])}

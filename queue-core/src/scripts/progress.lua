-- Records the progress of a running delivery (`ctx.progress(n, message)`), only while the
-- job is active under this delivery's lease token (DESIGN rule 3): a stale delivery
-- (reclaimed, or woken after the job finished) writes nothing. Fields `progress`,
-- `progress_message`, `progress_at` (Redis clock) of the job hash; they go with the hash.
-- KEYS: 1 job hash
-- ARGV: 1 token, 2 progress (a non-negative integer), 3 message
-- Returns 1 when stored, 0 when the delivery no longer owns the job.
local n = arg_count(ARGV[2], 'progress')
local h = redis.call('HMGET', KEYS[1], 'token', 'state')
if h[2] ~= 'active' or h[1] ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'progress', n, 'progress_message', utf8_cut(ARGV[3], 1024),
  'progress_at', now_ms())
return 1

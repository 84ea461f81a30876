-- A periodic job's last handled firing, kept per queue in the cron hash
-- (field: the job type; value: `<unix seconds> <schedule>`), so that a
-- scheduler starting after every worker was down knows which firings no one
-- enqueued (background/scheduler.rs). Never moved back for the same
-- schedule (workers mark in any order); replaced when it is of a different
-- schedule (a deploy that changed it), unreadable (not `<digits> <schedule>`),
-- or ahead of the Redis clock (written while the clock was ahead: kept, it
-- would refuse every mark until the clock caught up).
-- KEYS: 1 cron hash
-- ARGV: 1 job type, 2 firing (unix seconds), 3 schedule expression
-- Returns 1 when the record was written, 0 when it already held this firing
-- or a later one of the same schedule.
local at = arg_count(ARGV[2], 'firing')
if ARGV[1] == '' then
  return redis.error_reply('ERR invalid argument job type: empty')
end
expect_types(KEYS[1], 'hash')
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local space = string.find(cur, ' ', 1, true)
  local digits = space and string.sub(cur, 1, space - 1)
  local secs = digits and string.find(digits, '^%d+$') and tonumber(digits)
  if secs and string.sub(cur, space + 1) == ARGV[3] and secs >= at
    and secs <= math.floor(now_ms() / 1000) then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], int_str(at) .. ' ' .. ARGV[3])
return 1

-- Read-only: the next `limit` jobs to run from main (oldest first) and from
-- the delayed set (soonest first).
-- KEYS: 1 main, 2 delayed
-- ARGV: 1 job prefix, 2 limit
-- Returns {now_ms, main rows, delayed rows}; a row is
--   {id, time (enqueued_at for main, run_at for delayed), type, attempts, last_error}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[2])
local function row(id, at)
  local h = redis.call('HMGET', ARGV[1] .. id, 'enqueued_at', 'type', 'attempts', 'last_error')
  return {id, at or h[1] or '', h[2] or '', h[3] or '', h[4] or ''}
end
local main = {}
local ids = redis.call('LRANGE', KEYS[1], -limit, -1)
for i = #ids, 1, -1 do main[#main + 1] = row(ids[i], nil) end
local delayed = {}
local d = redis.call('ZRANGE', KEYS[2], 0, limit - 1, 'WITHSCORES')
for i = 1, #d, 2 do delayed[#delayed + 1] = row(d[i], d[i + 1]) end
return {now, main, delayed}

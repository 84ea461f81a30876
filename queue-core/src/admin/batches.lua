-- Read-only: one page of a queue's batch index (newest first), each entry
-- with its batch's state and counts in the same snapshot. An entry whose
-- batch expired (not yet swept by batch_open.lua) comes back with state ''.
-- KEYS: 1 batch index (zset id -> created_at), 2 guard (never written)
-- ARGV: 1 offset, 2 limit, 3 batch key prefix (`q:{Q}:batch:`)
-- Returns {now_ms, entries in the index, {id, created_at, state, total,
--          succeeded, dead, cancelled, failed, sealed_at, fired_at,
--          expires_at, m_dag} ...} (missing fields: '')
local offset, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local total = redis.call('ZCARD', KEYS[1])
local rows = {}
if limit > 0 then
  local ids = redis.call('ZREVRANGE', KEYS[1], offset, offset + limit - 1, 'WITHSCORES')
  for i = 1, #ids, 2 do
    local row = {ids[i], ids[i + 1]}
    local bkey = ARGV[3] .. ids[i]
    if redis.call('TYPE', bkey)['ok'] == 'hash' then
      local f = redis.call('HMGET', bkey, 'state', 'total', 'succeeded', 'dead', 'cancelled',
        'failed', 'sealed_at', 'fired_at', 'expires_at', 'm_dag')
      for j = 1, 10 do row[#row + 1] = f[j] or '' end
    else
      for _ = 1, 10 do row[#row + 1] = '' end
    end
    rows[#rows + 1] = row
  end
end
return {now_ms(), total, rows}

-- Opens a batch (docs/WORKFLOWS.md): creates its hash in state `open` with
-- zero counts, the default member policy, the callbacks' job specs and
-- optional metadata (`m_dag`, `m_steps`: the DAG it belongs to). An open
-- batch expires after the open TTL unless sealed (a producer that died
-- before the seal and never retried leaves nothing forever; batch_seal.lua
-- drops the TTL). A batch that exists is kept as it is (a retried call, or
-- a stable batch id used again): the reply says its state.
-- A new batch enters the queue's index (sorted set id -> created_at), and
-- the open sweeps a few index entries from a rotating rank: an entry whose
-- batch hash expired leaves the index, with the batch's leftover sets.
-- A new batch starts with empty sets: the `:members` / `:done` / `:results`
-- left by an earlier batch of this id whose hash expired (a
-- producer that died before the seal, retrying after the open TTL) are
-- deleted first. Kept, they made every id of the retry "already registered"
-- (`total` 0) and the seal fired the batch before any member ran.
-- A new batch's field `where` (1) says that its members on other queues
-- are recorded in its `where:<id>` fields (batch_add.lua): `batches show` reads the others
-- on the batch's queue; a batch opened by an older version has no such
-- field, and a member not found there is shown as possibly elsewhere.
-- KEYS: 1 batch hash, 2 batch index (zset), 3 sweep cursor (string), 4 guard of the
--       batch's queue (never written: see keys.rs; the script reaches the batch's sets
--       and the swept batches' keys)
-- ARGV: 1 default member policy ('' none | 'fail' | 'continue' | 'ignore'),
--       2 open TTL in ms (> 0), 3 batch id (the hash key ends with it),
--       then spec fields as name, value pairs (names `s_*` / `c_*` / `m_*`)
-- Returns {'new'} | {'exists', state}
local SWEEP = 5
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' then
  if t ~= 'hash' then
    return redis.error_reply('WRONGTYPE batch key ' .. KEYS[1] .. ' holds a ' .. t .. ': refused')
  end
  return {'exists', redis.call('HGET', KEYS[1], 'state') or ''}
end
local policy = ARGV[1]
if policy ~= '' and policy ~= 'fail' and policy ~= 'continue' and policy ~= 'ignore' then
  return redis.error_reply('ERR invalid argument policy: ' .. tostring(policy))
end
local ttl = tonumber(ARGV[2])
if not ttl or ttl <= 0 or ttl ~= math.floor(ttl) or ttl > 9007199254740991 then
  return redis.error_reply('ERR invalid argument open ttl: ' .. tostring(ARGV[2]))
end
local id = ARGV[3]
if id == '' or string.sub(KEYS[1], -#id) ~= id then
  return redis.error_reply('ERR invalid argument batch id: ' .. tostring(id))
end
if (#ARGV - 3) % 2 ~= 0 then
  return redis.error_reply('ERR invalid argument callback spec: name, value pairs expected')
end
local spec = {}
for i = 4, #ARGV, 2 do
  local p = string.sub(ARGV[i], 1, 2)
  if p ~= 's_' and p ~= 'c_' and p ~= 'm_' then
    return redis.error_reply('ERR invalid argument callback spec field: ' .. ARGV[i])
  end
  spec[#spec + 1] = ARGV[i]
  spec[#spec + 1] = ARGV[i + 1]
end
expect_types(KEYS[2], 'zset', KEYS[3], 'string')
local now = now_ms()
-- DEL cannot fail (any type): the stale sets go before the first HSET.
redis.call('DEL', KEYS[1] .. ':members', KEYS[1] .. ':done', KEYS[1] .. ':results')
redis.call('HSET', KEYS[1], 'state', 'open', 'total', 0, 'succeeded', 0, 'dead', 0,
  'cancelled', 0, 'failed', 0, 'created_at', now, 'expires_at', now + ttl, 'where', 1)
if policy ~= '' then redis.call('HSET', KEYS[1], 'policy', policy) end
if #spec > 0 then call_chunked('HSET', KEYS[1], spec) end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now, id)
-- The sweep: SWEEP entries from the cursor on (more than one open adds, so
-- it laps the index); the batches' keys share the prefix of KEYS[1].
local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #id)
local from = as_count(redis.call('GET', KEYS[3]) or '0') or 0
local seen = redis.call('ZRANGE', KEYS[2], from, from + SWEEP - 1)
local kept = 0
for _, other in ipairs(seen) do
  local bkey = prefix .. other
  if redis.call('EXISTS', bkey) == 0 then
    redis.call('ZREM', KEYS[2], other)
    redis.call('DEL', bkey .. ':members', bkey .. ':done', bkey .. ':results')
  else
    kept = kept + 1
  end
end
if #seen < SWEEP then from = 0 else from = from + kept end
redis.call('SET', KEYS[3], from)
return {'new'}

-- Opens a batch (docs/WORKFLOWS.md): creates its hash in state `open` with
-- zero counts, the default member policy and the callbacks' job specs. A
-- batch that exists is kept as it is (a retried call, or a stable batch id
-- used again): the reply says its state.
-- KEYS: 1 batch hash
-- ARGV: 1 default member policy ('' none | 'fail' | 'continue' | 'ignore'),
--       then callback spec fields as name, value pairs (names `s_*` / `c_*`)
-- Returns {'new'} | {'exists', state}
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
if (#ARGV - 1) % 2 ~= 0 then
  return redis.error_reply('ERR invalid argument callback spec: name, value pairs expected')
end
local spec = {}
for i = 2, #ARGV, 2 do
  local p = string.sub(ARGV[i], 1, 2)
  if p ~= 's_' and p ~= 'c_' then
    return redis.error_reply('ERR invalid argument callback spec field: ' .. ARGV[i])
  end
  spec[#spec + 1] = ARGV[i]
  spec[#spec + 1] = ARGV[i + 1]
end
redis.call('HSET', KEYS[1], 'state', 'open', 'total', 0, 'succeeded', 0, 'dead', 0,
  'cancelled', 0, 'failed', 0, 'created_at', now_ms())
if policy ~= '' then redis.call('HSET', KEYS[1], 'policy', policy) end
if #spec > 0 then redis.call('HSET', KEYS[1], unpack(spec)) end
return {'new'}

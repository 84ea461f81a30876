-- Read-only: everything about one batch in one snapshot, for `batches show`
-- and the dashboard's batch page: its named fields (not the callbacks'
-- payloads), its TTL, and its members (sorted, at most ARGV[3]) each with
-- whether it was counted, its recorded result, its job hash state and
-- whether its completion record exists.
-- KEYS: 1 batch hash, 2 guard (never written)
-- ARGV: 1 job prefix, 2 completion record prefix, 3 member cap
-- Returns {} when there is no such batch, else {now_ms, pttl, {name, value,
--          ...}, members registered, {id, counted 0/1, result, state, done 0/1} ...}
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return {} end
local names = {'state', 'total', 'succeeded', 'dead', 'cancelled', 'failed', 'failed_child',
  'fire_error', 'count_error', 'policy', 'created_at', 'sealed_at', 'fired_at', 'expires_at', 's_id', 's_type', 'c_id',
  'c_type', 'c_member', 'm_dag', 'm_steps'}
local values = redis.call('HMGET', KEYS[1], unpack(names))
local fields = {}
for i, n in ipairs(names) do
  if values[i] then
    fields[#fields + 1] = n
    fields[#fields + 1] = values[i]
  end
end
local function set_of(key)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'set' then return {} end
  return redis.call('SMEMBERS', key)
end
local members = set_of(KEYS[1] .. ':members')
table.sort(members)
local done = {}
for _, id in ipairs(set_of(KEYS[1] .. ':done')) do done[id] = true end
local results = KEYS[1] .. ':results'
local has_results = redis.call('TYPE', results)['ok'] == 'hash'
local rows = {}
for i = 1, math.min(#members, tonumber(ARGV[3])) do
  local id = members[i]
  local result = ''
  if has_results then result = redis.call('HGET', results, id) or '' end
  local state = ''
  local jobkey = ARGV[1] .. id
  if redis.call('TYPE', jobkey)['ok'] == 'hash' then
    state = redis.call('HGET', jobkey, 'state') or ''
  end
  rows[#rows + 1] = {id, done[id] and 1 or 0, result, state,
    redis.call('EXISTS', ARGV[2] .. id)}
end
return {now_ms(), redis.call('PTTL', KEYS[1]), fields, #members, rows}

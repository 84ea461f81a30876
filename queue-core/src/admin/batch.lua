-- Read-only: everything about one batch in one snapshot, for `batches show`
-- and the dashboard's batch page: its named fields (not the callbacks'
-- payloads), its TTL, and its members (at most ARGV[3], sorted) each with
-- whether it was counted, its recorded result, its job hash state and
-- whether its completion record exists. A batch of more members than the cap
-- lists a sample: the first ARGV[3] that SSCAN yields (not the first by id),
-- so the call costs O(cap), never O(members) (SMEMBERS + sort of 200k
-- members blocked Redis 610 ms).
-- A member on another queue (recorded in the batch field `where:<id>` by batch_add.lua)
-- is not looked up here: its keys are on another queue (another cluster
-- slot); its row names that queue, and the caller reads its state there
-- (batch_members.lua). A job hash here that does not name this batch in
-- its `batch` field is another job of the same id, not the member. A batch
-- opened before members' queues were kept (no field `where`) cannot tell a member
-- on another queue from one never enqueued: such a member, not found here,
-- has `?` as its queue.
-- KEYS: 1 batch hash, 2 guard (never written)
-- ARGV: 1 job prefix, 2 completion record prefix, 3 member cap
-- Returns {} when there is no such batch, else {now_ms, pttl, {name, value,
--          ...}, members registered, {{id, counted 0/1, result, state, done 0/1,
--          queue ('' this one, a queue name, or '?' unknown)} ...},
--          sample 0/1 (1: more members than listed)}
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return {} end
local names = {'state', 'total', 'succeeded', 'dead', 'cancelled', 'failed', 'failed_child',
  'fire_error', 'count_error', 'policy', 'created_at', 'sealed_at', 'fired_at', 'expires_at', 's_id', 's_type', 'c_id',
  'c_type', 'c_member', 'm_dag', 'm_steps', 'm_steps_total'}
local values = redis.call('HMGET', KEYS[1], unpack(names))
local fields = {}
for i, n in ipairs(names) do
  if values[i] then
    fields[#fields + 1] = n
    fields[#fields + 1] = values[i]
  end
end
local cap = tonumber(ARGV[3]) or 0
local members_key, done_key = KEYS[1] .. ':members', KEYS[1] .. ':done'
local registered, members = 0, {}
if redis.call('TYPE', members_key)['ok'] == 'set' then
  registered = redis.call('SCARD', members_key)
  if registered <= cap then
    members = redis.call('SMEMBERS', members_key)
  else
    -- At most cap members, SSCAN's COUNT bounding each step (a step may
    -- answer a few more, or repeat one: kept once).
    local seen, cursor = {}, '0'
    repeat
      local step = redis.call('SSCAN', members_key, cursor, 'COUNT', math.max(cap - #members, 10))
      cursor = step[1]
      for _, id in ipairs(step[2]) do
        if #members < cap and not seen[id] then
          seen[id] = true
          members[#members + 1] = id
        end
      end
    until cursor == '0' or #members >= cap
  end
end
table.sort(members)
local done = {}
if #members > 0 and redis.call('TYPE', done_key)['ok'] == 'set' then
  done = redis.call('SMISMEMBER', done_key, unpack(members))
end
local results = KEYS[1] .. ':results'
local has_results = redis.call('TYPE', results)['ok'] == 'hash'
local where = {}
if #members > 0 then
  local fields = {}
  for i = 1, #members do fields[i] = 'where:' .. members[i] end
  where = redis.call('HMGET', KEYS[1], unpack(fields))
end
local kept = redis.call('HGET', KEYS[1], 'where') == '1'
local rows = {}
for i = 1, #members do
  local id = members[i]
  local result = ''
  if has_results then result = redis.call('HGET', results, id) or '' end
  local state, queue, record = '', where[i] or '', 0
  if queue == '' then
    local jobkey = ARGV[1] .. id
    if redis.call('TYPE', jobkey)['ok'] == 'hash' then
      local h = redis.call('HMGET', jobkey, 'state', 'batch')
      -- One batch key a line (a DAG step feeding several batches).
      if h[2] and string.find('\n' .. h[2] .. '\n', '\n' .. KEYS[1] .. '\n', 1, true) then
        state = h[1] or ''
      end
    end
    record = redis.call('EXISTS', ARGV[2] .. id)
    if state == '' and not kept then queue = '?' end
  end
  rows[#rows + 1] = {id, done[i] or 0, result, state, record, queue}
end
return {now_ms(), redis.call('PTTL', KEYS[1]), fields, registered, rows,
  #members < registered and 1 or 0}

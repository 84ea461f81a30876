-- Read-only reads of the invariant checker (admin/check.rs), one consistent
-- snapshot per call: the key types and counters, one page of a structure, the
-- job hashes a SCAN found, everything about one id (the probe that
-- confirms a suspicion, so a job moving between two pages is never reported),
-- or one group's list length, ring membership and pause.
-- KEYS: 1 main, 2 processing, 3 delayed, 4 dead, 5 leases, 6 stats, 7 guard (never written)
-- ARGV: 1 mode ('types' | 'page' | 'hashes' | 'probe' | 'group'), 2 job prefix, 3 done prefix,
--       4 structure ('main' | 'processing' | 'delayed' | 'dead' | 'leases' | 'g:<group>', a
--       group's waiting list), 5 offset, 6 limit
--       (mode 'hashes': ARGV 4.. are job keys; mode 'probe': ARGV 4 is the id;
--        mode 'group': ARGV 4 is the group)
-- A row is {key type, state, attempts, max_attempts, token} (false: field missing).
-- Returns, by mode:
--   types:  {now, {type of KEYS 1..6}, stats fields and values (when a hash),
--            {type of the group ring, type of the group pause hash}}
--   page:   {now, length, {{id, lease expiry or false, row}, ...}}, or
--           {now, 0, {}, type} when the structure's key holds another type
--   hashes: {now, {{key, row}, ...}}
--   probe:  {now, main count (its group's list included), processing count, dead count, delayed score or false,
--            lease expiry or false, row, completion record exists (1/0)}
--   group:  {now, jobs in the group's list, in the ring (1/0), paused (1/0)}, each
--            false when its key holds another type
local mode, prefix = ARGV[1], ARGV[2]
local now = now_ms()

local function row(key)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'hash' then return {t, false, false, false, false} end
  local h = redis.call('HMGET', key, 'state', 'attempts', 'max_attempts', 'token')
  return {t, h[1], h[2], h[3], h[4]}
end

-- How many times `id` is in the waiting list of its group (job field `group`).
local function in_group_list(main, jobkey, id)
  if redis.call('TYPE', jobkey)['ok'] ~= 'hash' then return 0 end
  local group = group_of(redis.call('HGET', jobkey, 'group'))
  if not group then return 0 end
  local _, gprefix = group_keys(main)
  -- A group list of another type (corrupt data) lists nothing; mode 'page'
  -- returns its type for the report.
  if redis.call('TYPE', gprefix .. group)['ok'] ~= 'list' then return 0 end
  return #redis.call('LPOS', gprefix .. group, id, 'COUNT', 0)
end

if mode == 'types' then
  local types = {}
  for i = 1, 6 do types[i] = redis.call('TYPE', KEYS[i])['ok'] end
  local stats = {}
  if types[6] == 'hash' then stats = redis.call('HGETALL', KEYS[6]) end
  local ring, _, paused = group_keys(KEYS[1])
  return {now, types, stats, {redis.call('TYPE', ring)['ok'], redis.call('TYPE', paused)['ok']}}
elseif mode == 'page' then
  local which = ARGV[4]
  local key = ({main = KEYS[1], processing = KEYS[2], delayed = KEYS[3], dead = KEYS[4],
    leases = KEYS[5]})[which]
  if string.sub(which, 1, 2) == 'g:' then key = string.sub(KEYS[1], 1, -5) .. which end
  local offset, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
  local sorted = which == 'delayed' or which == 'leases'
  -- A key of another type (a group's list: corrupt data the fetch skips; the
  -- queue's own structures were typed by mode 'types') is not read: its type
  -- is returned for the report.
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= (sorted and 'zset' or 'list') then return {now, 0, {}, t} end
  local ids, len
  if sorted then
    ids = redis.call('ZRANGE', key, offset, offset + limit - 1)
    len = redis.call('ZCARD', key)
  else
    ids = redis.call('LRANGE', key, offset, offset + limit - 1)
    len = redis.call('LLEN', key)
  end
  local rows = {}
  for i, id in ipairs(ids) do
    rows[i] = {id, redis.call('ZSCORE', KEYS[5], id), row(prefix .. id)}
  end
  return {now, len, rows}
elseif mode == 'hashes' then
  local rows = {}
  for i = 4, #ARGV do rows[#rows + 1] = {ARGV[i], row(ARGV[i])} end
  return {now, rows}
elseif mode == 'probe' then
  local id = ARGV[4]
  return {now,
    #redis.call('LPOS', KEYS[1], id, 'COUNT', 0) + in_group_list(KEYS[1], prefix .. id, id),
    #redis.call('LPOS', KEYS[2], id, 'COUNT', 0),
    #redis.call('LPOS', KEYS[4], id, 'COUNT', 0),
    redis.call('ZSCORE', KEYS[3], id),
    redis.call('ZSCORE', KEYS[5], id),
    row(prefix .. id),
    redis.call('EXISTS', ARGV[3] .. id)}
elseif mode == 'group' then
  local g = ARGV[4]
  local ring, gprefix, paused = group_keys(KEYS[1])
  local function typed(key, want, read)
    local t = redis.call('TYPE', key)['ok']
    if t == 'none' then return 0 end
    if t ~= want then return false end
    return read()
  end
  return {now,
    typed(gprefix .. g, 'list', function() return redis.call('LLEN', gprefix .. g) end),
    typed(ring, 'list', function() return redis.call('LPOS', ring, g) and 1 or 0 end),
    typed(paused, 'hash', function() return redis.call('HEXISTS', paused, g) end)}
end
return redis.error_reply('check.lua: unknown mode ' .. tostring(mode))

-- Sets or clears a queue's limits (docs/LIMITS.md): fields of the limits hash.
-- A change of a rate key's limits (its override `key_rate:<k>` or
-- `key_concurrency:<k>`; for every key, the defaults `key_rate` and
-- `key_concurrency`, and clear_all) drops the key's booking
-- `<limits>:next:<k>` and releases the jobs deferred under the old limits
-- (limits_release: due again now, at most LIMITS_RELEASE per call; mode
-- 'release' goes on with the rest). A change for every key marks the keys
-- of `<limits>:deferkeys` a chunk per call (limits_walk), not all at once.
-- Setting a field to the value it holds changes nothing and releases nothing.
-- KEYS: 1 limits hash, 2 delayed, 3 promoter wake, 4 guard (never written: the
--       script reaches keys it does not declare, `<limits>:releasing`,
--       `:deferkeys`, `:walk`, a key's `:deferred:<k>` and `:next:<k>`, job
--       hashes; see keys.rs)
-- ARGV: 1 mode (below), 2 job prefix,
--       3.. field name, value, ... (rate fields "N/W" with N >= 1 and W >= 1 ms,
--       concurrency fields N >= 1)
-- Modes: 'set' (name/value pairs follow, value '' clears the field), 'clear_all',
-- 'release' (goes on with the releases pending), 'release_key' (ARGV 3: a rate key),
-- 'release_all' (every key's deferred jobs).
-- Returns {fields left in the limits hash, deferred jobs made due, rate keys
-- left to release (call again with 'release' while not 0)}.
local mode, jobprefix = ARGV[1], ARGV[2]
if not jobprefix or jobprefix == '' then
  error({err = 'ERR invalid argument job prefix: missing'})
end
local releasing, deferkeys = KEYS[1] .. ':releasing', KEYS[1] .. ':deferkeys'
expect_types(KEYS[1], 'hash', KEYS[2], 'zset', releasing, 'zset', deferkeys, 'zset')
local now = now_ms()
local release_keys = {}
local every = false
if mode == 'set' then
  if #ARGV % 2 ~= 0 then
    error({err = 'ERR invalid argument mode: set with ' .. (#ARGV - 2) .. ' values'})
  end
  for i = 3, #ARGV, 2 do
    local name, v = ARGV[i], ARGV[i + 1]
    local kind = string.match(name, '^key_rate:.') and 'rate' or string.match(name, '^key_concurrency:.')
      and 'concurrency' or ((name == 'rate' or name == 'key_rate') and 'rate')
      or ((name == 'concurrency' or name == 'key_concurrency') and 'concurrency')
    if not kind then error({err = 'ERR invalid argument limit field: ' .. name}) end
    if v ~= '' and v ~= 'none' and not (kind == 'rate' and limit_rate(v) or kind == 'concurrency' and as_count(v)) then
      error({err = 'ERR invalid argument ' .. name .. ': ' .. v})
    end
    -- A limit of 0 lets nothing start: the key's or queue's jobs went round
    -- between delayed and main (or every fetcher polled) for ever, with
    -- nothing reported. Holding work is a pause's job.
    local rate = kind == 'rate' and limit_rate(v)
    if (rate and rate[1] == 0) or (kind == 'concurrency' and as_count(v) == 0) then
      error({err = 'ERR invalid argument ' .. name .. ': ' .. v .. ' (a limit of 0 runs nothing:'
        .. ' to hold the jobs, pause the queue or their group)'})
    end
  end
  for i = 3, #ARGV, 2 do
    local name, v = ARGV[i], ARGV[i + 1]
    if (redis.call('HGET', KEYS[1], name) or '') ~= v then
      if name == 'key_rate' or name == 'key_concurrency' then
        every = true
      else
        local key = string.match(name, '^key_rate:(.+)$') or string.match(name, '^key_concurrency:(.+)$')
        if key then release_keys[#release_keys + 1] = key end
      end
    end
    if v == '' then
      redis.call('HDEL', KEYS[1], name)
    else
      redis.call('HSET', KEYS[1], name, v)
    end
  end
elseif mode == 'clear_all' then
  redis.call('DEL', KEYS[1])
  every = true
elseif mode == 'release_all' then
  every = true
elseif mode == 'release_key' then
  if not ARGV[3] or ARGV[3] == '' then error({err = 'ERR invalid argument rate key: missing'}) end
  release_keys[1] = ARGV[3]
elseif mode ~= 'release' then
  error({err = 'ERR invalid argument mode: ' .. tostring(mode)})
end
if every then
  -- Every key with deferred jobs is in `deferkeys`: limits_walk marks them,
  -- a chunk per call, from the start again (a walk under way for an
  -- earlier change marked its keys up to then only).
  redis.call('ZADD', releasing, int_str(now), '')
  redis.call('DEL', KEYS[1] .. ':walk')
end
for _, key in ipairs(release_keys) do limits_release_key(KEYS[1], key, now) end
limits_walk(KEYS[1], now)
local released, left = limits_release(KEYS[1], KEYS[2], KEYS[3], jobprefix, now)
return {redis.call('HLEN', KEYS[1]), released, left}

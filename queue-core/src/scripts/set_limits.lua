-- Sets or clears a queue's limits (docs/LIMITS.md): fields of the limits hash.
-- KEYS: 1 limits hash
-- ARGV: 1 mode ('set': name/value pairs follow, value '' clears the field; 'clear_all'),
--       2.. field name, value, ... (rate fields "N/W" with W >= 1 ms, concurrency fields N)
-- Returns the number of fields left in the limits hash.
expect_types(KEYS[1], 'hash')
if ARGV[1] == 'clear_all' then
  redis.call('DEL', KEYS[1])
  return 0
end
if ARGV[1] ~= 'set' or #ARGV % 2 ~= 1 then
  error({err = 'ERR invalid argument mode: ' .. tostring(ARGV[1]) .. ' with ' .. (#ARGV - 1) .. ' values'})
end
for i = 2, #ARGV, 2 do
  local name, v = ARGV[i], ARGV[i + 1]
  local kind = string.match(name, '^key_rate:.') and 'rate' or string.match(name, '^key_concurrency:.')
    and 'concurrency' or ((name == 'rate' or name == 'key_rate') and 'rate')
    or ((name == 'concurrency' or name == 'key_concurrency') and 'concurrency')
  if not kind then error({err = 'ERR invalid argument limit field: ' .. name}) end
  if v ~= '' and v ~= 'none' and not (kind == 'rate' and limit_rate(v) or kind == 'concurrency' and as_count(v)) then
    error({err = 'ERR invalid argument ' .. name .. ': ' .. v})
  end
end
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return redis.call('HLEN', KEYS[1])

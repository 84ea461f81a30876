-- Repair (checker): drops a lease whose id is not in processing (a lease
-- only means something for a processing entry). Only while that is still so.
-- KEYS: 1 processing, 2 leases
-- ARGV: 1 id
-- Returns 'dropped' | 'changed'
if redis.call('LPOS', KEYS[1], ARGV[1]) then
  return 'changed'
end
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 'changed'
end
return 'dropped'

-- Registers members of a batch before they are enqueued (docs/WORKFLOWS.md):
-- each new id joins the members set and counts in `total` once (an id added
-- again, e.g. by a producer's retry or a re-run member, changes nothing).
-- Allowed while the batch is open or sealed: a running member adds more
-- before its own ack, so the batch cannot fire in between.
-- Members on another queue than the batch's have it recorded in the batch
-- hash (field `where:<id>` -> queue; the first registration's stays), so
-- that `batches show` reads their state on their own queue (admin/batch.lua,
-- batch_members.lua); members on the batch's queue have no field. In the
-- batch hash, not a key of its own: it expires with the batch whichever
-- version fires it (an older version's fire expired the batch's keys it
-- knew, and a `:where` hash would have been left without a TTL).
-- KEYS: 1 batch hash, 2 members set
-- ARGV: 1 policy of these members ('' : the batch's default), 2 their queue when it is
--       not the batch's ('' : the batch's), then member ids
-- Returns {'added', new members} | {'fired'} | {'missing'}; an error before any
-- write when `total` is not an integer (corrupt)
local policy = ARGV[1]
if policy ~= '' and policy ~= 'fail' and policy ~= 'continue' and policy ~= 'ignore' then
  return redis.error_reply('ERR invalid argument policy: ' .. tostring(policy))
end
local where = ARGV[2]
expect_types(KEYS[1], 'hash', KEYS[2], 'set')
local b = redis.call('HMGET', KEYS[1], 'state', 'total')
local state = b[1]
if not state then return {'missing'} end
if state == 'fired' then
  -- A producer's retry after the batch fired: fine when nothing is new.
  for i = 3, #ARGV do
    if redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 0 then return {'fired'} end
  end
  return {'added', 0}
end
-- The count this call raises, checked before the first write: a `total`
-- that is not an integer (corrupt) would make the HINCRBY after the SADDs
-- fail, and a retry would find the members added and count none of them.
-- wf_bad_count: only the text HINCRBY reads as an integer ("00" is not).
if wf_bad_count('total', b[2]) then
  return redis.error_reply('ERR batch ' .. KEYS[1] .. " field total '" .. utf8_cut(b[2], 64)
    .. "' is not a non-negative integer (corrupt): refused before any write")
end
local added = 0
for i = 3, #ARGV do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    added = added + 1
    if policy ~= '' then redis.call('HSET', KEYS[1], 'policy:' .. ARGV[i], policy) end
  end
  -- Also for an id registered before (a retry): a batch registered by an
  -- older version gets the entry then.
  if where ~= '' then redis.call('HSETNX', KEYS[1], 'where:' .. ARGV[i], where) end
end
if added > 0 then redis.call('HINCRBY', KEYS[1], 'total', added) end
return {'added', added}

-- Read-only: the members of a batch homed on another queue that live on this
-- queue (batch_add.lua recorded them in the batch's `where:<id>` fields), for
-- `batches show` and the dashboard's batch page (admin/batches.rs). Run on
-- the members' queue, after batch.lua on the batch's: the two queues may be
-- on two cluster slots, so one script cannot read both.
-- A job hash of a member id that does not name the batch in its `batch`
-- field (one batch key a line) is another job of the same id: not the
-- member, so no state.
-- KEYS: 1 guard of this queue (never written: the script reads job hashes and
--       completion records by prefix)
-- ARGV: 1 batch key, 2 job prefix, 3 completion record prefix, then member ids
-- Returns one {state ('' none: no hash of the member here), record 0/1} per id
local rows = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local state = ''
  local jobkey = ARGV[2] .. id
  if redis.call('TYPE', jobkey)['ok'] == 'hash' then
    local h = redis.call('HMGET', jobkey, 'state', 'batch')
    if h[2] and string.find('\n' .. h[2] .. '\n', '\n' .. ARGV[1] .. '\n', 1, true) then
      state = h[1] or ''
    end
  end
  rows[#rows + 1] = {state, redis.call('EXISTS', ARGV[3] .. id)}
end
return rows

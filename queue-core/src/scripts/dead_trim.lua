-- Watchdog pass: trims the dead-letter list from its oldest end (the tail:
-- dead_letter() pushes at the head) while it is longer than `max_len` or its
-- oldest entry died more than `retention_ms` ago, at most `limit` ids per call.
-- Each trimmed id's hash and step results are deleted with it (only while the
-- hash still says `dead`: an id whose hash says otherwise is only unlisted).
-- An entry whose hash is missing or has no readable `dead_at` counts as expired,
-- and so does a `dead_at` that is no Redis-clock ms (inf, 1e300, a fraction)
-- or more than a day ahead of the Redis clock (a hand edit): kept, it stopped
-- every later trim at the tail for good. A day tolerates a failover to a
-- server whose clock is somewhat behind without deleting recent dead letters.
-- An entry whose hash says another state is stale (a hand edit, an older
-- bug): it is unlisted and the job left where it is, as long as it *is*
-- there (promote.lua's and reclaim.lua's rule for their stale entries): a
-- `queued` job neither waiting (main, its group's list) nor in processing is
-- made waiting; a `delayed` one missing from the delayed set goes back there
-- at its run_at; an `active` job neither in processing nor leased, a
-- `delayed` one whose run_at is no time, and a state that is none of the job
-- states (corrupt data) are dead-lettered again naming why (a new dead entry,
-- at the head). Before, each was unlisted and left in no list: lost.
-- Each of those lookups (`LPOS` of main or the group's list, and of
-- processing) searches STALE_SEARCH entries from the tail, then walks a
-- longer list whole at most STALE_WALKS times per call (prelude's
-- listed_near_tail): past that the call ends before the entry's writes
-- and the next call goes on from it. Before, every lookup walked the whole
-- list: 500 stale queued entries over a main of 200,500 blocked Redis for
-- 1.5 s in one call.
-- All reads come before the writes of each id; the counter is bumped last.
-- `trimmed` (the reply's and the stats counter) counts the dead letters
-- deleted; `unlisted` the other entries taken off the list (stale ones, their
-- job left or put where its state says or dead-lettered again, and those
-- whose job key holds another type): nothing deleted. Before, both were
-- `trimmed`, reported as dead letters deleted. The call takes at most `limit`
-- entries of both kinds.
-- KEYS: 1 dead, 2 stats, 3 guard, 4 main, 5 processing, 6 leases, 7 delayed
--       (4-7 read through pcall on the rare stale path, and written only to
--       put a stale entry's job back where its state says)
-- ARGV: 1 job key prefix, 2 step results key prefix, 3 max_len (0: no limit),
--       4 retention_ms (0: keep forever), 5 limit (ids per call)
-- Returns {trimmed, dead list length after, unlisted}
local function count(v, name)
  local n = tonumber(v)
  if not n or n ~= n or n < 0 or n == math.huge then
    return nil, redis.error_reply('ERR dead_trim: ' .. name .. ' must be a non-negative integer, got ' .. tostring(v))
  end
  return math.floor(n)
end
local max_len, e1 = count(ARGV[3], 'max_len')
if e1 then return e1 end
local retention, e2 = count(ARGV[4], 'retention_ms')
if e2 then return e2 end
local limit, e3 = count(ARGV[5], 'limit')
if e3 then return e3 end
local now = now_ms()
local walks = {left = STALE_WALKS}
local len = redis.call('LLEN', KEYS[1])
local trimmed, unlisted = 0, 0
while trimmed + unlisted < limit and len > 0 do
  local id = redis.call('LINDEX', KEYS[1], -1)
  local jobkey = ARGV[1] .. id
  -- A job key of another type (corrupt data) is unlisted, never deleted,
  -- and does not stop the trim half-way (the RPOPs before it stay).
  local h = redis.pcall('HMGET', jobkey, 'state', 'dead_at', 'group', 'run_at')
  local corrupt_key = h['err'] ~= nil
  if corrupt_key then h = {'corrupt'} end
  local expire = max_len > 0 and len > max_len
  if not expire and retention > 0 then
    local dead_at = as_count(h[2])
    expire = (not dead_at) or dead_at > now + 86400000 or now - dead_at > retention
  end
  if not expire then break end
  -- A stale entry: is the job where its state says (read before the writes,
  -- through pcall: a list of another type reads as not holding it)?
  local state = h[1]
  local requeue, relist_at, bad, unsure
  if state == 'queued' then
    local g = group_of(h[3])
    local waiting = g and select(2, group_keys(KEYS[4])) .. g or KEYS[4]
    local listed = queued_job_listed(waiting, KEYS[5], id, walks)
    if listed == false then
      requeue = true
      local why = waiting_types_bad(KEYS[4], h[3])
      if why then requeue, bad = nil, 'cannot wait: ' .. why .. ' (corrupt data)' end
    elseif listed == nil then
      unsure = true
    end
  elseif state == 'active' then
    if type(redis.pcall('ZSCORE', KEYS[6], id)) ~= 'string' then
      local p = listed_near_tail(KEYS[5], id, walks)
      if p == false then
        bad = 'state active but neither in processing nor leased (corrupt data)'
      elseif p == nil then
        unsure = true
      end
    end
  elseif state == 'delayed' then
    if type(redis.pcall('ZSCORE', KEYS[7], id)) ~= 'string' then
      relist_at = as_count(h[4])
      local why = relist_at and key_type_bad(KEYS[7], 'zset')
      if not relist_at then
        bad = corrupt_field('run_at', h[4])
      elseif why then
        relist_at, bad = nil, 'cannot wait in delayed: ' .. why .. ' (corrupt data)'
      end
    end
  elseif state and state ~= 'dead' and not corrupt_key then
    bad = "corrupt field state: '" .. utf8_cut(state, 64) .. "'"
  end
  -- The lookup's whole walks are used up: this entry waits for the next call.
  if unsure then break end
  redis.call('RPOP', KEYS[1])
  if h[1] == false or h[1] == 'dead' then
    redis.call('DEL', jobkey, ARGV[2] .. id)
    hist_close(KEYS[2], id)
    trimmed = trimmed + 1
  else
    unlisted = unlisted + 1
  end
  if requeue then
    push_waiting(KEYS[4], id, h[3])
    redis.log(redis.LOG_WARNING, 'dead_trim: job ' .. id .. ' in state queued was in no list ('
      .. KEYS[1] .. '): made waiting')
  elseif relist_at then
    redis.call('ZADD', KEYS[7], int_str(relist_at), id)
    redis.log(redis.LOG_WARNING, 'dead_trim: job ' .. id .. ' in state delayed was in no list ('
      .. KEYS[1] .. '): relisted in delayed at its run_at')
  elseif bad then
    local member = dead_letter(jobkey, KEYS[1], KEYS[2], id, bad, now)
    len = len + 1
    dead_member(member, id, bad, now, KEYS[2])
  end
  len = len - 1
end
if trimmed > 0 then
  bump(KEYS[2], 'trimmed', trimmed)
end
return {trimmed, len, unlisted}

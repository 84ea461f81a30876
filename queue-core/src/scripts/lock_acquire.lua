-- KEYS: 1 lock key, 2 fencing counter
-- ARGV: 1 owner token, 2 ttl_ms, 3 fencing counter ttl_ms
-- Returns the fencing number (increasing per acquisition), or 0 when held by another owner;
-- a call with the token that holds the lock (a retry whose reply was lost) answers that
-- acquisition's number again.
-- The counter expires `fence_ttl_ms` after the last acquisition (so unused
-- lock names leave nothing behind); a counter created anew, or found below
-- the Redis time in microseconds (set back by hand, restored from a
-- backup), starts at that time, above any number an earlier counter of this
-- name can have reached (one per acquisition), so fencing numbers only grow
-- while the Redis clock does.
-- Everything is checked before the lock is taken: a lock held by a call
-- that then failed would be unusable for its whole ttl (the caller's retry
-- finds it taken). The counter is read first (a key of another type refuses
-- the call); a value that is not a count in canonical form is replaced like
-- a missing counter.
local function ms(v, name)
  local n = tonumber(v)
  if not n or n < 1 or n ~= math.floor(n) or n > 9007199254740991 then
    error({err = 'ERR invalid argument ' .. name .. ': ' .. tostring(v)})
  end
  return n
end
local ttl, fence_ttl = ms(ARGV[2], 'ttl_ms'), ms(ARGV[3], 'fence_ttl_ms')
local counter = redis.call('GET', KEYS[2])
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ttl) then
  -- INCR takes only an integer's canonical text: '007' or '00' would pass
  -- a digits check and then make INCR raise with the lock already taken.
  -- The counter never starts below the Redis time in microseconds: a
  -- counter set back by hand or restored from an old backup ('5' after
  -- numbers near 1.8e15 were handed out) would otherwise hand out numbers
  -- below those earlier holders had, and a fenced store would take the
  -- stale holder's writes. Both are canonical digit strings: the shorter
  -- one is the smaller, and of equal length the text order is the order.
  local t = redis.call('TIME')
  local floor = t[1] .. string.format('%06d', tonumber(t[2]))
  if not counter or #counter > 18 or not (counter == '0' or string.match(counter, '^[1-9]%d*$'))
      or #counter < #floor or (#counter == #floor and counter < floor) then
    redis.call('SET', KEYS[2], floor)
  end
  local fence = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], fence_ttl)
  return fence
end
-- Held by this very token: this is the call sent again after its reply was
-- lost (the first one took the lock). It answers that acquisition, its
-- fencing number (the counter, read above, has not moved since: nobody else
-- can acquire meanwhile) and its lease restarted; before, it answered
-- "held" and the lock stayed taken for its whole ttl by a token nobody had.
if redis.call('GET', KEYS[1]) == ARGV[1] and counter and #counter <= 18
    and string.match(counter, '^[1-9]%d*$') then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return tonumber(counter)
end
return 0

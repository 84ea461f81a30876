-- KEYS: 1 lock key, 2 fencing counter
-- ARGV: 1 owner token, 2 ttl_ms, 3 fencing counter ttl_ms
-- Returns the fencing number (increasing per acquisition) as its decimal text, 0 when held
-- by another owner, or -1 when the counter is at 9223372036854775807 (the largest count
-- INCR makes: no number is left, and the lock is not taken); a call with the token that
-- holds the lock (a retry whose reply was lost) answers that acquisition's number again.
-- The number is answered as text, never as a Lua number: a Lua number is a double, which
-- rounds counts above 2^53 (two holders in turn got the same number).
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
-- a missing counter; a count is kept up to 9223372036854775806 (any count
-- INCR takes), and one at or above 9223372036854775807 refuses the call
-- (replaced, it would hand out numbers below those handed out before).
local function ms(v, name)
  local n = tonumber(v)
  if not n or n < 1 or n ~= math.floor(n) or n > 9007199254740991 then
    error({err = 'ERR invalid argument ' .. name .. ': ' .. tostring(v)})
  end
  return n
end
local ttl, fence_ttl = ms(ARGV[2], 'ttl_ms'), ms(ARGV[3], 'fence_ttl_ms')
local counter = redis.call('GET', KEYS[2])
-- Counts are compared as text, never through a Lua number (exact only up to
-- 2^53): of two canonical digit strings the shorter one is the smaller, and
-- of equal length the text order is the order.
local MAX = '9223372036854775807'
local function below(a, b)
  return #a < #b or (#a == #b and a < b)
end
-- A count in canonical form (INCR takes only an integer's canonical text:
-- '007' or '00' would pass a digits check and then make INCR raise with the
-- lock already taken).
local canonical = counter and (counter == '0' or string.match(counter, '^[1-9]%d*$')) and true
-- At (or, set by hand, above) the largest count: INCR would raise. Refused
-- before the lock is taken; a lock held already answers as below (held by
-- another owner, or this token's retry).
if canonical and not below(counter, MAX) then
  if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
elseif redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ttl) then
  -- The counter never starts below the Redis time in microseconds: a
  -- counter set back by hand or restored from an old backup ('5' after
  -- numbers near 1.8e15 were handed out) would otherwise hand out numbers
  -- below those earlier holders had, and a fenced store would take the
  -- stale holder's writes.
  local t = redis.call('TIME')
  local floor = t[1] .. string.format('%06d', tonumber(t[2]))
  if not canonical or below(counter, floor) then
    redis.call('SET', KEYS[2], floor)
  end
  redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], fence_ttl)
  -- INCR's own reply is a Lua number: rounded above 2^53.
  return redis.call('GET', KEYS[2])
end
-- Held by this very token: this is the call sent again after its reply was
-- lost (the first one took the lock). It answers that acquisition, its
-- fencing number (the counter, read above, has not moved since: nobody else
-- can acquire meanwhile) and its lease restarted; before, it answered
-- "held" and the lock stayed taken for its whole ttl by a token nobody had.
if redis.call('GET', KEYS[1]) == ARGV[1] and canonical and counter ~= '0'
    and not below(MAX, counter) then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return counter
end
return 0

-- Relay, step 1 of 2, on the batches' queue P: applies relay notices written
-- by members on other queues (wf_notice in the prelude) to P's batches, in
-- order. Idempotent by member id: the batch hash keeps `relay:<member id>` =
-- the seq of the last notice applied for that member, and a notice whose seq
-- is not above it was already applied (a relay that crashed before removing
-- it, or a second relayer) and changes nothing; a finish also counts once by
-- the `:done` set. Validates each notice and batch before writing for it.
-- KEYS: 1 P's stats hash, 2 P's guard (never written: see keys.rs)
-- ARGV: the notices, oldest first (all for batches on P)
-- Returns one code per notice, in order, then a flag: codes 1 applied now;
-- 2 already applied (nothing written); 0 no such batch (expired or deleted);
-- 3 the batch is corrupt (a key of another type, or a count the notice
-- changes is not an integer: not counted, not marked applied); 4 the notice is
-- unreadable or names a batch of another queue; 5 the notice has no seq (0:
-- wf_notice found `relay:seq` corrupt; relay_retry.lua numbers it once
-- repaired). A seq-0 notice is never "already applied": the member's last
-- seq reads 0 before any notice, so it would be dropped uncounted. The flag
-- is 1 when applying wrote notices into P's own relay list (a nested flow's
-- parent on P, dead-lettered, whose own batch is on a third queue).
local base = string.match(KEYS[1], '^(q:{[^}]*}:)stats$')
if not base then
  return redis.error_reply('relay_apply: KEYS[1] must be a queue stats key, got ' .. KEYS[1])
end
local now = now_ms()
local out, noted = {}, 0
for i, n in ipairs(ARGV) do
  local seq, kind, bkey, id, outcome, detail = wf_parse_notice(n)
  if not seq or wf_base(bkey) ~= base then
    out[i] = 4
  elseif seq == 0 then
    out[i] = 5
  else
    local t = redis.call('TYPE', bkey)['ok']
    local d = redis.call('TYPE', bkey .. ':done')['ok']
    if t == 'none' then
      out[i] = 0
    elseif t ~= 'hash' or (d ~= 'set' and d ~= 'none') then
      out[i] = 3
    else
      local last = tonumber(redis.call('HGET', bkey, 'relay:' .. id) or '0') or 0
      if seq <= last then
        out[i] = 2
      else
        -- Count first, then mark the notice applied: a count that is not an
        -- integer (corrupt) leaves the notice unapplied (code 3: kept in the
        -- dead-notice list, the batch's `count_error` says why), never marked
        -- applied without its count.
        local wrote, bad
        if kind == 'u' then
          bad = wf_unfinish(bkey, id)
        else
          wrote, bad = wf_finished(bkey, id, outcome, detail, now)
        end
        if wrote then noted = 1 end
        if bad then
          out[i] = 3
        else
          redis.call('HSET', bkey, 'relay:' .. id, seq)
          out[i] = 1
        end
      end
    end
  end
end
out[#out + 1] = noted
return out

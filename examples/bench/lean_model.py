#!/usr/bin/env python3
"""What a different data model would cost Redis per job (issue #12, stop 33).

Stops 30-32 measured that what is left of the scripts' cost per job is the
data model's: a hash per job written at enqueue and at claim and read at
claim and ack, a completion record key per job, and a `processing` list
entry per job, each a `redis.call` (~6-7k instructions of script machinery)
plus its fields. This measures, in the same way as script_cost.py
(callgrind inside FCALL, one phase per dump, the same call shapes and
payload), sketches of the designs that docs/BENCHMARKS.md names as the way
to the 12 µs goal, so that the claim "it needs a different design" has a
figure:

- `lean`: the job hash holds only what the producer wrote (no `id`,
  `attempts` absent until a retry, no claim fields); a claim writes one
  field per job into one per-queue hash `claims` (token, attempt, delivered
  at, worker, fence, first start, flags, in one string) with one variadic
  `HSET` per fetch; the ack checks all its tokens with one variadic `HMGET`
  of `claims`, writes a compact record (`SET ... PX`) per job, `LREM`s
  `processing` per job, and drops claims, leases and job hashes with one
  variadic call each.
- `lean-noproc`: the same without the `processing` list (the leases zset is
  the set of jobs in flight: a claim inside one script needs no list to
  survive a crash; only a blocking `BLMOVE` fetch outside a script does).
- `lean-buckets`: the same, with completion records as fields of one hash
  per time bucket (`done:<bucket>`, expiring as a whole one retention after
  its bucket ends), written with one variadic `HSET` per ack call: no key
  per completed job.
- `lean-min`: `lean-buckets` with the optional job fields packed into one
  `opt` field a plain job lacks (the claim reads 7 fields, not 14) and a
  claimed row of 6 values.
- `streams`: the job is a stream entry (`XADD`); a fetch is one
  `XREADGROUP` plus one variadic `HSET` of claims and `ZADD` of leases; an
  ack one `HMGET` of claims, then one `XACK`, `XDEL`, `HDEL` and `ZREM`;
  records in buckets (ChasquiMQ's shape, inside a script so that tokens are
  checked).

These are sketches for measurement, not implementations: they keep the
calls and reads the real scripts need on the measured path (type checks,
one `TIME`, the token check of every delivery, counts validated, a fetch
receipt, the completion-record check at claim, counters), not the paths a
no-op job does not take (retries, deadlines, groups, limits, events).

    python3 examples/bench/lean_model.py [--n 2000] [--enqueue-batch 13] [--batch 7] [--variant lean-min]

Prints instructions per job of each phase, beside the working tree's real
scripts measured by script_cost.py in the same shape.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_modes import ROOT, callgrind_dump, callgrind_redis, callgrind_total, connect, free_port  # noqa: E402

Q = "q:{lean}:"
PHASES = ("enqueue", "fetch", "ack")

LIBRARY = r"""#!lua name=lean
local function expect_types(a, ta, b, tb)
  local x = redis.call('TYPE', a)['ok']
  if x ~= ta and x ~= 'none' then error('WRONGTYPE ' .. a) end
  local y = redis.call('TYPE', b)['ok']
  if y ~= tb and y ~= 'none' then error('WRONGTYPE ' .. b) end
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int_str(n) return string.format('%d', n) end
local function as_count(v)
  if v and string.find(v, '^%d+$') then return tonumber(v) end
  return nil
end

-- The id of the first job (5 arguments each from args[first]: id, type, v,
-- payload, max_attempts) with an empty id or a max_attempts that is not a
-- count, or nil: every job is checked before the first write.
local function invalid_job(args, first)
  for i = first, #args, 5 do
    if args[i] == '' or not as_count(args[i + 4]) then return args[i] end
  end
  return nil
end

-- The writes that end a fetch: the batch's leases (`lz`: score, id, ...) and
-- claims (`cl`: id, value, ...) with one variadic call each, its receipt, and
-- the counter.
local function register_claims(leases, lz, claims, cl, receipt, entries, receipt_ms, stats)
  redis.call('ZADD', leases, unpack(lz))
  redis.call('HSET', claims, unpack(cl))
  redis.call('RPUSH', receipt, unpack(entries))
  redis.call('PEXPIRE', receipt, receipt_ms)
  redis.pcall('HINCRBY', stats, 'started', #entries)
end

-- The deliveries of an ack call (7 arguments each from args[first]: id, token,
-- result, attempts, type, enqueued_at, delivered_at), every token checked
-- against `claims` with one HMGET: a code per delivery (1 acked, 0 not), the
-- acked ids, and their compact records as {id, value, ...}.
local function check_acks(claims, args, first, worker, now_s)
  local ids = {}
  for i = first, #args, 7 do ids[#ids + 1] = args[i] end
  local c = redis.call('HMGET', claims, unpack(ids))
  local out, acked, rec = {}, {}, {}
  for k, id in ipairs(ids) do
    local i = first + (k - 1) * 7
    local token = args[i + 1]
    if c[k] and string.sub(c[k], 1, #token + 1) == token .. ' ' then
      rec[#rec + 1] = id
      rec[#rec + 1] = 'c1 ' .. now_s .. ' ' .. args[i + 3] .. ' ' .. args[i + 5] .. ' ' .. args[i + 6] .. ' '
        .. #token .. ':' .. #args[i + 4] .. ':' .. #worker .. ':' .. token .. args[i + 4] .. worker .. args[i + 2]
      acked[#acked + 1] = id
      out[k] = 1
    else
      out[k] = 0
    end
  end
  return out, acked, rec
end

-- Records {id, value, ...} into the bucket of the hour of `now` (prefix ..
-- hour), which expires one retention after the hour ends.
local function bucket_write(prefix, rec, now, retention)
  local b = math.floor(now / 3600000)
  redis.call('HSET', prefix .. b, unpack(rec))
  redis.call('PEXPIREAT', prefix .. b, int_str((b + 1) * 3600000 + as_count(retention)))
end

-- KEYS: main, stats. ARGV: job prefix, then per job: id, type, v, payload, max_attempts.
redis.register_function('lean_enqueue', function(keys, args)
  local bad = invalid_job(args, 2)
  if bad then return redis.error_reply('ERR invalid job ' .. bad) end
  expect_types(keys[1], 'list', keys[2], 'hash')
  local now = now_ms()
  local now_s = int_str(now)
  local ids, out = {}, {}
  for i = 2, #args, 5 do
    redis.call('HSET', args[1] .. args[i], 'type', args[i + 1], 'v', args[i + 2], 'payload', args[i + 3],
      'max_attempts', args[i + 4], 'enqueued_at', now_s)
    ids[#ids + 1] = args[i]
    out[#out + 1] = now
  end
  redis.call('LPUSH', keys[1], unpack(ids))
  redis.pcall('HINCRBY', keys[2], 'enqueued', #ids)
  return out
end)

local CLAIM = {'type', 'v', 'payload', 'attempts', 'max_attempts', 'enqueued_at', 'fence', 'traceparent',
  'expires_at', 'expires_after', 'first_started_at', 'batch', 'hist', 'notify'}
-- `lean-min`: the optional fields packed into one `opt` field a plain job
-- does not have (read as CLAIM's 7th; the rest absent).
local CLAIM_MIN = {'type', 'v', 'payload', 'attempts', 'max_attempts', 'enqueued_at', 'opt'}

-- KEYS: main, processing ('' for none), leases, claims, stats, receipt.
-- ARGV: job prefix, record prefix, lease ms, token base, count, receipt ms, worker, record buckets ('' or prefix),
-- 'min' for the packed optional fields.
redis.register_function('lean_fetch', function(keys, args)
  local fields = args[9] == 'min' and CLAIM_MIN or CLAIM
  expect_types(keys[3], 'zset', keys[4], 'hash')
  local count, lease_ms = as_count(args[5]), as_count(args[3])
  local now = now_ms()
  local moved = redis.call('LRANGE', keys[1], int_str(-count), '-1')
  local ids = {}
  for i = #moved, 1, -1 do ids[#ids + 1] = moved[i] end
  if #ids == 0 then return {} end
  if keys[2] ~= '' then redis.call('LPUSH', keys[2], unpack(ids)) end
  redis.call('LTRIM', keys[1], '0', int_str(-#ids - 1))
  -- The completion-record check of the batch: one EXISTS of the record keys,
  -- or one HMGET per live bucket (here: the current and the previous one).
  if args[8] == '' then
    local k = {}
    for i, id in ipairs(ids) do k[i] = args[2] .. id end
    if redis.call('EXISTS', unpack(k)) > 0 then error('a record exists') end
  else
    local b = math.floor(now / 3600000)
    for _, bucket in ipairs({b, b - 1}) do
      local r = redis.call('HMGET', args[8] .. bucket, unpack(ids))
      for i = 1, #ids do if r[i] then error('a record exists') end end
    end
  end
  local lease_until = int_str(now + lease_ms)
  local now_s = int_str(now)
  local out, lz, cl, entries = {}, {}, {}, {}
  for i, id in ipairs(ids) do
    local h = redis.call('HMGET', args[1] .. id, unpack(fields))
    local attempts = (as_count(h[4] or '0') or 0) + 1
    local max = as_count(h[5])
    if not h[1] or not max then error('corrupt job ' .. id) end
    local fence = (as_count(h[7] or '0') or 0) + 1
    local token = args[4] .. ':' .. int_str(i)
    cl[#cl + 1] = id
    cl[#cl + 1] = token .. ' ' .. attempts .. ' ' .. now_s .. ' ' .. fence .. ' ' .. (h[11] or now_s) .. ' '
      .. (h[12] and 'b' or '') .. (h[13] and 'h' or '') .. (h[14] and 'n' or '') .. ' ' .. args[7]
    lz[#lz + 1] = lease_until
    lz[#lz + 1] = id
    if args[9] == 'min' then
      out[i] = {id, token, h[1], h[3], attempts, h[6] or '0'}
    else
      out[i] = {'claimed', id, token, h[1], h[2], h[3], attempts, max, h[6] or '0', now, fence}
    end
    entries[i] = 'claimed:' .. id
  end
  register_claims(keys[3], lz, keys[4], cl, keys[6], entries, args[6], keys[5])
  return out
end)

-- KEYS: processing ('' for none), leases, claims, stats.
-- ARGV: job prefix, record prefix, retention ms, worker, record buckets ('' or prefix),
-- then per delivery: id, token, result, attempts, type, enqueued_at, delivered_at.
redis.register_function('lean_ack', function(keys, args)
  expect_types(keys[2], 'zset', keys[3], 'hash')
  local now = now_ms()
  local out, acked, rec = check_acks(keys[3], args, 6, args[4], int_str(now))
  if #acked > 0 then
    if args[5] == '' then
      for k = 1, #rec, 2 do redis.call('SET', args[2] .. rec[k], rec[k + 1], 'PX', args[3]) end
    else
      bucket_write(args[5], rec, now, args[3])
    end
    if keys[1] ~= '' then
      for _, id in ipairs(acked) do redis.call('LREM', keys[1], '-1', id) end
    end
    local jobs = {}
    for k, id in ipairs(acked) do jobs[k] = args[1] .. id end
    redis.call('ZREM', keys[2], unpack(acked))
    redis.call('HDEL', keys[3], unpack(acked))
    redis.call('DEL', unpack(jobs))
    redis.pcall('HINCRBY', keys[4], 'completed', #acked)
  end
  return out
end)
-- `streams`: the job is a stream entry (no hash, no list): the enqueue XADDs
-- it, the fetch reads a batch with one XREADGROUP (the entries' fields come
-- with it) and writes one variadic HSET of claims and one ZADD of leases; the
-- ack checks the tokens with one HMGET of claims and removes the batch with
-- one XACK, one XDEL, one HDEL and one ZREM; records in time buckets.
-- KEYS: stream, stats. ARGV: per job: id, type, v, payload, max_attempts.
redis.register_function('streams_enqueue', function(keys, args)
  local bad = invalid_job(args, 1)
  if bad then return redis.error_reply('ERR invalid job ' .. bad) end
  expect_types(keys[1], 'stream', keys[2], 'hash')
  local now = now_ms()
  local now_s = int_str(now)
  local out = {}
  for i = 1, #args, 5 do
    redis.call('XADD', keys[1], '*', 'id', args[i], 'type', args[i + 1], 'v', args[i + 2], 'payload', args[i + 3],
      'max', args[i + 4], 'enq', now_s)
    out[#out + 1] = now
  end
  redis.pcall('HINCRBY', keys[2], 'enqueued', #out)
  return out
end)

-- KEYS: stream, leases, claims, stats, receipt. ARGV: lease ms, token base, count, receipt ms, worker, buckets.
redis.register_function('streams_fetch', function(keys, args)
  expect_types(keys[2], 'zset', keys[3], 'hash')
  local now = now_ms()
  local now_s = int_str(now)
  local r = redis.call('XREADGROUP', 'GROUP', 'g', 'c', 'COUNT', args[3], 'STREAMS', keys[1], '>')
  if not r then return {} end
  local entries = r[1][2]
  local ids = {}
  for i, e in ipairs(entries) do ids[i] = e[1] end
  local b = math.floor(now / 3600000)
  for _, bucket in ipairs({b, b - 1}) do
    local d = redis.call('HMGET', args[6] .. bucket, unpack(ids))
    for i = 1, #ids do if d[i] then error('a record exists') end end
  end
  local lease_until = int_str(now + as_count(args[1]))
  local out, lz, cl, rc = {}, {}, {}, {}
  for i, e in ipairs(entries) do
    local f = e[2] -- id, <id>, type, <t>, v, <v>, payload, <p>, max, <m>, enq, <e>
    local token = args[2] .. ':' .. int_str(i)
    cl[#cl + 1] = e[1]
    cl[#cl + 1] = token .. ' 1 ' .. now_s .. ' ' .. args[5]
    lz[#lz + 1] = lease_until
    lz[#lz + 1] = e[1]
    out[i] = {e[1], token, f[4], f[8], 1, f[12]}
    rc[i] = e[1]
  end
  register_claims(keys[2], lz, keys[3], cl, keys[5], rc, args[4], keys[4])
  return out
end)

-- KEYS: stream, leases, claims, stats. ARGV: retention ms, worker, buckets, then per delivery
-- as lean_ack (the entry id as the id).
redis.register_function('streams_ack', function(keys, args)
  expect_types(keys[2], 'zset', keys[3], 'hash')
  local now = now_ms()
  local out, acked, rec = check_acks(keys[3], args, 4, args[2], int_str(now))
  if #acked > 0 then
    bucket_write(args[3], rec, now, args[1])
    redis.call('XACK', keys[1], 'g', unpack(acked))
    redis.call('XDEL', keys[1], unpack(acked))
    redis.call('ZREM', keys[2], unpack(acked))
    redis.call('HDEL', keys[3], unpack(acked))
    redis.pcall('HINCRBY', keys[4], 'completed', #acked)
  end
  return out
end)
"""

VARIANTS = {
    "lean": {"processing": True, "buckets": False},
    "lean-noproc": {"processing": False, "buckets": False},
    "lean-buckets": {"processing": False, "buckets": True},
    "lean-min": {"processing": False, "buckets": True, "min": True},
    "streams": {"streams": True},
}


def measure(variant, a):
    opts = VARIANTS[variant]
    port = free_port()
    out = os.path.join(tempfile.mkdtemp(), "cg")
    server = callgrind_redis(port, out, "fcallCommand")
    try:
        r = connect(port, 60.0)
        r.function_load(LIBRARY, replace=True)

        def dump():
            callgrind_dump(server)

        dump()  # part 1: the load
        if opts.get("streams"):
            parts, count = streams(r, dump, a)
        else:
            parts, count = hashes(r, dump, a, variant, opts)
    finally:
        server.terminate()
        server.wait()
    totals = {phase: callgrind_total(f"{out}.{part}") / count for part, phase in zip(parts, PHASES)}
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
        for part, phase in zip(parts, PHASES):
            shutil.copy(f"{out}.{part}", os.path.join(a.keep, f"{variant}.{phase}.cg"))
    shutil.rmtree(os.path.dirname(out))
    return totals


def enqueue_all(r, a, function, main, first_args):
    """The measured jobs, `a.enqueue_batch` per call of `function` (KEYS: `main`,
    stats; ARGV: `first_args`, then id, type, v, payload, max_attempts per job)."""
    p = r.pipeline(transaction=False)
    for c in range(0, a.n, a.enqueue_batch):
        args = list(first_args)
        for i in range(c, min(c + a.enqueue_batch, a.n)):
            args += ["j%d" % i, "noop", "1", "x" * a.payload, "3"]
        p.fcall(function, 2, main, Q + "stats", *args)
        if c % 2000 == 0:
            p.execute()
    p.execute()


def hashes(r, dump, a, variant, opts):
    """The hash sketches' phases (parts 2-4 of the callgrind dumps)."""
    enqueue_all(r, a, "lean_enqueue", Q + "main", [Q + "job:"])
    dump()  # part 2: enqueue
    processing = Q + "processing" if opts["processing"] else ""
    buckets = Q + "done:b:" if opts["buckets"] else ""
    deliveries = []
    for c in range(a.n // a.batch):
        base = "tok-%d-0123456789" % c
        rows = r.fcall("lean_fetch", 6, Q + "main", processing, Q + "leases", Q + "claims", Q + "stats",
                       Q + "fetch:" + base, Q + "job:", Q + "done:", "300000", base, str(a.batch), "150000",
                       "bench-worker", buckets, "min" if opts.get("min") else "")
        if opts.get("min"):
            deliveries += [(row[0], row[1], row[4], row[2], row[5], b"0") for row in rows]
        else:
            deliveries += [(row[1], row[2], row[6], row[3], row[8], row[9]) for row in rows]
    dump()  # part 3: fetch
    for c in range(0, len(deliveries), a.batch):
        args = [Q + "job:", Q + "done:", "86400000", "bench-worker", buckets]
        for job_id, token, attempts, jtype, enqueued_at, delivered_at in deliveries[c:c + a.batch]:
            args += [job_id, token, "", attempts, jtype, enqueued_at, delivered_at]
        codes = r.fcall("lean_ack", 4, processing, Q + "leases", Q + "claims", Q + "stats", *args)
        if any(code != 1 for code in codes):
            raise SystemExit(f"{variant}: ack answered {codes}")
    dump()  # part 4: ack
    if len(deliveries) != a.n // a.batch * a.batch:
        raise SystemExit(f"{variant}: fetched {len(deliveries)} jobs")
    return (2, 3, 4), len(deliveries)


def streams(r, dump, a):
    """The `streams` sketch's phases (see the library), dumped as measure()'s."""
    r.xgroup_create(Q + "stream", "g", id="0", mkstream=True)
    dump()  # part 2 (not counted: the group)
    enqueue_all(r, a, "streams_enqueue", Q + "stream", [])
    dump()  # part 3: enqueue
    deliveries = []
    for c in range(a.n // a.batch):
        base = "tok-%d-0123456789" % c
        rows = r.fcall("streams_fetch", 5, Q + "stream", Q + "leases", Q + "claims", Q + "stats",
                       Q + "fetch:" + base, "300000", base, str(a.batch), "150000", "bench-worker", Q + "done:b:")
        deliveries += [(row[0], row[1], row[4], row[2], row[5]) for row in rows]
    dump()  # part 4: fetch
    for c in range(0, len(deliveries), a.batch):
        args = ["86400000", "bench-worker", Q + "done:b:"]
        for entry, token, attempts, jtype, enqueued_at in deliveries[c:c + a.batch]:
            args += [entry, token, "", attempts, jtype, enqueued_at, b"0"]
        codes = r.fcall("streams_ack", 4, Q + "stream", Q + "leases", Q + "claims", Q + "stats", *args)
        if any(code != 1 for code in codes):
            raise SystemExit(f"streams: ack answered {codes}")
    dump()  # part 5: ack
    if len(deliveries) != a.n // a.batch * a.batch:
        raise SystemExit(f"streams: fetched {len(deliveries)} jobs")
    return (3, 4, 5), len(deliveries)


def real_scripts(a):
    """The working tree's scripts in the same shape, by script_cost.py."""
    cmd = [sys.executable, os.path.join(ROOT, "examples", "bench", "script_cost.py"), "--n", str(a.n),
           "--batch", str(a.batch), "--enqueue-batch", str(a.enqueue_batch), "--payload", str(a.payload)]
    if a.compact:
        cmd.append("--compact")
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    row = [line for line in text.splitlines() if line.startswith("| scripts |")][-1]
    cells = [c.strip().replace(",", "") for c in row.strip("|").split("|")]
    return {"enqueue": float(cells[1]), "fetch": float(cells[2]), "ack": float(cells[3])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000, help="jobs (default 2000)")
    ap.add_argument("--batch", type=int, default=7, help="jobs per fetch and per ack call (default 7)")
    ap.add_argument("--enqueue-batch", type=int, default=13, help="jobs per enqueue call (default 13)")
    ap.add_argument("--payload", type=int, default=30, help="payload bytes (default 30)")
    ap.add_argument("--compact", action="store_true", help="the real scripts write compact records")
    ap.add_argument("--keep", help="keep the callgrind files in this directory")
    ap.add_argument("--variant", action="append", choices=sorted(VARIANTS), help="default: all")
    a = ap.parse_args()
    print(f"{a.n} jobs, enqueue {a.enqueue_batch} per call, fetch and ack {a.batch} per call, payload "
          f"{a.payload} B; instructions per job inside FCALL (callgrind)")
    print("| design | enqueue | fetch | ack | per job | vs today |")
    print("|---|---:|---:|---:|---:|---:|")
    today = real_scripts(a)
    base = sum(today.values())
    label = "today's scripts" + (" (compact records)" if a.compact else "")
    print(f"| {label} | {today['enqueue']:,.0f} | {today['fetch']:,.0f} | {today['ack']:,.0f} | {base:,.0f} | |",
          flush=True)
    for variant in a.variant or list(VARIANTS):
        t = measure(variant, a)
        total = sum(t.values())
        print(f"| {variant} | {t['enqueue']:,.0f} | {t['fetch']:,.0f} | {t['ack']:,.0f} | {total:,.0f} | "
              f"{(total / base - 1) * 100:+.1f}% |", flush=True)


if __name__ == "__main__":
    main()

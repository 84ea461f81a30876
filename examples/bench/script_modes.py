#!/usr/bin/env python3
"""EVALSHA vs FCALL for the same queue scripts (issue #12, stop 25).

Starts a private redis-server, loads every script of queue-core/src/scripts
both ways -- as EVALSHA scripts (prelude + body each, as queue-core did up to
stop 24) and as one function library (prelude once, one function per script,
as scripts/library.rs builds it) -- preloads N waiting jobs, then runs the real
fetch.lua and ack.lua with B jobs per call, the two modes interleaved, and
prints the Redis time per job from INFO commandstats (median and runs).

    python3 examples/bench/script_modes.py [--n 8000] [--batch 1] [--runs 3]

Needs redis-server on PATH and redis-py (`pip install redis`; the RQ venv of
examples/bench/peers/setup.sh has it: examples/bench/peers/.work/rq-venv/bin/python).
"""
import argparse
import glob
import os
import re
import socket
import statistics
import subprocess
import time

import redis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "queue-core", "src", "scripts")
Q = "q:{bench}:"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(port, seconds):
    """A client of the server starting on `port`, once it answers PING."""
    r = redis.Redis(port=port)
    deadline = time.time() + seconds
    while True:
        try:
            r.ping()
            return r
        except redis.ConnectionError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)


def callgrind_redis(port, out, toggle):
    """A private redis-server on `port` (REDIS_SERVER or the one on PATH)
    under callgrind, counting only inside function `toggle`, writing `out`."""
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--toggle-collect=" + toggle, "--callgrind-out-file=" + out,
         os.environ.get("REDIS_SERVER", "redis-server"), "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def callgrind_dump(server):
    """Ends the current part of `server`'s count (file `out.N`), starts the next."""
    subprocess.run(["callgrind_control", "-d", str(server.pid)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    time.sleep(0.5)


def callgrind_total(path):
    """The instruction total of callgrind output file `path`, or None when
    it has none (a part with nothing collected)."""
    with open(path) as f:
        m = re.search(r"^(?:totals|summary): (\d+)", f.read(), re.M)
    return int(m.group(1)) if m else None


def claimed_delivery(row):
    """(id, token, attempts, type, enqueued_at, delivered_at, position) of a
    fetch reply's row when it is a claimed delivery, else None. Since stop 34
    a claimed row is one string (`claimed_row` in prelude.lua: each field its
    length in decimal, ':' and its bytes); before, an array led by
    b"claimed". Since stop 44 it carries the delivery's position (its
    distance from the tail of processing) before the payload; b"" before."""
    if isinstance(row, bytes):
        fields, at = [], 0
        while at < len(row):
            colon = row.index(b":", at)
            n = int(row[at:colon])
            fields.append(row[colon + 1:colon + 1 + n])
            at = colon + 1 + n
        position = fields[11] if len(fields) == 13 else b""
        return fields[0], fields[1], fields[4], fields[2], fields[6], fields[7], position
    if row[0] == b"claimed":
        return row[1], row[2], row[6], row[3], row[8], row[9], b""
    return None


def read(name):
    with open(os.path.join(SCRIPTS, name)) as f:
        return f.read()


def library(prelude, bodies):
    """The library text as scripts/library.rs builds it (names without the hash)."""
    text = "#!lua name=script_modes\n" + prelude + "\n"
    for name, body in bodies.items():
        text += ("redis.register_function{function_name='%s', flags={'allow-oom'}, "
                 "callback=function(KEYS, ARGV)\ncall_begin()\n%s\nend}\n") % (name, body)
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()

    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)
    try:
        r = connect(port, 5.0)
        prelude = read("prelude.lua")
        bodies = {os.path.basename(f)[:-4]: read(os.path.basename(f))
                  for f in sorted(glob.glob(os.path.join(SCRIPTS, "*.lua"))) if not f.endswith("prelude.lua")}
        # Every script loaded, as a worker's server has them: EVALSHA mode
        # keeps one compiled prelude per script in the Lua heap.
        sha = {name: r.script_load("#!lua flags=allow-oom\n" + prelude + "\n" + body)
               for name, body in bodies.items()}
        r.function_load(library(prelude, bodies), replace=True)

        def call(mode, name, keys, args):
            if mode == "evalsha":
                return r.evalsha(sha[name], len(keys), *keys, *args)
            return r.fcall(name, len(keys), *keys, *args)

        def usec(mode):
            stats = r.info("commandstats").get("cmdstat_" + mode, {})
            return stats.get("usec", 0)

        def run(mode):
            r.flushdb()
            pipe = r.pipeline(transaction=False)
            for i in range(a.n):
                pipe.hset(Q + "job:j%d" % i, mapping={
                    "id": "j%d" % i, "state": "queued", "type": "noop", "v": "1", "payload": "x" * 30,
                    "attempts": "0", "max_attempts": "3", "enqueued_at": "1733390000000"})
                pipe.lpush(Q + "main", "j%d" % i)
            pipe.execute()
            r.config_resetstat()
            items = []
            for c in range(a.n // a.batch):
                base = "tok%d" % c
                keys = [Q + "main", Q + "processing", Q + "leases", Q + "dead", Q + "stats", Q + "guard",
                        Q + "fetch:" + base, Q + "paused", Q + "limits", Q + "delayed", Q + "wake"]
                rows = call(mode, "fetch", keys, [Q + "job:", Q + "done:", "300000", base, str(a.batch),
                                                  "150000", "bench-worker"])
                items += [d for d in map(claimed_delivery, rows) if d]
            fetch_us = usec(mode) / len(items)
            r.config_resetstat()
            for c in range(0, len(items), a.batch):
                args = [Q + "job:", Q + "done:", Q + "steps:", "86400000", Q + "tput:", "hash", "bench-worker"]
                for job_id, token, attempts, jtype, enqueued_at, delivered_at, position in items[c:c + a.batch]:
                    args += [job_id, token, "", attempts, jtype, enqueued_at, delivered_at, position]
                call(mode, "ack", [Q + "processing", Q + "leases", Q + "stats", Q + "guard"], args)
            return fetch_us, usec(mode) / len(items)

        results = {"evalsha": [], "fcall": []}
        for _ in range(a.runs):
            for mode in results:
                results[mode].append(run(mode))
        print(f"{a.n} jobs, {a.batch} per call, {a.runs} interleaved runs; Redis µs per job (median; runs)")
        for mode, runs in results.items():
            f = [x[0] for x in runs]
            k = [x[1] for x in runs]
            print(f"{mode:8} fetch {statistics.median(f):6.2f} ({', '.join('%.2f' % x for x in f)})"
                  f"   ack {statistics.median(k):6.2f} ({', '.join('%.2f' % x for x in k)})")
    finally:
        server.kill()


if __name__ == "__main__":
    main()

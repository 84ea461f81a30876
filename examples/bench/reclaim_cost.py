#!/usr/bin/env python3
"""Instructions of one watchdog reclaim call (`reclaim.lua`), counted by callgrind.

Like script_cost.py (whose helpers it uses): a private redis-server under
`valgrind --tool=callgrind --toggle-collect=fcallCommand` loads the scripts as
one function library and runs one reclaim call per scenario on a fresh
keyspace, the counters dumped around it. Each scenario is a processing list of
`running` ids (leased far ahead) and `expired` ids (leased until 1, `active`
job hashes with attempts left), the expired ones at the tail (the oldest
deliveries, the usual case) or at the head (behind long-running deliveries).

    python3 examples/bench/reclaim_cost.py                    # the working tree
    python3 examples/bench/reclaim_cost.py --rev HEAD .       # a revision, then the tree

Instructions, not time; a revision's reclaim.lua that takes 7 keys ignores
the eighth (the orphan scan position) sent to it.
"""
import argparse
import os
import shutil
import sys
import tempfile

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_modes import callgrind_dump, callgrind_redis, callgrind_total, connect, free_port  # noqa: E402
from script_cost import add_source_args, labelled_sources, library_of  # noqa: E402

Q = "q:{bench}:"
KEYS = [Q + k for k in ("processing", "leases", "delayed", "dead", "stats", "guard", "wake", "orphan:cursor")]

# name, running, expired, where the expired sit, orphan scan
SCENARIOS = [
    ("short list: 10 running, 5 expired", 10, 5, "tail", 1000),
    ("1,000 running, 100 expired at the tail", 1000, 100, "tail", 1000),
    ("20,000 running, 100 expired at the tail", 20000, 100, "tail", 1000),
    ("20,000 running, 3 expired at the tail", 20000, 3, "tail", 1000),
    ("20,000 running, 100 expired at the head", 20000, 100, "head", 1000),
    ("20,000 running, 500 expired at the head", 20000, 500, "head", 1000),
]


def seed(r, running, expired, where):
    r.flushall()
    run = [f"running-{n}" for n in range(running)]
    exp = [f"expired-{n}" for n in range(expired)]
    listed = exp + run if where == "head" else run + exp
    p = r.pipeline(transaction=False)
    for i in range(0, len(listed), 10000):
        p.rpush(KEYS[0], *listed[i:i + 10000])
    for i in range(0, len(run), 10000):
        p.zadd(KEYS[1], {id: 9e12 for id in run[i:i + 10000]})
    for id in exp:
        p.hset(Q + "job:" + id, mapping={"state": "active", "attempts": 1, "max_attempts": 3})
        p.zadd(KEYS[1], {id: 1})
    p.execute()


def measure(directory, label, scenarios):
    port = free_port()
    out = os.path.join(tempfile.mkdtemp(), "cg")
    server = callgrind_redis(port, out, "fcallCommand")
    totals = []
    try:
        connect(port, 60.0)  # valgrind starts slowly
        # No timeout: redis-py 8 answers a call that takes more than 5 s
        # (the old script under callgrind) with a retry, which finds nothing.
        r = redis.Redis(port=port, socket_timeout=None)
        r.function_load(library_of(directory), replace=True)
        callgrind_dump(server)  # part 1: the load
        part = 1
        for _name, running, expired, where, scan in scenarios:
            seed(r, running, expired, where)
            callgrind_dump(server)  # nothing counted: the seeding is no FCALL
            part += 1
            reply = r.fcall("reclaim", len(KEYS), *KEYS, Q + "job:", 500, 30000, 10, 100, 7, scan, Q + "done:")
            assert reply[0] == expired, (label, reply)
            callgrind_dump(server)
            part += 1
            totals.append(callgrind_total(f"{out}.{part}"))
    finally:
        server.terminate()
        server.wait()
    shutil.rmtree(os.path.dirname(out))
    return totals


def main():
    ap = argparse.ArgumentParser()
    add_source_args(ap)
    ap.add_argument("--only", default="", help="the scenarios whose name contains this text")
    a = ap.parse_args()
    scenarios = [sc for sc in SCENARIOS if a.only in sc[0]]
    tmp = tempfile.mkdtemp()
    try:
        results = []
        for label, directory in labelled_sources(a, tmp):
            results.append((label, measure(directory, label, scenarios)))
        print("instructions of one reclaim call inside FCALL (callgrind)")
        print("| scenario | " + " | ".join(label for label, _ in results) + " |")
        print("|---|" + "---:|" * len(results))
        for i, (name, *_rest) in enumerate(scenarios):
            first = results[0][1][i]
            cells = []
            for j, (_label, t) in enumerate(results):
                change = "" if j == 0 else f" ({(t[i] / first - 1) * 100:+.1f}%)"
                cells.append(f"{t[i]:,}{change}")
            print(f"| {name} | " + " | ".join(cells) + " |")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()

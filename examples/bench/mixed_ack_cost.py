#!/usr/bin/env python3
"""What an ack costs when long-running deliveries sit at the tail of
processing (issue #12, "cost must not grow with the work").

Fetches push at the head of processing, so a delivery is usually old, near
the tail, by the time it ends. Long-running jobs stay at the tail while short
ones are fetched and acked behind them: an ack that looks from the tail walks
past every long-running delivery (stop 43 measured 14 µs per ack behind
1,000 of them, 1.5 ms behind 100,000). Since stop 44 a claim row carries the
delivery's distance from the tail, the worker sends it back with the ack,
and `unlist_delivery` (prelude.lua) looks from the head when the tail end
does not hold it.

This counts the real `ack.lua`'s instructions per acked job (callgrind,
only inside FCALL, as script_cost.py does) for each script set given, in
rounds as a worker of concurrency 64 runs them: 64 short jobs are fetched
(one fetch, or 64 fetches of one job: a worker whose slots long jobs hold)
and acked in batches of 8, with L long-running deliveries at the tail (0,
1,000, 10,000, 100,000); with 1,000 long ones and 256 short ones in flight
in front of each acked one; and with 4,096 short deliveries in flight acked
in the order they were fetched (the issue's table (a): the oldest, at the
tail, each fetched when 4,096 were in flight). The long-running
deliveries and the jobs are written with plain commands (not counted). Needs
valgrind, redis-server and redis-py.

    python3 examples/bench/mixed_ack_cost.py --rev f81d27a   # a revision, then the tree
"""
import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cost import ack_args, add_source_args, labelled_sources, library_of  # noqa: E402
from script_modes import callgrind_dump, callgrind_redis, callgrind_total, claimed_delivery, connect, free_port  # noqa: E402

Q = "q:{mixed}:"
SHORT = 64
ACK_BATCH = 8


def enqueue_plain(r, ids):
    """Jobs as enqueue.lua writes them, with plain commands (not counted)."""
    p = r.pipeline(transaction=False)
    for jid in ids:
        p.hset(Q + "job:" + jid, mapping={"id": jid, "type": "noop", "v": "1", "payload": "x" * 30,
                                          "max_attempts": "3", "attempts": "0",
                                          "enqueued_at": "1700000000000", "state": "queued"})
        p.lpush(Q + "main", jid)
    p.execute()


def fetch(r, base, count):
    keys = [Q + k for k in ("main", "processing", "leases", "dead", "stats", "guard", "fetch:" + base,
                            "paused", "limits", "delayed", "wake")]
    rows = r.fcall("fetch", len(keys), *keys, Q + "job:", Q + "done:", "300000", base, str(count),
                   "150000", "bench-worker", "1")
    return [d for d in map(claimed_delivery, rows) if d]


def ack(r, ack_text, deliveries):
    for c in range(0, len(deliveries), ACK_BATCH):
        args = ack_args(ack_text, Q, deliveries[c:c + ACK_BATCH], compact=False)
        codes = r.fcall("ack", 4, Q + "processing", Q + "leases", Q + "stats", Q + "guard", *args)
        if any(code not in (1, ord("1")) for code in codes):
            raise SystemExit(f"ack answered {codes}")


def measure(directory, long_running, in_flight, rounds, per_fetch):
    """Instructions per acked job; `in_flight` short deliveries stay in
    flight; fetches of `per_fetch` jobs."""
    ack_text = open(os.path.join(directory, "ack.lua")).read()
    port = free_port()
    out = os.path.join(tempfile.mkdtemp(), "cg")
    server = callgrind_redis(port, out, "fcallCommand")
    try:
        r = connect(port, 60.0)
        r.function_load(library_of(directory), replace=True)
        p = r.pipeline(transaction=False)
        for i in range(0, long_running, 1000):
            p.rpush(Q + "processing", *["long-%036d" % j for j in range(i, min(i + 1000, long_running))])
            p.execute()
        standing = []
        if in_flight:
            enqueue_plain(r, ["warm-%d" % i for i in range(in_flight)])
            standing = fetch(r, "warm-0123456789", in_flight)
        part, ack_parts = 1, []
        callgrind_dump(server)  # part 1: the setup
        for rnd in range(rounds):
            ids = ["short-%d-%030d" % (rnd, k) for k in range(SHORT)]
            enqueue_plain(r, ids)
            fetched = []
            for f in range(SHORT // per_fetch):
                fetched += fetch(r, "tok-%d-%d-0123456789" % (rnd, f), per_fetch)
            callgrind_dump(server)
            part += 1  # a fetch
            if in_flight:
                # The oldest go, the new ones join the standing deliveries.
                done, standing = standing[:SHORT], standing[SHORT:] + fetched
            else:
                done = fetched
            ack(r, ack_text, done)
            callgrind_dump(server)
            part += 1
            ack_parts.append(part)
        total = sum(callgrind_total(f"{out}.{n}") or 0 for n in ack_parts)
        return total / (rounds * SHORT)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(os.path.dirname(out))


def main():
    ap = argparse.ArgumentParser()
    add_source_args(ap)
    ap.add_argument("--rounds", type=int, default=8, help="measured rounds of 64 jobs (default 8)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    try:
        sources = labelled_sources(a, tmp)
        shapes = [(f"{n:,} long-running at the tail", n, 0, SHORT) for n in (0, 1000, 10000, 100000)]
        shapes.append(("1,000 long-running at the tail, fetches of 1 job", 1000, 0, 1))
        shapes.append(("1,000 long-running at the tail, 256 short in flight", 1000, 256, SHORT))
        shapes.append(("4,096 short in flight, acked oldest first", 0, 4096, SHORT))
        print(f"ack.lua instructions per acked job (callgrind, inside FCALL); {SHORT} short jobs per "
              f"fetch, acked {ACK_BATCH} per call, {a.rounds} rounds")
        print("| deliveries in processing | " + " | ".join(label for label, _ in sources) + " |")
        print("|---|" + "---:|" * len(sources))
        for name, long_running, in_flight, per_fetch in shapes:
            first, cells = None, []
            for _, directory in sources:
                n = measure(directory, long_running, in_flight, a.rounds, per_fetch)
                change = "" if first is None else f" ({(n / first - 1) * 100:+.1f}%)"
                first = first if first is not None else n
                cells.append(f"{n:,.0f}{change}")
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()

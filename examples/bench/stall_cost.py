#!/usr/bin/env python3
"""Redis time of one watchdog call whose work could grow with a queue's size
(stop 46): a promote of due grouped jobs while the fair-queuing ring holds
many groups, and a reclaim of stale processing entries of dead jobs over a
long dead list. One call blocks every other client of the server for its
whole length, so the figure is the stall it causes.

    python3 examples/bench/stall_cost.py                    # the working tree
    python3 examples/bench/stall_cost.py --rev c71433c      # a revision, then the tree
    python3 examples/bench/stall_cost.py --groups 100000 --due 1000 --dead 1000000 --stale 500

(a) promote: `--groups` groups waiting (one job each, all in the ring) and
`--due` delayed jobs due now, each of another group whose list is empty (a
retry of a tenant whose queue ran dry): one `promote.lua` call moves them.
(b) reclaim: a dead list of `--dead` ids and `--stale` dead jobs whose
dead letters sit at its head (dead-lettered lately), in its middle or at its
tail (the oldest), each also left in processing with an expired lease (an
operator's manual retry that the fetch answered busy): `reclaim.lua` calls,
a batch of `--stale` each, until none is left.
Each call's Redis time is `INFO commandstats` (`cmdstat_fcall`).
Needs redis-server and redis-py.
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cost import add_source_args, labelled_sources, library_of  # noqa: E402
from script_modes import connect, free_port  # noqa: E402

Q = "q:{stall}:"


def fcall_ms(r, name, keys, args):
    """(reply, Redis ms of this one call)."""
    r.config_resetstat()
    reply = r.fcall(name, len(keys), *keys, *args)
    usec = r.info("commandstats")["cmdstat_fcall"]["usec"]
    return reply, usec / 1000.0


def promote_case(r, groups, due):
    now = int(r.time()[0]) * 1000
    p = r.pipeline(transaction=False)
    p.rpush(Q + "groups", "")
    for i in range(groups):
        g, job = "tenant-%06d" % i, "w%d" % i
        p.hset(Q + "job:" + job, mapping=dict(id=job, state="queued", attempts=0, max_attempts=3, group=g,
                                             type="t", v=1, payload="x", enqueued_at=now))
        p.lpush(Q + "g:" + g, job)
        p.rpush(Q + "groups", g)
        if i % 10000 == 9999:
            p.execute()
    for i in range(due):
        job = "d%d" % i
        p.hset(Q + "job:" + job, mapping=dict(id=job, state="delayed", attempts=1, max_attempts=3,
                                             group="other-%06d" % i, type="t", v=1, payload="x",
                                             enqueued_at=now, run_at=now - 1))
        p.zadd(Q + "delayed", {job: now - 1})
    p.execute()
    keys = [Q + k for k in ("delayed", "main", "dead", "stats", "guard", "processing", "leases")]
    reply, ms = fcall_ms(r, "promote", keys, [Q + "job:", due, Q + "done:"])
    return "promote: %d groups in the ring, %d due grouped jobs: %d moved in one call, %.1f ms of Redis" % (
        groups, due, reply[0], ms)


def reclaim_case(r, dead, stale, where):
    """`where`: the stale jobs' dead letters at the list's head (dead-lettered
    lately), its tail (the oldest) or its middle."""
    now = int(r.time()[0]) * 1000
    before = {"head": 0, "middle": dead // 2, "tail": dead}[where]
    p = r.pipeline(transaction=False)

    def fill(lo, hi):
        for c in range(lo, hi, 10000):
            p.rpush(Q + "dead", *["old-%07d" % i for i in range(c, min(c + 10000, hi))])
        p.execute()
    fill(0, before)
    for i in range(stale):
        job = "stale-%d" % i
        p.hset(Q + "job:" + job, mapping=dict(id=job, state="dead", attempts=3, max_attempts=3,
                                             dead_at=now - 86400000))
        p.rpush(Q + "dead", job)
        p.lpush(Q + "processing", job)
        p.zadd(Q + "leases", {job: now - 1})
    p.execute()
    fill(before, dead)
    keys = [Q + k for k in ("processing", "leases", "delayed", "dead", "stats", "guard", "wake",
                            "orphan:cursor")]
    args = [Q + "job:", stale, 30000, 1000, 60000, 7, 1000, Q + "done:"]
    calls, total, longest, dropped = 0, 0.0, 0.0, 0
    while r.zcard(Q + "leases") > 0 and calls < 10 * stale + 10:
        reply, ms = fcall_ms(r, "reclaim", keys, args)
        calls, total, longest = calls + 1, total + ms, max(longest, ms)
        dropped += len(reply[3]) // 2
    return ("reclaim: dead list of %d, %d stale dead entries at its %s: %d dropped in %d call(s), "
            "longest call %.1f ms, %.1f ms of Redis in all" % (dead + stale, stale, where, dropped, calls, longest,
                                                              total))


def main():
    ap = argparse.ArgumentParser()
    add_source_args(ap)
    ap.add_argument("--groups", type=int, default=100000)
    ap.add_argument("--due", type=int, default=1000)
    ap.add_argument("--dead", type=int, default=1000000)
    ap.add_argument("--stale", type=int, default=500)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for label, directory in labelled_sources(a, tmp):
            port = free_port()
            server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                                      stdout=subprocess.DEVNULL)
            try:
                r = connect(port, 10.0)
                r.function_load(library_of(directory), replace=True)
                print("%s: %s" % (label, promote_case(r, a.groups, a.due)), flush=True)
                for where in ("head", "middle", "tail"):
                    r.flushall()
                    print("%s: %s" % (label, reclaim_case(r, a.dead, a.stale, where)), flush=True)
            finally:
                server.terminate()
                server.wait()


if __name__ == "__main__":
    main()

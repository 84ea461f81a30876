#!/usr/bin/env python3
"""Instructions per job inside the queue scripts, counted by callgrind (issue #12).

Wall-clock Redis time on a shared 2-core VM moves by 10-30% between runs,
which hides a 5% change. Instruction counts do not move: this runs a private
redis-server under `valgrind --tool=callgrind --toggle-collect=fcallCommand`
(only what FCALL runs is counted), loads the scripts as one function library
(as scripts/library.rs does), and drives the real enqueue.lua (one job per
call), fetch.lua and ack.lua (B jobs per call) over N jobs, dumping the
counters between the phases. Each script directory given is measured the
same way; a git revision is read with `git show REV:queue-core/src/scripts/`.

    python3 examples/bench/script_cost.py                   # the working tree
    python3 examples/bench/script_cost.py --rev 07a49ed .   # a revision, then the tree
    python3 examples/bench/script_cost.py --batch 1 --n 1000
    python3 examples/bench/script_cost.py --backlog 1000000   # 1M jobs waiting behind
    python3 examples/bench/script_cost.py --enqueue-batch 9 --batch 6   # the end-to-end shape
    python3 examples/bench/script_cost.py --compact           # acks write compact records

Instructions, not time: a cache miss in a large keyspace costs nothing here
(the figures are for a warm, small keyspace). Needs valgrind, redis-server
(`REDIS_SERVER` to pick another build, e.g. one with symbols for
callgrind_annotate) and redis-py. `--keep DIR` keeps the callgrind files
(`<label>.<phase>.cg`) for `callgrind_annotate --inclusive=yes`.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_modes import claimed_delivery, ROOT, callgrind_dump, callgrind_redis, callgrind_total, connect, free_port, library  # noqa: E402

Q = "q:{bench}:"
PHASES = ("enqueue", "fetch", "ack")


def scripts_of(source, tmp):
    """A directory of the scripts: `source` itself, or a git revision's copy."""
    if os.path.isdir(source):
        return source
    out = os.path.join(tmp, source)
    os.makedirs(out, exist_ok=True)
    names = subprocess.run(["git", "-C", ROOT, "ls-tree", "--name-only", source, "queue-core/src/scripts/"],
                           check=True, capture_output=True, text=True).stdout.split()
    for path in names:
        if path.endswith(".lua"):
            text = subprocess.run(["git", "-C", ROOT, "show", f"{source}:{path}"],
                                  check=True, capture_output=True, text=True).stdout
            with open(os.path.join(out, os.path.basename(path)), "w") as f:
                f.write(text)
    return out


def add_source_args(ap):
    """The script sets to measure: directories, and git revisions first."""
    ap.add_argument("sources", nargs="*", help="script directories (default: the working tree's)")
    ap.add_argument("--rev", action="append", default=[], help="a git revision to measure first (repeatable)")


def labelled_sources(a, tmp):
    """(label, script directory) for each set `add_source_args` named, in order."""
    sources = a.rev + (a.sources or [os.path.join(ROOT, "queue-core", "src", "scripts")])
    return [(os.path.basename(os.path.normpath(s)) if os.path.isdir(s) else s, scripts_of(s, tmp))
            for s in sources]


def library_of(directory):
    read = lambda n: open(os.path.join(directory, n)).read()  # noqa: E731
    bodies = {os.path.basename(f)[:-4]: read(os.path.basename(f))
              for f in sorted(glob.glob(os.path.join(directory, "*.lua"))) if not f.endswith("prelude.lua")}
    return library(read("prelude.lua"), bodies)


def ack_args(ack_text, q, deliveries, compact):
    """ARGV of one ack.lua call (its text `ack_text`: the layout changed over
    the stops) for `deliveries` as claimed_delivery reads them."""
    # Since stop 27 ack.lua takes the record format (ARGV 6); older scripts do not.
    args = [q + "job:", q + "done:", q + "steps:", "86400000", q + "tput:"]
    if "record format" in ack_text:
        args.append("compact" if compact else "hash")
    # Since stop 32 the worker's name follows (ARGV 7) and each delivery
    # carries its claimed fields, so the ack does not read them; since stop
    # 44 also its position (its distance from the tail of processing).
    claimed = "groups of 7" in ack_text or "groups of 8" in ack_text
    positioned = "groups of 8" in ack_text
    if claimed:
        args.append("bench-worker")
    for job_id, token, attempts, jtype, enqueued_at, delivered_at, position in deliveries:
        args += [job_id, token, ""]
        if claimed:
            args += [attempts, jtype, enqueued_at, delivered_at]
        if positioned:
            args.append(position)
    return args


def measure(directory, a, keep, label):
    port = free_port()
    out = os.path.join(tempfile.mkdtemp(), "cg")
    server = callgrind_redis(port, out, "fcallCommand")
    try:
        r = connect(port, 60.0)  # valgrind starts slowly
        r.function_load(library_of(directory), replace=True)

        def dump():
            callgrind_dump(server)

        dump()  # part 1: the load
        p = r.pipeline(transaction=False)
        if a.enqueue_batch:
            # enqueue_many, as the Queue's group commit sends it: generated
            # ids (fresh), no extra fields; since stop 32 (the scripts with
            # the `each:int` mode) no enqueue token for a generated id, before
            # one per job.
            stop32 = "'each:int'" in open(os.path.join(directory, "enqueue_many.lua")).read()
            # `--enqueue-mode all`: as `Queue::enqueue_many` sends its batches
            # (the whole call refused when one job is; group commit sends
            # `each`).
            mode = a.enqueue_mode + (":int" if stop32 else "")
            for c in range(0, a.n, a.enqueue_batch):
                args = [Q + "job:", Q + "done:", Q + "once:", mode]
                for i in range(c, min(c + a.enqueue_batch, a.n)):
                    args += ["j%d" % i, "noop", "1", "x" * a.payload, "3", "0", "0", "0",
                             "" if stop32 else "enq-%d-0123456789abcdef0123" % i, "1", "0"]
                p.fcall("enqueue_many", 4, Q + "main", Q + "delayed", Q + "stats", Q + "wake", *args)
                if c % 2000 == 0:
                    p.execute()
        else:
            for i in range(a.n):
                jid = "j%d" % i
                keys = [Q + "main", Q + "job:" + jid, Q + "done:" + jid, Q + "delayed", Q + "stats",
                        Q + "once:" + jid, Q + "wake"]
                p.fcall("enqueue", len(keys), *keys, jid, "noop", "1", "x" * a.payload, "3", "0", "0", "0",
                        "enq-%d-0123456789" % i)
                if i % 200 == 199:
                    p.execute()
        p.execute()
        dump()  # part 2: enqueue
        if a.backlog:
            # Jobs behind the measured ones, written with plain commands (not
            # counted: only FCALL is), as enqueue.lua writes them.
            for i in range(a.backlog):
                jid = "b%d" % i
                p.hset(Q + "job:" + jid, mapping={"id": jid, "type": "noop", "v": "1", "payload": "x" * a.payload,
                                                  "max_attempts": "3", "attempts": "0",
                                                  "enqueued_at": "1700000000000", "state": "waiting"})
                p.lpush(Q + "main", jid)
                if i % 1000 == 999:
                    p.execute()
            p.execute()
            if a.settle:
                time.sleep(a.settle)
            dump()  # the backlog, not reported
        deliveries = []
        for c in range(a.n // a.batch):
            base = "tok-%d-0123456789" % c
            keys = [Q + k for k in ("main", "processing", "leases", "dead", "stats", "guard", "fetch:" + base,
                                    "paused", "limits", "delayed", "wake")]
            rows = r.fcall("fetch", len(keys), *keys, Q + "job:", Q + "done:", "300000", base, str(a.batch),
                           "150000", "bench-worker", "1")  # a first try, as the worker sends it
            # id, token, and the fields the worker sends back with its ack
            # since stop 32: attempts, type, enqueued_at, delivered_at.
            deliveries += [d for d in map(claimed_delivery, rows) if d]
        dump()  # part 3: fetch
        ack_text = open(os.path.join(directory, "ack.lua")).read()
        if a.compact and "record format" not in ack_text:
            raise SystemExit(f"{label}: these scripts have no compact records")
        for c in range(0, len(deliveries), a.batch):
            args = ack_args(ack_text, Q, deliveries[c:c + a.batch], a.compact)
            codes = r.fcall("ack", 4, Q + "processing", Q + "leases", Q + "stats", Q + "guard", *args)
            # One digit per delivery since stop 34 (b"111..."), a list of integers before.
            if any(code not in (1, ord("1")) for code in codes):
                raise SystemExit(f"{label}: ack answered {codes}")
        dump()  # part 4: ack
        if len(deliveries) != a.n // a.batch * a.batch:
            raise SystemExit(f"{label}: fetched {len(deliveries)} jobs")
    finally:
        server.terminate()
        server.wait()
    totals = {}
    parts = (2, 4, 5) if a.backlog else (2, 3, 4)
    for part, phase in zip(parts, PHASES):
        totals[phase] = callgrind_total(f"{out}.{part}") / len(deliveries)
        if keep:
            shutil.copy(f"{out}.{part}", os.path.join(keep, f"{label}.{phase}.cg"))
    shutil.rmtree(os.path.dirname(out))
    return totals


def main():
    ap = argparse.ArgumentParser()
    add_source_args(ap)
    ap.add_argument("--n", type=int, default=2000, help="jobs (default 2000)")
    ap.add_argument("--batch", type=int, default=16, help="jobs per fetch and per ack call (default 16)")
    ap.add_argument("--enqueue-batch", type=int, default=0,
                    help="jobs per enqueue_many call (default 0: enqueue.lua, one job per call)")
    ap.add_argument("--enqueue-mode", choices=["each", "all"], default="each",
                    help="enqueue_many's mode: each (group commit, default) or all (Queue::enqueue_many)")
    ap.add_argument("--payload", type=int, default=30, help="payload bytes (default 30)")
    ap.add_argument("--backlog", type=int, default=0,
                    help="waiting jobs behind the measured ones (written uncounted; default 0)")
    ap.add_argument("--settle", type=float, default=0.0, help="seconds to wait after the backlog (default 0)")
    ap.add_argument("--compact", action="store_true",
                    help="acks write compact completion records (WorkerConfig::compact_records)")
    ap.add_argument("--keep", help="keep the callgrind files in this directory")
    a = ap.parse_args()
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
    tmp = tempfile.mkdtemp()
    try:
        print(f"{a.n} jobs, {a.batch} per fetch and ack call, payload {a.payload} B, backlog {a.backlog}; "
              f"instructions per job inside FCALL (callgrind)")
        enq = f"enqueue_many ({a.enqueue_batch} per call)" if a.enqueue_batch else "enqueue (1 per call)"
        print(f"| scripts | {enq} | fetch | ack | fetch + ack |")
        print("|---|---:|---:|---:|---:|")
        first = None
        for label, directory in labelled_sources(a, tmp):
            t = measure(directory, a, a.keep, label)
            t["fetch + ack"] = t["fetch"] + t["ack"]
            first = first or t
            cells = []
            for k in PHASES + ("fetch + ack",):
                change = "" if t is first else f" ({(t[k] / first[k] - 1) * 100:+.1f}%)"
                cells.append(f"{t[k]:,.0f}{change}")
            print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()

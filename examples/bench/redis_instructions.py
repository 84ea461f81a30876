#!/usr/bin/env python3
"""Redis instructions per job of a real queue-bench workload (issue #12).

The focus runs measure wall time and commandstats microseconds on a shared
2-core VM, where two runs of one build differ by up to 30%, which hides a 5%
change. This runs each given queue-bench build against its own redis-server
under `valgrind --tool=callgrind --toggle-collect=processCommand` (every
command Redis runs, scripts and the rest, none of its idle time), for the
same workload, interleaved, and prints Redis instructions per job: the cost
the real worker and producers put on Redis, with their real call shapes (how
many jobs a fetch, an ack and an enqueue call carry under valgrind's slower
Redis is printed beside it: the shapes are larger than at full speed).

    python3 examples/bench/redis_instructions.py --runs 2 OLD_BIN NEW_BIN -- process --n 5000 --concurrency 64
    python3 examples/bench/redis_instructions.py OLD_BIN NEW_BIN -- e2e --n 5000 --producers 16 --concurrency 16

The count covers everything Redis ran during the workload, including the
jobs' enqueue (a `process` run enqueues its jobs first). Needs valgrind and
redis-server (`REDIS_SERVER` for another build).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_modes import callgrind_redis, callgrind_total, connect, free_port  # noqa: E402


def measure(binary, workload):
    port = free_port()
    tmp = tempfile.mkdtemp()
    out = os.path.join(tmp, "cg")
    server = callgrind_redis(port, out, "processCommand")
    try:
        connect(port, 60.0)  # valgrind starts slowly
        run = subprocess.run([binary, "--redis-url", f"redis://127.0.0.1:{port}/", *workload],
                             capture_output=True, text=True, check=True)
        server.terminate()  # Redis exits on SIGTERM, and callgrind writes its file
        server.wait(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
    total = callgrind_total(out)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    scripts = result["cmds"]["scripts"]
    return total / result["n"], scripts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1, help="interleaved runs of each build (default 1)")
    ap.add_argument("builds", nargs="+", help="queue-bench binaries, then -- and the workload")
    argv = sys.argv[1:]
    if "--" not in argv:
        ap.error("give the workload after --, e.g. -- process --n 5000 --concurrency 64")
    cut = argv.index("--")
    args, workload = ap.parse_args(argv[:cut]), argv[cut + 1:]
    per_build = {b: [] for b in args.builds}
    print(f"Redis instructions per job (callgrind, every command), workload: {' '.join(workload)}")
    print("| build | run | instructions/job | jobs per fetch | jobs per ack | enqueue calls |")
    print("|---|---:|---:|---:|---:|---:|")
    for run in range(1, args.runs + 1):
        for b in args.builds:
            per_job, s = measure(b, workload)
            per_build[b].append(per_job)
            print(f"| {os.path.basename(b)} | {run} | {per_job:,.0f} | {s.get('jobs_per_fetch_script')} | "
                  f"{s.get('jobs_per_ack_script')} | {s.get('enqueue')} |", flush=True)
    first = statistics.median(per_build[args.builds[0]])
    for b in args.builds:
        m = statistics.median(per_build[b])
        print(f"median {os.path.basename(b)}: {m:,.0f} ({(m / first - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()

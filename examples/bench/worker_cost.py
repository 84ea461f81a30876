#!/usr/bin/env python3
"""Instructions per job of a worker process, counted by callgrind (issue #12).

The worker's CPU time per job moves by 20-40% between runs on a shared VM;
its user-space instructions do not. For each `queue-bench` binary given, this
starts a private redis-server, enqueues N no-op jobs with `queue-bench
enqueue`, runs `queue-bench consume` (the worker process of the `process`
workload) under `valgrind --tool=callgrind`, and prints the instructions per
job of that whole process (start-up included: under 1% at 10,000 jobs).

    python3 examples/bench/worker_cost.py /work/bin/queue-bench-old target/release/queue-bench
    python3 examples/bench/worker_cost.py --concurrency 1 --n 5000 target/release/queue-bench
    python3 examples/bench/worker_cost.py --enqueue --producers 16 OLD NEW   # the producers' process

Kernel work (system calls, context switches) is not counted, and under
valgrind the process runs ~50x slower, so time-driven batching (the acker's
window) differs from a native run: compare builds at the same settings, not
with wall-clock figures. `--keep DIR` keeps the callgrind files.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_modes import callgrind_total, connect, free_port  # noqa: E402


def measure(binary, a, keep):
    port = free_port()
    url = "redis://127.0.0.1:%d" % port
    server = subprocess.Popen([os.environ.get("REDIS_SERVER", "redis-server"), "--port", str(port), "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    tmp = tempfile.mkdtemp()
    try:
        connect(port, 5.0)
        enqueue = [binary, "--redis-url", url, "enqueue", "--n", str(a.n), "--producers", str(a.producers)]
        out = os.path.join(tmp, "cg")
        valgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out]
        if a.enqueue:
            # The producers' process (the enqueue path: group commit, one
            # shared connection), as the end-to-end workload's producers.
            run = subprocess.run(valgrind + enqueue, check=True, capture_output=True, text=True)
        else:
            subprocess.run(enqueue, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            run = subprocess.run(valgrind + [binary, "--redis-url", url, "consume", "--n", str(a.n),
                                             "--concurrency", str(a.concurrency)],
                                 check=True, capture_output=True, text=True)
        total = 0
        for f in glob.glob(out + "*"):
            total += callgrind_total(f) or 0
            if keep:
                shutil.copy(f, os.path.join(keep, os.path.basename(binary) + "." + os.path.basename(f)))
        result = json.loads(run.stdout.strip().splitlines()[-1])
        if a.enqueue:
            r = connect(port, 5.0)
            calls = sum(int(v["calls"]) for k, v in r.info("commandstats").items()
                        if k.startswith("cmdstat_fcall") or k.startswith("cmdstat_evalsha"))
            return total / a.n, round(a.n / max(calls, 1), 2), None
        scripts = (result.get("cmds") or {}).get("scripts") or {}
        return total / a.n, scripts.get("jobs_per_fetch_script"), scripts.get("jobs_per_ack_script")
    finally:
        server.kill()
        shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+", help="queue-bench builds to compare")
    ap.add_argument("--n", type=int, default=10000, help="jobs (default 10000)")
    ap.add_argument("--concurrency", type=int, default=64, help="worker concurrency (default 64)")
    ap.add_argument("--keep", help="keep the callgrind files in this directory")
    ap.add_argument("--enqueue", action="store_true",
                    help="measure the producers' process (queue-bench enqueue) instead of the worker")
    ap.add_argument("--producers", type=int, default=1, help="concurrent producers (default 1)")
    a = ap.parse_args()
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
    if a.enqueue:
        print(f"{a.n} no-op jobs, {a.producers} producers; producer process instructions per job (callgrind)")
        print("| build | instructions per job | jobs per enqueue script call | – |")
    else:
        print(f"{a.n} no-op jobs, concurrency {a.concurrency}; worker process instructions per job (callgrind)")
        print("| build | instructions per job | jobs per fetch call | jobs per ack call |")
    print("|---|---:|---:|---:|")
    first = None
    for binary in a.binaries:
        per_job, per_fetch, per_ack = measure(binary, a, a.keep)
        first = first or per_job
        change = "" if per_job == first else f" ({(per_job / first - 1) * 100:+.1f}%)"
        print(f"| {binary} | {per_job:,.0f}{change} | {per_fetch if per_fetch is not None else '–'} | "
              f"{per_ack if per_ack is not None else '–'} |", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Tables of `scripts/bench.sh --focus`: the goal workloads of issue #12, the
baseline build (an older commit), this build and BullMQ, interleaved runs.

    python3 examples/bench/focus_report.py RESULTS.jsonl > RESULTS.md

Each result's label is `run=R,build=B,load=L` (L: 1-minute load average just
before the run). Medians over the runs; ratios are medians of this build
over the median of the other system.
"""
import json
import statistics
import sys

WORKLOADS = [
    ("e2e", 16, "end to end, 16 producers, concurrency 16", 3.0),
    ("process", 64, "process only, concurrency 64", 4.0),
    ("process", 1, "process only, concurrency 1", 1.5),
]


def label(rec):
    out = {}
    for part in rec.get("label", "").split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out


def main(path):
    recs = [json.loads(l) for l in open(path) if l.strip()]
    machine = next((r for r in recs if r.get("workload") == "machine"), {})
    rows = {}
    idle = {}
    for r in recs:
        lab = label(r)
        if r.get("workload") == "idle":
            idle[lab.get("build", "new")] = r
            continue
        if r.get("workload") not in ("e2e", "process") or "build" not in lab:
            continue
        rows.setdefault((r["workload"], r.get("concurrency"), lab["build"]), []).append((lab, r))

    def med(key, f):
        vals = [f(r) for _, r in rows.get(key, []) if f(r) is not None]
        return statistics.median(vals) if vals else None

    jps = lambda r: r.get("jobs_per_s")
    usec = lambda r: (r.get("cmds") or {}).get("redis_usec_per_job") or (r.get("cmds") or {}).get("scripts_usec_per_job")
    wcpu = lambda r: r["worker_cpu_s"] * 1e6 / r["n"] if r.get("worker_cpu_s") is not None else None
    evals = lambda r: (r.get("cmds") or {}).get("evalsha_per_job")

    print(f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores; {machine.get('redis', '?')}; "
          f"load average at start {' '.join(machine.get('loadavg_start', []))}.\n")
    print("#### Per run (jobs/s; 1-minute load average before the run in brackets)\n")
    print("| workload | build | run | jobs/s | load | Redis µs/job (scripts, commandstats) | worker µs/job | script calls/job |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for wl, c, name, _ in WORKLOADS:
        for build in ("baseline", "new", "hash", "bullmq"):
            for lab, r in sorted(rows.get((wl, c, build), []), key=lambda x: x[0].get("run", "")):
                f = lambda v, d=1: "–" if v is None else f"{v:,.{d}f}"
                print(f"| {name} | {build} | {lab.get('run')} | {f(jps(r), 0)} | {lab.get('load', '?')} | "
                      f"{f(usec(r))} | {f(wcpu(r))} | {f(evals(r), 2)} |")
    print()
    def goals(before, after):
        """Medians of build `after` against build `before` and BullMQ, and the goal lines."""
        print(f"| workload | {before} jobs/s | {after} jobs/s | BullMQ jobs/s | {after} ÷ {before} | {after} ÷ BullMQ "
              f"| goal | met? | Redis µs/job {before} → {after} (BullMQ) | worker µs/job {before} → {after} |")
        print("|---|---:|---:|---:|---:|---:|---:|---|---|---|")
        for wl, c, name, goal in WORKLOADS:
            b, n, p = (med((wl, c, s), jps) for s in (before, after, "bullmq"))
            f = lambda v, d=0: "–" if v is None else f"{v:,.{d}f}"
            ratio = lambda x, y: f"{x / y:.2f}×" if x and y else "–"
            met = "–" if not (n and p) else ("**met**" if n / p >= goal else "**not met**")
            ub, un, up = (med((wl, c, s), usec) for s in (before, after, "bullmq"))
            wb, wn = (med((wl, c, s), wcpu) for s in (before, after))
            print(f"| {name} | {f(b)} | {f(n)} | {f(p)} | {ratio(n, b)} | {ratio(n, p)} | ≥ {goal}× | {met} | "
                  f"{f(ub, 1)} → {f(un, 1)} ({f(up, 1)}) | {f(wb, 1)} → {f(wn, 1)} |")
        print()

    print("#### Medians and goals\n")
    goals("baseline", "new")
    if any(k[2] == "hash" for k in rows):
        print("#### This build with hash completion records (`--hash-records`; compact is the default since stop 48)\n")
        goals("new", "hash")
    if idle:
        print("#### Idle worker (10 s, empty queue)\n")
        print("| build | BLMOVE | EVALSHA | calls/s | all commands |")
        print("|---|---:|---:|---:|---|")
        for build in ("baseline", "new"):
            r = idle.get(build)
            if r:
                print(f"| {build} | {r['blmove']} | {r['evalsha']} | {r['calls_per_s']} | `{json.dumps(r.get('per_command', {}))}` |")
        print()
    end = next((r for r in recs if r.get("workload") == "machine_end"), None)
    if end:
        print(f"Load average at end: {' '.join(end['loadavg_end'])}.")


if __name__ == "__main__":
    main(sys.argv[1])

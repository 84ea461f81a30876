#!/usr/bin/env python3
"""Tables of the issue #12 sections of scripts/bench.sh (--bullmq-bench,
--trickle, --cost) from its raw results (one JSON object a line).

    python3 examples/bench/issue12_report.py RESULTS.jsonl > RESULTS.md

Medians over the runs (label `run=N`); each run's 1-minute load average is in
its label (`load=X`). Goals are those of issue #12.
"""
import json
import statistics
import sys

# ChasquiMQ's published ratios over BullMQ (benchmarks/README.md of
# jotarios/chasquimq, Apple M3, Redis 8.6, BullMQ 5.76.4).
CHASQUI = {"queue-add": "1.19×", "queue-add-bulk": "3.22×", "worker-generic": "31.2× (direction only)",
           "worker-concurrent": "8.78×"}
BB_ORDER = ["queue-add", "queue-add-bulk", "worker-generic", "worker-concurrent"]


def label(r, key):
    for kv in (r.get("label") or "").split(","):
        if kv.startswith(key + "="):
            return kv.split("=", 1)[1]
    return None


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, nd=0):
    if x is None:
        return "–"
    return f"{x:,.{nd}f}"


def loads(rs):
    ls = sorted(float(r.get("load1") or label(r, "load")) for r in rs if r.get("load1") or label(r, "load"))
    return f"{ls[0]:.1f}–{ls[-1]:.1f}" if ls else "–"


def bb_section(rows):
    bb = [r for r in rows if r.get("workload") == "bb"]
    if not bb:
        return
    print("#### bullmq-bench scenarios\n")
    print("| scenario | measured jobs | BullMQ jobs/s (median; runs) | queue-core jobs/s (median; runs) "
          "| queue-core ÷ BullMQ | ChasquiMQ ÷ BullMQ (published) | load |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for sc in BB_ORDER:
        rs = [r for r in bb if r.get("scenario") == sc]
        if not rs:
            continue
        by = {s: [r.get("jobs_per_s") for r in rs if r.get("system") == s] for s in ("bullmq", "queue-core")}
        b, q = med(by["bullmq"]), med(by["queue-core"])
        runs = lambda v: ", ".join(fmt(x) for x in v)
        ratio = f"**{q / b:.2f}×**" if b and q else "–"
        print(f"| `{sc}` | {fmt(rs[0].get('n'))} | {fmt(b)} ({runs(by['bullmq'])}) | {fmt(q)} ({runs(by['queue-core'])}) "
              f"| {ratio} | {CHASQUI[sc]} | {loads(rs)} |")
    print()


def trickle_section(rows):
    tr = [r for r in rows if r.get("workload") == "e2e-rate" and label(r, "section") == "trickle"]
    if not tr:
        return
    print("#### Trickle: enqueue → start at a fixed offered load\n")
    print("| system | offered jobs/s | delivered jobs/s (median) | jobs | p50 ms (median; runs) | p99 ms (median; runs) | p99.9 ms | "
          "client commands/job | script calls/job | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    p99 = {}
    for s in ("queue-core", "bullmq"):
        rs = [r for r in tr if r.get("system") == s]
        if not rs:
            continue
        lat = [r.get("latency") or {} for r in rs]
        p50s, p99s = [l.get("p50_ms") for l in lat], [l.get("p99_ms") for l in lat]
        p999 = med([l.get("p999_ms") for l in lat])
        p99[s] = med(p99s)
        cm = [r.get("cmds") or {} for r in rs]
        if s == "queue-core":
            client = fmt(med([c.get("top_level_cmds_per_job") for c in cm]), 2)
        else:
            client = "–"
        scripts = fmt(med([c.get("evalsha_per_job") for c in cm]), 2)
        runs = lambda v: ", ".join(fmt(x, 2) for x in v)
        print(f"| {s} | {fmt(rs[0].get('rate'))} | {fmt(med([r.get('jobs_per_s') for r in rs]))} | {fmt(rs[0].get('n'))} | {fmt(med(p50s), 2)} ({runs(p50s)}) "
              f"| {fmt(p99[s], 2)} ({runs(p99s)}) | {fmt(p999, 2)} | {client} | {scripts} | {loads(rs)} |")
    print()
    if "queue-core" in p99 and "bullmq" in p99 and p99["queue-core"]:
        q, b = p99["queue-core"], p99["bullmq"]
        ok = q <= b / 3
        print(f"Goal p99 ≤ BullMQ's p99 / 3 ({b / 3:.2f} ms): queue-core {q:.2f} ms, "
              f"BullMQ ÷ queue-core = {b / q:.2f}× → **{'met' if ok else 'not met'}**.")
    q = [r for r in tr if r.get("system") == "queue-core"]
    if q:
        c = med([(r.get("cmds") or {}).get("top_level_cmds_per_job") for r in q])
        if c is not None:
            print(f"Goal ≤ 3 client round trips per job (enqueue included): {c:.2f} → **{'met' if c <= 3 else 'not met'}**.")
    print()


def flat(vals):
    """Growth from the smallest size (first) to the largest (last): met if <= 20%."""
    if len(vals) < 2 or not vals[0] or vals[-1] is None:
        return "–"
    g = (vals[-1] - vals[0]) / vals[0] * 100
    return f"{g:+.0f}% → **{'met' if g <= 20 else 'not met'}**"


def cost_section(rows):
    ack = [r for r in rows if r.get("workload") == "cost-ack"]
    if ack:
        print("#### (a) Ack cost vs jobs in flight\n")
        print("| in flight | worker processes × concurrency | handler sleep ms | processing list (median) | "
              "jobs/s | Redis µs/job, scripts (median; runs) | LREM µs per ack | Redis CPU µs/job | script calls/job | load |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        meds, cpus = [], []
        for f in sorted({r["in_flight"] for r in ack}):
            rs = [r for r in ack if r["in_flight"] == f]
            us = [r.get("redis_scripts_usec_per_job") for r in rs]
            meds.append(med(us))
            cpus.append(med([r.get("redis_cpu_usec_per_job") for r in rs]))
            print(f"| {f:,} | {rs[0]['workers']} × {rs[0]['concurrency_per_worker']} | {rs[0]['handler_sleep_ms']} "
                  f"| {fmt(med([(r.get('processing_len') or {}).get('median') for r in rs]))} "
                  f"| {fmt(med([r.get('jobs_per_s') for r in rs]))} | {fmt(med(us), 1)} ({', '.join(fmt(x, 1) for x in us)}) "
                  f"| {fmt(med([r.get('lrem_usec_per_ack') for r in rs]), 2)} "
                  f"| {fmt(med([r.get('redis_cpu_usec_per_job') for r in rs]), 1)} "
                  f"| {fmt(med([r.get('evalsha_per_job') for r in rs]), 2)} | {loads(rs)} |")
        print(f"\nGrowth from 16 to 4,096 in flight (goal: flat within 20%): scripts µs/job {flat(meds)}; "
              f"Redis CPU µs/job {flat(cpus)}.\n")
    bl = [r for r in rows if r.get("workload") == "cost-backlog"]
    if bl:
        print("#### (b) Fetch and promote cost vs backlog\n")
        print("| measured jobs | kind | other jobs in the queue | Redis used memory MiB | jobs/s | "
              "Redis µs/job, scripts (median; runs) | Redis CPU µs/job | list move µs/job | promote ZRANGEBYSCORE+ZRANGE µs/promoted | load |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        # A backlog measured at once after its load, without waiting for
        # Redis to finish rehashing its keyspace (`--settle-s 0`), is a kind
        # of its own, as is `--fresh` (each run's jobs written just before
        # it); their no-backlog rows are the plain kind's. A run that started
        # while the keyspace was being rehashed is marked † in the list.
        def kind_of(r):
            k = r["kind"] + (", fresh" if r.get("fresh") else "")
            if r["backlog"] > 0 and r.get("settle_s") == 0:
                k += ", measured at once after the load"
            return k

        kinds = []
        for r in bl:
            if kind_of(r) not in kinds:
                kinds.append(kind_of(r))
        for kind in kinds:
            meds, cpus = [], []
            base = kind.split(",")[0]
            ofk = [r for r in bl if kind_of(r) == kind or (kind != base and kind_of(r) == base
                                                          and r["backlog"] == 0)]
            if not any(kind_of(r) == kind and r["backlog"] > 0 for r in ofk) and kind != base:
                continue
            for b in sorted({r["backlog"] for r in ofk}):
                rs = [r for r in ofk if r["backlog"] == b]
                us = [r.get("redis_scripts_usec_per_job") for r in rs]
                meds.append(med(us))
                cpu = med([r.get("redis_cpu_usec_per_job") for r in rs])
                cpus.append(cpu)
                pz = med([r.get("promote_zset_usec_per_promoted") for r in rs])
                print(f"| {fmt(rs[0]['n'])} | {kind} | {fmt(b)} | {fmt(med([r.get('redis_used_memory_mib') for r in rs]))} "
                      f"| {fmt(med([r.get('jobs_per_s') for r in rs]))} | {fmt(med(us), 1)} "
                      f"({', '.join(fmt(r.get('redis_scripts_usec_per_job'), 1) + ('†' if r.get('rehashing') else '') for r in rs)}) "
                      f"| {fmt(cpu, 1)} | {fmt(med([r.get('move_usec_per_job') for r in rs]), 2)} | {fmt(pz, 2)} | {loads(rs)} |")
            if meds:
                print(f"| | {kind}: flat within 20%? | | | | {flat(meds)} | {flat(cpus)} | | | |")
        print()
    peer = [r for r in rows if r.get("workload") == "process" and r.get("system") == "bullmq"
            and r.get("backlog") is not None and "section=cost" in r.get("label", "")]
    if peer:
        print("BullMQ over the same backlogs (`bench.cjs process --backlog B`, its measured jobs added first; "
              "Redis µs in scripts while they ran):\n")
        print("| system | measured jobs | waiting behind them | jobs/s | Redis µs/job, scripts (median; runs) | load |")
        print("|---|---:|---:|---:|---:|---:|")
        meds = []
        for b in sorted({r["backlog"] for r in peer}):
            rs = [r for r in peer if r["backlog"] == b]
            us = [r.get("consume_scripts_usec_per_job") for r in rs]
            meds.append(med(us))
            print(f"| BullMQ | {fmt(rs[0]['n'])} | {fmt(b)} | {fmt(med([r.get('jobs_per_s') for r in rs]))} "
                  f"| {fmt(med(us), 1)} ({', '.join(fmt(x, 1) for x in us)}) | {loads(rs)} |")
        print(f"| | BullMQ: flat within 20%? | | | {flat(meds)} | |")
        print()
    mem = [r for r in rows if r.get("workload") == "cost-memory"]
    if mem:
        print("#### (c) Redis memory per job\n")
        print("| jobs | retention | records | bytes per waiting job (used_memory Δ / N) | MEMORY USAGE of one job hash "
              "| bytes per completed job (Δ / N) | MEMORY USAGE of one completion record | ≤ 150 B per record |")
        print("|---:|---|---|---:|---:|---:|---:|---|")
        for r in mem:
            ret = "default (24 h)" if r.get("retention_s") is None else f"{r['retention_s']} s"
            ret += " | " + ("compact" if r.get("compact_records") else "hash")
            per = r.get("bytes_per_completed_job")
            rec = r.get("memory_usage_completion_record")
            goal = "–" if r.get("retention_s") == 0 else (
                f"**{'met' if per is not None and per <= 150 else 'not met'}** ({fmt(per)} B)")
            print(f"| {fmt(r['n'])} | {ret} | {fmt(r.get('bytes_per_waiting_job'))} | {fmt(r.get('memory_usage_job_hash'))} "
                  f"| {fmt(per)} | {fmt(rec)} | {goal} |")
        print()


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
    m = next((r for r in rows if r.get("workload") == "machine"), None)
    e = next((r for r in rows if r.get("workload") == "machine_end"), None)
    if m:
        print(f"Machine: {m.get('cpu')}, {m.get('cores')} cores; {m.get('redis')}; {m.get('node')}. "
              f"Load average at start {' '.join(m.get('loadavg_start', []))}"
              + (f", at end {' '.join(e.get('loadavg_end', []))}" if e else "") + ".\n")
    bb_section(rows)
    trickle_section(rows)
    cost_section(rows)


if __name__ == "__main__":
    main()

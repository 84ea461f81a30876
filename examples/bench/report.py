#!/usr/bin/env python3
"""Turns a results file of scripts/bench.sh (JSON lines) into Markdown tables.

    python3 examples/bench/report.py examples/bench/results/bench-XXXX.jsonl

Each workload ran R times: the tables show the median, and the spread
(max - min) / median as the noise. Ratios are queue-core / peer (higher is
better for queue-core).
"""
import json
import statistics
import sys
from collections import defaultdict

SYSTEMS = ["queue-core", "bullmq", "apalis", "rq", "rq-fork"]
NAMES = {"queue-core": "queue-core", "bullmq": "BullMQ", "apalis": "apalis", "rq": "RQ (SimpleWorker)",
         "rq-fork": "RQ (default forking Worker)"}


def key(r):
    return (r.get("workload"), r.get("system"), r.get("producers"), r.get("batch"), r.get("payload") or 0,
            r.get("concurrency"), r.get("rate") or 0, r.get("n"))


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs):
    xs = [x for x in xs if x is not None]
    if len(xs) < 2 or not statistics.median(xs):
        return None
    return (max(xs) - min(xs)) / statistics.median(xs)


def fmt_int(x):
    return "–" if x is None else f"{x:,.0f}"


def fmt_ms(x):
    if x is None:
        return "–"
    return f"{x:.2f}" if x < 100 else f"{x:,.0f}"


def pct(x):
    return "–" if x is None else f"±{x * 50:.0f}%"  # half the range


def main(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    machine = next((r for r in rows if r.get("workload") == "machine"), {})
    machine_end = next((r for r in rows if r.get("workload") == "machine_end"), {})
    groups = defaultdict(list)
    for r in rows:
        if r.get("workload") in ("enqueue", "process", "e2e", "e2e-rate"):
            groups[key(r)].append(r)

    def agg(rs):
        g = lambda f: [f(r) for r in rs]
        lat = lambda q: med(g(lambda r: (r.get("latency") or {}).get(q)))
        cmds = rs[0].get("cmds") or {}
        return {
            "n": rs[0].get("n"), "runs": len(rs),
            "jps": med(g(lambda r: r.get("jobs_per_s"))), "spread": spread(g(lambda r: r.get("jobs_per_s"))),
            "p50": lat("p50_ms"), "p99": lat("p99_ms"), "p999": lat("p999_ms"),
            "all_cmds": med(g(lambda r: (r.get("cmds") or {}).get("all_cmds_per_job"))),
            "evalsha": med(g(lambda r: (r.get("cmds") or {}).get("evalsha_per_job"))),
            "top": med(g(lambda r: (r.get("cmds") or {}).get("top_level_cmds_per_job"))),
            "blmove": med(g(lambda r: (r.get("cmds") or {}).get("blmove_per_job"))),
            "rt": med(g(lambda r: r.get("round_trips_per_job"))),
            "usec": med(g(lambda r: (r.get("cmds") or {}).get("redis_usec_per_job"))),
            "jpf": med(g(lambda r: ((r.get("cmds") or {}).get("scripts") or {}).get("jobs_per_fetch_script"))),
            "rcpu": med(g(lambda r: r.get("redis_cpu_util"))),
            "cmds": cmds,
            "errors": [r.get("error") for r in rs if r.get("error")],
        }

    out = []
    w = out.append
    w(f"Results file: `{path}`\n")
    if machine:
        w(f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores, {machine.get('mem_gib')} GiB, "
          f"Linux {machine.get('kernel')}; {machine.get('redis')}; {machine.get('rustc')}; node {machine.get('node')}; "
          f"{machine.get('python')}. Load average at start {' '.join(machine.get('loadavg_start', []))}, "
          f"at end {' '.join(machine_end.get('loadavg_end', []))}.\n")

    # The ceiling.
    ceil = [r for r in rows if r.get("workload") == "ceiling"]
    best = {}
    if ceil:
        w("### Ceiling: redis-benchmark on the same server\n")
        w("| clients | LPUSH /s | LMOVE /s | EVALSHA (`return 1`) /s | EVALSHA pipelined ×16 /s |")
        w("|---:|---:|---:|---:|---:|")
        for c in ceil:
            rps = c["rps"]
            w(f"| {c['clients']} | {fmt_int(rps.get('lpush'))} | {fmt_int(rps.get('lmove'))} | "
              f"{fmt_int(rps.get('evalsha'))} | {fmt_int(rps.get('evalsha_pipelined_16'))} |")
            for k, v in rps.items():
                best[k] = max(best.get(k, 0), v)
        w("")

    # Throughput tables, one per workload family.
    def table(title, filt, show_lat=False, show_cmds=True):
        ks = sorted([k for k in groups if filt(k)], key=lambda k: (str(k[2]), str(k[3]), k[4], str(k[5]), k[6],
                                                                    SYSTEMS.index(k[1]) if k[1] in SYSTEMS else 9))
        if not ks:
            return
        w(f"### {title}\n")
        head = "| system | setting | N | jobs/s (median) | noise | queue-core ÷ system |"
        sep = "|---|---|---:|---:|---:|---:|"
        if show_lat:
            head += " enqueue→start p50 / p99 / p99.9 ms |"
            sep += "---:|"
        if show_cmds:
            head += " Redis cmds/job (all) | script calls/job |"
            sep += "---:|---:|"
        w(head)
        w(sep)
        # ours per setting (same producers/batch/payload/concurrency/rate)
        ours = {}
        for k in ks:
            if k[1] == "queue-core":
                ours[(k[0], k[2], k[3], k[4], k[5], k[6])] = agg(groups[k])["jps"]
        for k in ks:
            a = agg(groups[k])
            wl, system, prod, batch, payload, conc, rate, _n = k
            setting = []
            if prod is not None:
                setting.append(f"{prod} producer{'s' if prod != 1 else ''}")
            if batch and batch > 1:
                setting.append(f"batch {batch}")
            if conc is not None:
                setting.append(f"concurrency {conc}" if system not in ("rq", "rq-fork") else f"{conc} worker process{'es' if conc != 1 else ''}")
            if payload:
                setting.append(f"{payload} B payload")
            if rate:
                setting.append(f"offered {rate:.0f}/s")
            # ratio against ours with the same setting (RQ: same worker count as ours' concurrency)
            o = ours.get((wl, prod, batch, payload, conc, rate))
            if o is None and system in ("rq", "rq-fork") and wl != "process":
                # RQ's worker processes vs queue-core's headline concurrency 16
                o = ours.get((wl, prod, batch, payload, 16, rate))
            ratio = "–" if system == "queue-core" or not o or not a["jps"] else f"{o / a['jps']:.1f}×"
            jps_text = fmt_int(a["jps"])
            if a["errors"]:
                jps_text = "failed" if a["jps"] is None else f"{jps_text} ({len(a['errors'])} of {a['runs']} runs failed)"
            line = f"| {NAMES.get(system, system)} | {', '.join(setting)} | {fmt_int(a['n'])} | {jps_text} | {pct(a['spread'])} | {ratio} |"
            if show_lat:
                line += f" {fmt_ms(a['p50'])} / {fmt_ms(a['p99'])} / {fmt_ms(a['p999'])} |"
            if show_cmds:
                all_cmds = "–" if a["all_cmds"] is None else f"{a['all_cmds']:.1f}"
                scripts = "–" if a["evalsha"] is None else f"{a['evalsha']:.2f}"
                line += f" {all_cmds} | {scripts} |"
            w(line)
        w("")

    table("(a) Enqueue only", lambda k: k[0] == "enqueue")
    table("(b) Process only (jobs enqueued beforehand)", lambda k: k[0] == "process", show_cmds=False)
    table("(c) End to end, producers as fast as they can", lambda k: k[0] == "e2e" and not k[4], show_lat=True)
    table(f"(c) End to end at a fixed offered load (latency)", lambda k: k[0] == "e2e-rate", show_lat=True)
    table("(d) End to end, 1 KiB payload", lambda k: k[0] == "e2e" and k[4], show_lat=True)

    # queue-core's round trips and the fraction of the ceiling.
    w("### queue-core: commands per job and the ceiling\n")
    w("Ceiling = best redis-benchmark EVALSHA/s (BLMOVE counted at the LMOVE rate) ÷ queue-core's "
      "client→Redis commands per job in that workload.\n")
    w("| workload | setting | jobs/s | EVALSHA/job | BLMOVE/job | client commands/job | client round trips/job | jobs per fetch script | Redis µs/job (scripts) | Redis CPU | ceiling jobs/s | % of ceiling |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in sorted([k for k in groups if k[1] == "queue-core"], key=lambda k: (k[0], str(k[2]), str(k[3]), k[4], str(k[5]), k[6])):
        a = agg(groups[k])
        wl, _, prod, batch, payload, conc, rate, _n = k
        setting = ", ".join(x for x in [
            f"P={prod}" if prod is not None else "", f"batch={batch}" if batch and batch > 1 else "",
            f"C={conc}" if conc is not None else "", f"{payload} B" if payload else "", f"{rate:.0f}/s" if rate else ""] if x)
        ceiling = None
        if best.get("evalsha") and a["evalsha"] is not None:
            cost = (a["evalsha"] or 0) / best["evalsha"] + (a["blmove"] or 0) / max(best.get("lmove", 1), 1)
            ceiling = 1 / cost if cost else None
        frac = None if not ceiling or not a["jps"] else a["jps"] / ceiling
        rt = a["rt"]
        if rt is None and a["evalsha"] is not None and wl in ("e2e", "e2e-rate"):
            sc = (a["cmds"] or {}).get("scripts") or {}
            n = a["n"] or 1
            enq_rt = n / (batch or 1)
            rt = (enq_rt + sc.get("fetch", 0) + sc.get("claim_after_blmove", 0) + sc.get("blmove", 0) + sc.get("ack", 0)) / n
        elif rt is None and wl == "process":
            sc = (a["cmds"] or {}).get("scripts") or {}
            n = a["n"] or 1
            rt = (sc.get("fetch", 0) + sc.get("claim_after_blmove", 0) + sc.get("blmove", 0) + sc.get("ack", 0)) / n
        f2 = lambda x, d=2: "–" if x is None else f"{x:.{d}f}"
        rcpu = "–" if a["rcpu"] is None else f"{a['rcpu'] * 100:.0f}%"
        w(f"| {wl} | {setting} | {fmt_int(a['jps'])} | {f2(a['evalsha'])} | {f2(a['blmove'], 3)} | {f2(a['top'])} | {f2(rt)} | "
          f"{f2(a['jpf'], 1)} | {f2(a['usec'], 1)} | {rcpu} | {fmt_int(ceiling)} | "
          f"{'–' if frac is None else f'{frac*100:.0f}%'} |")
    w("")

    proto = defaultdict(list)
    for r in rows:
        if r.get("workload") == "proto":
            proto[(r["fetchers"], r["fetch_batch"], r["ack"])].append(r)
    if proto:
        w("### Prototype: the same scripts without the Worker, acks one per job vs batched\n")
        w("| fetch loops | jobs per fetch | ack | jobs/s (median) | noise | EVALSHA/job | Redis CPU |")
        w("|---:|---:|---|---:|---:|---:|---:|")
        for (f, b, a), rs in sorted(proto.items()):
            j = [r["jobs_per_s"] for r in rs]
            w(f"| {f} | {b} | {a} | {fmt_int(med(j))} | {pct(spread(j))} | {med([r['evalsha_per_job'] for r in rs]):.3f} | "
              f"{med([r['redis_cpu_util'] for r in rs]) * 100:.0f}% |")
        w("")

    # The targets of the issue, from the saturating end-to-end no-op workload.
    def jps(system, **want):
        for k, rs in groups.items():
            if k[0] == "e2e" and k[1] == system and not k[4] and (k[3] or 1) == 1 and \
                    all(dict(producers=k[2], concurrency=k[5])[a] == b for a, b in want.items()):
                return agg(rs)
        return None
    o, b, rq_ = jps("queue-core", producers=16, concurrency=16), jps("bullmq", producers=16), jps("rq", producers=16)
    if o:
        w("### Targets (end to end, no-op jobs, 16 producers, concurrency 16, same run)\n")
        if b and b["jps"]:
            w(f"- ≥ 2× BullMQ: {o['jps'] / b['jps']:.2f}× ({fmt_int(o['jps'])} vs {fmt_int(b['jps'])} jobs/s) — "
              f"{'met' if o['jps'] >= 2 * b['jps'] else 'NOT met'}")
        if rq_ and rq_["jps"]:
            w(f"- ≥ 5× RQ: {o['jps'] / rq_['jps']:.1f}× ({fmt_int(o['jps'])} vs {fmt_int(rq_['jps'])} jobs/s) — "
              f"{'met' if o['jps'] >= 5 * rq_['jps'] else 'NOT met'}")
        if best.get("evalsha") and o["evalsha"] is not None:
            c = 1 / ((o["evalsha"] or 0) / best["evalsha"] + (o["blmove"] or 0) / max(best.get("lmove", 1), 1))
            w(f"- ≥ 40% of the redis-benchmark ceiling for {o['top']:.2f} commands/job ({fmt_int(c)} jobs/s): "
              f"{o['jps'] / c * 100:.0f}% — {'met' if o['jps'] >= 0.4 * c else 'NOT met'}")
        w("")

    idle = [r for r in rows if r.get("workload") == "idle"]
    for r in idle:
        w("### Idle worker\n")
        w(f"{r['seconds']} s on an empty queue: {r['blmove']} BLMOVE (expected ≈ {r['expected_blmove']:.0f} = seconds ÷ "
          f"block_timeout {r['block_timeout_s']} s), {r['evalsha']} EVALSHA (the promoter, every "
          f"{r['promote_interval_ms']} ms) → {r['calls_per_s']} calls/s. All commands: `{json.dumps(r['per_command'])}`.\n")
    mem = [r for r in rows if r.get("workload") == "memory"]
    if mem:
        w("### Steady memory (one worker process, concurrency 16)\n")
        w("| jobs | completion retention | jobs/s | worker RSS start / peak / end MiB | Redis used_memory before → after MiB |")
        w("|---:|---|---:|---|---|")
        for r in mem:
            rss = r["rss_mib"]
            ret = "default (24 h)" if r.get("retention_s") is None else f"{r['retention_s']} s"
            red = r["redis_used_memory_mib"]
            w(f"| {fmt_int(r['n'])} | {ret} | {fmt_int(r['jobs_per_s'])} | {rss['start']} / {rss['peak']} / {rss['end']} | "
              f"{red['before_worker']} → {red['after_worker']} |")
        w("")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])

"""Peer driver: RQ running the queue-bench workloads.

Same job (a sequence number, the producer's wall clock in µs, padding), same
counts, same output (one JSON line) as `queue-bench`. Concurrency is the
number of worker processes (RQ runs one job at a time per worker). Workers are
`SimpleWorker`s (no fork per job) unless `--worker-class default`.

    python bench.py --redis-url URL enqueue --n 100000 --producers 16 [--batch 100]
    python bench.py --redis-url URL process --n 100000 --workers 2 [--worker-class default]
    python bench.py --redis-url URL e2e --n 100000 --producers 16 --workers 2 [--rate 2000]
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import redis
import rq
from rq import Queue, SimpleWorker, Worker
from rq.registry import FinishedJobRegistry

import rq_jobs

QUEUE = "bench"


def now_us():
    return time.time_ns() // 1000


def parse(argv):
    o = {"redis-url": "redis://127.0.0.1:6379/", "mode": ""}
    i = 0
    while i < len(argv):
        if argv[i].startswith("--"):
            o[argv[i][2:]] = argv[i + 1]
            i += 2
        else:
            o["mode"] = argv[i]
            i += 1
    return o


def summary_ms(v):
    v = sorted(v)

    def q(p):
        if not v:
            return 0.0
        i = min(max(-(-int(p * len(v) * 1000) // 1000), 1), len(v)) - 1
        return round(v[i] / 1000.0, 3)

    return {"count": len(v), "p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999), "max_ms": q(1.0)}


def produce(url, n, producers, batch, payload, rate):
    conn = redis.Redis.from_url(url)
    q = Queue(QUEUE, connection=conn)
    pad = "x" * payload
    start = time.monotonic()
    errors = []

    def run(i):
        try:
            share = n // producers + (1 if i < n % producers else 0)
            every = batch * producers / rate if rate > 0 else 0
            sent = k = 0
            while sent < share:
                if every:
                    wait = start + every * k - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                k += 1
                m = min(batch, share - sent)
                t = now_us()
                if m == 1:
                    q.enqueue(rq_jobs.noop, sent, t, pad)
                else:
                    q.enqueue_many([Queue.prepare_data(rq_jobs.noop, (sent + j, t, pad)) for j in range(m)])
                sent += m
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def worker_main(url, klass, burst):
    conn = redis.Redis.from_url(url)
    q = Queue(QUEUE, connection=conn)
    cls = SimpleWorker if klass == "simple" else Worker
    w = cls([q], connection=conn)
    w.work(burst=burst, logging_level="WARNING", with_scheduler=False)
    print(json.dumps({"latencies": rq_jobs.LATENCIES}), flush=True)


def spawn_workers(url, count, klass, burst):
    here = os.path.dirname(os.path.abspath(__file__))
    procs = []
    for _ in range(count):
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(here, "bench.py"), "--redis-url", url, "worker",
             "--worker-class", klass, "--burst", "1" if burst else "0"],
            stdout=subprocess.PIPE, text=True, cwd=here))
    return procs


def wait_finished(url, n):
    conn = redis.Redis.from_url(url)
    reg = FinishedJobRegistry(QUEUE, connection=conn)
    while reg.count < n:
        time.sleep(0.005)
    return now_us()


def collect(procs, stop):
    lat = []
    for p in procs:
        if stop:
            p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=120)
        for line in out.splitlines():
            if line.startswith("{"):
                lat.extend(json.loads(line)["latencies"])
    return lat


def main():
    o = parse(sys.argv[1:])
    url = o["redis-url"]
    n = int(o.get("n", 100000))
    producers = int(o.get("producers", 1))
    batch = int(o.get("batch", 1))
    payload = int(o.get("payload", 0))
    rate = float(o.get("rate", 0))
    workers = int(o.get("workers", 1))
    klass = o.get("worker-class", "simple")
    mode = o["mode"]
    if mode == "worker":
        worker_main(url, klass, o.get("burst") == "1")
        return
    redis.Redis.from_url(url).flushall()
    if mode == "enqueue":
        t = time.monotonic()
        produce(url, n, producers, batch, payload, 0)
        s = time.monotonic() - t
        out = {"workload": "enqueue", "n": n, "producers": producers, "batch": batch, "payload": payload,
               "seconds": s, "jobs_per_s": round(n / s)}
    elif mode == "process":
        produce(url, n, 4, 1000, payload, 0)
        t0 = now_us()
        procs = spawn_workers(url, workers, klass, burst=True)
        end = wait_finished(url, n)
        collect(procs, stop=False)
        s = (end - t0) / 1e6
        out = {"workload": "process", "n": n, "concurrency": workers, "worker_class": klass, "payload": payload,
               "seconds": s, "jobs_per_s": round(n / s)}
    elif mode == "e2e":
        procs = spawn_workers(url, workers, klass, burst=False)
        time.sleep(1.0)  # let the workers start and block on the empty queue
        t0 = now_us()
        produce(url, n, producers, batch, payload, rate)
        end = wait_finished(url, n)
        lat = collect(procs, stop=True)
        s = (end - t0) / 1e6
        out = {"workload": "e2e-rate" if rate > 0 else "e2e", "n": n, "producers": producers, "batch": batch,
               "payload": payload, "rate": rate, "concurrency": workers, "worker_class": klass,
               "seconds": s, "jobs_per_s": round(n / s),
               "latency": summary_ms(lat) if klass == "simple" else None}
    else:
        raise SystemExit(f"unknown mode {mode!r} (enqueue | process | e2e)")
    out["system"] = "rq" if klass == "simple" else "rq-fork"
    out["version"] = f"rq {rq.__version__}, redis-py {redis.__version__}, python {sys.version.split()[0]}"
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

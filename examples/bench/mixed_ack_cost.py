#!/usr/bin/env python3
"""What an ack's removal from processing costs when long-running deliveries
sit at the tail (issue #12, "cost must not grow with the work").

`ack.lua` removes each acked id with `LREM processing -1 id`: from the tail,
where the oldest deliveries are, O(1) when jobs finish in the order they were
fetched. Long-running jobs stay at the tail while short ones are fetched and
acked behind them: each short ack then walks past every long-running
delivery. This runs the same `LREM` the ack sends (and, for comparison, the
one from the head) against a private redis-server with L long-running ids at
the tail and 64 short deliveries at the head, acked 50 times over, and prints
Redis's own microseconds per call (`INFO commandstats`: Redis time only, no
round trip). Needs redis-server and redis-py.

    python3 examples/bench/mixed_ack_cost.py
"""
import socket
import subprocess
import time

import redis


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def usec_per_lrem(r, long_running, count):
    key = "q:{mixed}:processing"
    r.flushall()
    p = r.pipeline(transaction=False)
    for i in range(0, long_running, 1000):
        p.rpush(key, *["long-%036d" % j for j in range(i, min(i + 1000, long_running))])
    p.execute()
    r.config_resetstat()
    for rep in range(50):
        ids = ["short-%d-%030d" % (rep, k) for k in range(64)]
        r.lpush(key, *ids)
        p = r.pipeline(transaction=False)
        # Acked in the order fetched: the oldest short delivery (pushed
        # first, deepest) first.
        for i in ids:
            p.lrem(key, count, i)
        p.execute()
    return r.info("commandstats")["cmdstat_lrem"]["usec_per_call"]


def main():
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        r = redis.Redis(port=port)
        for _ in range(50):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        print("| long-running deliveries at the tail | `LREM -1` (ack.lua, from the tail), µs per call | `LREM 1` (from the head), µs per call |")
        print("|---:|---:|---:|")
        for long_running in [0, 1000, 10000, 100000]:
            tail = usec_per_lrem(r, long_running, -1)
            head = usec_per_lrem(r, long_running, 1)
            print(f"| {long_running:,} | {tail:.2f} | {head:.2f} |")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()

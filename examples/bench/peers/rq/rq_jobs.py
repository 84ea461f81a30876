"""The no-op job of the RQ peer driver (imported by RQ workers by name)."""
import time

# Enqueue -> start latencies (µs) seen by this worker process. Only a
# SimpleWorker runs jobs in this process; a forking Worker runs them in
# children, whose lists are lost (that variant reports throughput only).
LATENCIES = []


def noop(seq, t_us, pad):
    LATENCIES.append(time.time_ns() // 1000 - t_us)

#!/usr/bin/env bash
# The longer Sentinel failover measurement behind docs/SCALE-OUT.md:
# primary + replica(s) + 3 sentinels on loopback, producers with and without
# WAIT, two workers and a watchdog, FAILOVER_ROUNDS failovers alternating
# `SENTINEL FAILOVER` and a SIGKILL of the primary; prints one Markdown row
# per failover and the totals (and a line for any round in which the sentinels
# switched more than once). About 2 min per replica count.
#
#   scripts/failover.sh            # 1 and 2 replicas, 6 failovers each
#   FAILOVER_ROUNDS=10 scripts/failover.sh 1
#
# Needs redis-server and redis-cli (7.0+); the sentinels are
# `redis-server --sentinel`.
set -euo pipefail
cd "$(dirname "$0")/.."
replicas=("$@")
[ ${#replicas[@]} -gt 0 ] || replicas=(1 2)
for r in "${replicas[@]}"; do
  echo "=== FAILOVER_REPLICAS=$r (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
  FAILOVER_REPLICAS="$r" RUST_LOG="${RUST_LOG:-error}" \
    cargo test -q -p queue-tests --test failover failover_long_run -- --ignored --nocapture 2>&1 \
    | grep -v -E 'WARN|ERROR|^$|running 1 test|has been running'
done

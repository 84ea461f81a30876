#!/bin/bash
# Order-balanced A/B of two queue-bench builds (docs/BENCHMARKS.md, stops 37-39):
# A B B A, three times, on one private redis-server, each run
# `process --n 50000 --concurrency 64` and `e2e --n 50000 --producers 16 --concurrency 16`.
# Results are appended as JSON lines to OUT (label: the binary's name and the round).
#   bash examples/bench/abba.sh <queue-bench A> <queue-bench B> <out.jsonl>
set -euo pipefail
A=$1; B=$2; OUT=$3
PORT=$((20000 + RANDOM % 10000))
redis-server --port "$PORT" --save '' --appendonly no --daemonize yes --logfile /tmp/abba-redis-$PORT.log
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true' EXIT
until redis-cli -p "$PORT" ping >/dev/null 2>&1; do sleep 0.1; done
URL=redis://127.0.0.1:$PORT/
for r in 1 2 3; do
  for bin in "$A" "$B" "$B" "$A"; do
    redis-cli -p "$PORT" flushall >/dev/null
    "$bin" --redis-url "$URL" --out "$OUT" --label "$(basename "$bin") r$r" process --n 50000 --concurrency 64 >/dev/null
    redis-cli -p "$PORT" flushall >/dev/null
    "$bin" --redis-url "$URL" --out "$OUT" --label "$(basename "$bin") r$r" e2e --n 50000 --producers 16 --concurrency 16 >/dev/null
  done
done

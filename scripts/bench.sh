#!/usr/bin/env bash
# The benchmark suite: queue-core side by side with apalis, BullMQ and RQ on
# one redis-server, plus the redis-benchmark ceiling, idle-worker calls and
# steady memory. Writes raw results (one JSON object a line) and a Markdown
# table; see docs/BENCHMARKS.md.
#
#   scripts/bench.sh                 # full suite, 3 runs of each workload (~20 min on 2 cores)
#   scripts/bench.sh --quick         # small N, 1 run (~3 min): checks that everything works
#   scripts/bench.sh --no-peers      # queue-core only
#   scripts/bench.sh --runs 5 --out examples/bench/results/mine.jsonl
#   scripts/bench.sh --apalis-100k   # also apalis end to end with 100k jobs (+~2 min)
#   scripts/bench.sh --focus [--baseline BIN] [--new BIN] [--n 50000]
#                                    # the goal workloads of issue #12 only (e2e 16 producers x c16,
#                                    # process c64, process c1), interleaving BIN (queue-bench built
#                                    # from an older commit), this build (or --new BIN: no build) and BullMQ; median of --runs
#                                    # (3), ratios and Redis us/job: examples/bench/focus_report.py;
#                                    # --hash adds this build with hash completion records (compact is the default)
#   scripts/bench.sh --bullmq-bench [--bb-scale K]
#                                    # bullmq-bench's four scenarios (queue-add, queue-add-bulk of 50,
#                                    # worker-generic, worker-concurrent with 100), BullMQ and queue-core
#                                    # interleaved, --runs (3); K multiplies the measured jobs (1)
#   scripts/bench.sh --trickle [--trickle-rate R]
#                                    # enqueue->start p50/p99 at R (1,000) jobs/s offered, queue-core and BullMQ
#   scripts/bench.sh --cost          # cost vs size: ack with 16 vs 4,096 in flight (8 worker processes),
#                                    # fetch/promote with 1M waiting/delayed vs none (after Redis' keyspace
#                                    # rehash, and once during it; BullMQ over the same backlog), Redis bytes per job
#                                    # (these three combine; tables: examples/bench/issue12_report.py)
#
# Needs: cargo, redis-server + redis-benchmark, node + npm, python3 (venv).
# Peers are installed into examples/bench/peers/.work/ (gitignored) by
# examples/bench/peers/setup.sh; none of their code is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PEERS="$ROOT/examples/bench/peers"

QUICK=0
WITH_PEERS=1
RUNS=""
OUT=""
WAIT_QUIET="${BENCH_WAIT_QUIET:-0}"
APALIS_100K=0
FOCUS=0
BASELINE=""
NEW_BIN=""
FOCUS_N=50000
BB=0
BB_SCALE=1
TRICKLE=0
TRICKLE_RATE=1000
COST=0
HASH_RECORDS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --no-peers) WITH_PEERS=0 ;;
    --runs) RUNS="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --wait-quiet) WAIT_QUIET="$2"; shift ;;
    --apalis-100k) APALIS_100K=1 ;;
    --focus) FOCUS=1 ;;
    --baseline) BASELINE="$2"; shift ;;
    --new) NEW_BIN="$2"; shift ;;
    --n) FOCUS_N="$2"; shift ;;
    --bullmq-bench) BB=1 ;;
    --bb-scale) BB_SCALE="$2"; shift ;;
    --trickle) TRICKLE=1 ;;
    --trickle-rate) TRICKLE_RATE="$2"; shift ;;
    --cost) COST=1 ;;
    --hash) HASH_RECORDS=1 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

if [ "$QUICK" = 1 ]; then
  N=10000; N_APALIS=10000; N_RQ=1000; N_RQ_FORK=200; N_RATE=3000; N_MEM=100000; RUNS="${RUNS:-1}"; IDLE_S=4
else
  # apalis and RQ are too slow for 100k jobs x 3 runs x every workload in
  # ~20 minutes: they run fewer jobs (apalis: 100k once with --apalis-100k).
  N=100000; N_APALIS=20000; N_RQ=2000; N_RQ_FORK=500; N_RATE=5000; N_MEM=1000000; RUNS="${RUNS:-3}"; IDLE_S=10
fi
RATE=1000   # offered load of the latency workload, jobs/s, same for every system

mkdir -p examples/bench/results
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="${OUT:-examples/bench/results/bench-$STAMP.jsonl}"
: > "$OUT"

log() { printf '[bench %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# Optionally wait (up to N seconds) for a quiet machine: 1-minute load < 1.
if [ "$WAIT_QUIET" -gt 0 ]; then
  for _ in $(seq "$((WAIT_QUIET / 10))"); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    awk -v l="$load" 'BEGIN { exit !(l < 1.0) }' && break
    log "load $load: waiting for a quieter machine"
    sleep 10
  done
fi

if [ -n "$NEW_BIN" ]; then
  QB="$NEW_BIN"
else
  log "building queue-bench (release)"
  cargo build --release --quiet -p queue-bench
  QB="$ROOT/target/release/queue-bench"
fi

if [ "$WITH_PEERS" = 1 ]; then
  log "installing peers (examples/bench/peers/setup.sh)"
  if [ "$FOCUS" = 1 ] || [ "$BB$TRICKLE$COST" != 000 ]; then bash "$PEERS/setup.sh" bullmq; else bash "$PEERS/setup.sh"; fi
  export NODE_PATH="$PEERS/.work/bullmq/node_modules"
  APALIS="$PEERS/.work/apalis/target/release/apalis-bench"
  RQPY="$PEERS/.work/rq-venv/bin/python"
fi

# One redis-server for everything, no persistence, on a free loopback port.
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
RDIR="$(mktemp -d /tmp/queue-bench-redis.XXXXXX)"
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$RDIR" \
  --logfile "$RDIR/redis.log" --daemonize no &
REDIS_PID=$!
cleanup() { kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; rm -rf "$RDIR"; }
trap cleanup EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
URL="redis://127.0.0.1:$PORT/"
log "redis-server $(redis-server --version | awk '{print $3}') on $URL; results -> $OUT"

# The machine, for the record.
python3 - "$OUT" <<'PY'
import json, os, platform, subprocess, sys
def sh(c):
    try: return subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception: return ""
cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
mem = sh("free -g | awk '/Mem:/ {print $2}'")
rec = {"workload": "machine", "cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem,
       "kernel": platform.release(), "redis": sh("redis-server --version"),
       "rustc": sh("rustc --version"), "node": sh("node --version"), "python": sh("python3 --version"),
       "loadavg_start": open("/proc/loadavg").read().split()[:3]}
open(sys.argv[1], "a").write(json.dumps(rec) + "\n")
PY

ours() { "$QB" --redis-url "$URL" --out "$OUT" --label "run=$1" "${@:2}" >/dev/null || log "FAILED: queue-bench ${*:2}"; }
peer() { python3 "$PEERS/run_peer.py" --redis-url "$URL" --out "$OUT" --label "run=$1" -- "${@:2}" >/dev/null; }
bull() { peer "$1" node "$PEERS/bullmq/bench.cjs" --redis-url "$URL" "${@:2}"; }
apal() { peer "$1" "$APALIS" --redis-url "$URL" "${@:2}"; }
rqb() { peer "$1" "$RQPY" "$PEERS/rq/bench.py" --redis-url "$URL" "${@:2}"; }

if [ "$BB$TRICKLE$COST" != 000 ]; then
  # The issue #12 sections: each run's label carries its 1-minute load
  # average; BullMQ and queue-core interleaved within every run.
  RUNS="${RUNS:-3}"
  load1() { cut -d' ' -f1 /proc/loadavg; }
  qc() { # section run args...
    local label="section=$1,run=$2,load=$(load1)"; shift 2
    redis-cli -p "$PORT" flushall >/dev/null
    "$QB" --redis-url "$URL" --out "$OUT" --label "$label" "$@" >/dev/null || log "FAILED: queue-bench $*"
  }
  bq() { # section run args...
    local label="section=$1,run=$2,load=$(load1)"; shift 2
    redis-cli -p "$PORT" flushall >/dev/null
    python3 "$PEERS/run_peer.py" --redis-url "$URL" --out "$OUT" --label "$label" -- \
      node "$PEERS/bullmq/bench.cjs" --redis-url "$URL" "$@" >/dev/null || log "FAILED: bullmq $*"
  }
  if [ "$QUICK" = 1 ]; then
    N_TRICKLE=2000; N_ACK=8000; N_BACKLOG=10000; BACKLOG=100000; N_MEMORY=20000
  else
    N_TRICKLE=5000; N_ACK=24000; N_BACKLOG=20000; BACKLOG=1000000; N_MEMORY=100000
  fi
  for r in $(seq "$RUNS"); do
    if [ "$BB" = 1 ]; then
      for sc in queue-add queue-add-bulk worker-generic worker-concurrent; do
        log "run $r/$RUNS bullmq-bench $sc (scale $BB_SCALE, load $(load1))"
        if [ "$WITH_PEERS" = 1 ]; then bq bb "$r" bb --scenario "$sc" --scale "$BB_SCALE"; fi
        qc bb "$r" bb --scenario "$sc" --scale "$BB_SCALE"
      done
    fi
    if [ "$TRICKLE" = 1 ]; then
      # 5 s of offered load: N = 5 x rate (2 s with --quick).
      nt=$((N_TRICKLE * TRICKLE_RATE / 1000))
      log "run $r/$RUNS trickle: $nt jobs at $TRICKLE_RATE/s offered (load $(load1))"
      qc trickle "$r" e2e --n "$nt" --producers 16 --concurrency 16 --rate "$TRICKLE_RATE"
      if [ "$WITH_PEERS" = 1 ]; then bq trickle "$r" e2e --n "$nt" --producers 16 --concurrency 16 --rate "$TRICKLE_RATE"; fi
    fi
    if [ "$COST" = 1 ]; then
      for f in 16 4096; do
        log "run $r/$RUNS cost: ack with $f in flight across 8 worker processes (load $(load1))"
        qc cost "$r" cost-ack --n "$N_ACK" --in-flight "$f" --workers 8
      done
    fi
  done
  if [ "$COST" = 1 ]; then
    # The backlog is loaded once per size (1M jobs take minutes) and measured
    # --runs times over it (each result line carries its own load average).
    # A load that takes the key count past a power of two (2^20 here) starts
    # Redis' incremental rehash of the keyspace, during which every key lookup
    # also moves a bucket: --settle-s waits for it to end (about 50 s idle
    # for 1M keys), and one run more measures during it.
    for b in 0 "$BACKLOG"; do
      log "cost: fetch with $b waiting, promote with $b delayed, $RUNS runs each (load $(load1))"
      qc cost all cost-backlog --n "$N_BACKLOG" --backlog "$b" --runs "$RUNS" --settle-s 180
      qc cost all cost-backlog --n "$N_BACKLOG" --backlog "$b" --delayed --runs "$RUNS" --settle-s 180
    done
    log "cost: fetch with $BACKLOG waiting during the keyspace rehash, $RUNS runs (load $(load1))"
    qc cost all cost-backlog --n "$N_BACKLOG" --backlog "$BACKLOG" --runs "$RUNS"
    if [ "$WITH_PEERS" = 1 ]; then
      for r in $(seq 1 "$RUNS"); do
        for b in 0 "$BACKLOG"; do
          log "run $r/$RUNS cost: BullMQ fetch with $b waiting (load $(load1))"
          bq cost "$r" process --n "$N_BACKLOG" --concurrency 16 --backlog "$b"
        done
      done
    fi
    log "cost: Redis memory per waiting and per completed job ($N_MEMORY jobs)"
    qc cost 1 cost-memory --n "$N_MEMORY"
    qc cost 1 cost-memory --n "$N_MEMORY" --retention-s 0
    qc cost 1 cost-memory --n "$N_MEMORY" --hash-records
  fi
  python3 -c 'import json,sys; open(sys.argv[1],"a").write(json.dumps({"workload":"machine_end","loadavg_end":open("/proc/loadavg").read().split()[:3]})+"\n")' "$OUT"
  python3 examples/bench/issue12_report.py "$OUT" > "${OUT%.jsonl}.md"
  log "done: $OUT and ${OUT%.jsonl}.md"
  cat "${OUT%.jsonl}.md"
  exit 0
fi

if [ "$FOCUS" = 1 ]; then
  # Interleaved: every run goes through each workload with the baseline
  # build, this build and BullMQ in turn (in a rotated order), on the same redis-server. The
  # 1-minute load average before each run is part of its label.
  RUNS="${RUNS:-3}"
  focus() { # system run args...
    local sys="$1" r="$2"; shift 2
    local label="run=$r,build=$sys,load=$(cut -d' ' -f1 /proc/loadavg)"
    redis-cli -p "$PORT" flushall >/dev/null
    case "$sys" in
      new) "$QB" --redis-url "$URL" --out "$OUT" --label "$label" "$@" >/dev/null || log "FAILED: new $*" ;;
      hash) "$QB" --redis-url "$URL" --out "$OUT" --label "$label" "$@" --hash-records >/dev/null || log "FAILED: hash $*" ;;
      baseline) "$BASELINE" --redis-url "$URL" --out "$OUT" --label "$label" "$@" >/dev/null || log "FAILED: baseline $*" ;;
      bullmq) python3 "$PEERS/run_peer.py" --redis-url "$URL" --out "$OUT" --label "$label" -- \
                node "$PEERS/bullmq/bench.cjs" --redis-url "$URL" "$@" >/dev/null || log "FAILED: bullmq $*" ;;
    esac
  }
  SYSTEMS="new"
  [ -n "$BASELINE" ] && SYSTEMS="baseline $SYSTEMS"
  [ "$HASH_RECORDS" = 1 ] && SYSTEMS="$SYSTEMS hash"
  [ "$WITH_PEERS" = 1 ] && SYSTEMS="$SYSTEMS bullmq"
  # The order of the systems turns by one each run (run 1: baseline, new,
  # BullMQ; run 2: new, BullMQ, baseline; ...): stop 37 measured a place in
  # the order to be worth 10-15% on this machine, more than a change between
  # two builds, so each system takes each place in turn.
  read -r -a ORDER <<< "$SYSTEMS"
  for r in $(seq "$RUNS"); do
    k=$(( (r - 1) % ${#ORDER[@]} ))
    for sys in "${ORDER[@]:k}" "${ORDER[@]:0:k}"; do
      log "run $r/$RUNS $sys: e2e P=16 C=16, process C=64, process C=1 (load $(cut -d' ' -f1 /proc/loadavg))"
      focus "$sys" "$r" e2e --n "$FOCUS_N" --producers 16 --concurrency 16
      focus "$sys" "$r" process --n "$FOCUS_N" --concurrency 64
      focus "$sys" "$r" process --n "$FOCUS_N" --concurrency 1
    done
  done
  "$QB" --redis-url "$URL" --out "$OUT" --label "build=new" idle --seconds 10 >/dev/null
  [ -n "$BASELINE" ] && "$BASELINE" --redis-url "$URL" --out "$OUT" --label "build=baseline" idle --seconds 10 >/dev/null
  python3 -c 'import json,sys; open(sys.argv[1],"a").write(json.dumps({"workload":"machine_end","loadavg_end":open("/proc/loadavg").read().split()[:3]})+"\n")' "$OUT"
  python3 examples/bench/focus_report.py "$OUT" > "${OUT%.jsonl}.md"
  log "done: $OUT and ${OUT%.jsonl}.md"
  cat "${OUT%.jsonl}.md"
  exit 0
fi

log "ceiling: redis-benchmark"
"$QB" --redis-url "$URL" --out "$OUT" ceiling --clients 16 >/dev/null
"$QB" --redis-url "$URL" --out "$OUT" ceiling --clients 64 >/dev/null

# Each run goes through every workload, all systems interleaved, so slow
# drifts of the machine's load hit every system alike.
for r in $(seq "$RUNS"); do
  log "run $r/$RUNS: (a) enqueue only"
  for p in 1 16; do
    ours "$r" enqueue --n "$N" --producers "$p"
    if [ "$WITH_PEERS" = 1 ]; then
      bull "$r" enqueue --n "$N" --producers "$p"
      apal "$r" enqueue --n "$N_APALIS" --producers "$p"
      rqb "$r" enqueue --n "$N_RQ" --producers "$p"
    fi
  done
  ours "$r" enqueue --n "$N" --producers 1 --batch 100
  ours "$r" enqueue --n "$N" --producers 16 --payload 1024
  if [ "$WITH_PEERS" = 1 ]; then
    bull "$r" enqueue --n "$N" --producers 1 --batch 100
    apal "$r" enqueue --n "$N_APALIS" --producers 1 --batch 100
    rqb "$r" enqueue --n "$N_RQ" --producers 1 --batch 100
    bull "$r" enqueue --n "$N" --producers 16 --payload 1024
  fi

  log "run $r/$RUNS: (b) process only"
  for c in 1 16 64; do
    ours "$r" process --n "$N" --concurrency "$c"
    if [ "$WITH_PEERS" = 1 ]; then
      bull "$r" process --n "$N" --concurrency "$c"
      apal "$r" process --n "$N_APALIS" --concurrency "$c"
    fi
  done
  if [ "$WITH_PEERS" = 1 ]; then
    # RQ: concurrency = worker processes (one job at a time each).
    for wk in 1 2; do rqb "$r" process --n "$N_RQ" --workers "$wk"; done
  fi

  log "run $r/$RUNS: prototype: queue-core's scripts, acks one per job vs batched"
  ours "$r" proto --n "$N" --fetchers 1 --fetch-batch 16
  ours "$r" proto --n "$N" --fetchers 1 --fetch-batch 16 --batched-ack
  ours "$r" proto --n "$N" --fetchers 2 --fetch-batch 16 --batched-ack

  log "run $r/$RUNS: (c) end to end, saturating"
  ours "$r" e2e --n "$N" --producers 16 --concurrency 16
  ours "$r" e2e --n "$N" --producers 16 --concurrency 16 --batch 100
  if [ "$WITH_PEERS" = 1 ]; then
    bull "$r" e2e --n "$N" --producers 16 --concurrency 16
    apal "$r" e2e --n "$N_APALIS" --producers 16 --concurrency 16
    rqb "$r" e2e --n "$N_RQ" --producers 16 --workers 2
  fi

  log "run $r/$RUNS: (c) end to end at $RATE jobs/s (latency)"
  ours "$r" e2e --n "$N_RATE" --producers 16 --concurrency 16 --rate "$RATE"
  if [ "$WITH_PEERS" = 1 ]; then
    bull "$r" e2e --n "$N_RATE" --producers 16 --concurrency 16 --rate "$RATE"
    apal "$r" e2e --n "$N_RATE" --producers 16 --concurrency 16 --rate "$RATE"
    rqb "$r" e2e --n "$((N_RATE < N_RQ ? N_RATE : N_RQ))" --producers 16 --workers 2 --rate "$RATE"
  fi

  log "run $r/$RUNS: (c) end to end, a trickle: 1 producer at 200 jobs/s (the queue is empty at every job)"
  ours "$r" e2e --n 1000 --producers 1 --concurrency 16 --rate 200
  if [ "$WITH_PEERS" = 1 ]; then
    bull "$r" e2e --n 1000 --producers 1 --concurrency 16 --rate 200
    apal "$r" e2e --n 1000 --producers 1 --concurrency 16 --rate 200
    rqb "$r" e2e --n 1000 --producers 1 --workers 2 --rate 200
  fi

  log "run $r/$RUNS: (d) end to end, 1 KiB payload"
  ours "$r" e2e --n "$N" --producers 16 --concurrency 16 --payload 1024
  if [ "$WITH_PEERS" = 1 ]; then
    bull "$r" e2e --n "$N" --producers 16 --concurrency 16 --payload 1024
    apal "$r" e2e --n "$N_APALIS" --producers 16 --concurrency 16 --payload 1024
    rqb "$r" e2e --n "$N_RQ" --producers 16 --workers 2 --payload 1024
  fi
done

if [ "$WITH_PEERS" = 1 ] && [ "$APALIS_100K" = 1 ]; then
  log "apalis end to end with the same 100k jobs as the others, once (~100 s)"
  apal 1 e2e --n "$N" --producers 16 --concurrency 16
fi
if [ "$WITH_PEERS" = 1 ]; then
  log "RQ with 16 worker processes, and its default forking Worker (one fork per job), once"
  rqb 1 process --n "$N_RQ" --workers 16
  rqb 1 process --n "$N_RQ_FORK" --workers 1 --worker-class default
  rqb 1 process --n "$N_RQ_FORK" --workers 2 --worker-class default
fi

log "idle worker: ${IDLE_S}s on an empty queue"
"$QB" --redis-url "$URL" --out "$OUT" idle --seconds "$IDLE_S" >/dev/null

log "memory: $N_MEM jobs through one worker process (default 24 h completion retention), then $((N_MEM / 5)) with none"
"$QB" --redis-url "$URL" --out "$OUT" memory --n "$N_MEM" >/dev/null
"$QB" --redis-url "$URL" --out "$OUT" memory --n "$((N_MEM / 5))" --retention-s 0 >/dev/null

python3 - "$OUT" <<'PY'
import json, sys
open(sys.argv[1], "a").write(json.dumps({"workload": "machine_end", "loadavg_end": open("/proc/loadavg").read().split()[:3]}) + "\n")
PY
python3 examples/bench/report.py "$OUT" > "${OUT%.jsonl}.md"
log "done: $OUT and ${OUT%.jsonl}.md"
cat "${OUT%.jsonl}.md"

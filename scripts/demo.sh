#!/usr/bin/env bash
# The crash-recovery demo in one command, from a fresh machine:
#
#   bash scripts/demo.sh              # extra arguments go to the demo, e.g. --jobs 100
#
# It builds the binaries, then runs target/debug/demo, which starts the `web`
# example, POSTs a batch of jobs to it, runs `worker` processes, SIGKILLs one
# mid-job, lets `queue-watchdog` recover its jobs and prints a summary.
# Exit code 0 only when every enqueued job ended completed or dead-lettered.
#
# Redis: with REDIS_URL set, that server is used. Otherwise the demo starts a
# throwaway redis-server on a free loopback port (REDIS_SERVER may name the
# binary); when none is installed this script installs the Debian package.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${REDIS_URL:-}" ]] && ! command -v "${REDIS_SERVER:-redis-server}" >/dev/null 2>&1; then
  echo "demo.sh: redis-server not found; installing the Debian package redis-server" >&2
  sudo=""
  if [[ "$(id -u)" -ne 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "demo.sh: need root or sudo for apt-get (or set REDIS_URL, or REDIS_SERVER to a redis-server binary)" >&2
      exit 1
    fi
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q redis-server >/dev/null ||
    { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q redis-server >/dev/null; }
fi

echo "demo.sh: cargo build -p queue-examples -p queue-watchdog --bins" >&2
cargo build -p queue-examples -p queue-watchdog --bins
exec "${CARGO_TARGET_DIR:-target}/debug/demo" "$@"

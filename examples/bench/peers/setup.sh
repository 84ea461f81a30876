#!/usr/bin/env bash
# Installs the peers the benchmark compares against, into peers/.work/
# (gitignored): BullMQ + ioredis (npm), RQ (PyPI, in a venv), and builds the
# apalis driver (crates.io) as its own cargo project. Idempotent.
#   setup.sh               # every peer
#   setup.sh bullmq        # only the named ones (bullmq, rq, apalis)
# Versions are pinned so a re-run measures the same code.
set -euo pipefail
cd "$(dirname "$0")"
PEERS="$PWD"
WORK="$PEERS/.work"
mkdir -p "$WORK"

BULLMQ_VERSION="${BULLMQ_VERSION:-6.7.0}"
IOREDIS_VERSION="${IOREDIS_VERSION:-6.0.0}"
RQ_VERSION="${RQ_VERSION:-3.0.0}"
WANT=" ${*:-bullmq rq apalis} "
want() { case "$WANT" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if want bullmq && { [ ! -f "$WORK/bullmq/node_modules/bullmq/package.json" ] ||
   ! grep -q "\"version\": \"$BULLMQ_VERSION\"" "$WORK/bullmq/node_modules/bullmq/package.json"; }; then
  echo "setup: npm install bullmq@$BULLMQ_VERSION ioredis@$IOREDIS_VERSION" >&2
  mkdir -p "$WORK/bullmq"
  (cd "$WORK/bullmq" && [ -f package.json ] || npm init -y >/dev/null)
  (cd "$WORK/bullmq" && npm install --no-audit --no-fund --loglevel=error \
    "bullmq@$BULLMQ_VERSION" "ioredis@$IOREDIS_VERSION" >&2)
fi

if want rq && { [ ! -x "$WORK/rq-venv/bin/python" ] || ! "$WORK/rq-venv/bin/python" -c "import rq, sys; sys.exit(rq.__version__ != '$RQ_VERSION')" 2>/dev/null; }; then
  echo "setup: pip install rq==$RQ_VERSION (venv)" >&2
  python3 -m venv "$WORK/rq-venv"
  "$WORK/rq-venv/bin/pip" install --quiet "rq==$RQ_VERSION" >&2
fi

# The apalis driver is built from a copy so its lock file and target stay in .work.
if want apalis; then
  mkdir -p "$WORK/apalis"
  cp "$PEERS/apalis/Cargo.toml" "$WORK/apalis/Cargo.toml"
  rm -rf "$WORK/apalis/src" && cp -r "$PEERS/apalis/src" "$WORK/apalis/src"
  echo "setup: cargo build --release (apalis driver)" >&2
  (cd "$WORK/apalis" && cargo build --release --quiet >&2)
fi
echo "setup: peers ready in $WORK" >&2

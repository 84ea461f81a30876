#!/usr/bin/env bash
# The whole test suite: unit, doc, macro (trybuild), integration and fault
# tests, against redis-servers the tests start themselves on free ports, and
# the PostgreSQL server for the outbox tests. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-services.sh
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
cargo test --workspace --locked "$@"

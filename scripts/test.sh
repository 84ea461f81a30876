#!/usr/bin/env bash
# The whole test suite: unit, doc, macro (trybuild), integration and fault
# tests, against redis-servers the tests start themselves on free ports, and
# the PostgreSQL server for the outbox tests, after the lint gates (cargo fmt
# --check, clippy -D warnings; SKIP_LINT=1 skips them locally). `.ci/run`
# calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-services.sh
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
# Lint gates first: formatting and clippy (warnings are errors).
if [ "${SKIP_LINT:-0}" != 1 ]; then
  cargo fmt --all --check
  cargo clippy --workspace --all-targets --locked -- -D warnings
fi
cargo test --workspace --locked "$@"

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
  # No workspace member turns on queue-core's `opentelemetry` feature: lint
  # its code, its tests and the otel_stdout example on their own.
  cargo clippy -p queue-core --features opentelemetry --all-targets --locked -- -D warnings
fi
cargo test --workspace --locked "$@"
# The same feature for the tests it gates (docs/TRACING.md "Tests"): the lib's
# unit tests with it on (trace_context.rs's own, and every enqueue and claim
# through the feature's code), the `trace_context` test target, and a build
# of the `otel_stdout` example. Arguments are not passed on: they name
# targets and filters of the workspace run.
cargo test -p queue-core --features opentelemetry --locked --lib --test trace_context --example otel_stdout

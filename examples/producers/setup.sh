#!/usr/bin/env bash
# Installs the producer examples' client libraries into git-ignored folders
# next to them: python/.venv (redis, msgpack) and node/node_modules (ioredis,
# msgpackr). Needs python3 with venv, node and npm (scripts/ensure-services.sh
# installs them on Debian). Safe to run repeatedly; each install is tried up
# to 3 times; exits non-zero when one still fails.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { echo "[producers/setup] $*" >&2; }

# Runs "$@" up to 3 times, 5 s apart: a package registry or the network may
# fail for a moment (a reset, a timeout, a 5xx) on a loaded CI machine.
retry() {
  local try
  for try in 1 2 3; do
    if "$@"; then return 0; fi
    if [ "$try" -lt 3 ]; then
      log "attempt $try of 3 failed: $*; retrying in 5 s"
      sleep 5
    fi
  done
  log "failed 3 times: $*"
  return 1
}
npm_install() { (cd "$here/node" && npm install --no-audit --no-fund --loglevel=error >&2); }

venv="$here/python/.venv"
if ! "$venv/bin/python" -c 'import redis, msgpack' >/dev/null 2>&1; then
  log "creating $venv"
  python3 -m venv "$venv"
  retry "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/python/requirements.txt"
fi
log "python: $("$venv/bin/python" -c 'import redis, msgpack; print("redis", redis.__version__, "msgpack", msgpack.version)')"

if [ ! -f "$here/node/node_modules/ioredis/package.json" ] || [ ! -f "$here/node/node_modules/msgpackr/package.json" ]; then
  log "npm install in $here/node"
  retry npm_install
fi
# Fails (and so this script) when either library cannot be loaded.
(cd "$here/node" && node --input-type=module -e '
import { readFileSync } from "node:fs";
await import("ioredis"); await import("msgpackr");
const v = (p) => JSON.parse(readFileSync(`node_modules/${p}/package.json`, "utf8")).version;
console.error(`[producers/setup] node: ${process.version}, ioredis ${v("ioredis")}, msgpackr ${v("msgpackr")}`);
')

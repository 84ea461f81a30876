#!/usr/bin/env bash
# Makes sure the binaries and services the tests and the demo need exist on
# this machine: redis-server (tests start their own instances from it) and a
# PostgreSQL server on 127.0.0.1:5432 with a `test` database (outbox tests),
# Chromium (dashboard test), python3-venv, node and npm (producer examples).
# Installs Debian packages when missing. Safe to run repeatedly.
set -euo pipefail

log() { echo "[ensure-services] $*" >&2; }

apt_updated=0
apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    log "apt-get not available: install $* by hand"; return 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if [ "$apt_updated" -eq 0 ]; then
    $sudo apt-get update -qq >&2 || true
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >&2
}

ensure_redis() {
  if ! command -v redis-server >/dev/null 2>&1; then
    log "redis-server missing: installing the Debian package"
    apt_install redis-server
    # The package may start a system instance on 6379; tests do not use it.
  fi
  log "redis-server: $(redis-server --version | head -n1)"
}

ensure_postgres() {
  if [ "${SKIP_POSTGRES:-0}" = "1" ]; then return 0; fi
  if command -v pg_isready >/dev/null 2>&1 && pg_isready -h 127.0.0.1 -p 5432 -q; then
    :
  else
    if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
      log "PostgreSQL missing: installing the Debian package"
      apt_install postgresql
    fi
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n1)
    log "starting PostgreSQL $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 2>&1 || pg_ctlcluster "$version" main start >&2
    for _ in $(seq 1 30); do
      pg_isready -h 127.0.0.1 -p 5432 -q && break
      sleep 1
    done
  fi
  # A freshly installed cluster only trusts peer auth for the postgres OS user:
  # make sure the test role and database exist (as postgres over the socket).
  if ! psql "${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}" -tAc 'select 1' >/dev/null 2>&1; then
    log "preparing the test database"
    local as_pg=(runuser -u postgres --)
    command -v runuser >/dev/null 2>&1 || as_pg=(su postgres -c)
    "${as_pg[@]}" psql -tAc "select 1 from pg_database where datname='test'" | grep -q 1 \
      || "${as_pg[@]}" createdb test
    # Allow password-less loopback connections for the tests (local CI only).
    local hba
    hba=$("${as_pg[@]}" psql -tAc 'show hba_file')
    if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
      sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
      "${as_pg[@]}" psql -tAc 'select pg_reload_conf()' >/dev/null
    fi
  fi
  log "postgres: $(psql "${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}" -tAc 'show server_version')"
}

ensure_chromium() {
  # Headless Chromium drives the dashboard's browser test (no npm needed).
  if [ "${SKIP_CHROMIUM:-0}" = "1" ]; then return 0; fi
  if ! command -v chromium >/dev/null 2>&1; then
    log "chromium missing: installing Debian's chromium (dashboard browser test)"
    apt_install chromium || log "chromium could not be installed: the dashboard browser test will be skipped"
  fi
  if command -v chromium >/dev/null 2>&1; then log "chromium: $(chromium --version 2>/dev/null | head -n1)"; fi
}

ensure_producer_tools() {
  # python3 with venv, node and npm: the Python and Node producer examples
  # (examples/producers) that queue-watchdog's `producers` test drives. The
  # test installs their libraries with examples/producers/setup.sh.
  if [ "${SKIP_PRODUCERS:-0}" = "1" ]; then return 0; fi
  if ! command -v python3 >/dev/null 2>&1; then
    log "python3 missing: installing the Debian package"
    apt_install python3 python3-venv
  fi
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    log "python3 venv/ensurepip missing: installing python3-venv"
    apt_install python3-venv
  fi
  if ! command -v node >/dev/null 2>&1; then
    log "node missing: installing the Debian package"
    apt_install nodejs
  fi
  if ! command -v npm >/dev/null 2>&1; then
    log "npm missing: installing the Debian package"
    apt_install npm
  fi
  log "producers: $(python3 --version 2>&1), node $(node --version), npm $(npm --version)"
}

ensure_redis
ensure_postgres
ensure_chromium
ensure_producer_tools

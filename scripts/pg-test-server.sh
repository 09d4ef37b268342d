#!/usr/bin/env bash
# A private PostgreSQL for the fleet tests: its own data dir and port, loopback only, trust
# auth, run as the `postgres` user (the server refuses root).
#   scripts/pg-test-server.sh start [DIR] [PORT]  -> prints postgres://postgres@127.0.0.1:PORT/postgres
#   scripts/pg-test-server.sh stop  [DIR]
#   scripts/pg-test-server.sh pause|resume [DIR] [PORT]   (stop and start again on the same data)
set -euo pipefail
cmd=${1:?start|stop|pause|resume}
dir=${2:-/tmp/tokensaver-pg-test}
port=${3:-55432}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$bin/pg_ctl" ] || { echo "PostgreSQL server binaries not found (apt-get install postgresql)" >&2; exit 1; }
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
start_server() {
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" \
    start >/dev/null
}
case "$cmd" in
  start)
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
      as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >/dev/null
    fi
    start_server
    echo "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
    ;;
  stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
      as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || true
    fi
    rm -rf "$dir"
    ;;
  pause)
    as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
    ;;
  resume)
    start_server
    ;;
  *)
    echo "usage: $0 start|stop|pause|resume [DIR] [PORT]" >&2
    exit 2
    ;;
esac

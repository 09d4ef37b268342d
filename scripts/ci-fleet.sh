#!/usr/bin/env bash
# The fleet tests (tests/fleet.rs) against a private PostgreSQL started here and stopped on
# any exit: three `tokensaver serve` instances on one database.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
fi
export TOKENSAVER_TEST_PG_DIR="${TOKENSAVER_TEST_PG_DIR:-$(mktemp -d /tmp/tokensaver-pg.XXXXXX)}"
export TOKENSAVER_TEST_PG_PORT="${TOKENSAVER_TEST_PG_PORT:-55432}"
trap 'scripts/pg-test-server.sh stop "$TOKENSAVER_TEST_PG_DIR"' EXIT
TOKENSAVER_TEST_PG_URL="$(scripts/pg-test-server.sh start "$TOKENSAVER_TEST_PG_DIR" "$TOKENSAVER_TEST_PG_PORT")"
export TOKENSAVER_TEST_PG_URL
# One test at a time: each starts three servers and hundreds of concurrent clients.
timeout 1200 cargo test --test fleet -- --include-ignored --test-threads=1
# Prompt caching placed by a fleet (tests/gate_caching.rs: the one test there that needs it).
timeout 300 cargo test --test gate_caching fleet -- --include-ignored --test-threads=1
# The conformance suite's fleet home (its local and remote homes run with every cargo test).
timeout 300 cargo test --test conformance fleet -- --include-ignored --test-threads=1

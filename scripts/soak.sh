#!/usr/bin/env bash
# Soak: mixed traffic (ALLOW, SERVE, streams, BLOCKs, digest calls, reads) through a real
# `tokensaver serve` and the built-in provider, all on 127.0.0.1, for a set time; every minute
# it prints the server's RSS, open file descriptors, threads, ledger size, requests and errors.
# Fails on any error, on RSS growth after the warm-up (memory must be flat), on growing file
# descriptors, or if SIGTERM at the end does not drain to exit 0.
#
#   scripts/soak.sh                     30 minutes at 25 requests/s (release build)
#   scripts/soak.sh --minutes 10 --rate 40 --csv soak.csv
#   SOAK_BIN=target/debug/tokensaver scripts/soak.sh --minutes 2 --interval 10
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${SOAK_BIN:-target/release/tokensaver}"
if [ -z "${SOAK_BIN:-}" ]; then
  cargo build --release --bin tokensaver --bin tokensaver-mock-provider
fi
exec python3 scripts/soak.py --bin "$BIN" "$@"

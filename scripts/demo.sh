#!/usr/bin/env bash
# The quick start's run command: install pingora's build prerequisite if missing, then run the
# proxy with the example config in front of the local mock provider (its own binary,
# `tokensaver-mock-provider`, built beside `tokensaver`) and a scripted session.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cmake >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq cmake >/dev/null
fi
cargo build --release --quiet --bin tokensaver --bin tokensaver-mock-provider
exec target/release/tokensaver demo --config config/tokensaver.toml "$@"

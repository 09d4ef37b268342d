#!/usr/bin/env bash
# The quick start's run command: install pingora's build prerequisite if missing, then run the
# proxy with the example config in front of the built-in local provider and a scripted session.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cmake >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq cmake >/dev/null
fi
exec cargo run --release --quiet -- demo --config config/tokensaver.toml "$@"

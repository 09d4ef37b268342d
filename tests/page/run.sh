#!/usr/bin/env bash
# The ledger page in headless Chromium (tests/page/page.test.mjs): installs Debian's chromium
# and playwright-core (pinned) if missing, then runs the node tests against the debug build.
# `.ci/run` calls it after `cargo build`; SCREENSHOTS=DIR also saves the README's screenshots.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tests/page/install.sh
if [ ! -x "${TOKENSAVER_BIN:-target/debug/tokensaver}" ]; then
  cargo build -q
fi
node --test tests/page/page.test.mjs

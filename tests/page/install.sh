#!/usr/bin/env bash
# Install what the ledger page's browser test needs: Debian's chromium (never a browser
# downloaded by a test tool) and playwright-core, pinned, into tests/page/.node (git-ignored).
set -euo pipefail
cd "$(dirname "$0")"
PLAYWRIGHT_CORE=1.65.1
if ! command -v chromium >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi
if ! command -v npm >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nodejs npm >/dev/null
fi
want="playwright-core@$PLAYWRIGHT_CORE"
if [ "$(cat .node/.installed 2>/dev/null)" != "$want" ]; then
  # playwright-core ships no browser and downloads none on install.
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix .node --no-save --no-package-lock \
    --no-audit --no-fund --loglevel=error "$want"
  echo "$want" > .node/.installed
fi
chromium --version
node -e "console.log('playwright-core', require('./.node/node_modules/playwright-core/package.json').version)"

#!/usr/bin/env bash
# Install the real agent clients the agent tests drive, at pinned versions, into
# tests/agents/.clients (git-ignored). No lock file is kept: the versions are pinned here.
set -euo pipefail
cd "$(dirname "$0")"
CLAUDE_CODE=2.1.332
CODEX=0.171.0
want="claude-code@$CLAUDE_CODE codex@$CODEX"
if [ "$(cat .clients/.installed 2>/dev/null)" != "$want" ]; then
  npm install --prefix .clients --no-save --no-package-lock --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE" "@openai/codex@$CODEX"
  echo "$want" > .clients/.installed
fi
.clients/node_modules/.bin/claude --version
.clients/node_modules/.bin/codex --version

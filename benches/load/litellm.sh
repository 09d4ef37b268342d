# Sourced by run.sh and field.sh: the LiteLLM version they compare with, and its install.
# 1.82.6: the last release before the compromised 1.82.7 and 1.82.8 (March 2026), checked
# then by many projects that pinned it. Change it only to a version you have vetted.
LITELLM_VERSION=1.82.6
LL_VENV=${LITELLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tokensaver-bench/litellm-$LITELLM_VERSION}

# LITELLM=1: LiteLLM's proxy from PyPI, in a venv of its own kept between runs.
if [ -n "${LITELLM:-}" ] && [ ! -x "$LL_VENV/bin/litellm" ]; then
  echo "installing litellm[proxy]==$LITELLM_VERSION into $LL_VENV"
  python3 -m venv "$LL_VENV"
  "$LL_VENV/bin/pip" install -q "litellm[proxy]==$LITELLM_VERSION"
fi

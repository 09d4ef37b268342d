#!/usr/bin/env bash
# CI steps for operations (called by .ci/run after the Rust tests, which include the drain,
# upgrade, stall and bad-input tests). Each step is bounded:
#   1. fuzz smoke: build the libFuzzer targets, run each for FUZZ_SMOKE_SECONDS (default 5) from
#      its seeds; a crash fails CI (the long run is scripts/fuzz-long.sh);
#   2. the systemd unit: `systemd-analyze verify` (against a scratch root holding the binary at
#      the unit's path) and `systemd-analyze security --offline`, failing above exposure 2.0;
#   3. a one-minute soak on the debug binary (no errors, fds and memory steady, clean drain).
# CI_OPS_STEPS="fuzz systemd soak" (the default) picks steps.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=" ${CI_OPS_STEPS:-fuzz systemd soak} "

if [[ "$steps" == *" fuzz "* ]]; then
echo "== fuzz smoke"
scripts/fuzz.sh build
for t in $(scripts/fuzz.sh list); do
  out=$(scripts/fuzz.sh run "$t" "${FUZZ_SMOKE_SECONDS:-5}" 2>&1) || {
    echo "$out" | tail -40
    echo "fuzz smoke: $t crashed (input in fuzz/artifacts/$t)" >&2
    exit 1
  }
  echo "$t: $(sed -n 's/^stat::number_of_executed_units: *//p' <<<"$out") executions," \
    "$(grep -E '^#[0-9]+.*DONE' <<<"$out" | sed -n 's/.*\(cov: [0-9]* ft: [0-9]*\).*/\1/p')"
done
fi

if [[ "$steps" == *" systemd "* ]]; then
echo "== systemd unit"
if ! command -v systemd-analyze >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq systemd >/dev/null
fi
root="$(mktemp -d target/systemd-root.XXXXXX)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd"
cargo build --bin tokensaver
ln target/debug/tokensaver "$root/usr/local/bin/tokensaver" 2>/dev/null \
  || cp target/debug/tokensaver "$root/usr/local/bin/tokensaver"
cp -r /usr/lib/systemd/system "$root/usr/lib/systemd/"
cp systemd/tokensaver.service "$root/etc/systemd/system/"
systemd-analyze verify --root="$root" tokensaver.service
systemd-analyze security --offline=true --threshold=20 systemd/tokensaver.service | tail -1
fi

if [[ "$steps" == *" soak "* ]]; then
echo "== soak smoke"
# The soak starts `tokensaver mock-provider`, which runs the mock provider's own binary.
cargo build --bin tokensaver --bin tokensaver-mock-provider
SOAK_BIN=target/debug/tokensaver scripts/soak.sh --minutes 1 --interval 20 --warmup 0.4 | tail -8
fi

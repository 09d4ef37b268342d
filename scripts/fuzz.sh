#!/usr/bin/env bash
# Coverage-guided fuzzing on stable Rust: libFuzzer (crates.io `libfuzzer-sys`) with the
# SanitizerCoverage passes cargo-fuzz uses, all of which are stable `-C` options; what stable
# cannot do is AddressSanitizer (nightly `-Zsanitizer`), which safe Rust needs least.
#
#   scripts/fuzz.sh build                      build every target (fuzz/target, instrumented)
#   scripts/fuzz.sh run TARGET SECONDS [ARGS]  fuzz TARGET for SECONDS from its seeds
#   scripts/fuzz.sh list                       the targets
#
# A run starts from the committed seeds (fuzz/seeds/TARGET) and keeps what it learns in
# fuzz/corpus/TARGET (not committed); a crash lands in fuzz/artifacts/TARGET and fails the
# run. libFuzzer's last lines name the executions (stat::number_of_executed_units) and the
# coverage (cov: edges, ft: features).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(json_reader request_shapes digest sse_usage split_profile config)
TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"
BIN="fuzz/target/$TRIPLE/release"

build() {
  # --target keeps the instrumentation off build scripts and proc macros.
  RUSTFLAGS="-Cpasses=sancov-module \
    -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares \
    --cfg fuzzing" \
    cargo build --release --manifest-path fuzz/Cargo.toml --target "$TRIPLE" --bins
}

run() {
  local target="$1" seconds="$2"
  shift 2
  [ -x "$BIN/$target" ] || build
  mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
  "$BIN/$target" \
    -max_total_time="$seconds" -print_final_stats=1 -max_len=65536 -rss_limit_mb=2048 \
    -artifact_prefix="fuzz/artifacts/$target/" "$@" \
    "fuzz/corpus/$target" "fuzz/seeds/$target"
}

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  list) printf '%s\n' "${TARGETS[@]}" ;;
  *) echo "usage: $0 build | run TARGET SECONDS [libFuzzer args] | list" >&2; exit 2 ;;
esac

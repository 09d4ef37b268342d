# Sourced by field.sh and tail-profile.sh (after `cd` to the repository root, ROOT set): the
# release binaries, a work directory whose servers (PIDS) are stopped on exit, and wait_port.
# WORK_PREFIX names the directory; KEEP_WORK=1 keeps it.
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET/release/tokensaver MOCK=$TARGET/release/tokensaver-mock-provider
PT=$TARGET/release/examples/passthrough GEN=$TARGET/release/examples/field_load
PACED=$TARGET/release/examples/paced_load

WORK=$(mktemp -d "/tmp/${WORK_PREFIX:-tokensaver-bench}.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.3
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

# wait_port PORT [TRIES]: until 127.0.0.1:PORT accepts (TRIES × 0.1 s, default 100), else exit.
wait_port() { for _ in $(seq "${2:-100}"); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 not up"; exit 1; }

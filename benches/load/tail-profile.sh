#!/usr/bin/env bash
# What the slow 1 % at concurrency 1 waited on (issue "tail"): the field method's pinned setup
# (gateway on GATE_CPUS, mock and generator on LOAD_CPUS), one closed-loop connection per lane,
# the generator's per-answer trace matched with `perf sched` of the gateway's CPU
# (tail_profile.py). Needs perf and root (or perf_event_paranoid ≤ 1). Lanes: LANES (default
# "passthrough allow"; stream_passthrough and stream_allow stream), SECS each (default 10). Builds as field.sh does unless SKIP_BUILD=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SECS=${SECS:-10}
LANES=${LANES:-passthrough allow}
GATE_CPUS=${GATE_CPUS:-1} LOAD_CPUS=${LOAD_CPUS:-0}
P_MOCK=${P_MOCK:-18821} P_PT=${P_PT:-18822} P_TS=${P_TS:-18823} P_API=${P_API:-18824} P_ADMIN=${P_ADMIN:-18825}
if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build --release --bin tokensaver --bin tokensaver-mock-provider --example passthrough \
    --example field_load
fi
WORK_PREFIX=tokensaver-tail . benches/load/servers.sh # BIN MOCK PT GEN, WORK, PIDS, wait_port
python3 benches/load/gen.py config/tokensaver.toml "$WORK" $P_TS $P_API $P_ADMIN $P_MOCK 4000 16 "$BIN" >/dev/null
taskset -c "$LOAD_CPUS" "$MOCK" --listen 127.0.0.1:$P_MOCK --no-prompt-cache 2>"$WORK/mock.log" & PIDS+=($!)
taskset -c "$GATE_CPUS" "$PT" 127.0.0.1:$P_PT 127.0.0.1:$P_MOCK 1 2>"$WORK/pt.log" & PIDS+=($!)
RUST_LOG=warn taskset -c "$GATE_CPUS" "$BIN" serve --config "$WORK/config.toml" --threads 1 2>"$WORK/ts.log" & PIDS+=($!)
wait_port $P_MOCK; wait_port $P_PT; wait_port $P_TS
sleep 1
for lane in $LANES; do
  port=$P_TS mode=allow; [ "${lane#stream_}" = passthrough ] && port=$P_PT
  [ "$lane" = "${lane#stream_}" ] || mode=stream # stream_passthrough, stream_allow
  perf sched record -k CLOCK_MONOTONIC -C "$GATE_CPUS" -o "$WORK/$lane.data" 2>"$WORK/perf-$lane.log" &
  perf=$!
  cpu=
  if [ -n "${CPU_PROFILE:-}" ]; then # CPU samples too, to name what the long runs ran
    perf record -e cpu-clock -F 20000 ${CPU_CALLGRAPH:+-g} -k CLOCK_MONOTONIC -C "$GATE_CPUS" -o "$WORK/$lane.cpu.data" 2>"$WORK/perf-cpu-$lane.log" &
    cpu=$!
  fi
  sleep 0.5
  TRACE="$WORK/trace-$lane.txt" taskset -c "$LOAD_CPUS" "$GEN" "$mode" \
    "http://127.0.0.1:$port/v1/chat/completions" "$WORK" 1 "$SECS" "tail$lane" \
    >"$WORK/result-$lane.json" 2>"$WORK/gen-$lane.log"
  kill -INT $perf $cpu; wait $perf $cpu || true
  perf sched timehist -i "$WORK/$lane.data" >"$WORK/timehist-$lane.txt" 2>/dev/null
  samples=
  if [ -n "$cpu" ]; then
    perf script -i "$WORK/$lane.cpu.data" -F comm,tid,time,ip,sym >"$WORK/samples-$lane.txt" 2>/dev/null
    samples="$WORK/samples-$lane.txt"
  fi
  t0=$(awk '/t0_monotonic_ns/{print $2}' "$WORK/gen-$lane.log")
  echo "== $lane: $(cat "$WORK/result-$lane.json" | head -c 300)"
  python3 benches/load/tail_profile.py "$WORK/trace-$lane.txt" "$t0" "$WORK/timehist-$lane.txt" 0.01 $samples
done
echo "(raw profiles and traces: $WORK, kept with KEEP_WORK=1)"

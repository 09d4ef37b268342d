#!/usr/bin/env bash
# The field's method (onthebench, GetBusbar/benchmarking), on this machine: the gateway pinned
# to its own core(s), the mock and the load generator on the other(s); added p99 at
# concurrency 1, the throughput frontier at p99 bounds from one concurrency sweep, streams
# (added time to first frame, inter-frame p99, concurrent streams sustained without a stall)
# and memory (idle, steady, growth per minute at a fixed load). Every figure for the mock
# directly, a plain pingora pass-through, tokensaver ALLOW, SERVE and a streamed ALLOW (and
# LiteLLM with LITELLM=1). See README.md, "The field's method".
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

SECS=${SECS:-10}                      # each concurrency-1 run
SWEEP_SECS=${SWEEP_SECS:-5}           # each rung of the sweep
RUNGS=${RUNGS:-1 2 4 8 16 32 64}      # connections, closed loop
BOUNDS_MS=${BOUNDS_MS:-1 5 10 50 100}
PACE_MS=${PACE_MS:-10}                # the mock's pause between a stream's frames
STREAM_RUNGS=${STREAM_RUNGS:-16 64 128 256 384 512}
MEM_SECS=${MEM_SECS:-600}             # the fixed-load memory run (0: none)
MEM_LANES=${MEM_LANES:-tokensaver}    # and whose (passthrough tokensaver)
MEM_RATE=${MEM_RATE:-200}             # its requests per second (open loop, each its own fingerprint)
MEM_WARM_SECS=${MEM_WARM_SECS:-60}    # growth is the slope after this (the bounds filling before it)
GATE_CPUS=${GATE_CPUS:-1}             # taskset list for the gateway under test
LOAD_CPUS=${LOAD_CPUS:-0}             # ... for the mock and the generator
LANES=${LANES:-direct passthrough allow serve}
N_ALLOW=${N_ALLOW:-4000} N_SERVE=${N_SERVE:-3200}
export PROMPTS=${PROMPTS:-32}         # SERVE pairs: N_SERVE × PROMPTS, each SERVEd ≤ 6 times a loop window
P_MOCK=${P_MOCK:-18811} P_PT=${P_PT:-18812} P_TS=${P_TS:-18813} P_API=${P_API:-18814} P_ADMIN=${P_ADMIN:-18815}
P_LL=${P_LL:-18816}
OUT=${OUT:-$ROOT/target/field/field-$(date -u +%Y%m%dT%H%M%SZ).json}

ncpus() { # CPUs in a taskset list such as "1" or "2-3" or "1,3"
  python3 -c 'import sys; n=0
for p in sys.argv[1].split(","):
    a,_,b=p.partition("-"); n+= int(b or a)-int(a)+1
print(n)' "$1"
}
GATE_THREADS=$(ncpus "$GATE_CPUS")

. benches/load/litellm.sh # LITELLM_VERSION, LL_VENV; installs it with LITELLM=1
if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build --release --bin tokensaver --bin tokensaver-mock-provider --example passthrough \
    --example paced_load --example field_load
fi
WORK_PREFIX=tokensaver-field . benches/load/servers.sh # BIN MOCK PT GEN PACED, WORK, PIDS, wait_port
ulimit -n 65536 2>/dev/null || true

python3 benches/load/gen.py config/tokensaver.toml "$WORK" $P_TS $P_API $P_ADMIN $P_MOCK $N_ALLOW $N_SERVE "$BIN" >/dev/null
# ANSWER_STORE_BYTES: the answer store's cap (the example config's 256 MiB otherwise).
[ -z "${ANSWER_STORE_BYTES:-}" ] || sed -i "s/^answer_store_bytes = .*/answer_store_bytes = $ANSWER_STORE_BYTES/" "$WORK/config.toml"
# REMEMBERED_ENTRIES: each per-key table's total across keys (the example config's 1,000,000).
[ -z "${REMEMBERED_ENTRIES:-}" ] || sed -i "s/^remembered_entries = .*/remembered_entries = $REMEMBERED_ENTRIES/" "$WORK/config.toml"
"$BIN" check-config "$WORK/config.toml" >/dev/null

on_load() { taskset -c "$LOAD_CPUS" "$@"; }
# Servers are started with taskset itself in the background (it execs the server), so $! is the
# server's pid: its RSS is read and it is stopped by that pid.
taskset -c "$LOAD_CPUS" "$MOCK" --listen 127.0.0.1:$P_MOCK --no-prompt-cache --stream-delay-ms "$PACE_MS" 2>"$WORK/mock.log" & PIDS+=($!)
taskset -c "$GATE_CPUS" "$PT" 127.0.0.1:$P_PT 127.0.0.1:$P_MOCK "$GATE_THREADS" 2>"$WORK/pt.log" & PIDS+=($!); PT_PID=$!
RUST_LOG=warn taskset -c "$GATE_CPUS" "$BIN" serve --config "$WORK/config.toml" --threads "$GATE_THREADS" 2>"$WORK/ts.log" & PIDS+=($!); TS_PID=$!
if [ -n "${LITELLM:-}" ]; then
  mkdir -p "$WORK/litellm"
  printf 'model_list:\n  - model_name: gpt-4o\n    litellm_params:\n      model: openai/gpt-4o\n      api_base: http://127.0.0.1:%s/v1\n      api_key: sk-mock-upstream\nlitellm_settings:\n  telemetry: false\n  turn_off_message_logging: true\ngeneral_settings:\n  disable_spend_logs: true\n' "$P_MOCK" >"$WORK/litellm/config.yaml"
  (cd "$WORK/litellm" && exec env -u DATABASE_URL -u LITELLM_MASTER_KEY LITELLM_TELEMETRY=False \
    LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_LOG=WARNING NO_PROXY=127.0.0.1 no_proxy=127.0.0.1 \
    taskset -c "$GATE_CPUS" "$LL_VENV/bin/litellm" --config config.yaml --host 127.0.0.1 \
    --port $P_LL --num_workers "$GATE_THREADS" >"$WORK/litellm.log" 2>&1) & PIDS+=($!)
  LANES="$LANES litellm"
fi
wait_port $P_MOCK; wait_port $P_PT; wait_port $P_TS
[ -z "${LITELLM:-}" ] || wait_port $P_LL 900
for p in $PT_PID $TS_PID; do [ "$(readlink /proc/$p/exe)" != /usr/bin/taskset ] || { echo "pid $p is taskset, not the server"; exit 1; }; done
sleep 1 # idle: the servers' start-up done

rss_kib() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }
RES=$WORK/results.jsonl; : >"$RES"
note() { echo "$1" >>"$RES"; }
note "{\"kind\":\"meta\",\"gate_cpus\":\"$GATE_CPUS\",\"load_cpus\":\"$LOAD_CPUS\",\"nproc\":$(nproc),\"secs\":$SECS,\"sweep_secs\":$SWEEP_SECS,\"pace_ms\":$PACE_MS,\"mem_rate\":$MEM_RATE,\"mem_secs\":$MEM_SECS,\"mem_warm_secs\":$MEM_WARM_SECS,\"remembered_entries\":$(awk '/^remembered_entries/{gsub(/_/,"",$3); print $3}' "$WORK/config.toml"),\"answer_store_bytes\":$(awk '/^answer_store_bytes/{gsub(/_/,"",$3); print $3}' "$WORK/config.toml"),\"commit\":\"$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\",\"loadavg\":\"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
note "{\"kind\":\"idle_rss\",\"lane\":\"passthrough\",\"kib\":$(rss_kib $PT_PID)}"
note "{\"kind\":\"idle_rss\",\"lane\":\"tokensaver\",\"kib\":$(rss_kib $TS_PID)}"

port_of() { case $1 in direct) echo $P_MOCK ;; passthrough) echo $P_PT ;; litellm) echo $P_LL ;; *) echo $P_TS ;; esac; }
mode_of() { case $1 in serve) echo serve ;; stream_*) echo stream ;; *) echo allow ;; esac; }
RUN_N=0
measure() { # kind lane conns secs
  local kind=$1 lane=$2 conns=$3 secs=$4 json
  RUN_N=$((RUN_N + 1))
  json=$(TRACE="$WORK/trace-$kind-$lane-$conns.txt" PACE_MS=$PACE_MS on_load "$GEN" "$(mode_of "$lane")" \
    "http://127.0.0.1:$(port_of "${lane#stream_}")/v1/chat/completions" "$WORK" "$conns" "$secs" "f$RUN_N$lane")
  note "{\"kind\":\"$kind\",\"lane\":\"$lane\",\"conns\":$conns,\"result\":$json}"
  printf '  %-8s %-18s c=%-4s %s\n' "$kind" "$lane" "$conns" "$json" >&2
}

# SERVE needs its answers stored: each pair once (ALLOW), then repeats are SERVEd.
[ -n "${MEM_ONLY:-}" ] || case " $LANES " in *" serve "*)
  on_load "$GEN" warm "http://127.0.0.1:$P_TS/v1/chat/completions" "$WORK" 16 600 warm >"$WORK/warm.json"
  echo "warm-up: $(cat "$WORK/warm.json")" >&2 ;;
esac

# MEM_ONLY=1: the memory run alone.
if [ -z "${MEM_ONLY:-}" ]; then
echo "-- concurrency 1, ${SECS}s each" >&2
for lane in $LANES; do measure c1 "$lane" 1 "$SECS"; done
echo "-- sweep, ${SWEEP_SECS}s per rung" >&2
for c in $RUNGS; do for lane in $LANES; do measure sweep "$lane" "$c" "$SWEEP_SECS"; done; done
echo "-- streams (the mock pauses ${PACE_MS} ms between frames)" >&2
STREAM_LANES="stream_direct stream_passthrough stream_allow"
for lane in $STREAM_LANES; do measure stream_c1 "$lane" 1 "$SECS"; done
for c in $STREAM_RUNGS; do for lane in $STREAM_LANES; do measure stream "$lane" "$c" "$SWEEP_SECS"; done; done
fi

note "{\"kind\":\"verdicts\",\"metrics\":\"$(curl -s -H 'Authorization: Bearer tsa_demo-admin-key-not-for-production' http://127.0.0.1:$P_ADMIN/metrics | grep '^tokensaver_requests_total' | tr '\n' ';' | tr -d '"')\"}"
if [ "$MEM_SECS" -gt 0 ]; then
  # A fresh gateway, so that idle, steady and growth describe the fixed load alone (after the
  # runs above, the answer store and the ledger's caches are full of their requests).
  kill "$TS_PID" "$PT_PID"; wait "$TS_PID" "$PT_PID" 2>/dev/null || true
  rm -rf "$WORK/data"
  taskset -c "$GATE_CPUS" "$PT" 127.0.0.1:$P_PT 127.0.0.1:$P_MOCK "$GATE_THREADS" 2>>"$WORK/pt.log" & PIDS+=($!); PT_PID=$!
  RUST_LOG=warn taskset -c "$GATE_CPUS" "$BIN" serve --config "$WORK/config.toml" --threads "$GATE_THREADS" 2>>"$WORK/ts.log" & PIDS+=($!); TS_PID=$!
  wait_port $P_PT; wait_port $P_TS; sleep 5
  note "{\"kind\":\"fresh_rss\",\"lane\":\"passthrough\",\"kib\":$(rss_kib $PT_PID)}"
  note "{\"kind\":\"fresh_rss\",\"lane\":\"tokensaver\",\"kib\":$(rss_kib $TS_PID)}"
  echo "-- memory: fresh gateways, ${MEM_RATE} req/s for ${MEM_SECS}s (RSS every 10 s)" >&2
  for lane in $MEM_LANES; do
    pid=$TS_PID port=$P_TS; [ $lane = passthrough ] && pid=$PT_PID port=$P_PT
    on_load "$PACED" "http://127.0.0.1:$port/v1/chat/completions" "$WORK" "$MEM_RATE" "$MEM_SECS" 8 "mem$lane" \
      >"$WORK/mem-$lane.txt" 2>&1 &
    gen=$!; t0=$(date +%s)
    samples=""
    while kill -0 $gen 2>/dev/null; do
      samples="$samples${samples:+,}[$(( $(date +%s) - t0 )),$(rss_kib $pid)]"; sleep 10
    done
    wait $gen || true
    note "{\"kind\":\"memory\",\"lane\":\"$lane\",\"rate\":$MEM_RATE,\"secs\":$MEM_SECS,\"paced\":\"$(head -1 "$WORK/mem-$lane.txt")\",\"samples\":[$samples]}"
  done
fi

mkdir -p "$(dirname "$OUT")"
python3 benches/load/field_report.py "$RES" "$BOUNDS_MS" >"$OUT"
python3 benches/load/field_report.py --table "$OUT"
echo "(results: $OUT; raw runs and traces: $WORK, kept with KEEP_WORK=1)"

#!/usr/bin/env bash
# Load test: the mock provider directly, through a plain pingora pass-through, and through
# tokensaver (ALLOW path and SERVE path), same load for each. See README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

DURATION=${DURATION:-10s}        # per measured run
CONNS=${CONNS:-32}
WRK_THREADS=${WRK_THREADS:-2}
PROXY_THREADS=${PROXY_THREADS:-2} # worker threads: pass-through and tokensaver alike
N_ALLOW=${N_ALLOW:-4000}         # ALLOW keys (each key must stay < 120 requests / 60 s)
N_SERVE=${N_SERVE:-3200}         # SERVE keys (× PROMPTS pairs, each served ≤ 6 times)
PROMPTS=${PROMPTS:-16}
P_MOCK=${P_MOCK:-18801} P_PT=${P_PT:-18802} P_TS=${P_TS:-18803} P_API=${P_API:-18804} P_ADMIN=${P_ADMIN:-18805}
P_LL=${P_LL:-18806}              # LiteLLM's proxy (LITELLM=1)
ADMIN_KEY=tsa_demo-admin-key-not-for-production

command -v wrk >/dev/null || { echo "installing wrk"; apt-get install -y wrk >/dev/null; }

. benches/load/litellm.sh # LITELLM_VERSION, LL_VENV; installs it with LITELLM=1

if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build --release --bin tokensaver --bin tokensaver-mock-provider --example passthrough \
    --example paced_load
fi
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET/release/tokensaver
MOCK=$TARGET/release/tokensaver-mock-provider
PT=$TARGET/release/examples/passthrough
PACED=$TARGET/release/examples/paced_load

WORK=$(mktemp -d /tmp/tokensaver-load.XXXXXX)
PIDS=()
LL_PGID=
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  # LiteLLM's workers are its children: the whole process group it was started in.
  [ -z "$LL_PGID" ] || kill -- "-$LL_PGID" 2>/dev/null || true
  sleep 0.3
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [ -z "$LL_PGID" ] || { sleep 2; kill -9 -- "-$LL_PGID" 2>/dev/null || true; }
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

python3 benches/load/gen.py config/tokensaver.toml "$WORK" $P_TS $P_API $P_ADMIN $P_MOCK $N_ALLOW $N_SERVE "$BIN"
"$BIN" check-config "$WORK/config.toml" >/dev/null

# No prompt-cache billing in the mock: the load needs none of it, it made the mock's CPU per
# request ~1.7x, and before the cache's fix its cost grew with the entries held until a lane
# stalled (README, "Why the fixed-rate runs stalled").
"$MOCK" --listen 127.0.0.1:$P_MOCK --no-prompt-cache 2>"$WORK/mock.log" & PIDS+=($!); MOCK_PID=$!
"$PT" 127.0.0.1:$P_PT 127.0.0.1:$P_MOCK $PROXY_THREADS 2>"$WORK/pt.log" & PIDS+=($!); PT_PID=$!
RUST_LOG=warn "$BIN" serve --config "$WORK/config.toml" --threads $PROXY_THREADS 2>"$WORK/ts.log" & PIDS+=($!); TS_PID=$!

if [ -n "${LITELLM:-}" ]; then
  # Forwards /v1/chat/completions for the load's model to the mock. No master key, so no auth
  # (the tsk_ keys chat.lua sends are ignored), no database, no callbacks; its logging, and
  # uvicorn's (an access-log line per request otherwise), at warning.
  mkdir -p "$WORK/litellm"
  cat >"$WORK/litellm/config.yaml" <<YAML
model_list:
  - model_name: gpt-4o
    litellm_params:
      model: openai/gpt-4o
      api_base: http://127.0.0.1:$P_MOCK/v1
      api_key: sk-mock-upstream
litellm_settings:
  telemetry: false
  callbacks: []
  success_callback: []
  failure_callback: []
  turn_off_message_logging: true
general_settings:
  disable_spend_logs: true
YAML
  cat >"$WORK/litellm/log.json" <<'JSON'
{"version": 1, "disable_existing_loggers": false,
 "handlers": {"stderr": {"class": "logging.StreamHandler"}},
 "loggers": {"uvicorn": {"handlers": ["stderr"], "level": "WARNING"},
             "uvicorn.error": {"level": "WARNING"},
             "uvicorn.access": {"handlers": ["stderr"], "level": "WARNING", "propagate": false}}}
JSON
  # Loopback only: no telemetry, the model cost map from the package (not fetched), and no
  # proxy in the way of 127.0.0.1. Its own process group (setsid), so that its workers can be
  # counted and stopped together. Workers: as many as the proxies' threads.
  (cd "$WORK/litellm" && exec env -u DATABASE_URL -u LITELLM_MASTER_KEY LITELLM_TELEMETRY=False \
    LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_LOG=WARNING NO_PROXY=127.0.0.1,localhost \
    no_proxy=127.0.0.1,localhost setsid "$LL_VENV/bin/litellm" --config config.yaml \
    --log_config log.json --host 127.0.0.1 --port $P_LL --num_workers $PROXY_THREADS \
    >"$WORK/litellm.log" 2>&1) &
  LL_PID=$!; PIDS+=($LL_PID)
  disown $LL_PID # its SIGKILL at the end is no news
fi

wait_port() { for _ in $(seq ${2:-100}); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 not up"; exit 1; }
wait_port $P_MOCK; wait_port $P_PT; wait_port $P_TS
if [ -n "${LITELLM:-}" ]; then
  wait_port $P_LL 900 # Python imports: ~15 s
  # setsid made it the leader of its own group; never signal a group that is not its own.
  [ "$(awk '{print $5}' "/proc/$LL_PID/stat")" = "$LL_PID" ] || { echo "LiteLLM is not in a group of its own"; exit 1; }
  LL_PGID=$LL_PID
fi

# one request by hand: the verdict header must say ALLOW
KEY1=$(head -1 "$WORK/keys_allow.txt")
BODY="$(cat "$WORK/body_prefix.txt")probe$(cat "$WORK/body_suffix.txt")"
echo "body: $(printf %s "$BODY" | wc -c) bytes"
curl -s -o /dev/null -D - -H "Authorization: Bearer $KEY1" -H 'content-type: application/json' \
  -H 'x-tokensaver-human: true' --data-binary "$BODY" http://127.0.0.1:$P_TS/v1/chat/completions \
  | grep -i -E '^HTTP|x-tokensaver-verdict' | tr -d '\r'

export LOAD_DIR=$WORK PROMPTS WRK_THREADS
RESULTS=$WORK/results.txt; : >"$RESULTS"
to_ms() { # wrk latency "812.00us" / "1.20ms" / "1.01s" → ms
  awk -v v="$1" 'BEGIN{ if (v ~ /us$/) {sub(/us$/,"",v); print v/1000} else if (v ~ /ms$/) {sub(/ms$/,"",v); print v+0} else if (v ~ /s$/) {sub(/s$/,"",v); print v*1000} else print v }'
}
# CPU time (user + system, all threads) a process has used, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# The same summed over a process group (LiteLLM and the workers it forks).
group_ticks() {
  local g=$1 s=0 f line
  for f in /proc/[0-9]*/stat; do
    read -r line <"$f" 2>/dev/null || continue
    set -- ${line##*) } # the fields after the command name: 3 = process group, 12 + 13 = CPU
    [ "$3" = "$g" ] && s=$((s + ${12} + ${13}))
  done
  echo $s
}
TICK_US=$((1000000 / $(getconf CLK_TCK)))
run() { # name port mode
  local name=$1 port=$2 mode=$3 out=$WORK/wrk-$1.txt
  # The process that serves this run (its CPU per request is the figure that does not depend
  # on how the two cores were shared with wrk and the mock).
  local pid=$TS_PID ticks=cpu_ticks
  case $name in direct) pid=$MOCK_PID ;; passthrough) pid=$PT_PID ;; litellm) pid=$LL_PGID ticks=group_ticks ;; esac
  local ticks0; ticks0=$($ticks "$pid")
  # A profile is taken while the load runs (it costs the profiled run some throughput).
  if [ -n "${PERF:-}" ] && [ "$name" = "$PERF" ] && command -v perf >/dev/null; then
    (sleep 2; perf record -F 999 ${PERF_ARGS:--g} -p $pid -o "$WORK/perf.data" -- sleep 4 >/dev/null 2>&1) &
    PERF_PID=$!
  fi
  LOAD_MODE=$mode timeout 60 wrk -t$WRK_THREADS -c$CONNS -d$DURATION --latency -s benches/load/chat.lua \
    http://127.0.0.1:$port/v1/chat/completions >"$out" 2>&1 || true
  if [ -n "${PERF_PID:-}" ]; then wait "$PERF_PID" || true; PERF_PID=; fi
  local ticks1; ticks1=$($ticks "$pid")
  local rps p50 p99 bad cpu
  rps=$(awk '/^Requests\/sec/{print $2}' "$out")
  cpu=$(awk -v t=$((ticks1 - ticks0)) -v us=$TICK_US '/requests in/{n=$1} END{ if (n > 0) printf "%.0f", t * us / n; else print "?" }' "$out")
  p50=$(to_ms "$(awk '$1=="50%"{print $2}' "$out")")
  p99=$(to_ms "$(awk '$1=="99%"{print $2}' "$out")")
  bad=$(awk '/Non-2xx/{print $NF}' "$out"); bad=${bad:-0}
  local errs; errs=$(awk '/Socket errors/{print $0}' "$out")
  printf '%-12s %10s %9s %9s %8s %12s\n' "$name" "$rps" "$p50" "$p99" "$bad" "$cpu" | tee -a "$RESULTS"
  [ -z "$errs" ] || echo "  ($errs)"
}
metrics() { curl -s -H "Authorization: Bearer $ADMIN_KEY" http://127.0.0.1:$P_ADMIN/metrics | grep '^tokensaver_requests_total' || true; }

# PACED_ONLY=1: the fixed-rate runs alone.
if [ -z "${PACED_ONLY:-}" ]; then
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-12s %10s %9s %9s %8s %12s\n' run req/s p50_ms p99_ms non2xx cpu_us/req
run direct       $P_MOCK allow
run passthrough  $P_PT   allow
run allow        $P_TS   allow
echo "-- verdicts after ALLOW run:"; metrics
if [ -n "${LITELLM:-}" ]; then
  run litellm    $P_LL   allow
  # It must not have reached anything but loopback: its sockets now (TCP and UDP).
  far=$(ss -tunapH 2>/dev/null | awk -v g=" $(ps -o pid= -s "$LL_PGID" | tr '\n' ' ')" '
    { if (match($0, /pid=[0-9]+/)) { p = substr($0, RSTART + 4, RLENGTH - 4); if (index(g, " " p " ") && $6 !~ /^(127\.|\[::1\]|\*|0\.0\.0\.0)/) print $6 } }')
  [ -z "$far" ] && echo "   (LiteLLM: no socket beyond loopback)" || echo "   LiteLLM talks beyond loopback: $far"
fi
# SERVE: one ALLOW per (key, prompt) stores the answer, then identical repeats are SERVEd
# wrk keeps its clock running after the Lua stops every thread: size the run from the ALLOW rate
PAIRS=$((N_SERVE * PROMPTS))
WARM_SECS=$(awk -v n=$PAIRS -v r="$(awk '$1=="allow"{print $2}' "$RESULTS")" 'BEGIN{ s = (r > 0 ? n / r * 1.5 + 2 : 30); printf "%d", (s > 90 ? 90 : s) }')
LOAD_MODE=warm timeout 120 wrk -t$WRK_THREADS -c$CONNS -d${WARM_SECS}s -s benches/load/chat.lua \
  http://127.0.0.1:$P_TS/v1/chat/completions >"$WORK/wrk-warm.txt" 2>&1 || true
echo "warm-up: $(awk '/requests in/{print $1" requests in "$4}' "$WORK/wrk-warm.txt")"
run serve        $P_TS   serve
echo "-- verdicts after SERVE run:"; metrics
fi
# Fixed rate (open loop): latency from each request's due time, so what the proxy adds shows at
# a load it can carry (examples/paced_load.rs; wrk has no fixed rate). A lane that cannot carry
# the rate is reported `behind` and left out of the comparison: its percentiles would measure
# the length of the run, not the server.
PACED_SECS=${PACED_SECS:-10}
PACED_RATES=${PACED_RATES:-500 2000}
NCPU=$(nproc)
# CPU ticks used by every process on the machine: the live ones, and those that ended through
# their parents' cutime + cstime. (/proc/stat's busy time lags on this VM: it once showed less
# than the mock alone had used.)
all_ticks() { cat /proc/[0-9]*/stat 2>/dev/null | awk '{ sub(/^.*\) /, ""); s += $12 + $13 + $14 + $15 } END { print s }'; }
# CPU ticks of every process this script started.
ours_ticks() {
  local s=0 p; for p in $MOCK_PID $PT_PID $TS_PID; do s=$((s + $(cpu_ticks "$p"))); done
  [ -z "$LL_PGID" ] || s=$((s + $(group_ticks "$LL_PGID")))
  echo $s
}
[ -z "$PACED_RATES" ] || {
echo "-- fixed rate, ${PACED_SECS}s per run, ${CONNS} connections (latency from the due time); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "   cpu: us per request of the lane's server, the mock, the generator; busy: the machine's CPU in use; others: of which not this script's"
printf '%-12s %5s %6s %6s %6s %4s %5s %6s %8s %8s %8s %7s %5s %5s %5s %5s %6s\n' run rate sent ok non2xx err late rps p50_ms p99_ms max_ms verdict srv mock gen busy% others | tee -a "$WORK/paced.txt"
for rate in $PACED_RATES; do
  for target in direct:$P_MOCK passthrough:$P_PT allow:$P_TS; do
    name=${target%%:*}; port=${target##*:}
    pid=$TS_PID; case $name in direct) pid=$MOCK_PID ;; passthrough) pid=$PT_PID ;; esac
    srv0=$(cpu_ticks $pid) mock0=$(cpu_ticks $MOCK_PID) ours0=$(ours_ticks) all0=$(all_ticks) t0=$(date +%s%N)
    line=$(PACED_TRACE="$WORK/trace-$rate-$name.txt" "$PACED" "http://127.0.0.1:$port/v1/chat/completions" \
      "$WORK" "$rate" "$PACED_SECS" "$CONNS" "paced$rate$name" 2>"$WORK/paced-$rate-$name.txt") \
      || { echo "paced_load failed:"; cat "$WORK/paced-$rate-$name.txt"; exit 1; }
    srv1=$(cpu_ticks $pid) mock1=$(cpu_ticks $MOCK_PID) ours1=$(ours_ticks) all1=$(all_ticks) t1=$(date +%s%N)
    # The generator prints its own CPU time ("CPU 1.23 s") on stderr.
    gen=$(awk '{for (i = 1; i < NF; i++) if ($i == "CPU") print $(i + 1)}' "$WORK/paced-$rate-$name.txt")
    cpu=$(awk -v srv=$((srv1 - srv0)) -v mock=$((mock1 - mock0)) -v ours=$((ours1 - ours0)) -v busy=$((all1 - all0)) \
      -v gen="${gen:-0}" -v n="${line%% *}" -v us=$TICK_US -v hz=$(getconf CLK_TCK) -v ns=$((t1 - t0)) -v ncpu=$NCPU '
      BEGIN { cap = ns / 1e9 * hz * ncpu; others = busy - ours - gen * hz; if (others < 0) others = 0
              printf "%5.0f %5.0f %5.0f %5.0f %6.0f", srv * us / n, mock * us / n, gen * 1e6 / n, 100 * busy / cap, 100 * others / cap }')
    printf '%-12s %5s %6s %6s %6s %4s %5s %6s %8s %8s %8s %7s %s\n' "$name" "$rate" $line "$cpu" | tee -a "$WORK/paced.txt"
  done
done
echo "   (the generator's own figures per run, e.g. how long a due request waited for a free connection: $WORK/paced-*.txt;"
echo "    each answer's due time, latency and wait: $WORK/trace-*.txt)"
awk '
  NR > 1 { k = $1 " " $2; p50[k] = $9; p99[k] = $10; v[k] = $12; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } }
  END {
    for (i = 1; i <= n; i++) {
      r = order[i]; d = "direct " r; pt = "passthrough " r; al = "allow " r
      if (v[d] != "ok") { printf "at %s req/s the mock directly: %s, nothing to compare with\n", r, v[d]; continue }
      printf "added over direct at %s req/s:", r
      if (v[pt] == "ok") printf " pass-through p50 %+.3f p99 %+.3f ms;", p50[pt] - p50[d], p99[pt] - p99[d]; else printf " pass-through %s;", v[pt]
      if (v[al] == "ok") printf " tokensaver ALLOW p50 %+.3f p99 %+.3f ms", p50[al] - p50[d], p99[al] - p99[d]; else printf " tokensaver ALLOW %s", v[al]
      printf "\n"
      if (v[pt] == "ok" && v[al] == "ok")
        printf "  tokensaver added p99 - pass-through added p99: %+.3f ms (target <= +0.5 ms)\n", p99[al] - p99[pt]
    }
  }' "$WORK/paced.txt"
}

if [ -n "${PERF:-}" ] && [ -f "$WORK/perf.data" ]; then
  perf report -i "$WORK/perf.data" --no-children --percent-limit 1.5 --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -30 >"$WORK/perf-top.txt" || true
  echo "-- perf (process serving the $PERF run), self time:"; cat "$WORK/perf-top.txt"
fi

[ -s "$RESULTS" ] && awk '
  { rps[$1]=$2; p50[$1]=$3; p99[$1]=$4; cpu[$1]=$6 }
  END {
    printf "\nALLOW / pass-through throughput:     %.3f  (target >= 0.85)\n", rps["allow"]/rps["passthrough"]
    ap = p99["passthrough"]-p99["direct"]; aa = p99["allow"]-p99["direct"]
    printf "added p99 vs direct: pass-through %.3f ms, tokensaver ALLOW %.3f ms, ratio %.2f  (target <= 1.25)\n", ap, aa, (ap>0 ? aa/ap : 0)
    printf "CPU per request: pass-through %s us, tokensaver ALLOW %s us, SERVE %s us, mock %s us\n", cpu["passthrough"], cpu["allow"], cpu["serve"], cpu["direct"]
    printf "SERVE vs direct mock: throughput %.2fx, p50 %.3f vs %.3f ms, p99 %.3f vs %.3f ms  (target: faster)\n", rps["serve"]/rps["direct"], p50["serve"], p50["direct"], p99["serve"], p99["direct"]
    if ("litellm" in cpu)
      printf "LiteLLM: %s us CPU per request (all its processes) = %.1fx tokensaver ALLOW, %.1fx the pass-through  (target: ALLOW >= 100x less)\n", cpu["litellm"], cpu["litellm"]/cpu["allow"], cpu["litellm"]/cpu["passthrough"]
  }' "$RESULTS"
echo "(raw wrk output and logs: $WORK; KEEP_WORK=1 keeps it)"

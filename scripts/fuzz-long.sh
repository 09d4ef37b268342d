#!/usr/bin/env bash
# The long fuzzing run: each target until it has executed RUNS inputs (default 10 million) or
# for at most SECONDS (default 2 hours), one after the other, from the committed seeds and the
# corpus earlier runs grew (fuzz/corpus). Prints, per target, the executions, the coverage
# libFuzzer reports (cov: edges, ft: features), the corpus and the time; a crash stops that
# target with its input in fuzz/artifacts/TARGET and makes the script fail.
#
#   scripts/fuzz-long.sh                     every target, 10M executions each (2 h cap)
#   RUNS=1000000 SECONDS_CAP=600 scripts/fuzz-long.sh json_reader digest
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-10000000}"
SECONDS_CAP="${SECONDS_CAP:-7200}"
if [ "$#" -gt 0 ]; then targets=("$@"); else mapfile -t targets < <(scripts/fuzz.sh list); fi
scripts/fuzz.sh build >/dev/null || exit 1
mkdir -p fuzz/logs
failed=0
printf '%-15s %12s %8s %8s %8s %8s %s\n' target executions cov ft corpus seconds result
for t in "${targets[@]}"; do
  log="fuzz/logs/$t.log"
  start=$(date +%s)
  scripts/fuzz.sh run "$t" "$SECONDS_CAP" -runs="$RUNS" >"$log" 2>&1
  code=$?
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$last")
  result=ok
  if [ "$code" -ne 0 ]; then result="CRASH (see $log, fuzz/artifacts/$t)"; failed=1; fi
  printf '%-15s %12s %8s %8s %8s %8s %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$secs" "$result"
done
exit "$failed"

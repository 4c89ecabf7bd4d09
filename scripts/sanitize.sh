#!/usr/bin/env bash
# compute-sanitizer over the standalone GPU test programs (no MAX graph on the device).
#
# Here (builds .gpu-bin/ for sm_90a with ../shared/gpu/bundle-bin, ~1 min per program):
#   scripts/sanitize.sh build
# On the H200, one device call:
#   run carry=[".gpu-bin"] command: bash scripts/sanitize.sh run
# (optional after `run`: the tools, default "memcheck racecheck synccheck"; `run memcheck`.)
#
# Each program runs once without a tool (the baseline must pass), then once per tool with
# --error-exitcode 3 and --print-limit 20. Logs go to $OUT/sanitize/ (or ./sanitize-logs/), and
# a JSON summary (program, tool, exit code, seconds, the sanitizer's ERROR SUMMARY line) is
# printed last and written to summary.json. Exit 1 if any run failed.
# A racecheck run of int4_gemm_gpu_test may fail to launch (CUDA_ERROR_LAUNCH_FAILED): see
# docs/sanitizers.md for the hypothesis; the summary then reports it as failed.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
PROGRAMS=(int4_gemm_gpu_test grouped_gpu_harness k_cache_gpu_harness)
mode=${1:-run}
shift || true

if [ "$mode" = build ]; then
  set -e
  mkdir -p .gpu-bin
  PYTHONPATH=$top/python ${PYTHON:-/work/main/.venv/bin/python} tests/mojo/int4_gemm_fixture.py \
    .gpu-bin/int4_gemm_fixture.bin
  ../shared/gpu/bundle-bin -I . -I tests/mojo "${PROGRAMS[@]/#/tests/mojo/}"
  ls -la .gpu-bin
  exit 0
fi
[ "$mode" = run ] || { echo "usage: scripts/sanitize.sh build | run [tool...]" >&2; exit 2; }

tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck synccheck)
logs=${OUT:-$top/sanitize-logs}/sanitize
mkdir -p "$logs"
export LD_LIBRARY_PATH=$top/.gpu-bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
args_of() {  # the program's own arguments
  case "$1" in
    int4_gemm_gpu_test) echo ".gpu-bin/int4_gemm_fixture.bin" ;;
    *) echo "" ;;
  esac
}
rows=()
status=0
for prog in "${PROGRAMS[@]}"; do
  exe=.gpu-bin/$prog
  [ -x "$exe" ] || { echo "sanitize: $exe missing (run 'scripts/sanitize.sh build' first)"; status=1; continue; }
  for tool in none "${tools[@]}"; do
    log=$logs/$prog.$tool.log
    start=$(date +%s)
    if [ "$tool" = none ]; then
      # shellcheck disable=SC2046
      "$exe" $(args_of "$prog") >"$log" 2>&1
    else
      extra=()
      [ "$tool" = racecheck ] && extra=(--racecheck-report all)
      # shellcheck disable=SC2046
      "$sanitizer" --tool "$tool" --error-exitcode 3 --print-limit 20 "${extra[@]}" \
        "$exe" $(args_of "$prog") >"$log" 2>&1
    fi
    rc=$?
    secs=$(( $(date +%s) - start ))
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|LAUNCH_FAILED|ALL PASS" "$log" | tail -2 | tr '\n' ' ' | tr -d '"\\')
    echo "sanitize: $prog $tool rc=$rc ${secs}s $summary" 
    [ $rc -eq 0 ] || status=1
    rows+=("{\"program\": \"$prog\", \"tool\": \"$tool\", \"rc\": $rc, \"seconds\": $secs, \"summary\": \"$summary\"}")
  done
done
json="[$(IFS=,; echo "${rows[*]}")]"
echo "$json" > "$logs/summary.json"
echo "$json"
echo "sanitize: $([ $status -eq 0 ] && echo OK || echo FAILED)"
exit $status

#!/usr/bin/env bash
# One device call on an H200 with MAX installed: every gpu test in three parallel
# pytest processes (graph compiles dominate; timing is not measured by tests), then the named
# parts. Logs, RESULTS.md and benchmark JSON go to $OUT (or ./gpu-session-out).
#   scripts/gpu-session.sh tests            # gpu tests only
#   scripts/gpu-session.sh bench-grouped bench-kcache bench-int4 example
# Run from the repository root with PYTHONPATH=/root/site:$PWD/python and MAX's bin on PATH.
set -uo pipefail
out=${OUT:-gpu-session-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
python -c "import torch; print('torch', torch.__version__)" >> "$out/gpu.txt" 2>&1
for part in "$@"; do
  case "$part" in
    tests)
      P="python -m pytest -m gpu -q -p no:cacheprovider -rA"
      (timeout 540 $P tests/test_int4_graph.py tests/test_int4_op.py tests/test_grouped.py \
         tests/test_grouped_gpu_build.py tests/test_grouped_no_sync.py > "$out/tests1.log" 2>&1
       echo "rc=$?" >> "$out/tests1.log") &
      (timeout 540 $P tests/test_k_cache.py tests/test_kv_projection.py tests/test_fp8_quantize_op.py \
         tests/test_torch_bridge.py > "$out/tests2.log" 2>&1; echo "rc=$?" >> "$out/tests2.log") &
      (timeout 540 $P tests/test_moe_block.py tests/test_moe_decoder.py > "$out/tests3.log" 2>&1
       echo "rc=$?" >> "$out/tests3.log") &
      wait
      grep -hE "^(FAILED|ERROR|SKIPPED)|passed|failed|rc=" "$out"/tests*.log ;;
    bench-grouped)
      BENCH_BUDGET_S=${BENCH_BUDGET_S:-230} timeout 280 python benchmarks/bench_grouped_matmul.py \
        > "$out/bench_grouped.log" 2>&1; echo "rc=$?" >> "$out/bench_grouped.log"; tail -3 "$out/bench_grouped.log" ;;
    bench-kcache)
      BENCH_BUDGET_S=${BENCH_BUDGET_S:-280} timeout 330 python benchmarks/bench_k_matmul_paged.py \
        > "$out/bench_kcache.log" 2>&1; echo "rc=$?" >> "$out/bench_kcache.log"; tail -3 "$out/bench_kcache.log" ;;
    bench-int4)
      b=${BENCH_BUDGET_S:-240}
      BENCH_BUDGET_S=$b timeout $((b + 60)) python benchmarks/bench_int4_matmul.py \
        > "$out/bench_int4.log" 2>&1; echo "rc=$?" >> "$out/bench_int4.log"; tail -3 "$out/bench_int4.log" ;;
    example)
      timeout 300 python examples/moe_decoder.py --device gpu > "$out/example_gpu.log" 2>&1
      echo "rc=$?" >> "$out/example_gpu.log"; tail -8 "$out/example_gpu.log" ;;
    *) echo "unknown part: $part" >&2 ;;
  esac
  cp benchmarks/RESULTS.md "$out/" 2>/dev/null
  cp benchmarks/out/*.json "$out/" 2>/dev/null
  cp benchmarks/results/*.json "$out/" 2>/dev/null
done

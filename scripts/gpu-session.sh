#!/usr/bin/env bash
# One device call on an H200 with MAX installed: the named parts in order, then everything they
# wrote (logs, RESULTS.md, benchmark JSON) packed into $OUT/session-<first part>.tgz, one file,
# since a device call returns few files.
#   scripts/gpu-session.sh tests                 # every gpu test, four pytest processes
#   scripts/gpu-session.sh capture example       # the captured-decode tests, the GPU example
#   scripts/gpu-session.sh bench-int4 bench-grouped bench-kcache bench-fp8 bench-decoder
#   scripts/gpu-session.sh bench-int4-public     # int4 vs humming-kernels, public layers (~500 s)
#   scripts/gpu-session.sh tests-quick bench-decoder-ours   # kernels' tests; decoder without MAX's twin
#   scripts/gpu-session.sh bench-decoder-sharded  # ShardedMoEDecoder on 1 GPU (and 2 if present)
#   scripts/gpu-session.sh bench-targets         # forced Ampere / portable paths vs Hopper
#   scripts/gpu-session.sh harness-grouped int4-sweep   # standalone binaries of .gpu-bin (carry it)
#   scripts/gpu-session.sh harness-kcache harness-route  # K/V-cache and routing harnesses (.gpu-bin)
#   scripts/gpu-session.sh int4-test             # the int4 kernels' standalone test (.gpu-bin)
#   scripts/gpu-session.sh int4-ncu              # ncu: int4 at M = 4096 next to cuBLAS (.gpu-bin)
# Run from the repository root with MAX on PYTHONPATH (python/ too) and MAX's bin on PATH.
# BENCH_BUDGET_S sets each benchmark's wall-clock budget (seconds).
set -uo pipefail
work=gpu-session-out
mkdir -p "$work"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$work/gpu.txt" 2>&1
python -c "import torch; print('torch', torch.__version__)" >> "$work/gpu.txt" 2>&1
P="python -m pytest -m gpu -q -p no:cacheprovider -rA"
bench() {  # bench <log name> <budget> <script> [args]: runs a benchmark within its budget
  local name=$1 budget=$2; shift 2
  BENCH_BUDGET_S=$budget timeout $((budget + 90)) python "$@" > "$work/$name.log" 2>&1
  echo "rc=$?" >> "$work/$name.log"; grep -hE "^bar:|rc=" "$work/$name.log"; tail -2 "$work/$name.log"
}
for part in "$@"; do
  case "$part" in
    tests)
      # MAX builds its own Mojo extensions (max._kv_cache_ops, ...) into a cache on first import
      # and the kernel package is precompiled once: do both before the parallel processes,
      # which would otherwise race on the same cache files ("file too short").
      python -c "import max.nn, mojo_gemm; mojo_gemm.kernels_package()" > "$work/warmup.log" 2>&1
      (timeout 470 $P tests/test_int4_graph.py tests/test_int4_op.py tests/test_grouped.py \
         tests/test_grouped_gpu_build.py > "$work/tests1.log" 2>&1
       echo "rc=$?" >> "$work/tests1.log") &
      (timeout 470 $P tests/test_k_cache.py tests/test_kv_projection.py tests/test_fp8_quantize_op.py \
         tests/test_fp8_matmul.py tests/test_fp8_linear.py tests/test_torch_bridge.py > "$work/tests2.log" 2>&1; echo "rc=$?" >> "$work/tests2.log") &
      (timeout 470 $P tests/test_moe_route.py tests/test_moe_combine.py tests/test_rms_norm.py tests/test_moe_block.py tests/test_moe_decoder.py > "$work/tests3.log" 2>&1
       echo "rc=$?" >> "$work/tests3.log") &
      (timeout 470 $P tests/test_forced_paths.py > "$work/tests4.log" 2>&1
       echo "rc=$?" >> "$work/tests4.log") &
      wait
      # graph capture reserves fresh device memory: alone, not beside three other processes
      # (beside them it failed with CUDA_ERROR_OUT_OF_MEMORY)
      timeout 300 $P tests/test_grouped_no_sync.py tests/test_int4_capture.py > "$work/tests5.log" 2>&1
      echo "rc=$?" >> "$work/tests5.log"
      grep -hE "^(FAILED|ERROR|SKIPPED)|passed|failed|rc=" "$work"/tests*.log ;;
    tests-quick)
      # the kernels' own GPU tests and the captured decoder, two processes (a subset of `tests`)
      python -c "import max.nn, mojo_gemm; mojo_gemm.kernels_package()" > "$work/warmup.log" 2>&1
      (timeout 420 $P tests/test_int4_op.py tests/test_grouped.py tests/test_grouped_no_sync.py \
         tests/test_fp8_quantize_op.py tests/test_fp8_matmul.py tests/test_fp8_linear.py > "$work/quick1.log" 2>&1; echo "rc=$?" >> "$work/quick1.log") &
      (timeout 420 $P tests/test_k_cache.py tests/test_kv_projection.py tests/test_moe_route.py tests/test_moe_combine.py tests/test_rms_norm.py tests/test_moe_block.py tests/test_moe_decoder.py > "$work/quick2.log" 2>&1
       echo "rc=$?" >> "$work/quick2.log") &
      wait
      grep -hE "^(FAILED|ERROR|SKIPPED)|passed|failed|rc=" "$work"/quick*.log ;;
    capture)
      timeout 400 $P tests/test_moe_decoder.py tests/test_grouped_no_sync.py -k "gpu or capture" \
        > "$work/capture.log" 2>&1; echo "rc=$?" >> "$work/capture.log"
      grep -hE "^(FAILED|ERROR|SKIPPED)|passed|failed|rc=" "$work/capture.log" ;;
    example)
      timeout 300 python examples/moe_decoder.py --device gpu > "$work/example_gpu.log" 2>&1
      echo "rc=$?" >> "$work/example_gpu.log"; tail -8 "$work/example_gpu.log" ;;
    bench-int4) bench bench_int4 "${BENCH_BUDGET_S:-240}" benchmarks/bench_int4_matmul.py --shapes llama ;;
    bench-int4-public)  # issue 19's run: 28 public layers x 7 M with humming-kernels (carry .wheels)
      bench bench_int4 "${BENCH_BUDGET_S:-500}" benchmarks/bench_int4_matmul.py --shapes public ;;
    bench-grouped) bench bench_grouped "${BENCH_BUDGET_S:-480}" benchmarks/bench_grouped_matmul.py ;;
    bench-kcache) bench bench_kcache "${BENCH_BUDGET_S:-280}" benchmarks/bench_k_matmul_paged.py ;;
    bench-kcache-public)  # issue 21's set: adds KV widths 256 / 2048 at hidden 3072 / 5120 / 7168
      BENCH_PROBLEMS=public bench bench_kcache "${BENCH_BUDGET_S:-480}" benchmarks/bench_k_matmul_paged.py ;;
    bench-fp8)  # fp8_blockwise_matmul vs _scaled_mm (after bench-kcache*: it reads their JSON)
      bench bench_fp8 "${BENCH_BUDGET_S:-420}" benchmarks/bench_fp8_matmul.py ;;
    bench-decoder) bench bench_decoder "${BENCH_BUDGET_S:-420}" benchmarks/bench_decoder.py ;;
    bench-decoder-ours) bench bench_decoder "${BENCH_BUDGET_S:-300}" benchmarks/bench_decoder.py --skip-max ;;
    bench-decoder-sharded)  # the sharded decoder on 1 GPU and, where the machine has them, 2
      n=$(python -c "from max.driver import accelerator_count as a; print(min(2, a()))")
      bench bench_decoder_sharded "${BENCH_BUDGET_S:-240}" benchmarks/bench_decoder.py --devices "$n" ;;
    bench-targets) bench bench_targets "${BENCH_BUDGET_S:-150}" benchmarks/bench_targets.py ;;
    harness-grouped)  # carry .gpu-bin (scripts/build-gpu-bin tests/mojo/grouped_gpu_harness.mojo)
      LD_LIBRARY_PATH=$PWD/.gpu-bin/lib timeout 300 .gpu-bin/grouped_gpu_harness \
        > "$work/grouped_harness.log" 2>&1; echo "rc=$?" >> "$work/grouped_harness.log"
      grep -hE "FAIL|ALL PASS|rc=" "$work/grouped_harness.log" ;;
    harness-kcache)  # carry .gpu-bin (scripts/build-gpu-bin tests/mojo/k_cache_gpu_harness.mojo)
      LD_LIBRARY_PATH=$PWD/.gpu-bin/lib timeout 400 .gpu-bin/k_cache_gpu_harness \
        > "$work/kcache_harness.log" 2>&1; echo "rc=$?" >> "$work/kcache_harness.log"
      grep -hE "FAIL|fused K\+V|K op \+ V op|== dense|== tiles|time/call \(device events\): (K op,|LARGE)|rc=" \
        "$work/kcache_harness.log" ;;
    harness-kcache-tiles)  # the prefill tile configs timed over issue 21's shapes (.gpu-bin)
      LD_LIBRARY_PATH=$PWD/.gpu-bin/lib timeout 300 .gpu-bin/k_cache_gpu_harness --tiles \
        > "$work/kcache_tiles.log" 2>&1; echo "rc=$?" >> "$work/kcache_tiles.log"
      grep -hE "FAIL|== tiles|time/call|rc=" "$work/kcache_tiles.log" ;;
    harness-route)  # carry .gpu-bin (scripts/build-gpu-bin tests/mojo/moe_route_gpu_harness.mojo
      # benchmarks/mojo/moe_route_bench.mojo)
      LD_LIBRARY_PATH=$PWD/.gpu-bin/lib timeout 200 .gpu-bin/moe_route_gpu_harness \
        > "$work/route_harness.log" 2>&1; echo "rc=$?" >> "$work/route_harness.log"
      LD_LIBRARY_PATH=$PWD/.gpu-bin/lib timeout 200 .gpu-bin/moe_route_bench \
        > "$work/route_bench.log" 2>&1; echo "rc=$?" >> "$work/route_bench.log"
      grep -hE "FAIL|ALL PASS|rc=" "$work/route_harness.log" "$work/route_bench.log" ;;
    int4-test)  # carry .gpu-bin (scripts/build-gpu-bin tests/mojo/int4_gemm_gpu_test.mojo, and
      # python tests/mojo/int4_gemm_fixture.py .gpu-bin/int4_gemm_fixture.bin)
      LD_LIBRARY_PATH=$PWD/.gpu-bin/lib timeout 300 .gpu-bin/int4_gemm_gpu_test .gpu-bin/int4_gemm_fixture.bin \
        > "$work/int4_test.log" 2>&1; echo "rc=$?" >> "$work/int4_test.log"
      echo "PASS lines: $(grep -c PASS "$work/int4_test.log"), FAIL lines: $(grep -c FAIL "$work/int4_test.log")"
      grep -hE "int4_gemm_gpu_test:|FAIL|rc=" "$work/int4_test.log" | tail -5 ;;
    int4-sweep)  # carry .gpu-bin (scripts/build-gpu-bin -o int4_sweep benchmarks/mojo/int4_sweep.mojo);
      # SWEEP_M=1,16 sweeps only those M values (the sweep's --m)
      LD_LIBRARY_PATH=$PWD/.gpu-bin/lib timeout $((${SWEEP_BUDGET_S:-300} + 120)) .gpu-bin/int4_sweep \
        --budget-s "${SWEEP_BUDGET_S:-300}" ${SWEEP_M:+--m "$SWEEP_M"} > "$work/int4_sweep.json" 2> "$work/int4_sweep.err"
      echo "rc=$?" >> "$work/int4_sweep.err"; tail -3 "$work/int4_sweep.err"; wc -l "$work/int4_sweep.json" ;;
    int4-ncu)  # carry .gpu-bin (scripts/build-gpu-bin benchmarks/mojo/int4_gemm_bench.mojo): ncu of
      # the int4 dispatch's first launch on 8B.gate_up at M = 4096 next to cuBLAS's bf16 GEMM of
      # the same shape (SM clock, tensor pipe, issue and stall statistics, L2 / DRAM traffic)
      sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats"
      LD_LIBRARY_PATH=$PWD/.gpu-bin/lib timeout 150 ncu --clock-control none --kernel-name regex:int4_gemm_kernels \
        --launch-count 1 $sections .gpu-bin/int4_gemm_bench 2 noprev m=4096 > "$work/ncu_int4.txt" 2>&1
      cat > "$work/cublas_shape.py" <<'PY'
import torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(28672, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    c = a @ b.t()
torch.cuda.synchronize()
PY
      timeout 90 ncu --clock-control none --kernel-name regex:"gemm|nvjet|xmma" --launch-skip 1 --launch-count 1 \
        $sections python "$work/cublas_shape.py" \
        > "$work/ncu_cublas.txt" 2>&1
      grep -hE "Duration|SM Frequency|Compute \(SM\) Throughput|L2 Cache Throughput|Issue Slots Busy|Warp Cycles Per Issued" \
        "$work/ncu_int4.txt" "$work/ncu_cublas.txt" ;;
    *) echo "unknown part: $part" >&2 ;;
  esac
  # packed after every part, so a call cut short still returns the parts that finished
  cp benchmarks/RESULTS.md "$work/" 2>/dev/null
  mkdir -p "$work/results" && cp benchmarks/results/*.json "$work/results/" 2>/dev/null
  tar -czf "${OUT:-.}/session-${1:-none}.tgz" "$work"
done

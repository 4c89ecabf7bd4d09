"""Decode timing (T <= 128) of the FP8 K-cache op's dispatch on the issue-5 shapes (no checks:
tests/mojo/k_cache_gpu_harness.mojo checks the same kernels). The timed calls rotate over 4
copies of the weight, so every call reads its weight from HBM (as each layer of a model does).

    scripts/build-gpu-bin benchmarks/mojo/k_cache_decode_bench.mojo
"""

from max.gpu.host import DeviceContext

from k_cache_gpu_harness import rep, run_case


def main() raises:
    var ctx = DeviceContext()
    # OLMoE's K/V width (N = 2048, K = 2048) at decode, and the same 8 MB of weight as one
    # 4096-row half (the LARGE_N configs, which the fused K+V launch of 2 x 2048 rows takes)
    run_case[DType.bfloat16, 16, 128, 1, 128, 40, 1, 128, 128](
        ctx, String("N=2048 K=2048 T=1"), 2048, rep(1, 1), rep(1, 300), 0, False, False, 200, wcopies=4)
    run_case[DType.bfloat16, 32, 128, 1, 128, 40, 1, 128, 128](
        ctx, String("N=4096 K=2048 T=1"), 2048, rep(1, 1), rep(1, 300), 0, False, False, 200, wcopies=4)
    run_case[DType.bfloat16, 16, 128, 1, 128, 40, 1, 128, 128](
        ctx, String("N=2048 K=2048 T=8"), 2048, rep(8, 1), rep(8, 300), 0, False, False, 200, wcopies=4)
    run_case[DType.bfloat16, 32, 128, 1, 128, 40, 1, 128, 128](
        ctx, String("N=4096 K=2048 T=8"), 2048, rep(8, 1), rep(8, 300), 0, False, False, 200, wcopies=4)
    comptime for kk in range(2):
        comptime K = 4096 * (kk + 1)
        run_case[DType.bfloat16, 8, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=1024 K=", K, " T=1"), K, rep(1, 1), rep(1, 300), 0, False, False, 200, wcopies=4)
        run_case[DType.bfloat16, 8, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=1024 K=", K, " T=16"), K, rep(4, 4), rep(4, 300), 0, False, False, 200, wcopies=4)
        run_case[DType.bfloat16, 8, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=1024 K=", K, " T=64"), K, rep(4, 16), rep(4, 300), 0, False, False, 200, wcopies=4)
        run_case[DType.bfloat16, 64, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=8192 K=", K, " T=1"), K, rep(1, 1), rep(1, 300), 0, False, False, 100, wcopies=4)
        run_case[DType.bfloat16, 64, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=8192 K=", K, " T=16"), K, rep(4, 4), rep(4, 300), 0, False, False, 100, wcopies=4)
        run_case[DType.bfloat16, 64, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=8192 K=", K, " T=64"), K, rep(4, 16), rep(4, 300), 0, False, False, 100, wcopies=4)
        run_case[DType.bfloat16, 64, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=8192 K=", K, " T=128"), K, rep(4, 32), rep(4, 300), 0, False, False, 100, wcopies=4)
        run_case[DType.bfloat16, 64, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=8192 K=", K, " T=256"), K, rep(4, 64), rep(4, 300), 0, False, False, 50, wcopies=4)
        run_case[DType.bfloat16, 8, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=1024 K=", K, " T=256"), K, rep(4, 64), rep(4, 300), 0, False, False, 50, wcopies=4)

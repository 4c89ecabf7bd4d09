"""Prefill timing of the FP8 K-cache op's wgmma path on the issue-5 shapes (no checks: the
harness tests/mojo/k_cache_gpu_harness.mojo checks the same kernels).

    scripts/build-gpu-bin benchmarks/mojo/k_cache_prefill_bench.mojo
"""

from max.gpu.host import DeviceContext

from k_cache_gpu_harness import rep, run_case


def main() raises:
    var ctx = DeviceContext()
    # N = 8 x 128 (K cache of 8 heads), K = 4096 / 8192
    comptime for kk in range(2):
        comptime K = 4096 * (kk + 1)
        run_case[DType.bfloat16, 8, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=1024 K=", K, " T=1024"), K, rep(1, 1024), rep(1, 0), 0, False, False, 50)
        run_case[DType.bfloat16, 8, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=1024 K=", K, " T=4096"), K, rep(4, 1024), rep(4, 0), 0, False, False, 20)
    # N = 64 x 128 (fused-QKV-sized), K = 8192
    run_case[DType.bfloat16, 64, 128, 1, 128, 40, 1, 128, 128](
        ctx, "N=8192 K=8192 T=1024", 8192, rep(1, 1024), rep(1, 0), 0, False, False, 20)
    run_case[DType.bfloat16, 64, 128, 1, 128, 40, 1, 128, 128](
        ctx, "N=8192 K=8192 T=4096", 8192, rep(4, 1024), rep(4, 0), 0, False, False, 10)

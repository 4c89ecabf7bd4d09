"""One K-cache projection case for profilers: N = 8192 (argv[1] == "8192") or 1024, K = 8192,
T = 64 tokens in 4 sequences, bf16 cache, granularity (1, 128, 128); the op's kernel runs 3
warm-up times, then twice more (ncu: `-k regex:k_cache_matmul --launch-skip 3 --launch-count 1`).

    ../shared/gpu/bundle-bin -I . -I tests/mojo benchmarks/mojo/k_cache_one.mojo
"""

from std.sys import argv
from max.gpu.host import DeviceContext

from k_cache_gpu_harness import rep, run_case


def main() raises:
    var ctx = DeviceContext()
    var args = argv()
    if len(args) > 1 and String(args[1]) == "8192":
        run_case[DType.bfloat16, 64, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=8192 K=8192 T=64"), 8192, rep(4, 16), rep(4, 300), 0, False, False, 1)
    else:
        run_case[DType.bfloat16, 8, 128, 1, 128, 40, 1, 128, 128](
            ctx, String("N=1024 K=8192 T=64"), 8192, rep(4, 16), rep(4, 300), 0, False, False, 1)

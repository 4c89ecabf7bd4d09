# PTX probe for scripts/check_ptx.py (check k_cache_sm90): one instantiation of the K-cache
# harness's case runner (bf16 cache, 128-wide blocks, the op's MAX entry point with the GPU
# dispatch), which instantiates every GPU kernel the dispatch can pick for it (wgmma + TMA,
# swap-AB wgmma decode, mma.sync, SIMT), without the harness's two dozen other instantiations
# (tests/mojo/k_cache_gpu_harness.mojo, which scripts/gpu-check builds and runs on a GPU).
# Only built (`mojo build --emit asm`), never run.
from max.gpu.host import DeviceContext

from k_cache_gpu_harness import rep, run_case


def main() raises:
    var ctx = DeviceContext()
    run_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "probe", 4096, rep(8, 1), rep(8, 0), 0, False, True, 0)

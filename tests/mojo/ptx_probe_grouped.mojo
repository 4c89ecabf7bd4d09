# PTX probe for scripts/check_ptx.py (checks grouped_sm90, grouped_sm100): the grouped
# harness's case runner for the launcher's own path only (no forced Ampere / portable
# instantiations), bf16 plain, with SwiGLU + row scale and with row scale on settled routing
# (the early-routing kernels), fp16 plain. On sm_90a that builds
# the SM90 kernel's decode, mid and prefill tiles; on sm_100a the SM100 kernel with both
# cta_group values. The full harness (tests/mojo/grouped_gpu_harness.mojo, which
# scripts/build-gpu-bin builds and runs on a GPU) instantiates every path of every dtype twice
# as many times. Only built (`mojo build --emit asm`), never run.
from max.gpu.host import DeviceContext

from grouped_gpu_harness import run_case


def main() raises:
    var ctx = DeviceContext()
    run_case[DType.bfloat16, 0, 0, False, False](ctx, "probe", 40, 256, 200, 6,
        [0, 5, 5, 6, 20, 33, 40], [3, 1, 0, -1, 5, 2], 5)
    run_case[DType.bfloat16, 0, 0, True, True](ctx, "probe_swiglu_scale", 20, 136, 256, 4,
        [0, 3, 3, 10, 20], [1, 0, 3, 2], 4)
    run_case[DType.bfloat16, 0, 0, False, True, 0, True](ctx, "probe_scale_settled", 20, 136, 256, 4,
        [0, 3, 3, 10, 20], [1, 0, 3, 2], 4)
    run_case[DType.float16, 0, 0, False, False](ctx, "probe_fp16", 40, 256, 200, 6,
        [0, 5, 5, 6, 20, 33, 40], [3, 1, 0, -1, 5, 2], 5)

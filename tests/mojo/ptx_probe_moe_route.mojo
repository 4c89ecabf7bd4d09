# PTX probe for scripts/check_ptx.py (check moe_route_sm90): one instantiation (bf16) of the
# router harness's case runner, which launches every GPU kernel of the router, the grouping and
# the combine (their instructions do not depend on the dtype), without the harness's fp16
# instantiation (tests/mojo/moe_route_gpu_harness.mojo, which scripts/gpu-session.sh builds and
# runs on a GPU). Only built (`mojo build --emit asm`), never run.
from max.gpu.host import DeviceContext

from moe_route_gpu_harness import run_case


def main() raises:
    var ctx = DeviceContext()
    _ = run_case[DType.bfloat16](ctx, 1, 64, 5, 2, 0)

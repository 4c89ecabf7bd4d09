"""The H200 launch plan of the int4 op (`multistage_gemm_q_plan`), computed on the host CPU.

`int4_gpu_plan(m, n, k)` returns the text the GPU dispatch would print for that problem, e.g.
"int4_gemm_mma BMxBNxBK=8x128x128 WMxWN=8x64 stages=4 warp_k=2 split_k=4 pipe=warp smem=108544"
or "int4_gemm_wgmma ... split_k=1 smem=200832". It runs the dispatch's own Mojo function in a
tiny CPU graph (`_plan_op`, compiled once per (group_size, has_zeros) and process), so
benchmarks can record the config of every row and tests can check the plan without a GPU.
"""

from __future__ import annotations

from ._plan_op import plan_text
from .contracts import int4_padded
from .contracts._rules import BOOL, INT, check_types

OP_NAME = "multistage_gemm_q_plan"
PLAN_BYTES = 256


def int4_gpu_plan(m: int, n: int, k: int, group_size: int = 128, has_zeros: bool = False) -> str:
    """The kernel, tile, stages, warp-k partitions and split-K `int4_matmul` uses on an H200.

    m: tokens (rows of x); n, k: the layer's logical out/in features (padded as the packed
    layout pads them); group_size: 32, 64, 128 or -1; has_zeros: asymmetric weights.
    """
    check_types(
        "int4_gpu_plan",
        {"m": m, "n": n, "k": k, "group_size": group_size, "has_zeros": has_zeros},
        {"m": INT, "n": INT, "k": INT, "group_size": INT, "has_zeros": BOOL},
    )
    if min(m, n, k) <= 0:
        raise ValueError(f"int4_gpu_plan: m, n, k must be positive, got {(m, n, k)}")
    _, kp = int4_padded(n, k)
    return plan_text(OP_NAME, [m, n, kp], PLAN_BYTES,
                     {"group_size": group_size, "has_zeros": has_zeros})

"""The H200 launch plan of the int4 op (`multistage_gemm_q_plan`), computed on the host CPU.

`int4_gpu_plan(m, n, k)` returns the text the GPU dispatch would print for that problem, e.g.
"int4_gemm_mma BMxBNxBK=8x128x128 WMxWN=8x64 stages=4 warp_k=2 split_k=4 pipe=warp smem=108544"
or "int4_gemm_wgmma ... split_k=1 smem=200832". It runs the dispatch's own Mojo function in a
tiny CPU graph (compiled once per (group_size, has_zeros) and process), so benchmarks can record
the config of every row and tests can check the plan without a GPU.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .contracts import int4_padded

OP_NAME = "multistage_gemm_q_plan"
PLAN_BYTES = 256


@cache
def _plan_model(group_size: int, has_zeros: bool) -> Any:
    from max.driver import CPU
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    from ._extension import kernels_package

    cpu = DeviceRef.CPU()
    with Graph(f"int4_plan_{group_size}_{int(has_zeros)}",
               input_types=[TensorType(DType.int64, [3], cpu)],
               custom_extensions=[kernels_package()]) as graph:
        plan = ops.custom(
            OP_NAME, cpu, [graph.inputs[0].tensor],
            [TensorType(DType.uint8, [PLAN_BYTES], cpu)],
            parameters={"group_size": group_size, "has_zeros": has_zeros},
        )[0].tensor
        graph.output(plan)
    return InferenceSession(devices=[CPU()]).load(graph)


def int4_gpu_plan(m: int, n: int, k: int, group_size: int = 128, has_zeros: bool = False) -> str:
    """The kernel, tile, stages, warp-k partitions and split-K `int4_matmul` uses on an H200.

    m: tokens (rows of x); n, k: the layer's logical out/in features (padded as the packed
    layout pads them); group_size: 32, 64, 128 or -1; has_zeros: asymmetric weights.
    """
    from max.driver import Buffer

    if min(m, n, k) <= 0:
        raise ValueError(f"int4_gpu_plan: m, n, k must be positive, got {(m, n, k)}")
    _, kp = int4_padded(n, k)
    sizes = Buffer.from_numpy(np.array([m, n, kp], dtype=np.int64))
    raw = _plan_model(group_size, has_zeros).execute(sizes)[0].to_numpy()
    return bytes(raw).split(b"\0", 1)[0].decode("ascii")

"""The H200 launch plan of the FP8 K/V-cache op (`k_matmul_ragged_paged_scale_plan`), on the CPU.

`k_cache_gpu_plan(t, n, k)` returns the text naming the kernel and CTA tile the GPU dispatch of
`k_matmul_ragged_paged_scale` (and its V twin) launches for that call, e.g. "wgmma 128x128",
"wgmma 64x64", "mma.sync MT=1 NB=2 U=2 late", "mma.sync MT=2 NB=2 U=2", "simt" or "none (T=0)".
It runs the dispatch's own Mojo function (`k_cache_gpu_plan` in k_cache_matmul/gpu.mojo) in a
tiny CPU graph (compiled once per granularity and process), so benchmarks can record the config
of every row and tests can check the plan without a GPU.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

OP_NAME = "k_matmul_ragged_paged_scale_plan"
PLAN_BYTES = 64


@cache
def _plan_model(granularity: tuple[int, int, int]) -> Any:
    from max.driver import CPU
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    from ._extension import kernels_package

    gm, gn, gk = granularity
    cpu = DeviceRef.CPU()
    with Graph(f"k_cache_plan_{gm}_{gn}_{gk}",
               input_types=[TensorType(DType.int64, [5], cpu)],
               custom_extensions=[kernels_package()]) as graph:
        plan = ops.custom(
            OP_NAME, cpu, [graph.inputs[0].tensor],
            [TensorType(DType.uint8, [PLAN_BYTES], cpu)],
            parameters={"m_scale_granularity": gm, "n_scale_granularity": gn,
                        "k_scale_granularity": gk},
        )[0].tensor
        graph.output(plan)
    return InferenceSession(devices=[CPU()]).load(graph)


def k_cache_gpu_plan(
    t: int,
    n: int,
    k: int,
    granularity: tuple[int, int, int] = (1, 128, 128),
    a_stride: int | None = None,
    w_stride: int | None = None,
) -> str:
    """The kernel and CTA tile `k_matmul_ragged_paged_scale` launches on an H200 for one call.

    t: tokens (rows of hidden_state [T, K], >= 0); n: weight rows (weight [N, K], N = n_kv_heads
    · head_dim, >= 0); k: features (> 0); granularity: scales_granularity_mnk (gm, gn, gk),
    positive ints; a_stride / w_stride: row strides of hidden_state / weight in elements
    (default k: dense rows). Raises ValueError for a negative size or stride, k <= 0 or a
    non-positive granularity.
    """
    from max.driver import Buffer

    a_stride = k if a_stride is None else a_stride
    w_stride = k if w_stride is None else w_stride
    if min(t, n, a_stride, w_stride) < 0 or k <= 0:
        raise ValueError(
            "k_cache_gpu_plan: need t, n, a_stride, w_stride >= 0 and k > 0, got "
            f"t={t}, n={n}, k={k}, a_stride={a_stride}, w_stride={w_stride}"
        )
    if len(granularity) != 3 or min(granularity) <= 0:
        raise ValueError(
            f"k_cache_gpu_plan: granularity must be 3 positive ints, got {granularity}"
        )
    gran = (int(granularity[0]), int(granularity[1]), int(granularity[2]))
    sizes = Buffer.from_numpy(np.array([t, n, k, a_stride, w_stride], dtype=np.int64))
    raw = _plan_model(gran).execute(sizes)[0].to_numpy()
    return bytes(raw).split(b"\0", 1)[0].decode("ascii")

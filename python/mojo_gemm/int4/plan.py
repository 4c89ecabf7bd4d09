"""The launch plan of the int4 op (`multistage_gemm_q_plan`) on a GPU target, computed on the host.

`int4_gpu_plan(m, n, k)` returns the text the GPU dispatch would print for that problem on an
H200, e.g. "int4_gemm_mma BMxBNxBK=8x128x128 WMxWN=8x64 stages=4 warp_k=2 split_k=4 pipe=warp
smem=108544" or "int4_gemm_wgmma ... split_k=1 smem=200832"; `arch="sm_89"` gives the Ampere
path's mma.sync launch (split_k=1, the target's shared memory), `arch="gfx950"` the portable
kernel's ("int4_gemm_portable ..."). It runs the dispatch's own Mojo function in a
tiny CPU graph (`core.plan_op`, compiled once per (group_size, has_zeros) and process), so
benchmarks can record the config of every row and tests can check the plan without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..core.plan_op import PlanBatch, plan_text
from ..core.rules import BOOL, INT, check_types
from ..core.targets import check_plan_arch
from .contract import int4_padded

OP_NAME = "multistage_gemm_q_plan"
PLAN_BYTES = 256


def int4_gpu_plan(m: int, n: int, k: int, group_size: int = 128, has_zeros: bool = False,
                  arch: str = "sm_90a", force: str | None = None) -> str:
    """The kernel, tile, stages, warp-k partitions and split-K `int4_matmul` uses on GPU `arch`
    (default the H200's sm_90a).

    m: tokens (rows of x); n, k: the layer's logical out/in features (padded as the packed
    layout pads them); group_size: 32, 64, 128 or -1; has_zeros: asymmetric weights; arch: a
    GPU target ("sm_80", "sm_89", "sm_90a", "sm_100a", "gfx950", ...); force: "ampere",
    "portable", "auto" or None (= MOJO_GEMM_FORCE_PATH), as the graph op would be forced.
    Raises ValueError for a non-positive size or a target no path supports.
    """
    check_types(
        "int4_gpu_plan",
        {"m": m, "n": n, "k": k, "group_size": group_size, "has_zeros": has_zeros},
        {"m": INT, "n": INT, "k": INT, "group_size": INT, "has_zeros": BOOL},
    )
    if min(m, n, k) <= 0:
        raise ValueError(f"int4_gpu_plan: m, n, k must be positive, got {(m, n, k)}")
    parameters = _parameters(group_size, has_zeros, arch, force)
    _, kp = int4_padded(n, k)
    return plan_text(OP_NAME, [m, n, kp], PLAN_BYTES, parameters)


def _parameters(group_size: int, has_zeros: bool, arch: str,
                force: str | None) -> dict[str, int | bool | str]:
    forced = check_plan_arch("multistage_gemm_q", arch, force)
    return {"group_size": group_size, "has_zeros": has_zeros, "arch": arch,
            "force_path": forced}


def int4_plan_batch(variants: Iterable[Mapping[str, Any]]) -> PlanBatch:
    """The plan op once per variant, for `core.plan_op.plan_graph`: once the model of
    `plan_graph(int4_plan_batch(variants), ...)` is adopted (one CPU graph, other ops' batches
    may share it) the `int4_gpu_plan` calls with these variants need no compile of their own.

    variants: keyword arguments of `int4_gpu_plan` other than m, n, k (group_size, has_zeros,
    arch, force; missing ones take its defaults), e.g. [{}, {"arch": "sm_89"}].
    """
    defaults: dict[str, Any] = {"group_size": 128, "has_zeros": False, "arch": "sm_90a",
                                "force": None}
    return PlanBatch(OP_NAME, 3, PLAN_BYTES,
                     tuple(_parameters(**{**defaults, **v}) for v in variants), (1, 4096, 4096))

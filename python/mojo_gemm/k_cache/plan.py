"""The launch plan of the FP8 K/V-cache op (`k_matmul_ragged_paged_scale_plan`) on a GPU target,
computed on the CPU.

`k_cache_gpu_plan(t, n, k)` returns the text naming the kernel and CTA tile the GPU dispatch of
`k_matmul_ragged_paged_scale` (and its V twin) launches for that call, e.g. "wgmma 128x128",
"wgmma 64x64", "mma.sync MT=1 NB=2 U=2 late", "mma.sync MT=2 NB=2 U=2 rot", "simt" or
"none (T=0)" (default: the H200, sm_90a; `arch="sm_80"` or an AMD target gives "simt" for
every call, `arch="sm_89"` the mma.sync and SIMT kernels).
It runs the dispatch's own Mojo function (`k_cache_gpu_plan` in k_cache_matmul/dispatch.mojo) in a
tiny CPU graph (`core.plan_op`, compiled once per granularity and process), so benchmarks can
record the config of every row and tests can check the plan without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..core.plan_op import PlanBatch, plan_text
from ..core.rules import INT, INT_SEQ, check_types, optional
from ..core.targets import check_plan_arch

OP_NAME = "k_matmul_ragged_paged_scale_plan"
PLAN_BYTES = 64


def k_cache_gpu_plan(
    t: int,
    n: int,
    k: int,
    granularity: tuple[int, int, int] = (1, 128, 128),
    a_stride: int | None = None,
    w_stride: int | None = None,
    arch: str = "sm_90a",
    force: str | None = None,
) -> str:
    """The kernel and CTA tile `k_matmul_ragged_paged_scale` launches on GPU `arch` (default
    the H200's sm_90a) for one call.

    t: tokens (rows of hidden_state [T, K], >= 0); n: weight rows (weight [N, K], N = n_kv_heads
    · head_dim, >= 0); k: features (> 0); granularity: scales_granularity_mnk (gm, gn, gk),
    positive ints; a_stride / w_stride: row strides of hidden_state / weight in elements
    (default k: dense rows); arch: a GPU target ("sm_80", "sm_89", "sm_90a", "sm_100a",
    "gfx950", ...); force: "ampere", "portable", "auto" or None (= MOJO_GEMM_FORCE_PATH).
    Raises ValueError for a negative size or stride, k <= 0, a non-positive granularity or a
    target no path supports.
    """
    check_types(
        "k_cache_gpu_plan",
        {"t": t, "n": n, "k": k, "granularity": granularity, "a_stride": a_stride,
         "w_stride": w_stride},
        {"t": INT, "n": INT, "k": INT, "granularity": INT_SEQ, "a_stride": optional(INT),
         "w_stride": optional(INT)},
    )
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
    return plan_text(OP_NAME, [t, n, k, a_stride, w_stride], PLAN_BYTES,
                     _parameters(granularity, arch, force))


def _parameters(granularity: tuple[int, int, int], arch: str,
                force: str | None) -> dict[str, int | bool | str]:
    forced = check_plan_arch("k_matmul_ragged_paged_scale", arch, force)
    gm, gn, gk = (int(g) for g in granularity)
    return {"m_scale_granularity": gm, "n_scale_granularity": gn, "k_scale_granularity": gk,
            "arch": arch, "force_path": forced}


def k_cache_plan_batch(variants: Iterable[Mapping[str, Any]]) -> PlanBatch:
    """The plan op once per variant, for `core.plan_op.plan_graph`: once the model of
    `plan_graph(k_cache_plan_batch(variants), ...)` is adopted (one CPU graph, other ops' batches
    may share it) the `k_cache_gpu_plan` calls with these variants need no compile of their own.

    variants: keyword arguments of `k_cache_gpu_plan` among granularity, arch and force
    (missing ones take its defaults), e.g. [{}, {"granularity": (1, 128, 64)}].
    """
    defaults: dict[str, Any] = {"granularity": (1, 128, 128), "arch": "sm_90a", "force": None}
    return PlanBatch(OP_NAME, 5, PLAN_BYTES,
                     tuple(_parameters(**{**defaults, **v}) for v in variants),
                     (1, 1024, 4096, 4096, 4096))


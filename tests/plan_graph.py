"""The plan-op variants of tests/test_int4_plan.py and tests/test_k_cache_plan.py, compiled in
ONE CPU graph by whichever of the two runs first (one compile's fixed cost instead of two)."""

from __future__ import annotations

from mojo_gemm.core.plan_op import compile_plans
from mojo_gemm.int4.plan import int4_plan_batch
from mojo_gemm.k_cache.plan import k_cache_plan_batch

INT4_VARIANTS = [{}, {"has_zeros": True}, {"arch": "sm_80"}, {"arch": "sm_89"},
                 {"arch": "sm_100a"}, {"arch": "gfx950"}, {"force": "ampere"}]
K_CACHE_VARIANTS = (
    [{"granularity": g} for g in [(1, 128, 128), (1, 128, 64), (1, 128, 32), (1, 128, 96),
                                  (1, 1, 1)]]
    + [{"arch": a} for a in ("sm_80", "sm_89", "gfx950", "sm_100a")]
    + [{"force": f} for f in ("portable", "ampere")]
)


def compile_plan_graph() -> None:
    """Compiles every variant of both plan ops (once per process; later calls do nothing)."""
    compile_plans(int4_plan_batch(INT4_VARIANTS), k_cache_plan_batch(K_CACHE_VARIANTS))

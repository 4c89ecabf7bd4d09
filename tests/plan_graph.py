"""The plan-op variants of tests/test_int4_plan.py and tests/test_k_cache_plan.py in ONE CPU
graph of the suite's pool (tests/graph_pool.py), adopted by whichever of the two runs first."""

from __future__ import annotations

import graph_pool
from max.graph import Module

from mojo_gemm.core.plan_op import PlanGraph, plan_graph
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
_BUILT: list[PlanGraph] = []


def _pooled(module: Module) -> graph_pool.Built:
    built = plan_graph(int4_plan_batch(INT4_VARIANTS), k_cache_plan_batch(K_CACHE_VARIANTS),
                       module=module)
    assert built is not None, "plan variants adopted before the pool was built"
    _BUILT.append(built)
    return built.graph, {}


graph_pool.register("plans", _pooled)


def compile_plan_graph() -> None:
    """Every variant of both plan ops ready to run (once per process; later calls do nothing)."""
    model = graph_pool.model("plans")
    _BUILT[-1].adopt(model)

"""The int4 op's H200 launch plan, computed on the CPU from the dispatch's own Mojo code.

Checks the choices the benchmark records: decode sizes use the mma.sync kernels with warp-k
partitions (> 1, reduced in shared memory) and split-K; M >= 33 uses the wgmma kernel; and
the shared-memory budget of every plan fits the H200 (227 KB per CTA).
"""

from __future__ import annotations

import re

import pytest

from mojo_gemm.int4_plan import int4_gpu_plan

SMEM_LIMIT = 227 * 1024


def field(plan: str, name: str) -> int:
    match = re.search(rf"\b{name}=(\d+)", plan)
    assert match, f"no {name} in {plan!r}"
    return int(match.group(1))


@pytest.mark.parametrize(("m", "n", "k"), [(1, 4096, 4096), (1, 6144, 4096), (16, 4096, 14336)])
def test_decode_plan_uses_warp_k_partitions(m: int, n: int, k: int) -> None:
    plan = int4_gpu_plan(m, n, k)
    assert plan.startswith("int4_gemm_mma "), plan
    assert field(plan, "warp_k") > 1, plan
    assert field(plan, "stages") >= 3, plan
    assert 0 < field(plan, "smem") <= SMEM_LIMIT, plan


@pytest.mark.parametrize(("m", "n", "k"), [(64, 28672, 4096), (4096, 4096, 4096), (300, 200, 1000)])
def test_prefill_plan_uses_wgmma(m: int, n: int, k: int) -> None:
    plan = int4_gpu_plan(m, n, k)
    assert plan.startswith("int4_gemm_wgmma "), plan
    assert field(plan, "split_k") >= 1, plan
    assert 0 < field(plan, "smem") <= SMEM_LIMIT, plan


def test_plan_depends_on_group_size_and_zeros() -> None:
    # per-channel scales and zero points change the shared-memory rows the plan budgets
    sym = int4_gpu_plan(1, 4096, 4096, group_size=128)
    asym = int4_gpu_plan(1, 4096, 4096, group_size=128, has_zeros=True)
    assert field(asym, "smem") > field(sym, "smem"), (sym, asym)


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match="m, n, k must be positive"):
        int4_gpu_plan(0, 4096, 4096)

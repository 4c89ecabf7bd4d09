"""The int4 op's H200 launch plan, computed on the CPU from the dispatch's own Mojo code.

Checks the choices the benchmark records: decode sizes use the mma.sync kernels with warp-k
partitions (> 1, reduced in shared memory) and split-K; M >= 17 uses the wgmma kernel (unless the
table keeps 17-64 tokens on mma.sync); and
the shared-memory budget of every plan fits the H200 (227 KB per CTA); at M = 16, 32, 64 and 128
the eight Llama-3 layers get exactly the launches the generated table and the rules give (a
change of either shows here).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from mojo_gemm.int4.plan import int4_gpu_plan
from plan_graph import compile_plan_graph

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import int4_sweep_table as tbl

SMEM_LIMIT = 227 * 1024


@pytest.fixture(scope="module", autouse=True)
def _one_plan_graph() -> None:
    compile_plan_graph()  # every variant used below (and test_k_cache_plan's) in one graph


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
    assert field(asym, "smem") != field(sym, "smem"), (sym, asym)


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match="m, n, k must be positive"):
        int4_gpu_plan(0, 4096, 4096)


LLAMA3 = {
    "8B.qkv": (6144, 4096),
    "8B.o": (4096, 4096),
    "8B.gate_up": (28672, 4096),
    "8B.down": (4096, 14336),
    "70B.qkv": (10240, 8192),
    "70B.o": (8192, 8192),
    "70B.gate_up": (57344, 8192),
    "70B.down": (8192, 28672),
}
MMA = "int4_gemm_mma BMxBNxBK={} WMxWN=16x64 stages={} warp_k={} split_k={{}} pipe=warp smem={}"
K8 = MMA.format("16x64x64", 4, 8, 155648).replace("pipe=warp", "pipe=warp dequant_first")
M16 = MMA.format("16x128x128", 4, 2, 143360)
WG = "int4_gemm_wgmma wgmma BMxBNxBK={} fpw={} wg={} kg={} stages={} split_k={{}}{} smem={}"
WG64N = WG.format("64x128x64", 2, 1, 4, 8, " ctas=2", 100480)
WG64W = WG.format("64x512x64", 4, 2, 2, 7, "", 179312)
WG128 = WG.format("128x256x64", 2, 2, 4, 8, "", 200832)
WG256 = WG.format("256x128x64", 1, 2, 4, 6, "", 223328)
SK = "int4_gemm_wgmma wgmma BMxBNxBK={} fpw=2 wg=2 kg=4 stages=8 split_k=1 streamk ctas=132 smem={}"
SK64 = SK.format("64x256x64", 135296)
SK128 = SK.format("128x256x64", 200832)
GS = "int4_gemm_wgmma wgmma BMxBNxBK={} fpw=2 wg=2 kg=4 stages=8 split_k={} gsplit smem={}"


@pytest.mark.parametrize(
    ("layer", "m", "expected"),
    [
        # M = 16: tuned_choice (mojo_kernels/int4_gemm/tuning_sm90.mojo, generated from the
        # sweep): CFG_M16_K8 at the rule's split below 256 bands (split 2 where twice the bands
        # still fit one wave and each warp keeps >= 512 of K: 8B.down), CFG_M16 split 1 above
        ("8B.qkv", 16, K8.format(1)),
        ("8B.o", 16, K8.format(1)),
        ("8B.gate_up", 16, M16.format(1)),
        ("8B.down", 16, K8.format(2)),
        ("70B.qkv", 16, K8.format(1)),
        ("70B.o", 16, K8.format(1)),
        ("70B.gate_up", 16, M16.format(1)),
        ("70B.down", 16, K8.format(1)),
        # M = 32 and 64: no table entries; dispatch.small_m_tile_rule: the 2-CTA-per-SM
        # 64 x 128 tile at the split that fills the SMs, the 64 x 512 tile on the widest layer,
        # a split without a cluster where a tile has many K steps and the cluster splits
        # cannot fill the SMs
        ("8B.qkv", 32, WG64N.format(4)),
        ("8B.o", 32, WG64N.format(6)),
        ("8B.gate_up", 32, WG64N.format(1)),
        ("8B.down", 32, WG64N.format(6)),
        ("70B.qkv", 32, GS.format("64x256x64", 3, 135296)),
        ("70B.o", 32, WG64N.format(3)),
        ("70B.gate_up", 32, WG64W.format(1)),
        ("70B.down", 32, GS.format("64x256x64", 4, 135296)),
        ("8B.qkv", 64, WG64N.format(4)),
        ("8B.o", 64, WG64N.format(6)),
        ("8B.gate_up", 64, WG64N.format(1)),
        ("8B.down", 64, WG64N.format(6)),
        ("70B.qkv", 64, GS.format("64x256x64", 3, 135296)),
        ("70B.o", 64, WG64N.format(3)),
        ("70B.gate_up", 64, WG64W.format(1)),
        ("70B.down", 64, GS.format("64x256x64", 4, 135296)),
        # M = 128: no table entries (the rule does as well held out): 128 x 256, the one-wave
        # split with the fewest stages per CTA, or a split without a cluster where the split
        # clusters cannot fill the SMs (8B.down, 70B o / down), stream-K where the tiles need
        # a second wave (70B.gate_up: 224 tiles) or split unevenly (70B.qkv: 40 tiles)
        ("8B.qkv", 128, WG128.format(4)),
        ("8B.o", 128, WG128.format(6)),
        ("8B.gate_up", 128, WG128.format(1)),
        ("8B.down", 128, GS.format("128x256x64", 8, 200832)),
        ("70B.qkv", 128, SK128),
        ("70B.o", 128, GS.format("128x256x64", 4, 200832)),
        ("70B.gate_up", 128, SK128),
        ("70B.down", 128, GS.format("128x256x64", 4, 200832)),
    ],
)
def test_llama3_small_m_plans_follow_the_table(layer: str, m: int, expected: str) -> None:
    n, k = LLAMA3[layer]
    assert int4_gpu_plan(m, n, k) == expected


@pytest.mark.parametrize("n", [3072, 4096, 5120, 9216, 16384, 16896, 17408, 28672, 57344])
@pytest.mark.parametrize("k", [1024, 4096, 14336])
def test_one_token_plan_is_the_rule_the_sweep_table_mirrors(n: int, k: int) -> None:
    # M <= 8 has no table entries: the plan is dispatch.small_m_rule + choose_split_k, which
    # scripts/int4_sweep_table.small_m_rule mirrors to score the table against it
    item = tbl.Item("x", "x", n, k, 1)
    cfg, split = tbl.small_m_rule(item)
    tile = {"CFG_M8_K8": "8x64x128", "CFG_M8": "8x128x128"}[cfg]
    plan = int4_gpu_plan(1, n, k)
    assert f"BMxBNxBK={tile} " in plan and field(plan, "split_k") == split, (cfg, split, plan)


@pytest.mark.parametrize(
    ("layer", "m", "expected"),
    [
        # the cost model (dispatch.wgmma_tile_rule): 8B.o's 128 tiles of 256 x 128 are one
        # wave; 8B.qkv's 192 run one wave split 1 and the other 60 tiles split 2 (the
        # data-parallel + tail schedule); 70B.gate_up's 1792 tiles fill 13.6 waves split 1
        ("8B.o", 1024, WG256.format(1)),
        ("8B.qkv", 1024, WG256.format(2) + " dp_tiles=132"),
        ("70B.gate_up", 1024, WG256.format(1)),
        ("8B.o", 4096, WG256.format(1)),
    ],
)
def test_large_m_plans_follow_the_cost_model(layer: str, m: int, expected: str) -> None:
    n, k = LLAMA3[layer]
    assert int4_gpu_plan(m, n, k) == expected


# ---- other targets: the path each GPU gets (mojo_kernels/common/target.mojo) --------------
SMEM_AMPERE = {"sm_80": 163 * 1024, "sm_89": 99 * 1024}
SHAPES = [(1, 4096, 4096), (16, 4096, 14336), (64, 28672, 4096), (4096, 4096, 4096)]


@pytest.mark.parametrize("arch", sorted(SMEM_AMPERE))
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_ampere_plan_is_mma_sync_without_clusters(arch: str, m: int, n: int, k: int) -> None:
    # no wgmma at any M, split_k 1 (no thread-block clusters), the target's shared memory
    plan = int4_gpu_plan(m, n, k, arch=arch)
    assert plan.startswith("int4_gemm_mma "), plan
    assert field(plan, "split_k") == 1, plan
    assert field(plan, "stages") >= 3, plan
    assert 0 < field(plan, "smem") <= SMEM_AMPERE[arch], plan


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_blackwell_plan_is_mma_sync_with_clusters(m: int, n: int, k: int) -> None:
    plan = int4_gpu_plan(m, n, k, arch="sm_100a")
    assert plan.startswith("int4_gemm_mma "), plan
    assert 0 < field(plan, "smem") <= SMEM_LIMIT, plan
    if m == 1:  # one token: K spread over CTAs of a cluster or over the warps of a CTA
        assert field(plan, "split_k") * field(plan, "warp_k") >= 8, plan


def test_amd_plan_is_portable() -> None:
    assert int4_gpu_plan(1, 4096, 4096, arch="gfx950") == (
        "int4_gemm_portable BMxBNxBK=32x64x32 grid=64x1")
    assert int4_gpu_plan(4096, 200, 256, arch="gfx950") == (
        "int4_gemm_portable BMxBNxBK=32x64x32 grid=4x128")


def test_forced_ampere_on_hopper_is_the_sm89_plan() -> None:
    for m, n, k in SHAPES:
        assert int4_gpu_plan(m, n, k, force="ampere") == int4_gpu_plan(m, n, k, arch="sm_89")


def test_unsupported_target_raises() -> None:
    with pytest.raises(ValueError, match="multistage_gemm_q: unsupported GPU target 'sm_75'"):
        int4_gpu_plan(1, 4096, 4096, arch="sm_75")

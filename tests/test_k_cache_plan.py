"""The FP8 K-cache op's H200 launch plan, computed on the CPU from the dispatch's own Mojo code.

Expected strings follow the rules of k_cache_matmul/dispatch.mojo (`k_cache_gpu_plan`:
WGMMA_MIN_TOKENS = 128, LARGE_N = 4096, DECODE_MIN_CTAS = 100, the MMA_* configs),
kernels/wgmma.mojo (`wgmma_large_tiles`: LARGE 128x128 tiles from MIN_CTAS_FOR_LARGE = 120 CTAs,
else SMALL 64x64) and kernels/wgmma_decode.mojo (`decode_config`).
"""

from __future__ import annotations

import pytest

from mojo_gemm import k_cache_gpu_plan
from plan_graph import compile_plan_graph

K = 4096


@pytest.fixture(scope="module", autouse=True)
def _one_plan_graph() -> None:
    compile_plan_graph()  # every variant used below (and test_int4_plan's) in one graph


CASES = [
    # decode: 16-token CTAs of 8 weight rows; from N = LARGE_N 16 rows, rows resolved late
    (1, 1024, "mma.sync MT=1 NB=1 U=4"),
    (16, 1024, "mma.sync MT=1 NB=1 U=4"),
    (1, 4096, "mma.sync MT=1 NB=2 U=2 late"),
    (16, 6336, "mma.sync MT=1 NB=2 U=2 late"),  # 99 CTAs of 64 rows: below DECODE_MIN_CTAS
    # 16 < T <= 128: 32 x 16 CTAs, 64 x 32 from N = LARGE_N
    (64, 1024, "wgmma swap-AB 64x64 s=3 c=2 k=512 P=4"),
    (64, 4096, "mma.sync MT=4 NB=4 U=1"),
    (128, 4096, "mma.sync MT=4 NB=4 U=1"),
    # T <= 128 and ceil(N / 64) >= DECODE_MIN_CTAS = 100: swap-AB wgmma, the smallest token tile
    # holding T, K 256 / 512 / 128 per stage, up to 8 stages as shared memory allows
    (1, 6400, "wgmma swap-AB 64x8 s=8 c=2 k=256"),
    (1, 8192, "wgmma swap-AB 64x8 s=8 c=2 k=256"),
    (9, 8192, "wgmma swap-AB 64x16 s=8 c=2 k=256"),
    (16, 8192, "wgmma swap-AB 64x16 s=8 c=2 k=256"),
    (17, 8192, "wgmma swap-AB 64x32 s=4 c=2 k=512 rot"),
    (64, 8192, "wgmma swap-AB 64x64 s=3 c=2 k=512 rot"),
    (128, 8192, "wgmma swap-AB 64x128 s=8 c=2 rot"),  # accumulators over the drained ring
    # T > 128: wgmma, LARGE when ceil(N/128) * ceil(T/128) >= 120 CTAs; TALL_PERSISTENT
    # (192x128) from ceil(N/128) * ceil(T/192) >= 10 waves x 132 SMs with K >= 4096
    (129, 1024, "wgmma 64x64"),  # 8 x 2 = 16 CTAs
    (256, 1024, "wgmma 64x64"),  # 8 x 2 = 16 CTAs
    (256, 8192, "wgmma 128x128"),  # 64 x 2 = 128 CTAs
    (4096, 1024, "wgmma 128x128"),  # 8 x 32 = 256 CTAs
    (2048, 8192, "wgmma 128x128"),  # 64 x 11 = 704 tall tiles
    (4096, 8192, "wgmma 192x128 s=5 persistent"),  # 64 x 22 = 1408 tall tiles
    (32768, 1024, "wgmma 192x128 s=5 persistent"),  # 8 x 171 = 1368 tall tiles
]


@pytest.mark.parametrize(("t", "n", "expected"), CASES, ids=[f"T{t}-N{n}" for t, n, _ in CASES])
def test_default_granularity(t: int, n: int, expected: str) -> None:
    assert k_cache_gpu_plan(t, n, K) == expected


def test_tall_tiles_need_k_4096() -> None:
    assert k_cache_gpu_plan(4096, 8192, 3072) == "wgmma 128x128"
    assert k_cache_gpu_plan(8192, 8192, 8192) == "wgmma 192x128 s=5 persistent"


def test_nothing_to_launch() -> None:
    assert k_cache_gpu_plan(0, 1024, K) == "none (T=0)"
    assert k_cache_gpu_plan(0, 8192, K, granularity=(1, 128, 64)) == "none (T=0)"
    assert k_cache_gpu_plan(4, 0, K) == "none (N=0)"


def test_gk_64_takes_mma_sync_at_any_t() -> None:
    # gk % 128 != 0: no wgmma; gk % 64 == 0: the mma.sync kernel, (2, 4, 1) above 128 tokens
    g = (1, 128, 64)
    assert k_cache_gpu_plan(1, 1024, K, granularity=g) == "mma.sync MT=1 NB=1 U=4"
    assert k_cache_gpu_plan(1, 8192, K, granularity=g) == "mma.sync MT=1 NB=2 U=2 late"
    assert k_cache_gpu_plan(64, 1024, K, granularity=g) == "mma.sync MT=2 NB=2 U=2 rot"
    assert k_cache_gpu_plan(256, 1024, K, granularity=g) == "mma.sync MT=2 NB=4 U=1"
    assert k_cache_gpu_plan(4096, 8192, K, granularity=g) == "mma.sync MT=2 NB=4 U=1"


@pytest.mark.parametrize("granularity", [(1, 128, 32), (1, 128, 96), (1, 1, 1)])
def test_gk_not_multiple_of_64_takes_simt(granularity: tuple[int, int, int]) -> None:
    assert k_cache_gpu_plan(1, 1024, K, granularity=granularity) == "simt"
    assert k_cache_gpu_plan(4096, 8192, K, granularity=granularity) == "simt"


def test_non_dense_rows_skip_wgmma() -> None:
    # wgmma needs a_stride == w_stride == K; mma.sync needs strides that are multiples of 16
    assert k_cache_gpu_plan(4096, 1024, K, a_stride=K + 16) == "mma.sync MT=2 NB=4 U=1"
    assert k_cache_gpu_plan(4096, 1024, K, w_stride=2 * K) == "mma.sync MT=2 NB=4 U=1"
    assert k_cache_gpu_plan(4096, 1024, K, a_stride=K + 8) == "simt"
    assert k_cache_gpu_plan(1, 1024, K, a_stride=K + 8) == "simt"
    assert k_cache_gpu_plan(1, 1024, K + 8) == "simt"  # K % 16 != 0
    assert k_cache_gpu_plan(1, 8192, K, a_stride=K + 16) == "mma.sync MT=1 NB=2 U=2 late"


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match="k > 0"):
        k_cache_gpu_plan(1, 1024, 0)
    with pytest.raises(ValueError, match="t, n, a_stride, w_stride >= 0"):
        k_cache_gpu_plan(-1, 1024, K)
    with pytest.raises(ValueError, match="granularity"):
        k_cache_gpu_plan(1, 1024, K, granularity=(1, 0, 128))


# ---- other targets: the path each GPU gets (mojo_kernels/common/target.mojo) --------------
TARGET_CASES = [(1, 1024), (64, 1024), (16, 8192), (128, 8192), (4096, 8192)]


@pytest.mark.parametrize(("t", "n"), TARGET_CASES)
def test_ampere_ada_and_amd_take_simt(t: int, n: int) -> None:
    # no FP8 mma.sync on sm_80 / sm_86 (nor on sm_89 with MAX 26.7's PTX version), only
    # vendor-neutral kernels on AMD
    assert k_cache_gpu_plan(t, n, K, arch="sm_80") == "simt"
    assert k_cache_gpu_plan(t, n, K, arch="sm_89") == "simt"
    assert k_cache_gpu_plan(t, n, K, arch="gfx950") == "simt"
    assert k_cache_gpu_plan(t, n, K, force="portable") == "simt"


@pytest.mark.parametrize(("t", "n"), TARGET_CASES)
def test_forced_ampere_and_blackwell_take_mma_sync_never_wgmma(t: int, n: int) -> None:
    plan = k_cache_gpu_plan(t, n, K, force="ampere")
    assert plan.startswith("mma.sync "), plan
    assert k_cache_gpu_plan(t, n, K, arch="sm_100a") == plan


def test_nothing_to_launch_on_every_target() -> None:
    for arch in ("sm_80", "gfx950"):
        assert k_cache_gpu_plan(0, 1024, K, arch=arch) == "none (T=0)"


def test_unsupported_target_raises() -> None:
    with pytest.raises(ValueError, match="k_matmul_ragged_paged_scale: unsupported GPU target"):
        k_cache_gpu_plan(1, 1024, K, arch="gfx1100")

"""The Ampere and portable kernel paths, forced through the dispatch on a GPU that would pick a
faster one (the H200), against float64: the ops' own GPU checks with MOJO_GEMM_FORCE_PATH set.

Ampere: int4 mma.sync without clusters (split_k 1, the sm_89 shared-memory budget), K-cache
mma.sync + SIMT (no wgmma), grouped mma.sync (no TMA / wgmma). Portable: int4's tiled fp32
kernel, the K-cache SIMT kernel, the grouped naive kernel (what AMD GPUs run). The env var
becomes an op parameter when a graph is built, so each test builds its graphs while it is set.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import test_grouped
import test_int4_graph
import test_k_cache

from mojo_gemm.core.targets import FORCE_ENV

PATHS = ["ampere", "portable"]


@pytest.fixture(params=PATHS)
def forced(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Sets MOJO_GEMM_FORCE_PATH for the test; the K-cache test's compiled graph is rebuilt
    under it and dropped afterwards (its builder caches one graph per device kind)."""
    monkeypatch.setenv(FORCE_ENV, request.param)
    test_k_cache.compiled.cache_clear()
    yield request.param
    test_k_cache.compiled.cache_clear()


@pytest.mark.gpu
def test_int4_linear_forced(forced: str) -> None:
    """Int4Linear, every checkpoint case, M in {1, 7, 16, 33, 300}: within 1e-2 of float64."""
    test_int4_graph.run_cases("gpu")


@pytest.mark.gpu
def test_grouped_matmul_forced(forced: str) -> None:
    """Every grouped scenario (planes, SwiGLU + row scale, in place) within 1e-2."""
    test_grouped.run_all("gpu")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", list(test_k_cache.BATCHES))
def test_k_cache_forced(forced: str, batch: str) -> None:
    """K and V projections into bf16 and fp8 caches, every batch, element by element."""
    seed = list(test_k_cache.BATCHES).index(batch)
    test_k_cache.run("gpu", test_k_cache.BATCHES[batch], seed=seed)

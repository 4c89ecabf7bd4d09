"""Every kernel that claims wgmma / TMA / tcgen05 shows it in its PTX (scripts/check_ptx.py).

The sm_90a checks run on the kernels of the sm_90a graph compile (tests/test_gpu_compile.py:
scripts/compile_gpu_graphs.py --ptx-checks captures their PTX and `ptxas -v` reports), the
code users get, at no build of their own. The others (the grouped GEMM for sm_100a with both
cta_group values, which no graph here builds) build their harness with `mojo build
--target-accelerator <arch> --emit asm` (no GPU needed): one background job per check
(`check_ptx.py --only NAME`) on the suite's background lane (tests/background.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from background import Job, run
from subprocess_env import child_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "scripts" / "check_ptx.py")
CHECKS = {"grouped_sm100": 24}
"""The checks of scripts/check_ptx.py that build a harness here, with about how many seconds
each takes cold (the build, plus `ptxas -v` over its kernels where ptxas is on PATH)."""
JOBS = {name: Job((sys.executable, SCRIPT, "--only", name), timeout=900, cwd=str(ROOT),
                  env=tuple(sorted(child_env().items())), seconds=seconds)
        for name, seconds in CHECKS.items()}


def test_every_check_runs() -> None:
    """Every check scripts/check_ptx.py defines runs: on the sm_90a graph compile's kernels
    (tests/test_gpu_compile.py) or as a job below, never both."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_ptx
    finally:
        sys.path.pop(0)
    in_graph = {c.name for c in check_ptx.captured_checks("sm_90a")}
    assert in_graph == {"int4_sm90", "k_cache_sm90", "grouped_sm90", "moe_route_sm90"}
    assert not in_graph & set(CHECKS)
    assert {c.name for c in check_ptx.CHECKS} == in_graph | set(CHECKS)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.background(job)) for n, job in JOBS.items()])
def test_ptx_check_passes(name: str) -> None:
    """scripts/check_ptx.py --only NAME builds the harness and finds every required
    instruction (and no forbidden one)."""
    result = run(JOBS[name])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert f"OK {name}" in result.stdout
    assert "all PTX checks passed" in result.stdout

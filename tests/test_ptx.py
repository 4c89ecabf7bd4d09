"""Every kernel that claims wgmma / TMA / tcgen05 shows it in its PTX (scripts/check_ptx.py).

Builds each harness with `mojo build --target-accelerator <arch> --emit asm` (no GPU needed)
and greps the PTX: the int4 kernels and the FP8 K-cache kernel for sm_90a, the grouped GEMM for
sm_90a and for sm_100a with both cta_group values, the MoE router for sm_90a; where ptxas is
on PATH, no kernel spills more than its check allows (`ptxas -v`). One background
job per check (`check_ptx.py --only NAME`), so the suite's background lane (tests/background.py)
can pack the builds, 15-40 CPU-s each, into the gaps the longer compiles leave.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from background import Job, run
from subprocess_env import child_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "scripts" / "check_ptx.py")
CHECKS = {"int4_sm90": 55, "k_cache_sm90": 28, "grouped_sm90": 20, "grouped_sm100": 24,
          "moe_route_sm90": 20}
"""Every check of scripts/check_ptx.py, with about how many seconds it takes cold (the build,
plus `ptxas -v` over its kernels where ptxas is on PATH)."""
JOBS = {name: Job((sys.executable, SCRIPT, "--only", name), timeout=900, cwd=str(ROOT),
                  env=tuple(sorted(child_env().items())), seconds=seconds)
        for name, seconds in CHECKS.items()}


def test_every_check_has_a_job() -> None:
    """The checks scripts/check_ptx.py defines are exactly the ones run below."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_ptx
    finally:
        sys.path.pop(0)
    assert {c.name for c in check_ptx.CHECKS} == set(CHECKS)


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

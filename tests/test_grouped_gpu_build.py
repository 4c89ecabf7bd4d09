"""GPU builds of `grouped_matmul_sm100_persistent` (slow; no GPU needed except the last test).

- the op's GPU graph compiles for sm_90a and sm_100a through MAX's virtual devices
  (scripts/compile_gpu_graphs.py: compile_grouped, in the children of tests/test_gpu_compile.py);
- the harness's PTX has wgmma / TMA / setmaxnreg on sm_90a and tcgen05 mma / alloc / ld with
  cta_group 1 and 2 on sm_100a (scripts/check_ptx.py);
- on an H200, the standalone harness runs every kernel against the simple GPU kernel.
Each runs in a subprocess: virtual devices are process-wide and must be set before any device
(the graph compile on the suite's background lane, tests/background.py).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_gpu_compile import ONE_GRAPH

from background import run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from check_ptx import MOJO, MOJO_ENV  # noqa: E402  (the compiler that came with max)

HARNESS = ROOT / "tests" / "mojo" / "grouped_gpu_harness.mojo"

# sm_100a: grouped_matmul's graph is compiled by the sm_100a child of tests/test_gpu_compile.py
# (`--one-graph --grouped`: one MAX start-up for both); sm_90a: that file's full sm_90a child
ARCHS = ("sm_100a",)
COMPILE_JOBS = {arch: ONE_GRAPH[arch] for arch in ARCHS}


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch", [pytest.param(a, marks=pytest.mark.background(COMPILE_JOBS[a])) for a in ARCHS])
def test_grouped_graph_compiles(arch: str) -> None:
    """The GPU graph with plain, in-place SwiGLU + row-scale and plane-split instances builds."""
    result = run(COMPILE_JOBS[arch])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert f"compiled grouped_matmul_sm100_persistent for {arch} in " in result.stdout


@pytest.mark.gpu
def test_grouped_harness_on_gpu() -> None:
    """Builds the harness for sm_90a and runs it: every case matches the simple GPU kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "grouped_gpu_harness"
        build = subprocess.run(
            [MOJO, "build", "-I", str(ROOT), "--target-accelerator", "sm_90a", str(HARNESS),
             "-o", str(exe)],
            capture_output=True, text=True, timeout=900, cwd=ROOT, env=MOJO_ENV,
        )
        assert build.returncode == 0, build.stderr[-6000:]
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
        assert "ALL PASS" in run.stdout

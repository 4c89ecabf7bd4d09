"""GPU build and run of `grouped_matmul_sm100_persistent`'s standalone harness on an H200.

The op's GPU graphs compile in tests/test_gpu_compile.py (sm_90a: every specialization; sm_100a
and the other targets: the one-graph instance); the PTX checks (scripts/check_ptx.py) run on
the sm_90a compile's kernels (wgmma / TMA / setmaxnreg) and on the harness for sm_100a
(tcgen05 with cta_group 1 and 2, every epilogue of the harness; tests/test_ptx.py).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from check_ptx import MOJO, MOJO_ENV  # noqa: E402  (the compiler that came with max)

HARNESS = ROOT / "tests" / "mojo" / "grouped_gpu_harness.mojo"


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

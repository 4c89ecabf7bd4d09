"""Every op's GPU graph compiles for sm_90a (every op's full graph) and for sm_80, sm_89, sm_100a
and gfx950 (one graph holding every op) on this (GPU-less) machine via virtual devices.

Runs in a subprocess: virtual devices are process-wide and must be set before any device.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from subprocess_env import child_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_graphs_compile_for_sm90a() -> None:
    """scripts/compile_gpu_graphs.py --arch sm_90a succeeds and names every op."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compile_gpu_graphs.py"), "--arch", "sm_90a"],
        capture_output=True, text=True, timeout=1200, env=child_env(),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    ops = ("multistage_gemm_q", "grouped_matmul_sm100_persistent", "k_matmul_ragged_paged_scale",
           "moe_route_topk_group")
    for op in ops:
        assert f"compiled {op} for sm_90a" in run.stdout
    assert ("compiled quantize_fp8_rows + k/v_matmul_ragged_paged_scale (PagedKVProjection) "
            "for sm_90a") in run.stdout
    assert "all GPU graphs compiled" in run.stdout


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_100a", "gfx950"])
def test_every_op_compiles_in_one_graph(arch: str) -> None:
    """scripts/compile_gpu_graphs.py --arch ARCH --one-graph: one graph holding every op
    compiles for the Ampere (A100), Ada (L40S), Blackwell (B200) and AMD (MI355X) targets."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compile_gpu_graphs.py"), "--arch", arch,
         "--one-graph"],
        capture_output=True, text=True, timeout=1200, env=child_env(),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    assert "compiled every op (multistage_gemm_q, " in run.stdout
    assert f"for {arch} in " in run.stdout
    assert "all GPU graphs compiled" in run.stdout

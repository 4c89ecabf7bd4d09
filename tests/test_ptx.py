"""Every kernel that claims wgmma / TMA / tcgen05 shows it in its PTX (scripts/check_ptx.py).

Builds each harness with `mojo build --target-accelerator <arch> --emit asm` (no GPU needed)
and greps the PTX: the int4 kernels and the FP8 K-cache kernel for sm_90a, the grouped GEMM for
sm_90a and for sm_100a with both cta_group values. The builds run on the suite's background
lane (tests/background.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from background import Job, run
from subprocess_env import child_env

ROOT = Path(__file__).resolve().parents[1]
CHECK_PTX = Job((sys.executable, str(ROOT / "scripts" / "check_ptx.py")), timeout=1500,
                cwd=str(ROOT), env=tuple(sorted(child_env().items())), seconds=170)


@pytest.mark.slow
@pytest.mark.background(CHECK_PTX)
def test_every_ptx_check_passes() -> None:
    """All checks of scripts/check_ptx.py pass, and each one ran."""
    listing = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_ptx.py"), "--list"],
                             capture_output=True, text=True, check=True, env=child_env()).stdout
    names = [line.split(":")[0] for line in listing.splitlines() if line.strip()]
    assert {"int4_sm90", "k_cache_sm90", "grouped_sm90", "grouped_sm100"} <= set(names)
    result = run(CHECK_PTX)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    for name in names:
        assert f"OK {name}" in result.stdout
    assert "all PTX checks passed" in result.stdout

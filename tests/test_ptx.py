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
from typing import Any

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


def _check_ptx() -> Any:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_ptx
    finally:
        sys.path.pop(0)
    return check_ptx


def test_every_check_runs() -> None:
    """Every check scripts/check_ptx.py defines runs: on the sm_90a graph compile's kernels
    (tests/test_gpu_compile.py) or as a job below, never both."""
    check_ptx = _check_ptx()
    in_graph = {c.name for c in check_ptx.captured_checks("sm_90a")}
    assert in_graph == {"int4_sm90", "k_cache_sm90", "grouped_sm90", "moe_route_sm90"}
    assert not in_graph & set(CHECKS)
    assert {c.name for c in check_ptx.CHECKS} == in_graph | set(CHECKS)


def _kernel(capture: Path, name: str, entry: str, body: str, report: str | None) -> None:
    """A captured kernel as scripts/ptxas-capture leaves it: its PTX and ptxas -v report."""
    (capture / f"{name}.ptx").write_text(f".visible .entry {entry}(\n)\n{{\n{body}\n}}\n")
    if report is not None:
        (capture / f"{name}.ptx.ptxas.log").write_text(report)


def _report(registers: int, spill: int) -> str:
    return (f"ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
            f"    {spill} bytes stack frame, {spill} bytes spill stores, "
            f"{spill} bytes spill loads\n"
            f"ptxas info    : Used {registers} registers, used 1 barriers\n")


def test_captured_mode_finds_what_a_capture_lacks(tmp_path: Path) -> None:
    """--captured: a check passes on its own kernels (by entry-name prefix) when every required
    instruction shows and none spills past its limit, and names the missing instruction, the
    kernel over the limit and a kernel without a ptxas report otherwise."""
    check_ptx = _check_ptx()
    check = next(c for c in check_ptx.CHECKS if c.name == "moe_route_sm90")
    assert check.kernel_prefix is not None and check.max_spill_bytes is not None
    body = "ld.global.v4.b32 %r1;\nmatch.any.sync.b32 %r2;\nshfl.sync.up.b32 %r3;"
    _kernel(tmp_path, "a", check.kernel_prefix + "_1", body, _report(96, check.max_spill_bytes))
    _kernel(tmp_path, "other", "mojo_kernels_int4_gemm_kernels_2", "st.local.b32 %r1;",
            _report(255, 999))  # another op's kernel: not this check's
    problems, summary = check_ptx.captured_problems(check, tmp_path)
    assert problems == []
    assert summary.startswith("1 kernel, at most 96 registers")

    _kernel(tmp_path, "b", check.kernel_prefix + "_2", "ld.local.b32 %r1;",
            _report(128, check.max_spill_bytes + 4))
    _kernel(tmp_path, "c", check.kernel_prefix + "_3", "", None)
    problems, _ = check_ptx.captured_problems(check, tmp_path)
    assert any("forbidden" in p and "b.ptx" in p for p in problems)
    assert any(p.startswith(check.kernel_prefix + "_2: ") and "spill stores" in p for p in problems)
    assert any(p.startswith("c.ptx: no ptxas -v report") for p in problems)

    (tmp_path / "empty").mkdir()
    problems, _ = check_ptx.captured_problems(check, tmp_path / "empty")
    assert problems == [f"no captured kernel named {check.kernel_prefix}*"]


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

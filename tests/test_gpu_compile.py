"""Every op's GPU graph compiles for sm_90a (every op's specializations, in one graph) and
for sm_80, sm_100a and gfx950 (one graph holding every op) on this (GPU-less) machine via
virtual devices; so does the sharded example decoder up to its LM head (every kind of shard the
decoder uses, MAX's allreduce) over 2 virtual sm_90a devices, in one module with the
specializations' graph. sm_89 (Ada) is not compiled here: it runs the Ampere path (the PTX MAX
emits for it has no FP8 mma.sync), so its instructions are sm_80's, and its 99 KB shared-memory
configs are the forced Ampere path's (tests/test_int4_plan.py checks that the plans agree),
which tests/test_forced_paths.py compiles and runs on the GPU. The sm_90a compile also runs
scripts/check_ptx.py's sm_90a checks on the PTX of the kernels it builds (`--ptx-checks`).

Runs in a subprocess (virtual devices are process-wide and must be set before any device), on
the suite's background lane (tests/background.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from background import Job, run
from subprocess_env import child_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "scripts" / "compile_gpu_graphs.py")


def compile_job(arch: str, *flags: str, seconds: float) -> Job:
    """scripts/compile_gpu_graphs.py --arch ARCH [flags] in a child process."""
    return Job((sys.executable, SCRIPT, "--arch", arch, *flags), timeout=1200,
               env=tuple(sorted(child_env().items())), seconds=seconds)


SM90 = compile_job("sm_90a", "--ptx-checks", seconds=250)
sys.path.insert(0, str(ROOT / "scripts"))
from check_ptx import captured_checks  # noqa: E402  (scripts/ is not a package)

PTX_IN_GRAPH = tuple(c.name for c in captured_checks("sm_90a"))
"""scripts/check_ptx.py's checks the sm_90a compile runs on its kernels (--ptx-checks)."""
ONE_GRAPH = {arch: compile_job(arch, "--one-graph", seconds=seconds)
             for arch, seconds in (("sm_80", 40), ("gfx950", 40), ("sm_100a", 60))}


@pytest.mark.slow
@pytest.mark.background(SM90)
def test_gpu_graphs_compile_for_sm90a() -> None:
    """scripts/compile_gpu_graphs.py --arch sm_90a succeeds and names every op."""
    result = run(SM90)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert ("compiled every specialization of multistage_gemm_q, grouped_matmul_sm100_persistent, "
            "k_matmul_ragged_paged_scale, fp8_blockwise_matmul, moe_route_topk_group, "
            "moe_combine_rows, add_rms_norm_rows, rms_norm_rows, "
            "quantize_fp8_rows + kv_matmul_ragged_paged_scale "
            "(PagedKVProjection) (one graph) for sm_90a"
            ) in result.stdout
    assert "all GPU graphs compiled" in result.stdout


@pytest.mark.slow
@pytest.mark.background(SM90)
def test_sm90a_kernels_pass_the_ptx_checks() -> None:
    """The kernels the sm_90a compile builds pass scripts/check_ptx.py's sm_90a checks: the
    instructions they claim (wgmma, TMA, setmaxnreg, ...) and their spill limits (ptxas -v)."""
    result = run(SM90)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    for name in PTX_IN_GRAPH:
        assert f"OK {name} (sm_90a" in result.stdout, result.stdout[-3000:]
    assert "all PTX checks passed" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch", [pytest.param(a, marks=pytest.mark.background(job)) for a, job in ONE_GRAPH.items()])
def test_every_op_compiles_in_one_graph(arch: str) -> None:
    """scripts/compile_gpu_graphs.py --arch ARCH --one-graph: one graph holding every op
    compiles for the Ampere (A100), Blackwell (B200) and AMD (MI355X) targets."""
    result = run(ONE_GRAPH[arch])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "compiled every op (multistage_gemm_q, " in result.stdout
    assert f"for {arch} in " in result.stdout
    assert "all GPU graphs compiled" in result.stdout


@pytest.mark.slow
@pytest.mark.background(SM90)
def test_sharded_layers_compile_for_two_sm90a_devices() -> None:
    """scripts/compile_gpu_graphs.py (sm_90a): the example decoder sharded over 2 virtual
    sm_90a devices (`ShardedMoEDecoder`: Int4Linear's row/column shards, PagedKVProjection's
    head shards each writing its device's paged cache, MAX's flash attention over each
    device's heads, MoEBlock's expert shards, MAX's allreduce) compiles up to its LM head (the
    one-device decoder's, compiled by the GPU tests)."""
    result = run(SM90)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert ("MoEBlock expert shards, allreduce; up to the LM head) on 2 devices for sm_90a in "
            in result.stdout)
    assert "all GPU graphs compiled" in result.stdout

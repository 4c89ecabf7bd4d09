"""GPU targets: the path table, the forced-path variable, and the graph-build error for a target
no kernel path supports (checked through MAX's virtual devices, in a subprocess: they are
process-wide; nothing is compiled)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mojo_gemm.core.targets import force_path_value, gpu_path
from subprocess_env import child_env


@pytest.mark.parametrize(
    ("arch", "path"),
    [
        ("sm_80", "ampere"),
        ("sm_86", "ampere"),
        ("sm_89", "ampere"),
        ("nvidia:sm_90a", "hopper"),
        ("sm_90a", "hopper"),
        ("sm_100a", "blackwell"),
        ("gfx942", "portable"),
        ("amdgpu:gfx950", "portable"),
        ("sm_75", None),
        ("gfx1100", None),
    ],
)
def test_gpu_path_by_target(arch: str, path: str | None) -> None:
    assert gpu_path(arch, "auto") == path


def test_forced_paths() -> None:
    assert gpu_path("sm_90a", "ampere") == "ampere"
    assert gpu_path("sm_90a", "portable") == "portable"
    assert gpu_path("gfx950", "ampere") == "portable"  # no Ampere path on AMD
    assert gpu_path("sm_75", "portable") is None


def test_force_path_values() -> None:
    assert [force_path_value(v) for v in ("", "auto", "Ampere", "portable")] == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="MOJO_GEMM_FORCE_PATH must be one of"):
        force_path_value("hopper")


_UNSUPPORTED = textwrap.dedent(
    """
    import os
    from max import driver
    driver.set_virtual_device_api("cuda")
    driver.set_virtual_device_target_arch("sm_75")
    driver.set_virtual_device_count(1)
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType
    from mojo_gemm import Int4Linear, grouped_matmul, quantize_fp8_rows

    gpu = DeviceRef.GPU()
    bf16 = DType.bfloat16

    def int4():
        with Graph("g", input_types=[TensorType(bf16, [4, 256], gpu)]) as g:
            Int4Linear(256, 64, group_size=128, dtype=bf16, device=gpu)(g.inputs[0].tensor)

    def grouped():
        types = [TensorType(bf16, [4, 256], gpu), TensorType(bf16, [2, 64, 256], gpu),
                 TensorType(DType.uint32, [3], gpu), TensorType(DType.int32, [2], gpu),
                 TensorType(DType.uint32, [2], gpu)]
        with Graph("g", input_types=types) as g:
            grouped_matmul(*(v.tensor for v in g.inputs))

    def quantize():
        with Graph("g", input_types=[TensorType(bf16, [4, 256], gpu)]) as g:
            quantize_fp8_rows(g.inputs[0].tensor)

    for build in (int4, grouped, quantize):
        try:
            build()
            print("NO ERROR", build.__name__)
        except ValueError as e:
            print("ValueError:", e)
    os._exit(0)
    """
)


def test_unsupported_target_raises_at_graph_build() -> None:
    """A GPU graph for sm_75 (no kernel path) raises ValueError naming op, target and the
    supported targets while the graph is built (MAX never compiles it)."""
    run = subprocess.run([sys.executable, "-c", _UNSUPPORTED], capture_output=True, text=True,
                         timeout=300, env=child_env())
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith(("ValueError", "NO"))]
    assert len(lines) == 3, run.stdout
    for line, op in zip(lines, ("multistage_gemm_q", "grouped_matmul_sm100_persistent",
                                "quantize_fp8_rows"), strict=True):
        assert line.startswith(f"ValueError: {op}: unsupported GPU target 'sm_75'"), line
        assert "supported: NVIDIA sm_80" in line and "gfx950" in line, line

"""Which GPU targets the ops support, and the kernel path each gets (Python side).

The Mojo dispatch picks the path at compile time (mojo_kernels/common/target.mojo); this module
mirrors its table so that a graph for a target nothing supports fails at graph build with a
`ValueError` naming the op and the target, before MAX compiles anything, and so that the plan
functions can name the path a target gets. `MOJO_GEMM_FORCE_PATH` (ampere | portable) makes the
graph functions ask for the Ampere or the portable path on a GPU that would pick a faster one
(an op parameter, so it applies to graphs built while it is set).
"""

from __future__ import annotations

import os
from functools import cache

from max.graph import DeviceRef

from .rules import STR, check_types, optional

FORCE_ENV = "MOJO_GEMM_FORCE_PATH"
FORCE_VALUES = {"": 0, "auto": 0, "ampere": 1, "portable": 2}
"""FORCE_* of target.mojo by the env var's value."""

HOPPER = "hopper"
BLACKWELL = "blackwell"
AMPERE = "ampere"
PORTABLE = "portable"

AMPERE_ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_120", "sm_120a")
"""NVIDIA targets of the Ampere path (mma.sync and cp.async, no wgmma / TMA / clusters)."""
SUPPORTED_TARGETS = (
    "NVIDIA sm_80, sm_86, sm_87, sm_89 (Ampere / Ada: mma.sync), sm_90a (Hopper), sm_100a"
    " (Blackwell), sm_120; AMD gfx9xx (gfx942, gfx950: portable kernels)"
)


def _bare(arch: str) -> str:
    """`arch` without a vendor prefix ("nvidia:sm_90a" -> "sm_90a")."""
    return arch.split(":", 1)[1] if ":" in arch else arch


def force_path_value(env: str | None = None) -> int:
    """The FORCE_* value of `env` (default: the MOJO_GEMM_FORCE_PATH environment variable):
    0 for unset / "auto", 1 "ampere", 2 "portable". Raises ValueError for anything else."""
    value = (os.environ.get(FORCE_ENV, "") if env is None else env).strip().lower()
    if value not in FORCE_VALUES:
        raise ValueError(
            f"{FORCE_ENV} must be one of auto, ampere, portable (or unset), got {value!r}"
        )
    return FORCE_VALUES[value]


def gpu_path(arch: str, force: str | None = None) -> str | None:
    """The kernel path of GPU `arch` ("sm_90a", "nvidia:sm_89", "gfx950", ...): "hopper",
    "blackwell", "ampere", "portable", or None when no path supports it. force: "ampere",
    "portable", "auto" or None (= the MOJO_GEMM_FORCE_PATH environment variable)."""
    check_types("gpu_path", {"arch": arch, "force": force},
                {"arch": STR, "force": optional(STR)})
    a = _bare(arch)
    forced = force_path_value(force)
    nvidia = a in ("sm_90a", "sm_100a") or a in AMPERE_ARCHS
    amd = a.startswith("gfx9")
    if forced == FORCE_VALUES["portable"] and (nvidia or amd):
        return PORTABLE
    if forced == FORCE_VALUES["ampere"] and nvidia:
        return AMPERE
    if a == "sm_90a":
        return HOPPER
    if a == "sm_100a":
        return BLACKWELL
    if a in AMPERE_ARCHS:
        return AMPERE
    return PORTABLE if amd else None


@cache
def _accelerator_arch(device_id: int) -> str | None:
    """The architecture of accelerator `device_id` (a virtual device's target too), or None
    when this process sees no accelerator."""
    from max.driver import Accelerator, accelerator_count

    if accelerator_count() == 0:
        return None
    return Accelerator(device_id).architecture_name


def op_target_parameters(op: str, device: DeviceRef) -> dict[str, int]:
    """The op parameters that carry the forced path for a graph op on `device` ({} or
    {"force_path": 1 | 2}).

    Raises ValueError naming `op`, the target and the supported targets when `device` is a GPU
    whose architecture no path supports (known only where the process sees the accelerator,
    a virtual one included), or when MOJO_GEMM_FORCE_PATH is not a known value.
    """
    force = force_path_value()
    if device.is_cpu():
        return {}
    arch = _accelerator_arch(device.id)
    if arch is not None and gpu_path(arch, "auto") is None:
        raise ValueError(
            f"{op}: unsupported GPU target {arch!r} (supported: {SUPPORTED_TARGETS})"
        )
    return {"force_path": force} if force else {}


def check_plan_arch(op: str, arch: str, force: str | None) -> int:
    """The FORCE_* value for a plan of `op` on `arch`; raises ValueError when no path supports
    `arch` (the plan functions' check, before the plan op runs)."""
    if gpu_path(arch, force) is None:
        raise ValueError(
            f"{op}: unsupported GPU target {arch!r} (supported: {SUPPORTED_TARGETS})"
        )
    return force_path_value(force)

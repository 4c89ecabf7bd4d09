"""The GPU target of a compile, classified once for every op's dispatch.

Each op's entry (and GPU dispatch) asks `gpu_path[force]()` at compile time which kernel family it may
instantiate, so a target never sees an instruction it lacks (wgmma, TMA, clusters and setmaxnreg
exist only on sm_90a; tcgen05 only on sm_100a; inline PTX only on NVIDIA). The plan ops call
`path_for_arch` with the arch the caller names, so the host-side plans report the same choice.

Paths (what each op does with them: the op's entry.mojo / dispatch.mojo):
- PATH_HOPPER: sm_90a, the TMA + wgmma kernels.
- PATH_BLACKWELL: sm_100a (grouped: tcgen05 kernels; int4 and K-cache: the mma.sync kernels,
  clusters allowed).
- PATH_AMPERE: sm_80 / 86 / 87 / 89 / 120: mma.sync and cp.async only, no clusters (the FP8
  mma.sync of the K-cache op only where `has_fp8_mma`).
- PATH_PORTABLE: AMD (gfx9xx): kernels written with vendor-neutral primitives only (shared
  memory tiles, barrier()).
- PATH_UNSUPPORTED: anything else; the entries fail the compile naming SUPPORTED_TARGETS,
  and the Python wrappers (mojo_gemm.core.targets) raise before a graph with it is compiled.

`force` (an op parameter set from MOJO_GEMM_FORCE_PATH by the Python wrappers) runs the Ampere
or portable path on a GPU that would pick a faster one, to test those paths on an H200.
"""

from std.sys.info import _accelerator_arch

comptime PATH_UNSUPPORTED = -1
comptime PATH_HOPPER = 0
comptime PATH_BLACKWELL = 1
comptime PATH_AMPERE = 2
comptime PATH_PORTABLE = 3

comptime FORCE_AUTO = 0
"""No forcing: the path of the target."""
comptime FORCE_AMPERE = 1
"""The Ampere path on any NVIDIA target that has it (sm_80+)."""
comptime FORCE_PORTABLE = 2
"""The portable path on any GPU."""

comptime SUPPORTED_TARGETS = (
    "NVIDIA sm_80, sm_86, sm_87, sm_89 (Ampere / Ada: mma.sync), sm_90a (Hopper), sm_100a"
    " (Blackwell), sm_120; AMD gfx9xx (gfx942, gfx950: portable kernels)"
)
"""The targets some path covers, for error messages (mojo_gemm.core.targets keeps the same list)."""

comptime SM90_SMS = 132
"""Streaming multiprocessors of the H100 / H200 SXM: the host-side rules that count waves of
CTAs (launches size persistent grids from the device itself)."""
comptime SMEM_BUDGET_AMPERE_SMALL = 99 * 1024
"""Largest dynamic shared memory per CTA on sm_86 / sm_89 / sm_120 (also used for a forced
Ampere path, so that the H200 runs the configs of the tightest budget)."""
comptime SMEM_BUDGET_A100 = 163 * 1024
"""Largest dynamic shared memory per CTA on sm_80 / sm_87."""
comptime SMEM_BUDGET_SM90 = 227 * 1024
"""Largest dynamic shared memory per CTA on sm_90a / sm_100a (232448 bytes): the one definition
every op's kernels and configs resolve against on those targets."""


def arch_name(arch: StaticString) -> StaticString:
    """`arch` without a vendor prefix: MAX graphs report "nvidia:sm_90a" / "amdgpu:gfx950",
    `mojo build --target-accelerator` "sm_90a" / "gfx950"."""
    if arch.startswith("nvidia:"):
        return arch[byte=7:]
    if arch.startswith("amdgpu:"):
        return arch[byte=7:]
    return arch


def is_amd_arch(arch: StaticString) -> Bool:
    """A gfx9xx (CDNA) target: MI300X (gfx942), MI355X (gfx950) and their relatives."""
    return arch_name(arch).startswith("gfx9")


def is_ampere_arch(arch: StaticString) -> Bool:
    """An NVIDIA target with mma.sync and cp.async but without Hopper's wgmma / TMA."""
    var a = arch_name(arch)
    return a == "sm_80" or a == "sm_86" or a == "sm_87" or a == "sm_89" or a == "sm_120" or a == "sm_120a"


def path_for_arch(arch: StaticString, force: Int) -> Int:
    """The PATH_* of `arch` (with or without vendor prefix) under the FORCE_* value `force`."""
    var a = arch_name(arch)
    var hopper = a == "sm_90a"
    var blackwell = a == "sm_100a"
    var nvidia = hopper or blackwell or is_ampere_arch(a)
    if force == FORCE_PORTABLE and (nvidia or is_amd_arch(a)):
        return PATH_PORTABLE
    if force == FORCE_AMPERE and nvidia:
        return PATH_AMPERE
    if hopper:
        return PATH_HOPPER
    if blackwell:
        return PATH_BLACKWELL
    if is_ampere_arch(a):
        return PATH_AMPERE
    if is_amd_arch(a):
        return PATH_PORTABLE
    return PATH_UNSUPPORTED


def gpu_arch() -> StaticString:
    """The accelerator this compile targets, without vendor prefix (e.g. "sm_90a", "gfx950")."""
    return arch_name(_accelerator_arch())


def gpu_path[force: Int]() -> Int:
    """The PATH_* of the accelerator this compile targets under `force` (compile time)."""
    return path_for_arch(_accelerator_arch(), force)


def has_clusters(path: Int) -> Bool:
    """Whether the kernels of `path` may use thread-block clusters (sm_90a and sm_100a)."""
    return path == PATH_HOPPER or path == PATH_BLACKWELL


def has_mma_sync(path: Int) -> Bool:
    """Whether the kernels of `path` may use mma.sync (every NVIDIA path: sm_80 on)."""
    return path == PATH_HOPPER or path == PATH_BLACKWELL or path == PATH_AMPERE


def has_fp8_mma(arch: StaticString) -> Bool:
    """Whether the compile can emit mma.sync with e4m3 operands: sm_90a and sm_100a. The
    hardware has it from sm_89 on, but it needs PTX ISA 8.4 and MAX 26.7 emits an older PTX
    version for sm_89 (ptxas: "Feature 'mma with FP8 floating point type' requires PTX ISA
    .version 8.4 or later")."""
    var a = arch_name(arch)
    return a == "sm_90a" or a == "sm_100a"


def smem_budget(arch: StaticString, path: Int) -> Int:
    """Dynamic shared memory (bytes) one CTA of the mma.sync kernels may opt into on `arch`
    when it runs `path` (a forced Ampere path takes the sm_89 budget)."""
    var a = arch_name(arch)
    if path == PATH_AMPERE:
        if a == "sm_80" or a == "sm_87":
            return SMEM_BUDGET_A100
        return SMEM_BUDGET_AMPERE_SMALL
    return SMEM_BUDGET_SM90


def path_name(path: Int) -> StaticString:
    """"hopper", "blackwell", "ampere", "portable" or "unsupported" (plan texts)."""
    if path == PATH_HOPPER:
        return "hopper"
    if path == PATH_BLACKWELL:
        return "blackwell"
    if path == PATH_AMPERE:
        return "ampere"
    if path == PATH_PORTABLE:
        return "portable"
    return "unsupported"

"""Launcher of `k_matmul_ragged_paged_scale` and its V twin: picks the CPU or GPU path.

`k_cache` is the half the entry chose (entry.mojo: the K or the V cache of the layer); every
path writes through it alone, so the V twin runs exactly the K kernels.
"""

from max.gpu.host import DeviceContext
from kv_cache.types import KVCacheT

from ..common.target import (
    PATH_UNSUPPORTED,
    SUPPORTED_TARGETS,
    gpu_arch,
    gpu_path,
    has_fp8_mma,
    path_for_arch,
)
from .cpu import k_cache_matmul_cpu
from .gpu import k_cache_gpu_plan_text, k_cache_matmul_gpu
from .layout import F32Ptr, Fp8Ptr, KCacheShape, U32Ptr


def launch_k_cache_matmul[
    gm: Int, gn: Int, gk: Int, cache_t: KVCacheT, target: StaticString, force: Int = 0
](
    hidden: Fp8Ptr,
    offsets: U32Ptr,
    weight: Fp8Ptr,
    in_scale: F32Ptr,
    w_scale: F32Ptr,
    kv_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    k_cache: cache_t,
    shape: KCacheShape,
    ctx: DeviceContext,
) raises:
    """Writes k[t, n] = sum_k a[t,k] w[n,k] as[k//gk, t//gm] ws[n//gn, k//gk] into k_cache.

    Pointers live on the target's device (see KCacheShape for the shapes). target "cpu" ->
    cpu.mojo; "gpu" -> gpu.mojo, given the GPU's path under the FORCE_* value `force`
    (common/target.mojo) and whether it has FP8 mma.sync: wgmma kernels on Hopper only, the
    mma.sync kernel on sm_90a / sm_100a, the SIMT kernel everywhere (sm_80 / 86 / 89 and AMD
    take it for every call). A target no path supports fails to compile, naming it.
    """
    comptime if target == "cpu":
        k_cache_matmul_cpu[gm, gn, gk](
            hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape
        )
    elif target == "gpu":
        comptime path = gpu_path[force]()
        comptime assert path != PATH_UNSUPPORTED, String(
            "k_matmul_ragged_paged_scale: unsupported GPU target '", gpu_arch(), "' (supported: ",
            SUPPORTED_TARGETS, ")")
        k_cache_matmul_gpu[gm, gn, gk, cache_t, path, has_fp8_mma(gpu_arch())](
            hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape, ctx
        )
    else:
        comptime assert False, String("k_matmul_ragged_paged_scale: unsupported target '", target, "'")


def k_cache_plan_text[gm: Int, gn: Int, gk: Int, arch: StaticString, force: Int](shape: KCacheShape) raises -> String:
    """The launch `launch_k_cache_matmul` makes on GPU `arch` (e.g. "sm_90a", "sm_80", "gfx950")
    under `force`, as text: host arithmetic, for the plan op. Raises for a target no path
    supports."""
    comptime path = path_for_arch(arch, force)
    comptime if path == PATH_UNSUPPORTED:
        raise Error("k_matmul_ragged_paged_scale: unsupported GPU target '", arch, "' (supported: ",
                    SUPPORTED_TARGETS, ")")
    else:
        return k_cache_gpu_plan_text[gm, gn, gk, path, has_fp8_mma(arch)](shape)

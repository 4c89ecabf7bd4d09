"""Launcher of `k_matmul_ragged_paged_scale` and its V twin: picks the CPU or GPU path.

`k_cache` is the half the entry chose (entry.mojo: the K or the V cache of the layer); every
path writes through it alone, so the V twin runs exactly the K kernels.
"""

from max.gpu.host import DeviceContext
from kv_cache.types import KVCacheT

from .cpu import k_cache_matmul_cpu
from .gpu import k_cache_matmul_gpu
from .layout import F32Ptr, Fp8Ptr, KCacheShape, U32Ptr


def launch_k_cache_matmul[gm: Int, gn: Int, gk: Int, cache_t: KVCacheT, target: StaticString](
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
    cpu.mojo; "gpu" -> gpu.mojo (which dispatches to the wgmma, mma.sync or SIMT kernel).
    """
    comptime if target == "cpu":
        k_cache_matmul_cpu[gm, gn, gk](
            hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape
        )
    elif target == "gpu":
        k_cache_matmul_gpu[gm, gn, gk](
            hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape, ctx
        )
    else:
        comptime assert False, String("k_matmul_ragged_paged_scale: unsupported target '", target, "'")

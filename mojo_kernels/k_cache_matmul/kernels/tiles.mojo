"""Pieces the mma.sync and SIMT kernels share: the CTA size, the token-row resolution into the
paged cache and the fp32 tile store."""

from max.gpu import thread_idx
from max.gpu.memory import AddressSpace
from kv_cache.types import KVCacheT

from ..layout import F32Ptr, KCacheShape, U32Ptr, is_fp8_cache, store_cast, token_slot

comptime F32 = DType.float32
comptime THREADS = 256
"""Threads per CTA of both kernels."""
comptime WARPS = THREADS // 32


@always_inline
def resolve_rows[page_size: Int, BT: Int](
    rows: Pointer[Int32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    offsets: U32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    shape: KCacheShape,
    t0: Int,
):
    """Threads < BT write (b, pos) of token t0 + tid into rows[2 tid], b = -1 when skipped."""
    var tid = thread_idx.x
    if tid < BT:
        var slot = token_slot[page_size](offsets, cache_lengths, lut, shape, t0 + tid)
        rows[unsafe_offset=2 * tid] = Int32(slot[0])
        rows[unsafe_offset=2 * tid + 1] = Int32(slot[1])


@always_inline
def store_tile[cache_t: KVCacheT, BT: Int, BN: Int](
    k_cache: cache_t,
    tile: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    rows: Pointer[Int32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    kv_scale: F32Ptr,
    shape: KCacheShape,
    n0: Int,
):
    """Writes the fp32 tile [BT][BN] (columns n0..) into the cache rows resolved in `rows`."""
    comptime head_dim = cache_t.kv_params.head_size
    var tid = thread_idx.x
    for e in range(tid, BT * BN, THREADS):
        var r = e // BN
        var n = n0 + e % BN
        var b = Int(rows[unsafe_offset=2 * r])
        if b < 0 or n >= Int(shape.N):
            continue
        var v = tile[unsafe_offset=e]
        comptime if is_fp8_cache[cache_t.dtype]():
            var h = n // head_dim if Int(shape.n_kv_scale) > 1 else 0
            v = v / kv_scale[unsafe_offset=h]
        var dst = k_cache.block_paged_ptr[1](b, Int(rows[unsafe_offset=2 * r + 1]), 0, 0)
        dst[unsafe_offset=n] = store_cast[cache_t.dtype, 1](SIMD[F32, 1](v))

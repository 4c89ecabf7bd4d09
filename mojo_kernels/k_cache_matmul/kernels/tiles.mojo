"""Pieces the mma.sync and SIMT kernels share: the CTA size, the token-slot resolution and the
fp32 tile store into the rows of a `RowSink` (sink.mojo)."""

from max.gpu import thread_idx
from max.gpu.memory import AddressSpace

from ..layout import F32Ptr, KCacheShape, U32Ptr, is_fp8_cache, store_cast
from ..sink import RowSink, row_ptr

comptime F32 = DType.float32
comptime THREADS = 256
"""Threads per CTA of both kernels."""
comptime WARPS = THREADS // 32


@always_inline
def resolve_rows[sink_t: RowSink, BT: Int](
    rows: Pointer[Int32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    sink: sink_t,
    offsets: U32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    shape: KCacheShape,
    t0: Int,
):
    """Threads < BT write the slot (b, pos) of token t0 + tid into rows[2 tid], b = -1 when
    skipped."""
    var tid = thread_idx.x
    if tid < BT:
        var slot = sink.slot(offsets, cache_lengths, lut, shape, t0 + tid)
        rows[unsafe_offset=2 * tid] = Int32(slot[0])
        rows[unsafe_offset=2 * tid + 1] = Int32(slot[1])


@always_inline
def store_tile[sink_t: RowSink, BT: Int, BN: Int](
    sink: sink_t,
    tile: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    rows: Pointer[Int32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    kv_scale: F32Ptr,
    shape: KCacheShape,
    n0: Int,
):
    """Writes the fp32 tile [BT][BN] (columns n0..) into the slots resolved in `rows`."""
    var tid = thread_idx.x
    for e in range(tid, BT * BN, THREADS):
        var r = e // BN
        var n = n0 + e % BN
        var b = Int(rows[unsafe_offset=2 * r])
        if b < 0 or n >= Int(shape.N):
            continue
        var v = tile[unsafe_offset=e]
        comptime if is_fp8_cache[sink_t.dtype]():
            var h = n // sink_t.group if Int(shape.n_kv_scale) > 1 else 0
            v = v / kv_scale[unsafe_offset=h]
        var dst = row_ptr[sink_t](sink.slot_addr(b, Int(rows[unsafe_offset=2 * r + 1])))
        dst[unsafe_offset=n] = store_cast[sink_t.dtype, 1](SIMD[F32, 1](v))

"""Pieces the mma.sync and SIMT kernels share: the CTA size, the token-row resolution and the
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
    rows: Pointer[Int64, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    sink: sink_t,
    offsets: U32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    shape: KCacheShape,
    t0: Int,
):
    """Threads < BT write token t0 + tid's output row address into rows[tid] (0: skipped)."""
    var tid = thread_idx.x
    if tid < BT:
        rows[unsafe_offset=tid] = Int64(sink.row_addr(offsets, cache_lengths, lut, shape, t0 + tid))


@always_inline
def store_tile[sink_t: RowSink, BT: Int, BN: Int](
    tile: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    rows: Pointer[Int64, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    kv_scale: F32Ptr,
    shape: KCacheShape,
    n0: Int,
):
    """Writes the fp32 tile [BT][BN] (columns n0..) into the rows resolved in `rows`."""
    var tid = thread_idx.x
    for e in range(tid, BT * BN, THREADS):
        var r = e // BN
        var n = n0 + e % BN
        var addr = Int(rows[unsafe_offset=r])
        if addr == 0 or n >= Int(shape.N):
            continue
        var v = tile[unsafe_offset=e]
        comptime if is_fp8_cache[sink_t.dtype]():
            var h = n // sink_t.group if Int(shape.n_kv_scale) > 1 else 0
            v = v / kv_scale[unsafe_offset=h]
        row_ptr[sink_t](addr)[unsafe_offset=n] = store_cast[sink_t.dtype, 1](SIMD[F32, 1](v))

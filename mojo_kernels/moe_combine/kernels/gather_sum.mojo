"""GPU path of `moe_combine_rows`: one kernel, a CTA per (token, 1024-column block).

Each thread owns V consecutive columns (V = 8, one 16-byte vector, when H is a multiple of 8,
else 1). It reads the token's K row indices (the same addresses for the whole CTA: broadcast
loads), then, UNROLL rows at a time, loads those rows' vectors together before summing them in
float32 in j order (combine.mojo), and stores the rounded sum. This replaces a gather of the
T K rows, a cast to float32, a sum over k and a cast back (four kernels and a float32 copy of
all rows) by one pass that reads the rows once. Launched as a programmatic dependent
(common/pdl.mojo): it waits for the kernel before it before any access.
"""

from std.math import ceildiv
from std.sys import size_of
from std.utils.static_tuple import StaticTuple
from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, block_idx, thread_idx
from max.gpu.host import DeviceContext, Dim

from ...common.pdl import launch_dependent_grids, pdl_attributes, wait_on_dependent_grids

comptime F32 = DType.float32
comptime THREADS = 128
comptime COLS = 1024
"""Columns per CTA (THREADS x 8)."""
comptime UNROLL = 8
"""Rows whose loads a thread issues together."""


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(THREADS)))
def _combine_kernel[dtype: DType, V: Int](
    combined: Pointer[Scalar[dtype], MutAnyOrigin],
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    inverse: Pointer[Int64, MutAnyOrigin],
    R: Int32,
    H: Int32,
    K: Int32,
):
    """Token block_idx.x, columns [block_idx.y * COLS, +COLS)."""
    comptime SPAN = THREADS * V
    launch_dependent_grids()
    wait_on_dependent_grids()
    var t = block_idx.x
    var n_h = Int(H)
    var n_r = Int(R)
    var n_k = Int(K)
    var c = block_idx.y * COLS + thread_idx.x * V
    var c_end = min(n_h, (block_idx.y + 1) * COLS)
    while c < c_end:
        var acc = SIMD[F32, V](0)
        var j0 = 0
        while j0 < n_k:
            var rows = SIMD[DType.int64, UNROLL](-1)
            comptime for u in range(UNROLL):
                if j0 + u < n_k:
                    rows[u] = inverse[unsafe_offset=t * n_k + j0 + u]
            var vals = SIMD[F32, V * UNROLL](0)
            comptime for u in range(UNROLL):
                var r = Int(rows[u])
                if r >= 0 and r < n_r:
                    var v = y.unsafe_offset(r * n_h + c).unsafe_load[
                        width=V, alignment=V * size_of[dtype]()](0)
                    vals = vals.insert[offset=u * V](v.cast[F32]())
            comptime for u in range(UNROLL):
                acc += vals.slice[V, offset=u * V]()
            j0 += UNROLL
        combined.unsafe_offset(t * n_h + c).unsafe_store[alignment=V * size_of[dtype]()](acc.cast[dtype]())
        c += SPAN


def combine_rows_gpu[dtype: DType](
    combined: Pointer[Scalar[dtype], MutAnyOrigin],
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    inverse: Pointer[Int64, MutAnyOrigin],
    T: Int,
    R: Int,
    H: Int,
    K: Int,
    ctx: DeviceContext,
) raises:
    """Enqueues the kernel (nothing when T or H is 0); device pointers, dense row-major."""
    if T == 0 or H == 0:
        return
    var grid = Dim(T, ceildiv(H, COLS), 1)
    if H % 8 == 0:
        ctx.enqueue_function[_combine_kernel[dtype, 8]](
            combined, y, inverse, Int32(R), Int32(H), Int32(K),
            grid_dim=grid, block_dim=THREADS, attributes=pdl_attributes())
    else:
        ctx.enqueue_function[_combine_kernel[dtype, 1]](
            combined, y, inverse, Int32(R), Int32(H), Int32(K),
            grid_dim=grid, block_dim=THREADS, attributes=pdl_attributes())

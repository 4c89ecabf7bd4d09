"""GPU path of `rms_norm_rows` / `add_rms_norm_rows`: one kernel, a CTA per token row.

Each thread owns V consecutive columns per step (V = 4 when H is a multiple of 4: 16-byte float32
loads, else 1), UNROLL steps' loads issued together. Pass 1 forms s = h (+ y) in float32, writes
it to `sum` and sums s² per thread; warp shuffles and one shared-memory slot per warp reduce the
squares, every thread adding the warp partials in the same order (deterministic). Pass 2 reads the
row again (the CTA just read it: L1 / L2 hits) and stores round(s · rstd · w). The weight is not
written by earlier kernels, so its first loads are issued before the programmatic-dependent wait
(common/pdl.mojo); h and y are read only after it. With an FP8 block (QB > 0) a third pass
quantizes the rows just written, warp w taking blocks w, w + WARPS, ... with the quantizer's own
warp body (fp8_quant/kernels/quantize.mojo), so the e4m3 data and scales are bit-identical to
`quantize_fp8_rows` of the normed rows.
"""

from std.math import ceildiv, sqrt
from std.memory import stack_allocation
from std.sys import size_of
from std.utils.static_tuple import StaticTuple
from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, WARP_SIZE, barrier, block_idx, thread_idx
from max.gpu.host import DeviceContext
from max.gpu.memory import AddressSpace
from max.gpu.primitives.warp import sum as warp_sum

from ...common.pdl import launch_dependent_grids, pdl_attributes, wait_on_dependent_grids
from ...fp8_quant.kernels.quantize import quantize_block_warp
from ...fp8_quant.rows import FP8
from ..norm import F32

comptime THREADS = 256
comptime WARPS = THREADS // WARP_SIZE
comptime UNROLL = 4
"""Column steps whose loads a thread issues together."""


@always_inline
def _load[dtype: DType, V: Int](p: Pointer[Scalar[dtype], MutAnyOrigin], i: Int) -> SIMD[F32, V]:
    return p.unsafe_offset(i).unsafe_load[width=V, alignment=V * size_of[dtype]()](0).cast[F32]()


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(THREADS)))
def _norm_kernel[
    h_dtype: DType, y_dtype: DType, out_dtype: DType, has_y: Bool, V: Int, QB: Int
](
    sum: Pointer[Float32, MutAnyOrigin],
    normed: Pointer[Scalar[out_dtype], MutAnyOrigin],
    data: Pointer[Scalar[FP8], MutAnyOrigin],
    scales: Pointer[Float32, MutAnyOrigin],
    h: Pointer[Scalar[h_dtype], MutAnyOrigin],
    y: Pointer[Scalar[y_dtype], MutAnyOrigin],
    w: Pointer[Float32, MutAnyOrigin],
    T: Int32,
    H: Int32,
    eps: Float32,
    write_sum: Int32,
):
    """Token row block_idx.x."""
    comptime SPAN = THREADS * V
    var partial = stack_allocation[WARPS, Float32, address_space=AddressSpace.SHARED]()
    var n_h = Int(H)
    var c0 = thread_idx.x * V
    var w0 = SIMD[F32, V](0)
    if c0 < n_h:
        w0 = _load[DType.float32, V](w, c0)
    launch_dependent_grids()
    wait_on_dependent_grids()
    var row = block_idx.x * n_h
    var ss = SIMD[F32, V](0)
    var c = c0
    while c < n_h:
        var vals = SIMD[F32, V * UNROLL](0)
        comptime for u in range(UNROLL):
            var cu = c + u * SPAN
            if cu < n_h:
                var s = _load[h_dtype, V](h, row + cu)
                comptime if has_y:
                    s += _load[y_dtype, V](y, row + cu)
                vals = vals.insert[offset=u * V](s)
        comptime for u in range(UNROLL):
            var cu = c + u * SPAN
            if cu < n_h:
                var s = vals.slice[V, offset=u * V]()
                if write_sum != 0:
                    sum.unsafe_offset(row + cu).unsafe_store[alignment=V * 4](s)
                ss += s * s
        c += UNROLL * SPAN
    var warp_ss = warp_sum(ss.reduce_add())
    if thread_idx.x % WARP_SIZE == 0:
        partial[unsafe_offset=thread_idx.x // WARP_SIZE] = warp_ss
    barrier()
    var total = Float32(0)
    comptime for i in range(WARPS):
        total += partial[unsafe_offset=i]
    var rstd = 1 / sqrt(total / Float32(n_h) + eps)
    c = c0
    while c < n_h:
        var s = _load[h_dtype, V](h, row + c)
        comptime if has_y:
            s += _load[y_dtype, V](y, row + c)
        var wv = w0 if c == c0 else _load[DType.float32, V](w, c)
        normed.unsafe_offset(row + c).unsafe_store[alignment=V * size_of[out_dtype]()](
            (s * rstd * wv).cast[out_dtype]())
        c += SPAN
    comptime if QB > 0:
        barrier()  # the CTA's normed stores are visible to every warp of it
        var kb = thread_idx.x // WARP_SIZE
        while kb < ceildiv(n_h, QB):  # uniform per warp: every lane of it calls the quantizer
            quantize_block_warp[out_dtype, QB](
                normed.unsafe_offset(row), data.unsafe_offset(row), scales, block_idx.x, kb,
                Int(T), n_h)
            kb += WARPS


def rms_norm_rows_gpu[h_dtype: DType, y_dtype: DType, out_dtype: DType, has_y: Bool, QB: Int](
    sum: Pointer[Float32, MutAnyOrigin],
    normed: Pointer[Scalar[out_dtype], MutAnyOrigin],
    data: Pointer[Scalar[FP8], MutAnyOrigin],
    scales: Pointer[Float32, MutAnyOrigin],
    h: Pointer[Scalar[h_dtype], MutAnyOrigin],
    y: Pointer[Scalar[y_dtype], MutAnyOrigin],
    w: Pointer[Float32, MutAnyOrigin],
    T: Int,
    H: Int,
    eps: Float32,
    write_sum: Bool,
    ctx: DeviceContext,
) raises:
    """Enqueues the kernel (nothing when T or H is 0); device pointers, dense row-major; QB > 0
    also writes data [T, H] and scales [ceil(H / QB), T]."""
    if T == 0 or H == 0:
        return
    if H % 4 == 0:
        ctx.enqueue_function[_norm_kernel[h_dtype, y_dtype, out_dtype, has_y, 4, QB]](
            sum, normed, data, scales, h, y, w, Int32(T), Int32(H), eps,
            Int32(1 if write_sum else 0),
            grid_dim=T, block_dim=THREADS, attributes=pdl_attributes())
    else:
        ctx.enqueue_function[_norm_kernel[h_dtype, y_dtype, out_dtype, has_y, 1, QB]](
            sum, normed, data, scales, h, y, w, Int32(T), Int32(H), eps,
            Int32(1 if write_sum else 0),
            grid_dim=T, block_dim=THREADS, attributes=pdl_attributes())

"""GPU path of `quantize_fp8_rows`: one warp per (token, block of columns).

Lane l holds columns c0 + l + 32 i of its block in registers (each step the warp reads 32
consecutive elements: coalesced), the warp max-reduces the bits of |x| with shuffles, every lane
derives the same scale, lane 0 stores it and each lane writes its e4m3 values (32 consecutive
bytes per step). That warp body, `quantize_block_warp`, is also what the fused norm kernel of
rms_norm/ runs on the bf16 rows it has just written.
"""

from std.math import ceildiv
from max.gpu import WARP_SIZE, block_idx, thread_idx
from max.gpu.host import DeviceContext
from max.gpu.primitives.warp import max as warp_max

from ...common.pdl import launch_dependent_grids, pdl_attributes, wait_on_dependent_grids
from ..rows import F32, FP8, abs_bits, quantize, scale_from_amax

comptime THREADS = 256
comptime WARPS = THREADS // WARP_SIZE


@always_inline
def quantize_block_warp[in_dtype: DType, block: Int](
    row: Pointer[Scalar[in_dtype], MutAnyOrigin],
    data_row: Pointer[Scalar[FP8], MutAnyOrigin],
    scales: Pointer[Float32, MutAnyOrigin],
    t: Int,
    kb: Int,
    T: Int,
    H: Int,
):
    """One warp quantizes block kb of token t: row and data_row point at the token's first
    column; the scale goes to scales[kb * T + t]. Every lane of the warp must call it."""
    comptime PER_LANE = ceildiv(block, WARP_SIZE)
    var lane = thread_idx.x % WARP_SIZE
    var c0 = kb * block
    var c1 = min(H, c0 + block)
    var vals = SIMD[F32, PER_LANE](0)
    comptime for i in range(PER_LANE):
        var c = c0 + lane + i * WARP_SIZE
        if c < c1:
            vals[i] = row[unsafe_offset=c].cast[F32]()
    var amax = warp_max(abs_bits[PER_LANE](vals).reduce_max())  # bits: subnormal- and NaN-safe
    var s = scale_from_amax(amax)
    if lane == 0:
        scales[unsafe_offset=kb * T + t] = s
    var q = quantize[PER_LANE](vals, s, amax)
    comptime for i in range(PER_LANE):
        var c = c0 + lane + i * WARP_SIZE
        if c < c1:
            data_row[unsafe_offset=c] = q[i]


def _quantize_kernel[in_dtype: DType, block: Int](
    x: Pointer[Scalar[in_dtype], MutAnyOrigin],
    data: Pointer[Scalar[FP8], MutAnyOrigin],
    scales: Pointer[Float32, MutAnyOrigin],
    T: Int32,
    H: Int32,
    x_stride: Int32,
):
    """Warp w of the grid takes token w // n_kb and block w % n_kb (n_kb = ceil(H / block))."""
    # PDL (common/pdl.mojo): resident early, reading x only once its producer has completed
    launch_dependent_grids()
    wait_on_dependent_grids()
    var n_kb = ceildiv(Int(H), block)
    var w = block_idx.x * WARPS + thread_idx.x // WARP_SIZE
    if w >= Int(T) * n_kb:
        return  # the whole warp leaves together: no shuffle is left waiting
    var t = w // n_kb
    quantize_block_warp[in_dtype, block](
        x.unsafe_offset(t * Int(x_stride)), data.unsafe_offset(t * Int(H)), scales, t, w % n_kb,
        Int(T), Int(H))


def quantize_rows_gpu[in_dtype: DType, block: Int](
    x: Pointer[Scalar[in_dtype], MutAnyOrigin],
    data: Pointer[Scalar[FP8], MutAnyOrigin],
    scales: Pointer[Float32, MutAnyOrigin],
    T: Int,
    H: Int,
    x_stride: Int,
    ctx: DeviceContext,
) raises:
    """Enqueues the kernel (nothing for T == 0)."""
    var warps = T * ceildiv(H, block)
    if warps == 0:
        return
    comptime kernel = _quantize_kernel[in_dtype, block]
    ctx.enqueue_function[kernel](
        x, data, scales, Int32(T), Int32(H), Int32(x_stride),
        grid_dim=ceildiv(warps, WARPS), block_dim=THREADS, attributes=pdl_attributes(),
    )

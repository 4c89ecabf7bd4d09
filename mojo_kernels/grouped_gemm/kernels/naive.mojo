"""Simple GPU path of `grouped_matmul_sm100_persistent`: one thread per output element.

Used where TMA cannot describe the tensors (K * sizeof(dtype) not a multiple of 16 bytes) and as
the on-device reference of the fast kernels. grid = (ceil(Nc / 64), ROW_BLOCKS, G): block z is
group z (returns at once when z >= G_active, read on the device); each of the 256 threads owns
one output column and strides over the group's rows. Capturable: no host reads, no syncs.
"""

from std.math import ceildiv
from max.gpu import block_idx, grid_dim, thread_idx
from max.gpu.host import DeviceContext

from ..epilogue import apply_epilogue
from ..scheduler import (
    ElemPtr,
    F32Ptr,
    GroupedShape,
    I32Ptr,
    U32Ptr,
    active_groups,
    group_row_range,
    plane_of,
    swiglu_gate_col,
    SWIGLU_BLOCK,
    valid_expert,
)

comptime F32 = DType.float32
comptime COLS = 64
comptime ROWS = 4
comptime ROW_BLOCKS = 16


@always_inline
def _dot[dtype: DType](a: ElemPtr[dtype], b: ElemPtr[dtype], K: Int) -> Float32:
    var s = Float32(0)
    for k in range(K):
        s += a[unsafe_offset=k].cast[F32]() * b[unsafe_offset=k].cast[F32]()
    return s


def _grouped_naive_kernel[dtype: DType, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool](
    c: ElemPtr[dtype],
    a: ElemPtr[dtype],
    b: ElemPtr[dtype],
    a_offsets: U32Ptr,
    expert_ids: I32Ptr,
    stats: U32Ptr,
    row_scale: F32Ptr,
    T32: Int32,
    K32: Int32,
    N32: Int32,
    Nc32: Int32,
    E32: Int32,
    G32: Int32,
):
    var g = block_idx.z
    if g >= active_groups(stats, Int(G32)):
        return
    var T = Int(T32)
    var K = Int(K32)
    var N = Int(N32)
    var Nc = Int(Nc32)
    var o = block_idx.x * COLS + thread_idx.x % COLS
    if o >= Nc:
        return
    var r = group_row_range(a_offsets, g, T)
    var expert = Int(expert_ids[unsafe_offset=g])
    var valid = valid_expert(expert, Int(E32))
    var n = o
    comptime if swiglu:
        n = swiglu_gate_col(o)
    var plane = plane_of[s0, s1](n)
    var row = r[0] + block_idx.y * ROWS + thread_idx.x // COLS
    while row < r[1]:
        var v = Float32(0)
        if valid:
            var a_row = a.unsafe_offset((row + plane * T) * K)
            var b_row = b.unsafe_offset((expert * N + n) * K)
            var x = _dot(a_row, b_row, K)
            var up = Float32(0)
            comptime if swiglu:
                up = _dot(a_row, b_row.unsafe_offset(SWIGLU_BLOCK * K), K)
            var scale = Float32(1)
            comptime if has_row_scale:
                scale = row_scale[unsafe_offset=row]
            v = apply_epilogue[swiglu, has_row_scale, 1](x, up, scale)
        c[unsafe_offset=row * Nc + o] = v.cast[dtype]()
        row += grid_dim.y * ROWS


def grouped_matmul_gpu_naive[dtype: DType, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool](
    c: ElemPtr[dtype],
    a: ElemPtr[dtype],
    b: ElemPtr[dtype],
    a_offsets: U32Ptr,
    expert_ids: I32Ptr,
    stats: U32Ptr,
    row_scale: F32Ptr,
    shape: GroupedShape,
    ctx: DeviceContext,
) raises:
    """Enqueues the simple kernel (device pointers; see scheduler.mojo for the semantics)."""
    if shape.T == 0 or shape.G == 0:
        return
    ctx.enqueue_function[_grouped_naive_kernel[dtype, s0, s1, swiglu, has_row_scale]](
        c, a, b, a_offsets, expert_ids, stats, row_scale,
        Int32(shape.T), Int32(shape.K), Int32(shape.N), Int32(shape.Nc), Int32(shape.E),
        Int32(shape.G),
        grid_dim=(ceildiv(shape.Nc, COLS), ROW_BLOCKS, shape.G),
        block_dim=COLS * ROWS,
    )

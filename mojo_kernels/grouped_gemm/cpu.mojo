"""CPU path of `grouped_matmul_sm100_persistent`: correct and parallel (not tuned).

Work items are (row block of up to RB rows of one group) x (band of CB matmul columns); they
run in parallel with sync_parallelize. An item computes its RB x CB fp32 tile with an
MR x NR register-blocked dot-product micro-kernel vectorized along K (bf16/fp16 converted to
fp32 on load), then applies the epilogue and stores. The item list is built on the host from
a_offsets / expert_ids / expert_usage_stats, which are host memory on this path.
"""

from std.math import ceildiv
from std.memory import stack_allocation
from std.memory.alloc import unsafe_alloc
from std.sys import simd_width_of
from max.algorithm import sync_parallelize

from .epilogue import apply_epilogue
from .scheduler import (
    ElemPtr,
    F32Ptr,
    GroupedShape,
    I32Ptr,
    SWIGLU_BLOCK,
    U32Ptr,
    active_groups,
    group_row_range,
    plane_of,
    valid_expert,
)

comptime F32 = DType.float32
comptime RB = 16
"""Rows per work item."""
comptime CB = 64
"""Matmul columns per work item (a multiple of 16 for the SwiGLU pairs; divides PLANE_ALIGN)."""
comptime MR = 2
comptime NR = 4
comptime W = simd_width_of[F32]()


@always_inline
def _micro[dtype: DType, mr: Int, nr: Int](
    a: ElemPtr[dtype], b: ElemPtr[dtype], K: Int, tile: F32Ptr
):
    """tile[i * CB + j] = sum_k a[i * K + k] * b[j * K + k] for i < mr, j < nr (fp32)."""
    var acc = Array[SIMD[F32, W], mr * nr](fill=0)
    var kv = (K // W) * W
    for k in range(0, kv, W):
        var av = Array[SIMD[F32, W], mr](fill=0)
        comptime for i in range(mr):
            av[i] = a.unsafe_offset(i * K + k).unsafe_load[width=W]().cast[F32]()
        comptime for j in range(nr):
            var bv = b.unsafe_offset(j * K + k).unsafe_load[width=W]().cast[F32]()
            comptime for i in range(mr):
                acc[i * nr + j] = av[i].fma(bv, acc[i * nr + j])
    comptime for i in range(mr):
        comptime for j in range(nr):
            var s = acc[i * nr + j].reduce_add()
            for k in range(kv, K):
                s += a[unsafe_offset=i * K + k].cast[F32]() * b[unsafe_offset=j * K + k].cast[F32]()
            tile[unsafe_offset=i * CB + j] = s


@always_inline
def _rows_block[dtype: DType, mr: Int](
    a: ElemPtr[dtype], b: ElemPtr[dtype], K: Int, cols: Int, tile: F32Ptr
):
    """mr rows x `cols` columns of the tile (row stride CB)."""
    var j = 0
    while j + NR <= cols:
        _micro[dtype, mr, NR](a, b.unsafe_offset(j * K), K, tile.unsafe_offset(j))
        j += NR
    while j < cols:
        _micro[dtype, mr, 1](a, b.unsafe_offset(j * K), K, tile.unsafe_offset(j))
        j += 1


def _item[dtype: DType, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool](
    c: ElemPtr[dtype],
    a: ElemPtr[dtype],
    b: ElemPtr[dtype],
    row_scale: F32Ptr,
    shape: GroupedShape,
    expert: Int,
    row0: Int,
    rows: Int,
    n0: Int,
):
    """Rows [row0, row0 + rows) x matmul columns [n0, n0 + CB) ∩ [0, N)."""
    var K = shape.K
    var cols = min(CB, shape.N - n0)
    # Output columns of this band: the same range, or half of it with SwiGLU.
    var o0 = n0
    var ocols = cols
    comptime if swiglu:
        o0 = n0 // 2
        ocols = cols // 2
    if not valid_expert(expert, shape.E):
        for r in range(rows):
            var crow = c.unsafe_offset((row0 + r) * shape.Nc + o0)
            for j in range(ocols):
                crow[unsafe_offset=j] = 0
        return

    var tile = stack_allocation[RB * CB, Float32]().as_unsafe_any_origin()
    var plane = plane_of[s0, s1](n0)
    var a_base = a.unsafe_offset((row0 + plane * shape.T) * K)
    var b_base = b.unsafe_offset((expert * shape.N + n0) * K)
    var r = 0
    while r + MR <= rows:
        _rows_block[dtype, MR](a_base.unsafe_offset(r * K), b_base, K, cols, tile.unsafe_offset(r * CB))
        r += MR
    while r < rows:
        _rows_block[dtype, 1](a_base.unsafe_offset(r * K), b_base, K, cols, tile.unsafe_offset(r * CB))
        r += 1

    for i in range(rows):
        var scale = Float32(1)
        comptime if has_row_scale:
            scale = row_scale[unsafe_offset=row0 + i]
        var crow = c.unsafe_offset((row0 + i) * shape.Nc + o0)
        var trow = tile.unsafe_offset(i * CB)
        for j in range(ocols):
            comptime if swiglu:
                var gate_col = 2 * SWIGLU_BLOCK * (j // SWIGLU_BLOCK) + j % SWIGLU_BLOCK
                var v = apply_epilogue[swiglu, has_row_scale, 1](
                    trow[unsafe_offset=gate_col], trow[unsafe_offset=gate_col + SWIGLU_BLOCK], scale)
                crow[unsafe_offset=j] = v.cast[dtype]()
            else:
                var v = apply_epilogue[swiglu, has_row_scale, 1](trow[unsafe_offset=j], 0, scale)
                crow[unsafe_offset=j] = v.cast[dtype]()


def grouped_matmul_cpu[dtype: DType, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool](
    c: ElemPtr[dtype],
    a: ElemPtr[dtype],
    b: ElemPtr[dtype],
    a_offsets: U32Ptr,
    expert_ids: I32Ptr,
    stats: U32Ptr,
    row_scale: F32Ptr,
    shape: GroupedShape,
) raises:
    """The grouped matmul on the host (every pointer is host memory; see scheduler.mojo)."""
    var G_active = active_groups(stats, shape.G)
    var n_bands = ceildiv(shape.N, CB)
    # Row blocks of the active groups: (group, first row, rows), packed in one Int array.
    var n_blocks = 0
    for g in range(G_active):
        var r = group_row_range(a_offsets, g, shape.T)
        if r[1] > r[0]:
            n_blocks += ceildiv(r[1] - r[0], RB)
    if n_blocks == 0:
        return
    var blocks = unsafe_alloc[Int](3 * n_blocks)
    var i = 0
    for g in range(G_active):
        var r = group_row_range(a_offsets, g, shape.T)
        var row = r[0]
        while row < r[1]:
            blocks[unsafe_offset=3 * i] = Int(expert_ids[unsafe_offset=g])
            blocks[unsafe_offset=3 * i + 1] = row
            blocks[unsafe_offset=3 * i + 2] = min(RB, r[1] - row)
            row += RB
            i += 1
    var blk = blocks

    def item(w: Int) {var c, var a, var b, var row_scale, var shape, var blk, var n_bands}:
        var bi = w // n_bands
        var band = w % n_bands
        _item[dtype, s0, s1, swiglu, has_row_scale](
            c, a, b, row_scale, shape,
            blk[unsafe_offset=3 * bi], blk[unsafe_offset=3 * bi + 1], blk[unsafe_offset=3 * bi + 2],
            band * CB,
        )

    sync_parallelize(item, n_blocks * n_bands)
    blocks.unsafe_free()

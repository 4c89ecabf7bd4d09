"""Tensor-core path of `grouped_matmul_sm100_persistent` for GPUs without wgmma / TMA (the Ampere
path: sm_80 - sm_89, sm_120; forced on Hopper for testing): mma.sync m16n8k16 with fp32
accumulators, fragments loaded straight from global memory as 16-byte vectors.

A lane loads 8 consecutive k values of its A rows and of its B column per 32-wide k chunk; the
two m16n8k16 MMAs of the chunk take the first and the last four of them. That assigns each
logical k of the MMA a physical k by the same permutation for A and B, so no shuffle is needed
(the dot product does not depend on the order of k). Needs K a multiple of 8 (16-byte rows);
the dispatch sends other K to the naive kernel.

grid = (ceil(N / BN), ROW_BLOCKS, G): block z is group z (returns at once when z >= G_active, read
on the device), block x a 128-column weight tile (4 warps x 32 columns; 128 = PLANE_ALIGN, so the
tile reads one Q/K/V plane), block y strides over the group's 32-row token tiles. SwiGLU: the
gate and up columns of an output column lie in adjacent 8-column MMA tiles of one warp (the
block-8 interleave), so the epilogue pairs accumulators of one lane. Capturable: no host reads.
"""

from std.math import ceildiv
from max.gpu import block_idx, grid_dim, thread_idx
from max.gpu.compute.mma import mma
from max.gpu.host import DeviceContext

from ..epilogue import apply_epilogue
from ..scheduler import (
    ElemPtr,
    F32Ptr,
    GroupedShape,
    I32Ptr,
    PLANE_ALIGN,
    U32Ptr,
    active_groups,
    group_row_range,
    plane_of,
    valid_expert,
)

comptime F32 = DType.float32
comptime WARPS = 4
comptime MT = 2
"""16-row MMA tiles per warp (the CTA's token tile is 16 MT rows)."""
comptime NB = 4
"""8-column MMA tiles per warp."""
comptime BT = 16 * MT
comptime BN = WARPS * 8 * NB
comptime ROW_BLOCKS = 16


def _grouped_mma_kernel[dtype: DType, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool](
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
    comptime assert BN == PLANE_ALIGN, "a column tile must read one plane"
    comptime assert NB % 2 == 0, "SwiGLU pairs 8-column tiles"
    var g = block_idx.z
    if g >= active_groups(stats, Int(G32)):
        return
    var T = Int(T32)
    var K = Int(K32)
    var N = Int(N32)
    var Nc = Int(Nc32)
    var r = group_row_range(a_offsets, g, T)
    var expert = Int(expert_ids[unsafe_offset=g])
    var valid = valid_expert(expert, Int(E32))
    var warp = thread_idx.x // 32
    var lane = thread_idx.x % 32
    var gi = lane // 4
    var tig = lane % 4
    var n_w = block_idx.x * BN + warp * 8 * NB  # first matmul column of this warp
    var plane = plane_of[s0, s1](block_idx.x * BN)
    var b_exp = b.unsafe_offset(max(expert, 0) * N * K)

    var rt0 = r[0] + block_idx.y * BT
    while rt0 < r[1]:
        var acc = Array[SIMD[F32, 4], MT * NB](fill=SIMD[F32, 4](0))
        if valid:
            for kc in range(0, K, 32):
                # lanes past K load zeros but still issue the MMAs: mma.sync is warp-collective
                var k = kc + 8 * tig
                var k_in = k < K
                var a_lo = Array[SIMD[dtype, 8], MT](fill=SIMD[dtype, 8](0))
                var a_hi = Array[SIMD[dtype, 8], MT](fill=SIMD[dtype, 8](0))
                var bv = Array[SIMD[dtype, 8], NB](fill=SIMD[dtype, 8](0))
                comptime for mt in range(MT):
                    var row = rt0 + mt * 16 + gi
                    if k_in and row < r[1]:
                        a_lo[mt] = a.unsafe_offset((row + plane * T) * K + k).unsafe_load[
                            width=8, alignment=16
                        ](0)
                    if k_in and row + 8 < r[1]:
                        a_hi[mt] = a.unsafe_offset((row + 8 + plane * T) * K + k).unsafe_load[
                            width=8, alignment=16
                        ](0)
                comptime for nb in range(NB):
                    var n = n_w + nb * 8 + gi
                    if k_in and n < N:
                        bv[nb] = b_exp.unsafe_offset(n * K + k).unsafe_load[width=8, alignment=16](0)
                comptime for h in range(2):
                    comptime for mt in range(MT):
                        # a0..a3 = (row g, k 0-1), (row g+8, k 0-1), (row g, k 2-3), (row g+8, k 2-3)
                        # of this half's four physical k values
                        var frag = (
                            a_lo[mt].slice[2, offset=4 * h]().join(a_hi[mt].slice[2, offset=4 * h]())
                        ).join(
                            a_lo[mt].slice[2, offset=4 * h + 2]().join(a_hi[mt].slice[2, offset=4 * h + 2]())
                        )
                        comptime for nb in range(NB):
                            var d = SIMD[F32, 4](0)
                            mma(d, frag, bv[nb].slice[4, offset=4 * h](), acc[mt * NB + nb])
                            acc[mt * NB + nb] = d

        # epilogue: accumulator (mt, nb) holds rows (g, g + 8) x matmul columns (2 tig, 2 tig + 1)
        comptime for mt in range(MT):
            comptime for hi in range(2):
                var row = rt0 + mt * 16 + gi + 8 * hi
                if row < r[1]:
                    var scale = Float32(1)
                    comptime if has_row_scale:
                        scale = row_scale[unsafe_offset=row]
                    comptime if swiglu:
                        comptime for p in range(NB // 2):
                            var gate = acc[mt * NB + 2 * p]
                            var up = acc[mt * NB + 2 * p + 1]
                            var n_gate = n_w + 16 * p + 2 * tig  # gate column; its up is 8 further
                            var o = 8 * (n_gate // 16) + n_gate % 8
                            var v = apply_epilogue[swiglu, has_row_scale, 2](
                                SIMD[F32, 2](gate[2 * hi], gate[2 * hi + 1]),
                                SIMD[F32, 2](up[2 * hi], up[2 * hi + 1]), scale)
                            comptime for e in range(2):
                                if o + e < Nc:
                                    c[unsafe_offset=row * Nc + o + e] = v[e].cast[dtype]()
                    else:
                        comptime for nb in range(NB):
                            var x = acc[mt * NB + nb]
                            var o = n_w + nb * 8 + 2 * tig
                            var v = apply_epilogue[swiglu, has_row_scale, 2](
                                SIMD[F32, 2](x[2 * hi], x[2 * hi + 1]), SIMD[F32, 2](0), scale)
                            comptime for e in range(2):
                                if o + e < Nc:
                                    c[unsafe_offset=row * Nc + o + e] = v[e].cast[dtype]()
        rt0 += grid_dim.y * BT


def grouped_matmul_gpu_mma[dtype: DType, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool](
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
    """Enqueues the mma.sync kernel (device pointers; K a multiple of 8; see scheduler.mojo for
    the semantics)."""
    if shape.T == 0 or shape.G == 0:
        return
    ctx.enqueue_function[_grouped_mma_kernel[dtype, s0, s1, swiglu, has_row_scale]](
        c, a, b, a_offsets, expert_ids, stats, row_scale,
        Int32(shape.T), Int32(shape.K), Int32(shape.N), Int32(shape.Nc), Int32(shape.E),
        Int32(shape.G),
        grid_dim=(ceildiv(shape.N, BN), ROW_BLOCKS, shape.G),
        block_dim=WARPS * 32,
    )

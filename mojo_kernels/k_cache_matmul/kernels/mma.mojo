"""`mma_splitk_kernel` (FP8 mma.sync split-K): warps compute mma.sync m16n8k32 e4m3 tiles (16
tokens on the MMA's M side, 8 weight rows on its N side) with fragments loaded straight from global memory as 16-byte vectors;
the 64 k values one 16-byte load per lane covers are the same permutation of k for both
operands, so no shuffle is needed. A CTA covers 16·MT tokens x 8·NB weight rows, and its 8
warps split K by scale block (intra-CTA split-K: with so few rows per CTA, decode spreads over
all SMs without a cross-CTA reduction buffer). Each block's MMA sum is multiplied by its input
and weight scales in fp32 registers (promotion) and added to the warp's fp32 accumulators; the
warps' partial sums are reduced in shared memory and the epilogue writes the rows straight into
the paged cache.
"""

from std.math import ceildiv
from std.memory import stack_allocation
from max.gpu import barrier, block_idx, thread_idx
from max.gpu.compute.mma import mma
from max.gpu.memory import AddressSpace

from ...common.pdl import launch_dependent_grids, wait_on_dependent_grids
from ..layout import F32Ptr, Fp8Ptr, KCacheShape, U32Ptr, walk_start, walk_step
from ..sink import RowSink
from .tiles import F32, THREADS, WARPS, resolve_rows, store_tile

comptime FP8 = DType.float8_e4m3fn


@fieldwise_init
struct MmaConfig(ImplicitlyCopyable, Writable):
    """Parameters of `mma_splitk_kernel`: CTAs of 16·mt tokens x 8·nb weight rows, warps taking
    u scale blocks at a time, rows resolved after the loads (late_rows) or before them."""

    var mt: Int
    var nb: Int
    var u: Int
    var late_rows: Bool
    var rotate: Bool

    def write_to(self, mut writer: Some[Writer]):
        writer.write("mma.sync MT=", self.mt, " NB=", self.nb, " U=", self.u)
        if self.late_rows:
            writer.write(" late")
        if self.rotate:
            writer.write(" rot")


def mma_splitk_kernel[
    sink_t: RowSink, gm: Int, gn: Int, gk: Int, MT: Int, NB: Int, U: Int, late_rows: Bool, rotate: Bool
](
    hidden: Fp8Ptr,
    offsets: U32Ptr,
    k_weight: Fp8Ptr,
    v_weight: Fp8Ptr,
    in_scale: F32Ptr,
    k_w_scale: F32Ptr,
    v_w_scale: F32Ptr,
    k_kv_scale: F32Ptr,
    v_kv_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    k_sink: sink_t,
    v_sink: sink_t,
    shape: KCacheShape,
):
    """One CTA: tokens [t0, t0 + 16 MT) x weight rows [n0, n0 + 8 NB), all of K split by warp.

    grid z selects the half: z = 0 projects with the k_* operands into k_sink, z = 1 with the
    v_* operands into v_sink (the fused K+V op launches z = 2, a single half z = 1); both
    halves share the tokens, their scales, the row resolution and `shape`.

    A warp takes U consecutive scale blocks at a time and issues all their loads before the
    first MMA, so that U * gk/64 * (NB + 2 MT) 16-byte loads per lane are in flight. late_rows:
    warp 0 resolves the tokens' cache rows after its loads instead of before them (faster with
    NB = 2 at large N, slower with NB = 1; measured, not understood). rotate: the CTAs of one
    token tile start their K walks at different scale blocks (CTA i of G at block i * blocks / G),
    so that they do not all read the same token rows at the same time.
    """
    comptime BT = 16 * MT
    comptime BN = 8 * NB
    comptime CH = gk // 64
    var red = stack_allocation[WARPS * BT * BN, Float32, address_space=AddressSpace.SHARED]()
    var rows = stack_allocation[2 * BT, Int32, address_space=AddressSpace.SHARED]()
    var tid = thread_idx.x
    var warp = tid // 32
    var lane = tid % 32
    var g = lane // 4
    var tig = lane % 4
    var n0 = block_idx.x * BN
    var t0 = block_idx.y * BT
    var T = Int(shape.T)
    var K = Int(shape.K)
    var N = Int(shape.N)
    var a_stride = Int(shape.a_stride)
    var w_stride = Int(shape.w_stride)
    var n_kb = ceildiv(K, gk)
    var rot = walk_start(n_kb) if rotate else 0
    var wv = Array[SIMD[FP8, 16], U * CH * NB](fill=0)
    var is_v = block_idx.z != 0
    var weight = v_weight if is_v else k_weight
    var w_scale = v_w_scale if is_v else k_w_scale

    @always_inline
    @__parameter
    def load_weights(kb0: Int):
        comptime for u in range(U):
            var kbp = walk_step(kb0 + u, rot, n_kb)
            comptime for c in range(CH):
                var kc = kbp * gk + c * 64 + tig * 16
                comptime for nb in range(NB):
                    var n = n0 + nb * 8 + g
                    if kb0 + u < n_kb and kc < K and n < N:
                        wv[(u * CH + c) * NB + nb] = weight.unsafe_offset(n * w_stride + kc).unsafe_load[
                            width=16, alignment=16
                        ](0)
                    else:
                        wv[(u * CH + c) * NB + nb] = SIMD[FP8, 16](0)

    # PDL (common/pdl.mojo): the first step's weights are loaded while the previous kernel may
    # still run; tokens, their scales, the cache rows and the cache itself only after the wait.
    launch_dependent_grids()
    load_weights(warp * U)
    wait_on_dependent_grids()
    comptime if not late_rows:
        resolve_rows[sink_t, BT](rows, k_sink, offsets, cache_lengths, lut, shape, t0)  # slots: the same for both halves

    var acc = Array[SIMD[F32, 4], MT * NB](fill=0)
    for kb0 in range(warp * U, n_kb, WARPS * U):
        var a_lo = Array[SIMD[FP8, 16], U * CH * MT](fill=0)
        var a_hi = Array[SIMD[FP8, 16], U * CH * MT](fill=0)
        if kb0 != warp * U:
            load_weights(kb0)
        comptime for u in range(U):
            var kbp = walk_step(kb0 + u, rot, n_kb)  # the scale block of step kb0 + u of the walk
            comptime for c in range(CH):
                var kc = kbp * gk + c * 64 + tig * 16
                if kb0 + u < n_kb and kc < K:
                    comptime for mt in range(MT):
                        var r0 = t0 + mt * 16 + g
                        if r0 < T:
                            a_lo[(u * CH + c) * MT + mt] = hidden.unsafe_offset(r0 * a_stride + kc).unsafe_load[
                                width=16, alignment=16
                            ](0)
                        if r0 + 8 < T:
                            a_hi[(u * CH + c) * MT + mt] = hidden.unsafe_offset((r0 + 8) * a_stride + kc).unsafe_load[
                                width=16, alignment=16
                            ](0)
        comptime for u in range(U):
            var kb = walk_step(kb0 + u, rot, n_kb)
            if kb0 + u < n_kb:
                var tmp = Array[SIMD[F32, 4], MT * NB](fill=0)
                comptime for c in range(CH):
                    comptime for h in range(2):
                        comptime for mt in range(MT):
                            comptime ai = (u * CH + c) * MT + mt
                            var a = (
                                a_lo[ai].slice[4, offset=8 * h]().join(a_hi[ai].slice[4, offset=8 * h]())
                            ).join(
                                a_lo[ai].slice[4, offset=8 * h + 4]().join(a_hi[ai].slice[4, offset=8 * h + 4]())
                            )
                            comptime for nb in range(NB):
                                var d = SIMD[F32, 4](0)
                                mma(d, a, wv[(u * CH + c) * NB + nb].slice[8, offset=8 * h](), tmp[mt * NB + nb])
                                tmp[mt * NB + nb] = d
                # promotion: scale this block's sums in fp32 and add them to the accumulators
                comptime for mt in range(MT):
                    var r0 = t0 + mt * 16 + g
                    var sa0 = in_scale[unsafe_offset=kb * Int(shape.as_stride) + r0 // gm] if r0 < T else Float32(0)
                    var sa1 = in_scale[unsafe_offset=kb * Int(shape.as_stride) + (r0 + 8) // gm] if r0 + 8 < T else Float32(0)
                    comptime for nb in range(NB):
                        var n = n0 + nb * 8 + tig * 2
                        var sw0 = w_scale[unsafe_offset=(n // gn) * Int(shape.ws_stride) + kb] if n < N else Float32(0)
                        var sw1 = w_scale[unsafe_offset=((n + 1) // gn) * Int(shape.ws_stride) + kb] if n + 1 < N else Float32(0)
                        acc[mt * NB + nb] += tmp[mt * NB + nb] * SIMD[F32, 4](sa0 * sw0, sa0 * sw1, sa1 * sw0, sa1 * sw1)

    comptime if late_rows:
        resolve_rows[sink_t, BT](rows, k_sink, offsets, cache_lengths, lut, shape, t0)  # slots: the same for both halves
    # reduce the warps' partial sums in shared memory: red[warp][row][col]
    comptime for mt in range(MT):
        comptime for nb in range(NB):
            var v = acc[mt * NB + nb]
            var r = mt * 16 + g
            var col = nb * 8 + tig * 2
            var base = warp * BT * BN
            red[unsafe_offset=base + r * BN + col] = v[0]
            red[unsafe_offset=base + r * BN + col + 1] = v[1]
            red[unsafe_offset=base + (r + 8) * BN + col] = v[2]
            red[unsafe_offset=base + (r + 8) * BN + col + 1] = v[3]
    barrier()
    for e in range(tid, BT * BN, THREADS):
        var s = red[unsafe_offset=e]
        comptime for w in range(1, WARPS):
            s += red[unsafe_offset=w * BT * BN + e]
        red[unsafe_offset=e] = s
    barrier()
    if is_v:
        store_tile[sink_t, BT, BN](v_sink, red, rows, v_kv_scale, shape, n0)
    else:
        store_tile[sink_t, BT, BN](k_sink, red, rows, k_kv_scale, shape, n0)

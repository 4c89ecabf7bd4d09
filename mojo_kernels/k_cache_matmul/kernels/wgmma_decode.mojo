"""Hopper (sm_90a) decode path of `k_matmul_ragged_paged_scale` for many weight rows: swap-AB
TMA + wgmma FP8.

At decode (few tokens) the weight is the whole cost, so the kernel puts the WEIGHT on wgmma's
M side (64 rows per CTA, A operand) and the tokens on its N side (B operand, n = `tn` in
{8, 16, 32, 64, 128}, the smallest holding T): one CTA streams its 64 x K weight rows through
a deep TMA ring (`stages` of 64 x (128 ksub) e4m3 weight + tn x (128 ksub) e4m3 tokens, as
ksub boxes of 128 bytes per row with 128-byte swizzle: 256-512 contiguous bytes per weight row
per stage) while the token tile, the same for every CTA, is served by L2. With N / 64 CTAs
and one CTA per SM (e.g. N = 8192: 128 CTAs), every SM keeps 64-96 KB of weight in flight,
which is what HBM latency needs; the mma.sync split-K kernel (mma.mojo) holds its in-flight
bytes in registers instead and stops at ~2.6 TB/s there.

Warp-specialized like wgmma.mojo: warpgroup 0's first thread issues the TMA loads into
"full"/"empty" mbarriers (its other warps resolve each token's cache slot meanwhile);
`consumers` warpgroups take the stages round-robin (two hide each other's wgmma -> wait ->
promote chain), each with its own fp32 accumulator. Per 128-wide K block (one scale block):
4 wgmma m64n{tn}k32 into a block accumulator (the first with scale-d = 0: no zeroing moves,
which made ptxas inject warpgroup.arrive), wait, then promotion in fp32 registers,
acc += block · weight_scale[row] · input_scale[token] (Hopper's FP8 tensor cores accumulate
with reduced precision; no sum longer than one block stays inside them; each lane loads
TN / 32 token scales of the next round and shuffles gather the ones its fragment needs); the
stage is released after its last block. From tn = 32 on, CTA i of G walks K from tile
i · tiles / G ("rot"), so that the CTAs do not all read the same token tile at once.
Epilogue: the consumers' accumulators go to shared memory (token-major), one CTA barrier, then
16-byte stores of each token's 64-column row segment into its paged cache slot (scalar stores
when the slot address or the N tail forbid a vector); the row addresses were resolved by the
producer warpgroup's spare warps while the ring filled (lookup table read off the tail).
Small N (`decode_split_config`, few 64-row blocks): K is split over a (P, 1, 1) cluster, each
CTA walks its own K part, and the partial sums are added through distributed shared memory
(each CTA stores every P-th 16-byte piece). Rows past T, skipped tokens and columns
past N are not written. TMA zero-fills the tails of T, N and K.

Requirements: those of `wgmma_path_supported` (gk % 128 == 0, K % 16 == 0, dense rows).
"""

from std.math import ceildiv
from std.memory import stack_allocation
from std.sys import size_of
from std.utils.index import Index
from std.utils.static_tuple import StaticTuple
from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, barrier, block_idx, thread_idx
from max.gpu.primitives.warp import shuffle_idx
from max.gpu.sync import named_barrier
from max.gpu.host import DeviceContext, Dim, FuncAttribute
from max.gpu.primitives.cluster import cluster_sync, load_cluster_smem
from max.gpu.intrinsics import warpgroup_reg_alloc, warpgroup_reg_dealloc
from max.gpu.memory import AddressSpace, external_memory
from layout import Coord, TileTensor, row_major
from layout.tensor_core_async import TensorCoreAsync, tile_layout_k_major_typed, warpgroup_fence
from layout.tma_async import SharedMemBarrier, TMATensorTile, create_tma_tile

from ...common.target import SMEM_BUDGET_SM90
from ...common.pdl import launch_dependent_grids, pdl_attributes, wait_on_dependent_grids
from ...common.sync import role_barrier
from .wgmma import BK, SW
from ..sink import RowSink, row_addr, row_ptr
from ..layout import (
    F32Ptr,
    Fp8Ptr,
    KCacheShape,
    U32Ptr,
    is_fp8_cache,
    store_cast,
    walk_start,
    walk_step,
)

comptime F32 = DType.float32
comptime FP8 = DType.float8_e4m3fn
comptime ROWS = 64
"""Weight rows per CTA (wgmma M)."""
comptime W_TILE = ROWS * BK
"""Bytes of one stage's weight tile."""
comptime MAX_TOKENS = 128
"""Most tokens one CTA takes (the largest `tn`); `k_cache_gpu_plan` sends larger T elsewhere."""
comptime OUT_STRIDE = ROWS + 4
"""Floats per token row of the epilogue's accumulator tile: the padding makes the consumers'
stores conflict-free (a warp writes 4 tokens x 8 rows; at a stride of 64 floats the 4 tokens
fell on the same bank)."""


@fieldwise_init
struct DecodeConfig(ImplicitlyCopyable, Writable):
    """A swap-AB CTA: 64 weight rows x `tn` tokens, a ring of `stages` K tiles, `consumers`
    warpgroups taking the K tiles round-robin."""

    var tn: Int
    var stages: Int
    var consumers: Int
    var ksub: Int
    """128-wide K blocks per stage (longer contiguous reads per weight row per stage)."""
    var rotate: Bool
    """Each CTA walks K from its own starting tile (CTA i of G at tile i * tiles / G), so that
    the CTAs do not all read the same token tile at the same time."""
    var split: Int
    """CTAs of a (split, 1, 1) cluster sharing one 64-row block, each on its own K part, their
    sums added through distributed shared memory (1: no cluster)."""

    def write_to(self, mut writer: Some[Writer]):
        """The plan text: "wgmma swap-AB 64xTN s=S c=C" (weight rows x tokens per CTA), then
        " k=KB" (K per stage), " rot" (rotated K walks) and " P=S" (K split over clusters of S)
        where they apply."""
        writer.write("wgmma swap-AB ", ROWS, "x", self.tn, " s=", self.stages, " c=", self.consumers)
        if self.ksub > 1:
            writer.write(" k=", self.ksub * BK)
        if self.rotate:
            writer.write(" rot")
        if self.split > 1:
            writer.write(" P=", self.split)

    def threads(self) -> Int:
        return 128 * (1 + self.consumers)

    def consumer_regs(self) -> Int:
        """Registers per consumer thread after setmaxnreg, the producer keeping 40, one CTA per
        SM: 40 + 2 x 232 = 3 x 168 (384 threads; one consumer: 40 + 232 <= 2 x 255)."""
        return 232

    def x_tile(self) -> Int:
        return self.tn * BK

    def out_bytes(self) -> Int:
        """fp32 accumulators of all consumers, token-major, OUT_STRIDE floats per token."""
        return self.consumers * self.tn * OUT_STRIDE * 4

    def ring_bytes(self) -> Int:
        """The ring, or the accumulators that reuse it once it is drained, the larger."""
        return max(self.stages * self.ksub * (W_TILE + self.x_tile()), self.out_bytes())

    def smem_bytes(self) -> Int:
        # ring (then accumulators) | cache row address per token | full + empty barriers
        return self.ring_bytes() + 8 * self.tn + 16 * self.stages


comptime DECODE_STAGES = 8
"""Most stages (`decode_config` takes fewer when they do not fit in SMEM_BUDGET_SM90_SM90). Measured at
N = 8192 with 128-wide stages: 10 or 12 stages were 0-10 % slower (the ring is not the limit)."""
comptime DECODE_CONSUMERS = 2
"""Consumer warpgroups. Measured at N = 8192: one was 7-60 % slower (its wgmma -> wait ->
promote chain per K tile is not hidden), three (152 registers each) no faster than two; two
consumers splitting the tokens of every stage (each 64 x tn/2) 18-32 % slower (the weight
tile is then read from shared memory twice)."""
comptime ROTATE_MIN_TN = 32
"""Rotated K walks from this token tile on: at N = 8192 they gain ~3 % at T = 64 and lose ~3 %
at T = 1 (K = 4096)."""


def decode_config(t: Int) -> DecodeConfig:
    """The CTA shape for T tokens: the smallest tn in {8, 16, 32, 64, 128} holding them, the K
    per stage, and as many stages (up to DECODE_STAGES) as fit in SMEM_BUDGET_SM90 next to the
    accumulators."""
    var tn = 8
    while tn < t and tn < MAX_TOKENS:
        tn *= 2
    var stages = DECODE_STAGES
    # K per stage, measured at N = 8192, K = 8192: 256 for tn <= 16, 512 up to 64 tokens
    # (384 and 256 at tn = 64 are 2-10 % slower); 128 at tn = 128, whose accumulators leave
    # room for few stages
    var ksub = 2 if tn <= 16 else (4 if tn <= 64 else 1)
    var rotate = tn >= ROTATE_MIN_TN
    while DecodeConfig(tn, stages, DECODE_CONSUMERS, ksub, rotate, 1).smem_bytes() > SMEM_BUDGET_SM90:
        stages -= 1
    return DecodeConfig(tn, stages, DECODE_CONSUMERS, ksub, rotate, 1)


comptime SPLIT_MAX = 4
"""Most CTAs per cluster of the split decode (clusters of up to 4 fit one wave of 120 CTAs on
the H200, `cluster_wave_cap`)."""


def decode_split_config(t: Int, split: Int) -> DecodeConfig:
    """`decode_config(t)` with its K split over a (split, 1, 1) cluster (no rotated walks: each
    CTA walks its own K part)."""
    var cfg = decode_config(t)
    return DecodeConfig(cfg.tn, cfg.stages, cfg.consumers, cfg.ksub, False, split)


@always_inline
def _lane_token_scales[gm: Int, gn: Int, gk: Int, TN: Int, V: Int](
    in_scale: F32Ptr, w_scale: F32Ptr, shape: KCacheShape, blk: Int, t0: Int, n0: Int, lane: Int
) -> SIMD[F32, V]:
    """Token scales of 128-wide K block blk (clamped to the last) that one lane loads for its
    warp: input_scale of tokens t0 + lane + 32 v (v < V; 0 past T or the tile), times the
    CTA's weight_scale when all its rows share one (gn % ROWS == 0)."""
    var kb = (min(blk, ceildiv(Int(shape.K), BK) - 1) * BK) // gk
    var T = Int(shape.T)
    var as_stride = Int(shape.as_stride)
    var v = SIMD[F32, V]()
    comptime for i in range(V):
        var t = t0 + lane + 32 * i
        v[i] = in_scale[unsafe_offset=kb * as_stride + t // gm] if (lane + 32 * i < TN and t < T) else Float32(0)
    comptime if gn % ROWS == 0:
        v *= w_scale[unsafe_offset=(n0 // gn) * Int(shape.ws_stride) + kb]
    return v


@always_inline
def _row_scales[gn: Int, gk: Int](w_scale: F32Ptr, shape: KCacheShape, blk: Int, n_lo: Int) -> SIMD[F32, 2]:
    """weight_scale of rows n_lo and n_lo + 8 for 128-wide K block blk (clamped to the last); 0
    past N. Only when gn % ROWS != 0 (else `_lane_token_scales` carries the weight scale)."""
    var kb = (min(blk, ceildiv(Int(shape.K), BK) - 1) * BK) // gk
    var sw = SIMD[F32, 2]()
    comptime for h in range(2):
        var n = n_lo + 8 * h
        sw[h] = w_scale[unsafe_offset=(n // gn) * Int(shape.ws_stride) + kb] if n < Int(shape.N) else Float32(0)
    return sw


@__llvm_arg_metadata(w_tma, `nvvm.grid_constant`)
@__llvm_arg_metadata(x_tma, `nvvm.grid_constant`)
@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(cfg.threads())),
    `nvvm.minctasm`=SIMDLength(1),
)
def _wgmma_decode_kernel[
    sink_t: RowSink, gm: Int, gn: Int, gk: Int, cfg: DecodeConfig,
    w_tile: Coord, w_desc: Coord, x_tile: Coord, x_desc: Coord,
](
    w_tma: TMATensorTile[FP8, w_tile, w_desc],
    x_tma: TMATensorTile[FP8, x_tile, x_desc],
    offsets: U32Ptr,
    in_scale: F32Ptr,
    w_scale: F32Ptr,
    kv_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    sink: sink_t,
    shape: KCacheShape,
):
    comptime assert cfg.consumers == 1 or cfg.consumers == 2, "consumer_regs budgets 1 or 2 consumers"
    comptime TN = cfg.tn
    comptime STAGES = cfg.stages
    comptime X_TILE = cfg.x_tile()
    comptime KS = cfg.ksub
    comptime W_STAGE = KS * W_TILE
    comptime X_STAGE = KS * X_TILE
    comptime STAGE_BYTES = W_STAGE + X_STAGE
    comptime FRAG = ROWS * TN // 128
    comptime w_layout = tile_layout_k_major_typed[FP8, ROWS, BK, SW]
    comptime x_layout = tile_layout_k_major_typed[FP8, TN, BK, SW]
    comptime group = sink_t.group
    var smem = external_memory[Scalar[FP8], address_space=AddressSpace.SHARED, alignment=1024]()
    var w_smem = smem
    var x_smem = smem.unsafe_offset(STAGES * W_STAGE)
    var out_sh = smem.unsafe_bitcast[Float32]()  # the accumulators, once the ring is drained
    # each token's output row address (0: not written), resolved while the ring fills
    var rows = smem.unsafe_offset(cfg.ring_bytes()).unsafe_bitcast[Int64]()
    var full = rows.unsafe_offset(TN).unsafe_bitcast[SharedMemBarrier]()
    var empty = full.unsafe_offset(STAGES)

    var tid = thread_idx.x
    launch_dependent_grids()  # PDL (common/pdl.mojo): the next kernel may become resident
    if tid == 0:
        comptime for s in range(STAGES):
            full[unsafe_offset=s].init(1)
            empty[unsafe_offset=s].init(1)  # the one consumer that took the stage
    barrier()

    comptime P = cfg.split
    comptime assert P >= 1 and P <= SPLIT_MAX, "split: 1 to SPLIT_MAX CTAs per cluster"
    var K = Int(shape.K)
    var N = Int(shape.N)
    var ks = 0  # rank in the cluster: this CTA's K part
    var n0 = block_idx.x * ROWS
    var k_lo = 0  # this CTA's first K tile; it walks num_k_tiles of them (maybe none)
    var num_k_tiles = ceildiv(K, BK * KS)
    comptime if P > 1:  # (P = 1 keeps the unsplit kernel's code as it was)
        ks = block_idx.x % P
        n0 = (block_idx.x // P) * ROWS
        var part = ceildiv(num_k_tiles, P)
        k_lo = ks * part
        num_k_tiles = max(0, min(part, num_k_tiles - k_lo))
    var t0 = block_idx.y * TN
    var wg = tid // 128
    # step kt of this CTA's K walk reads K tile (kt + rot) % num_k_tiles
    var rot = walk_start(num_k_tiles) if cfg.rotate else 0

    @always_inline
    @__parameter
    def load_weights(kt: Int):
        var s = kt % STAGES
        full[unsafe_offset=s].expect_bytes(Int32(STAGE_BYTES))  # weights and tokens of the stage
        var kp = k_lo + walk_step(kt, rot, num_k_tiles)
        comptime for j in range(KS):
            var w_dst = TileTensor(w_smem.unsafe_offset(s * W_STAGE + j * W_TILE), w_layout)
            w_tma.async_copy(w_dst, full[unsafe_offset=s], ((kp * KS + j) * BK, n0))

    # The first ring's weights are requested before the PDL wait; tokens, scales, the lookup
    # table and the cache only after it.
    var prefetched = min(STAGES, num_k_tiles)
    if tid == 0:
        for kt in range(prefetched):
            load_weights(kt)
    wait_on_dependent_grids()

    if wg == 0:
        warpgroup_reg_dealloc[40]()
        if tid < 32:  # warp 0 waits for free stages; its first lane issues the copies
            for kt in range(num_k_tiles):
                var s = kt % STAGES
                if kt >= STAGES:
                    empty[unsafe_offset=s].wait(UInt32(((kt // STAGES) & 1) ^ 1))
                if tid == 0:
                    if kt >= prefetched:
                        load_weights(kt)
                    var kp = k_lo + walk_step(kt, rot, num_k_tiles)
                    comptime for j in range(KS):
                        var x_dst = TileTensor(x_smem.unsafe_offset(s * X_STAGE + j * X_TILE), x_layout)
                        x_tma.async_copy(x_dst, full[unsafe_offset=s], ((kp * KS + j) * BK, t0))
        else:
            # warps 1-3 resolve each token's output row while the ring fills (read after the
            # barrier below): a paged sink's lookup-table read happens here, not in the
            # epilogue, where each thread's stores would wait on it (a visible tail at T = 64)
            for tl in range(tid - 32, TN, 96):
                rows[unsafe_offset=tl] = Int64(row_addr(sink, offsets, cache_lengths, lut, shape, t0 + tl))
        role_barrier()  # the consumers' accumulators are in shared memory; they store them
        comptime if P > 1:
            cluster_sync()  # the consumers' sums are final in every CTA of the cluster
            cluster_sync()  # peers' shared memory must outlive every remote read
        return

    warpgroup_reg_alloc[cfg.consumer_regs()]()
    var c = wg - 1
    var ltid = tid - 128 * wg
    var ctid = tid - 128
    var warp = ltid // 32
    var lane = ltid % 32

    # fragment register 4j + q: weight row n0 + r_lo (q < 2) or r_hi, token t0 + 8j + 2 (lane % 4)
    # + q % 2
    var r_lo = 16 * warp + lane // 4
    var n_lo = n0 + r_lo
    var accum = TileTensor(
        stack_allocation[FRAG, Float32, address_space=AddressSpace.LOCAL](), row_major[1, FRAG]()
    )
    var tmp = TileTensor(
        stack_allocation[FRAG, Float32, address_space=AddressSpace.LOCAL](), row_major[1, FRAG]()
    )
    comptime for i in range(FRAG):
        accum[0, i] = 0
    var mma = TensorCoreAsync[
        F32, FP8, FP8, Index(ROWS, TN, 32), a_swizzle=SW, b_swizzle=SW, transpose_b=True
    ]()
    # every consumer runs the same trip count (a loop bound depending on c makes ptxas serialize
    # the wgmmas, C7520); on the last round a consumer without a tile of its own repeats one with
    # its scales zeroed and does not release it (below)
    var rounds = ceildiv(num_k_tiles, cfg.consumers)
    # Scales: per K block a lane loads V = TN / 32 token scales (its warp's TN between the 32
    # lanes; times the weight scale when FOLD) and the promotion gathers the TN / 4 its
    # fragment needs with shuffles. Loaded one round ahead, each block's registers reloaded
    # right after their values are used (no register copy that waits on the load). (Under ncu, a
    # variant with each thread loading its TN / 4 scales one round ahead: the copy of the prefetched registers waited
    # on the loads as long as the consumers waited for data; without any scales T = 64 ran
    # 12 % faster, T = 128 35 %.)
    comptime V = ceildiv(TN, 32)
    comptime FOLD = gn % ROWS == 0
    var sa_buf = Array[SIMD[F32, V], KS](uninitialized=True)
    var sw_buf = Array[SIMD[F32, 2], KS](fill=SIMD[F32, 2](1))
    var kp0 = walk_step(c, rot, num_k_tiles)
    comptime if P > 1:
        # a rank of a split cluster may walk one K tile or none: clamp (the scale loads clamp
        # the block themselves)
        kp0 = k_lo + walk_step(min(c, max(num_k_tiles - 1, 0)), rot, max(num_k_tiles, 1))
    comptime for j in range(KS):
        sa_buf[j] = _lane_token_scales[gm, gn, gk, TN, V](in_scale, w_scale, shape, kp0 * KS + j, t0, n0, lane)
        comptime if not FOLD:
            sw_buf[j] = _row_scales[gn, gk](w_scale, shape, kp0 * KS + j, n_lo)
    # the last tile this consumer owns (a round past it repeats it, with zeroed scales: landed,
    # and never overwritten, as no tile follows it on its stage); a consumer without any tile
    # (num_k_tiles < consumers) repeats tile num_k_tiles - 1, its stage's first phase
    var last_own = c + cfg.consumers * ((num_k_tiles - 1 - c) // cfg.consumers) if c < num_k_tiles else num_k_tiles - 1
    for it in range(rounds):
        var own = it * cfg.consumers + c
        var mine = own < num_k_tiles
        var kt = own if mine else last_own
        var s = kt % STAGES
        # the K tile of round it + 1, whose scales replace this round's (clamped)
        var k_ahead = k_lo + walk_step(min(own + cfg.consumers, num_k_tiles - 1), rot, num_k_tiles)
        var zero = Float32(1) if mine else Float32(0)
        comptime if STAGES % cfg.consumers != 0:
            # the stage's previous tile belongs to the other consumer: an mbarrier parity
            # wait cannot tell phase q from q - 2, so first wait until that tile has been
            # released (as the producer does); with STAGES a multiple of the consumers a
            # consumer's stages are its own and their phases come one at a time
            if mine and kt >= STAGES:
                empty[unsafe_offset=s].wait(UInt32(((kt // STAGES) & 1) ^ 1))
        full[unsafe_offset=s].wait(UInt32((kt // STAGES) & 1))
        comptime for j in range(KS):
            var w_t = TileTensor(w_smem.unsafe_offset(s * W_STAGE + j * W_TILE), w_layout)
            var x_t = TileTensor(x_smem.unsafe_offset(s * X_STAGE + j * X_TILE), x_layout)
            warpgroup_fence(tmp)
            mma.arrive()
            mma.wgmma[scale_c=0](w_t, x_t, tmp)  # k32 step 0 overwrites tmp
            mma.commit_group()
            warpgroup_fence(tmp)
            mma.wait_group[0]()
            comptime if j == KS - 1:
                if ltid == 0 and mine:
                    _ = empty[unsafe_offset=s].arrive()
            var vals = sa_buf[j]
            var sw = sw_buf[j] * zero
            comptime for jj in range(TN // 8):
                comptime for p in range(2):
                    # token 8 jj + 2 (lane % 4) + p: loaded by lane (8 jj) % 32 + 2 (lane % 4) + p
                    var sa = shuffle_idx(vals[(8 * jj) // 32], UInt32((8 * jj) % 32 + 2 * (lane % 4) + p))
                    comptime for h in range(2):
                        comptime i = 4 * jj + 2 * h + p
                        accum[0, i] = rebind[Float32](accum[0, i]) + rebind[Float32](tmp[0, i]) * (sa * sw[h])
            # unconditional (clamped past the end): a branch here serializes the wgmmas
            sa_buf[j] = _lane_token_scales[gm, gn, gk, TN, V](
                in_scale, w_scale, shape, k_ahead * KS + j, t0, n0, lane)
            comptime if not FOLD:
                sw_buf[j] = _row_scales[gn, gk](w_scale, shape, k_ahead * KS + j, n_lo)

    # epilogue: accumulators to shared memory as out[c][token][row] (over the ring: every
    # consumer is past its last stage, and every copy has landed, once all consumers arrive
    # here), then rows to the cache
    named_barrier[Int32(128 * cfg.consumers)](1)
    var out_c = out_sh.unsafe_offset(c * TN * OUT_STRIDE)
    comptime for j in range(TN // 8):
        comptime for q in range(4):
            var tl = 8 * j + 2 * (lane % 4) + q % 2
            var rl = r_lo + 8 * (q // 2)
            out_c[unsafe_offset=tl * OUT_STRIDE + rl] = rebind[Float32](accum[0, 4 * j + q])
    role_barrier()  # joins the producer's role_barrier above

    comptime VEC = 16 // size_of[sink_t.dtype]()
    comptime CHUNKS = ROWS // VEC
    comptime CT = 128 * cfg.consumers  # consumer threads
    comptime if P > 1:
        # each CTA adds its consumers' sums into set 0; once every CTA of the cluster has, CTA
        # ks stores the chunks e = ks, ks + P, ... adding the P CTAs' sums through
        # distributed shared memory
        for e in range(ctid, TN * ROWS // 4, CT):
            var off = (e // (ROWS // 4)) * OUT_STRIDE + (e % (ROWS // 4)) * 4
            var v4 = out_sh.unsafe_offset(off).unsafe_load[width=4, alignment=16]()
            comptime for cc in range(1, cfg.consumers):
                v4 += out_sh.unsafe_offset(cc * TN * OUT_STRIDE + off).unsafe_load[width=4, alignment=16]()
            out_sh.unsafe_offset(off).unsafe_store[alignment=16](v4)
        cluster_sync()
    for e_p in range(ctid, ceildiv(TN * CHUNKS, P), CT):
        var e = e_p * P + ks
        if e >= TN * CHUNKS:
            continue
        var tl = e // CHUNKS
        var dst_addr = Int(rows[unsafe_offset=tl])
        if dst_addr == 0:
            continue
        var nl = (e % CHUNKS) * VEC
        var n = n0 + nl
        if n >= N:
            continue
        var v = SIMD[F32, VEC](0)
        comptime if P > 1:
            comptime for g in range(VEC // 4):
                var part = SIMD[F32, 4](0)
                comptime for r in range(P):
                    part += load_cluster_smem[F32, 4](out_sh.unsafe_offset(tl * OUT_STRIDE + nl + 4 * g), UInt32(r))
                comptime for i in range(4):
                    v[4 * g + i] = part[i]
        else:
            v = out_sh.unsafe_offset(tl * OUT_STRIDE + nl).unsafe_load[width=VEC, alignment=16]()
            comptime for cc in range(1, cfg.consumers):
                v += out_sh.unsafe_offset((cc * TN + tl) * OUT_STRIDE + nl).unsafe_load[width=VEC, alignment=16]()
        comptime if is_fp8_cache[sink_t.dtype]():
            if Int(shape.n_kv_scale) > 1:
                comptime for i in range(VEC):
                    v[i] = v[i] / kv_scale[unsafe_offset=min(n + i, N - 1) // group]
            else:
                v = v / kv_scale[unsafe_offset=0]
        var out = store_cast[sink_t.dtype, VEC](v)
        var dst = row_ptr[sink_t](dst_addr).unsafe_offset(n)
        if n + VEC <= N and Int(dst) % 16 == 0:
            dst.unsafe_store[alignment=16](0, out)
        else:
            comptime for i in range(VEC):
                if n + i < N:
                    dst[unsafe_offset=i] = out[i]
    comptime if P > 1:
        cluster_sync()  # peers' shared memory must outlive every remote read


def launch_wgmma_decode[gm: Int, gn: Int, gk: Int, sink_t: RowSink, cfg: DecodeConfig](
    hidden: Fp8Ptr,
    offsets: U32Ptr,
    weight: Fp8Ptr,
    in_scale: F32Ptr,
    w_scale: F32Ptr,
    kv_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    sink: sink_t,
    shape: KCacheShape,
    ctx: DeviceContext,
) raises:
    """Builds the two TMA descriptors (host side, no allocation) and launches ceil(N / 64)
    · cfg.split x ceil(T / tn) CTAs of shape `cfg` (from `decode_config` or
    `decode_split_config`), in (cfg.split, 1, 1) clusters when cfg.split > 1."""
    var T = Int(shape.T)
    var K = Int(shape.K)
    var N = Int(shape.N)
    comptime SMEM = cfg.smem_bytes()
    var w_tma = create_tma_tile[ROWS, BK, swizzle_mode=SW](
        ctx, TileTensor(ptr=weight, layout=row_major(N, K))
    )
    var x_tma = create_tma_tile[cfg.tn, BK, swizzle_mode=SW](
        ctx, TileTensor(ptr=hidden, layout=row_major(T, K))
    )
    comptime kernel = _wgmma_decode_kernel[
        sink_t, gm, gn, gk, cfg,
        type_of(w_tma).tile_shape, type_of(w_tma).desc_shape,
        type_of(x_tma).tile_shape, type_of(x_tma).desc_shape,
    ]
    var grid = (ceildiv(N, ROWS) * cfg.split, ceildiv(T, cfg.tn))
    comptime if cfg.split > 1:
        ctx.enqueue_function[kernel](
            w_tma, x_tma, offsets, in_scale, w_scale, kv_scale, cache_lengths, lut, sink, shape,
            grid_dim=grid,
            block_dim=cfg.threads(),
            shared_mem_bytes=SMEM,
            cluster_dim=Dim(cfg.split, 1, 1),
            func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(SMEM)),
            attributes=pdl_attributes(),
        )
    else:
        ctx.enqueue_function[kernel](
            w_tma, x_tma, offsets, in_scale, w_scale, kv_scale, cache_lengths, lut, sink, shape,
            grid_dim=grid,
            block_dim=cfg.threads(),
            shared_mem_bytes=SMEM,
            func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(SMEM)),
            attributes=pdl_attributes(),
        )

"""Hopper (sm_90a) path of `k_matmul_ragged_paged_scale` for many tokens: TMA + wgmma FP8.

Warp-specialized: one CTA computes a (64 · consumers)-token x BN-column tile (LARGE: 128 x
128, 384 threads; SMALL: 64 x 64, 256 threads, used when LARGE would leave SMs idle:
`wgmma_large_tiles`, which dispatch.mojo's `k_cache_gpu_plan` calls; TALL_PERSISTENT: 192 x
128, 512 threads, one CTA per SM walking the tiles, for problems of many waves:
`wgmma_tall_tiles`; TALL and LARGE_PERSISTENT: candidates the GPU harness times). Warpgroup 0's first thread
streams BM x 128 and BN x 128 e4m3 tiles of hidden_state and weight (K-major, 128B swizzle) by
TMA into a ring of `stages` "full"/"empty" mbarriers (a persistent CTA's ring runs on from one
tile to the next); each consumer warpgroup owns 64 tokens and issues wgmma m64nBNk32 (4 per K
tile, the first with scale-d = 0 so the block accumulator needs no zeroing) into a per-tile
fp32 block accumulator, then multiplies it by that K block's input_scale (per token) and
weight_scale (per column) in fp32 registers and adds it to the running fp32 result (promotion:
Hopper's FP8 tensor cores accumulate with reduced precision, so no sum longer than one
128-wide block stays inside them). With gn a multiple of the tile width and at most two
consumers, two block accumulators alternate: tile kt + 1's wgmmas are issued before tile kt is
waited for (wait_group 1), released and promoted, so the promotion overlaps the warpgroup's
own next MMAs (it is the serial part of a block-scaled FP8 main loop;
docs/design/k_matmul_ragged_paged_scale.md); three consumers have registers for one block
accumulator each and hide each other's promotion. The epilogue divides by kv_scale for an fp8
destination, casts, and stores each token's row segment straight into its row (sink.mojo:
rows past T, skipped tokens and columns past N are not written). Requirements (checked by
`wgmma_path_supported`): gk % 128 == 0, K % 16 == 0 and dense rows (TMA strides are 16-byte
multiples). TMA zero-fills the tails of T, N and K.
"""

from std.math import ceildiv
from std.memory import stack_allocation
from std.sys import size_of
from std.utils.index import Index
from std.utils.static_tuple import StaticTuple
from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, barrier, block_idx, grid_dim, thread_idx
from max.gpu.host import DeviceAttribute, DeviceContext, FuncAttribute
from max.gpu.host.nvidia.tma import TensorMapSwizzle
from max.gpu.intrinsics import warpgroup_reg_alloc, warpgroup_reg_dealloc
from max.gpu.memory import AddressSpace, external_memory
from layout import Coord, TileTensor, row_major
from layout.tensor_core_async import TensorCoreAsync, tile_layout_k_major_typed, warpgroup_fence
from layout.tma_async import SharedMemBarrier, TMATensorTile, create_tma_tile

from ..layout import (
    F32Ptr,
    Fp8Ptr,
    KCacheShape,
    U32Ptr,
    is_fp8_cache,
    store_cast,
)
from ...common.raster import raster_tile
from ...common.target import SM90_SMS
from ..sink import RowSink, row_addr, row_ptr

comptime F32 = DType.float32
comptime FP8 = DType.float8_e4m3fn
comptime BK = 128
"""K per stage: 128 e4m3 = one 128-byte swizzle row."""
comptime SW = TensorMapSwizzle.SWIZZLE_128B
comptime WG_M = 64
"""Tokens per consumer warpgroup (wgmma M)."""


@fieldwise_init
struct WgmmaConfig(ImplicitlyCopyable, Writable):
    """A CTA shape: `consumers` warpgroups of 64 tokens each, times `bn` weight rows, a ring of
    `stages` K tiles; `persistent`: one CTA per SM walks the tiles in raster order."""

    var consumers: Int
    var bn: Int
    var stages: Int
    var persistent: Bool

    def write_to(self, mut writer: Some[Writer]):
        """The plan text: "wgmma BMxBN" (tokens x weight rows per CTA), then " s=S" for a ring
        other than 4 stages and " persistent"."""
        writer.write("wgmma ", self.bm(), "x", self.bn)
        if self.stages != 4:
            writer.write(" s=", self.stages)
        if self.persistent:
            writer.write(" persistent")

    def bm(self) -> Int:
        return WG_M * self.consumers

    def threads(self) -> Int:
        return 128 * (1 + self.consumers)

    def stage_bytes(self) -> Int:
        return (self.bm() + self.bn) * BK

    def smem_bytes(self) -> Int:
        return self.stages * self.stage_bytes() + 2 * self.stages * 8

    def ctas_per_sm(self) -> Int:
        """CTAs per SM the registers are budgeted for (one; SMALL: two)."""
        return 2 if self.consumers == 1 else 1

    def double_blocks(self) -> Bool:
        """Two block accumulators per consumer (block kt + 1's wgmmas issued before block kt is
        promoted), where the registers allow: up to two consumers, not persistent (the tile
        loop's state on top of three accumulators spilled 228 bytes)."""
        return self.consumers <= 2 and not self.persistent

    def producer_regs(self) -> Int:
        """Registers the producer warpgroup keeps after setmaxnreg."""
        return 24 if self.consumers == 3 else 40

    def consumer_regs(self) -> Int:
        """Registers per consumer thread after setmaxnreg: the SM's 65536 over `ctas_per_sm`
        CTAs (LARGE 40 + 2 x 232; SMALL 40 + 160 of 2 x 128; three consumers 24 + 3 x 160 of
        4 x 128: one block accumulator each)."""
        return 232 if self.consumers == 2 else 160


comptime LARGE = WgmmaConfig(consumers=2, bn=128, stages=4, persistent=False)
"""128 tokens x 128 columns, 384 threads: many tokens."""
comptime SMALL = WgmmaConfig(consumers=1, bn=64, stages=4, persistent=False)
"""64 tokens x 64 columns, 256 threads: four times the CTAs when LARGE leaves SMs idle."""
comptime LARGE_PERSISTENT = WgmmaConfig(consumers=2, bn=128, stages=4, persistent=True)
"""LARGE with one CTA per SM walking the tiles (see TALL_PERSISTENT), one block accumulator per
consumer. Not dispatched: the GPU harness times it against LARGE."""
comptime TALL = WgmmaConfig(consumers=3, bn=128, stages=5, persistent=False)
"""192 tokens x 128 columns, 512 threads: 1/6 fewer L2 -> SM bytes per FLOP than LARGE (an
FP8 128 x 128 tile needs ~9 TB/s of them at 1.2 PFLOP/s); one block accumulator per consumer,
the three consumers hiding each other's promotion. Not dispatched: the GPU harness times it
against LARGE."""
comptime TALL_PERSISTENT = WgmmaConfig(consumers=3, bn=128, stages=5, persistent=True)
"""TALL with one CTA per SM walking the tiles (raster groups of RASTER_GROUP_M M tiles): the
ring streams on across tiles (no fill per tile), the epilogue overlaps the next tile's loads.
Dispatched for big problems (`wgmma_tall_tiles`)."""
comptime MIN_CTAS_FOR_LARGE = 120
"""LARGE tiles from this many CTAs on (`wgmma_large_tiles`)."""
comptime TALL_MIN_WAVES = 10
"""TALL_PERSISTENT from this many waves of 192 x 128 tiles on: measured +4-9 % over LARGE at
10.7 and 21 waves (K >= 4096), 3-40 % slower at 1-3 waves, where the partial last wave and the
1.5x taller tiles leave SMs idle."""
comptime TALL_MIN_K = 4096
"""... and from this K on: a shorter main loop gains nothing from the unbroken ring (even with
LARGE at K = 3072, +4-9 % from K = 4096)."""
comptime RASTER_GROUP_M = 8
"""M tiles per raster group of a persistent walk: concurrent CTAs share tokens and weights in
L2 (the weights of N = K = 8192 are 64 MB, more than L2)."""


@always_inline
def _tile_scales[gm: Int, gn: Int, gk: Int](
    in_scale: F32Ptr, w_scale: F32Ptr, shape: KCacheShape, kt: Int, r_lo: Int, n0: Int
) -> SIMD[F32, 4]:
    """K tile kt's scales for a consumer thread when gn is a multiple of the tile width: (input
    scale of token r_lo, of token r_lo + 8 (0 past T), weight scale of the tile's columns, 0)."""
    var kb = (kt * BK) // gk
    var as_stride = Int(shape.as_stride)
    var T = Int(shape.T)
    var r_hi = r_lo + 8
    return SIMD[F32, 4](
        in_scale[unsafe_offset=kb * as_stride + r_lo // gm] if r_lo < T else Float32(0),
        in_scale[unsafe_offset=kb * as_stride + r_hi // gm] if r_hi < T else Float32(0),
        w_scale[unsafe_offset=(n0 // gn) * Int(shape.ws_stride) + kb],
        Float32(0),
    )


@__llvm_arg_metadata(a_tma, `nvvm.grid_constant`)
@__llvm_arg_metadata(b_tma, `nvvm.grid_constant`)
@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(cfg.threads())),
    `nvvm.minctasm`=SIMDLength(cfg.ctas_per_sm()),
)
def _wgmma_kernel[
    sink_t: RowSink, gm: Int, gn: Int, gk: Int, cfg: WgmmaConfig,
    a_tile: Coord, a_desc: Coord, b_tile: Coord, b_desc: Coord,
](
    a_tma: TMATensorTile[FP8, a_tile, a_desc],
    b_tma: TMATensorTile[FP8, b_tile, b_desc],
    offsets: U32Ptr,
    in_scale: F32Ptr,
    w_scale: F32Ptr,
    kv_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    sink: sink_t,
    shape: KCacheShape,
):
    comptime BM = cfg.bm()
    comptime BN = cfg.bn
    comptime STAGES = cfg.stages
    comptime A_TILE = BM * BK
    comptime B_TILE = BN * BK
    comptime STAGE_BYTES = A_TILE + B_TILE
    comptime FRAG = WG_M * BN // 128
    comptime a_layout = tile_layout_k_major_typed[FP8, WG_M, BK, SW]
    comptime a_full_layout = tile_layout_k_major_typed[FP8, BM, BK, SW]
    comptime b_layout = tile_layout_k_major_typed[FP8, BN, BK, SW]
    comptime group = sink_t.group
    var smem = external_memory[Scalar[FP8], address_space=AddressSpace.SHARED, alignment=1024]()
    var a_smem = smem
    var b_smem = smem.unsafe_offset(STAGES * A_TILE)
    var full = smem.unsafe_offset(STAGES * STAGE_BYTES).unsafe_bitcast[SharedMemBarrier]()
    var empty = full.unsafe_offset(STAGES)

    var tid = thread_idx.x
    if tid == 0:
        comptime for s in range(STAGES):
            full[unsafe_offset=s].init(1)
            empty[unsafe_offset=s].init(Int32(cfg.consumers))  # one arrival per consumer
    barrier()

    var K = Int(shape.K)
    var T = Int(shape.T)
    var N = Int(shape.N)
    var num_k_tiles = ceildiv(K, BK)
    var ntn = ceildiv(N, BN)
    var ntm = ceildiv(T, BM)
    # the tiles this CTA computes: tile i of [first, last) in steps of `step` (one tile of the
    # 2-D grid unless persistent); the ring position runs on across them
    var first = block_idx.x if cfg.persistent else 0
    var last = ntm * ntn if cfg.persistent else 1
    var step = grid_dim.x if cfg.persistent else 1
    var wg = tid // 128

    @always_inline
    @__parameter
    def tile_origin(i: Int) -> Tuple[Int, Int]:
        """(m0, n0) of tile i."""
        comptime if cfg.persistent:
            var t = raster_tile[RASTER_GROUP_M](i, ntm, ntn)
            return (t[0] * BM, t[1] * BN)
        else:
            return (block_idx.y * BM, block_idx.x * BN)

    # setmaxnreg: besides moving registers to the consumers, it is what stops ptxas from
    # serializing the wgmmas of this kernel (C7520, measured: +25-30 % at 128 x 128 tiles)
    if wg == 0:
        warpgroup_reg_dealloc[cfg.producer_regs()]()
        if tid == 0:
            var g = 0  # K tiles loaded so far: the ring position
            for i in range(first, last, step):
                var o = tile_origin(i)
                for kt in range(num_k_tiles):
                    var s = g % STAGES
                    if g >= STAGES:
                        empty[unsafe_offset=s].wait(UInt32(((g // STAGES) & 1) ^ 1))
                    full[unsafe_offset=s].expect_bytes(Int32(STAGE_BYTES))
                    var a_dst = TileTensor(a_smem.unsafe_offset(s * A_TILE), a_full_layout)
                    var b_dst = TileTensor(b_smem.unsafe_offset(s * B_TILE), b_layout)
                    a_tma.async_copy(a_dst, full[unsafe_offset=s], (kt * BK, o[0]))
                    b_tma.async_copy(b_dst, full[unsafe_offset=s], (kt * BK, o[1]))
                    g += 1
        return

    warpgroup_reg_alloc[cfg.consumer_regs()]()
    var c = wg - 1
    var ltid = tid - 128 * wg
    var warp = ltid // 32
    var lane = ltid % 32
    var accum = TileTensor(
        stack_allocation[FRAG, Float32, address_space=AddressSpace.LOCAL](), row_major[1, FRAG]()
    )
    var blk = TileTensor(
        stack_allocation[FRAG, Float32, address_space=AddressSpace.LOCAL](), row_major[1, FRAG]()
    )
    var mma = TensorCoreAsync[
        F32, FP8, FP8, Index(WG_M, BN, 32), a_swizzle=SW, b_swizzle=SW, transpose_b=True
    ]()
    var as_stride = Int(shape.as_stride)
    var ws_stride = Int(shape.ws_stride)

    @always_inline
    def issue(g: UInt32, buf: type_of(blk)) {var full, var a_smem, var b_smem, var c, mma}:
        """Waits for ring position g and issues its 4 wgmma k32 steps into buf as one group
        (step 0 overwrites buf: no zeroing moves, which made ptxas inject warpgroup.arrive)."""
        var s = Int(g % UInt32(STAGES))
        full[unsafe_offset=s].wait((g // UInt32(STAGES)) & 1)
        warpgroup_fence(buf)
        mma.arrive()
        mma.wgmma[scale_c=0](
            TileTensor(a_smem.unsafe_offset(s * A_TILE + c * WG_M * BK), a_layout),
            TileTensor(b_smem.unsafe_offset(s * B_TILE), b_layout),
            buf,
        )
        mma.commit_group()
        warpgroup_fence(buf)

    @always_inline
    def release(g: UInt32, buf: type_of(blk)) {var empty, var ltid}:
        """After the wait that completes ring position g's group in buf: frees its stage (one
        arrival per consumer warpgroup)."""
        warpgroup_fence(buf)
        if ltid == 0:
            _ = empty[unsafe_offset=Int(g % UInt32(STAGES))].arrive()

    @always_inline
    def promote(buf: type_of(blk), sc: SIMD[F32, 4]) {var accum}:
        """accum += buf x input scale x weight scale (sc from _tile_scales): register i holds
        token r_lo (i % 4 < 2) or r_lo + 8."""
        comptime for i in range(FRAG):
            var f = sc[i % 4 // 2] * sc[2]
            accum[0, i] = rebind[Float32](accum[0, i]) + rebind[Float32](buf[0, i]) * f

    var g0 = UInt32(0)  # ring position of this tile's first K tile (32-bit: consumer registers)
    var i32 = UInt32(first)
    while i32 < UInt32(last):
        var o = tile_origin(Int(i32))
        i32 += UInt32(step)
        var m0 = o[0]
        var n0 = o[1]
        var r_lo = m0 + c * WG_M + warp * 16 + lane // 4
        var r_hi = r_lo + 8
        var col0 = n0 + 2 * (lane % 4)
        comptime for j in range(FRAG):
            accum[0, j] = 0

        comptime if gn % BN == 0 and cfg.double_blocks():
            # two block accumulators: block kt + 1's wgmmas are issued before block kt is
            # promoted (wait_group 1), so a warpgroup's promotion overlaps its own next MMAs
            var blk2 = TileTensor(
                stack_allocation[FRAG, Float32, address_space=AddressSpace.LOCAL](), row_major[1, FRAG]()
            )
            var sc = _tile_scales[gm, gn, gk](in_scale, w_scale, shape, 0, r_lo, n0)
            issue(g0, blk)
            var last_kt = num_k_tiles - 1
            for p in range(last_kt // 2):
                comptime for h in range(2):  # blk and blk2 alternate at compile time
                    var kt = 2 * p + h
                    var cur = blk if h == 0 else blk2
                    var nxt = blk2 if h == 0 else blk
                    var sc_next = _tile_scales[gm, gn, gk](in_scale, w_scale, shape, kt + 1, r_lo, n0)
                    issue(g0 + UInt32(kt + 1), nxt)
                    mma.wait_group[1]()
                    release(g0 + UInt32(kt), cur)
                    promote(cur, sc)
                    sc = sc_next
            if last_kt % 2 == 1:  # blocks last - 1 (in blk) and last (in blk2) remain
                var sc_last = _tile_scales[gm, gn, gk](in_scale, w_scale, shape, last_kt, r_lo, n0)
                issue(g0 + UInt32(last_kt), blk2)
                mma.wait_group[1]()
                release(g0 + UInt32(last_kt - 1), blk)
                promote(blk, sc)
                mma.wait_group[0]()
                release(g0 + UInt32(last_kt), blk2)
                promote(blk2, sc_last)
            else:  # block last remains, in blk
                mma.wait_group[0]()
                release(g0 + UInt32(last_kt), blk)
                promote(blk, sc)
        elif gn % BN == 0:
            # one block accumulator: the other consumers' MMAs run while this one promotes
            for kt in range(num_k_tiles):
                var sc = _tile_scales[gm, gn, gk](in_scale, w_scale, shape, kt, r_lo, n0)
                issue(g0 + UInt32(kt), blk)
                mma.wait_group[0]()
                release(g0 + UInt32(kt), blk)
                promote(blk, sc)
        else:
            # gn not a multiple of BN: a weight scale per column, one block at a time
            for kt in range(num_k_tiles):
                var kb = (kt * BK) // gk
                var sa_lo = in_scale[unsafe_offset=kb * as_stride + r_lo // gm] if r_lo < T else Float32(0)
                var sa_hi = in_scale[unsafe_offset=kb * as_stride + r_hi // gm] if r_hi < T else Float32(0)
                issue(g0 + UInt32(kt), blk)
                mma.wait_group[0]()
                release(g0 + UInt32(kt), blk)
                # fragment register 4j + q holds row (q < 2 ? r_lo : r_hi), column
                # n0 + 8j + 2 (lane % 4) + q % 2
                comptime for j in range(FRAG // 4):
                    comptime for q in range(4):
                        comptime ii = 4 * j + q
                        var n = col0 + 8 * j + q % 2
                        var sw = w_scale[unsafe_offset=(n // gn) * ws_stride + kb] if n < N else Float32(0)
                        var sa = sa_lo if q < 2 else sa_hi
                        accum[0, ii] = rebind[Float32](accum[0, ii]) + rebind[Float32](blk[0, ii]) * (sa * sw)
        g0 += UInt32(num_k_tiles)

        # epilogue: each token's row segment straight to its destination row
        comptime for half in range(2):
            var addr = row_addr(sink, offsets, cache_lengths, lut, shape, r_lo + 8 * half)
            if addr != 0:
                var dst = row_ptr[sink_t](addr)
                comptime for j in range(FRAG // 4):
                    var n = col0 + 8 * j
                    var v = SIMD[F32, 2](
                        rebind[Float32](accum[0, 4 * j + 2 * half]),
                        rebind[Float32](accum[0, 4 * j + 2 * half + 1]),
                    )
                    comptime if is_fp8_cache[sink_t.dtype]():
                        if Int(shape.n_kv_scale) > 1:
                            v = v / SIMD[F32, 2](
                                kv_scale[unsafe_offset=n // group],
                                kv_scale[unsafe_offset=(n + 1) // group],
                            )
                        else:
                            v = v / kv_scale[unsafe_offset=0]
                    var out = store_cast[sink_t.dtype, 2](v)
                    if n + 1 < N:
                        dst.unsafe_offset(n).unsafe_store[alignment=2 * size_of[sink_t.dtype]()](0, out)
                    elif n < N:
                        dst[unsafe_offset=n] = out[0]


def wgmma_path_supported[gk: Int](shape: KCacheShape) -> Bool:
    """Whether gk % 128 == 0, K % 16 == 0 and rows are dense (TMA: 16-byte global strides)."""
    comptime if gk % 128 != 0:
        return False
    return (
        Int(shape.K) % 16 == 0
        and Int(shape.a_stride) == Int(shape.K)
        and Int(shape.w_stride) == Int(shape.K)
    )


def wgmma_large_tiles(shape: KCacheShape) -> Bool:
    """LARGE tiles when they give at least MIN_CTAS_FOR_LARGE CTAs, else SMALL ones."""
    var ctas = ceildiv(Int(shape.N), LARGE.bn) * ceildiv(Int(shape.T), LARGE.bm())
    return ctas >= MIN_CTAS_FOR_LARGE


def wgmma_tall_tiles(shape: KCacheShape) -> Bool:
    """TALL_PERSISTENT instead of LARGE: at least TALL_MIN_WAVES waves of its tiles on the
    H200's SM90_SMS SMs and K >= TALL_MIN_K."""
    var tiles = ceildiv(Int(shape.N), TALL_PERSISTENT.bn) * ceildiv(Int(shape.T), TALL_PERSISTENT.bm())
    return tiles >= TALL_MIN_WAVES * SM90_SMS and Int(shape.K) >= TALL_MIN_K


def launch_wgmma[gm: Int, gn: Int, gk: Int, sink_t: RowSink, cfg: WgmmaConfig](
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
    """Builds the two TMA descriptors (host side, no allocation) and launches the kernel with
    CTA shape `cfg` (LARGE, SMALL or TALL_PERSISTENT, as `k_cache_gpu_plan` picked them by
    `wgmma_large_tiles` and `wgmma_tall_tiles`)."""
    var T = Int(shape.T)
    var K = Int(shape.K)
    var N = Int(shape.N)
    comptime BM = cfg.bm()
    comptime BN = cfg.bn
    comptime SMEM = cfg.smem_bytes()
    var a_tma = create_tma_tile[BM, BK, swizzle_mode=SW](
        ctx, TileTensor(ptr=hidden, layout=row_major(T, K))
    )
    var b_tma = create_tma_tile[BN, BK, swizzle_mode=SW](
        ctx, TileTensor(ptr=weight, layout=row_major(N, K))
    )
    comptime kernel = _wgmma_kernel[
        sink_t, gm, gn, gk, cfg,
        type_of(a_tma).tile_shape, type_of(a_tma).desc_shape,
        type_of(b_tma).tile_shape, type_of(b_tma).desc_shape,
    ]
    var tiles = ceildiv(N, BN) * ceildiv(T, BM)
    var grid = (min(tiles, ctx.get_attribute(DeviceAttribute.MULTIPROCESSOR_COUNT)), 1) if cfg.persistent else (
        ceildiv(N, BN), ceildiv(T, BM))
    ctx.enqueue_function[kernel](
        a_tma, b_tma, offsets, in_scale, w_scale, kv_scale, cache_lengths, lut, sink, shape,
        grid_dim=grid,
        block_dim=cfg.threads(),
        shared_mem_bytes=SMEM,
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(SMEM)),
    )

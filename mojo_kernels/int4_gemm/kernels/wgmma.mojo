"""W4A16 wgmma kernel of `multistage_gemm_q` for Hopper (sm_90a): `int4_gemm_wgmma_kernel`.

    C[M, N] = x[M, Kp] · W[N, Kp]ᵀ (+ bias[N]),  W[n, k] = (q[n, k] - z) · s[k // g, n]

Same operands, layout and math as `mma.mojo` (see there and python/mojo_gemm/int4/layout.py); fp32
accumulation, one rounding to `dtype` at the end, masked stores (m < M, n < N): straight from
the fragments, or (split K, warp-k) staged through an fp32 tile in shared memory.

Design ("swap AB" with register-A wgmma, no shared-memory write of dequantized weights):
- The weights are wgmma's A operand (m64 = output columns), the activations its B operand
  (n = tokens, K-major, read by wgmma straight from a 128B-swizzled shared-memory tile).
- wgmma's register-A fragment of a 64 x 16 block is, per warp w of the warpgroup, the
  mma.m16n8k16 A fragment of rows 16w..16w+15: exactly what one 4-byte word of a lane's
  16-byte slice of a packed 16(K) x 64(N) tile holds (word j = column block 16j..16j+15). So
  warp w of a warpgroup may supply *any* 16 columns: warp w owns fpw words (m16 blocks) of one
  band, and wgmma i of a k16 step multiplies, in warp w, block jb(w) + i of band b(w). One
  warpgroup thus covers 64 * fpw columns with fpw wgmma per k16 step and one 8- or 16-byte
  shared-memory load per lane per packed tile (no bank conflicts for fpw = 4, 2-way for 2).
- Dequant in registers, per packed word: 4 x (shift/lop3 to (magic + q) pairs, sub
  (magic + z), mul s) in bf16x2 / f16x2 (exact up to the one rounding of (q - z) * s).
- Warp specialization: warpgroup 0 is the producer (warp 0: the x tile by TMA, the packed
  tiles and the scale / zero rows by 1-D bulk copies, all completing on one "full" mbarrier per
  stage); warpgroups 1..nwg consume (setmaxnreg 40 / 232 with two consumers). A consumer
  releases a stage ("empty" mbarrier, one arrival per consumer warpgroup) once its last wgmma
  batch of that stage has retired.
- wgmma batches: dequant kg k16 steps -> wgmma.fence -> kg * fpw wgmma -> commit ->
  wait_group 0. ptxas serializes every register-A wgmma of the kernel (C7513) as soon as A
  registers are written while one is in flight, so a warpgroup does not overlap its own
  dequant with its MMAs: the two consumer warpgroups overlap each other's (ping-pong).
- Split K (M <= 256 on small layers): `split_k` CTAs of a thread-block cluster; each writes
  its fp32 tile into its drained ring and stores a 1/split_k share of the rows, summed over
  the cluster's tiles through distributed shared memory (`_store_tile`).
- Warp-k partitions (cfg.wk = 2): two consumer warpgroups on the same columns take alternate
  stages with their own accumulators, added up in the same shared-memory tile. Launches with
  split_k = 1 and wk = 1 use a kernel instance without that fp32 staging (`staged = False`):
  the consumers write their rounded fragments token-major into the drained ring by stmatrix
  and store 16-byte row pieces (`_store_tile_16b`).
- Grid order: groups of 8 M-tiles walk the N-tiles (the split-K clusters of a tile stay
  together), so a wave re-uses both its x tiles and its weight tiles from L2. A launch may
  cover a range of tiles of that order (`tile0`): the dispatch runs the full waves of a
  problem split 1 and the last partial wave's tiles split K in a second launch.
- Stream-K (`streamk`, `launch_int4_gemm_wgmma_streamk`): one CTA per SM, the (tile, 64-K
  stage) units of that order dealt out evenly; a CTA walks its range as one-tile segments on
  one ring. A tile split between CTAs is summed by the CTA holding its first stage (its last
  segment) from the fp32 parts the following CTAs computed first and published in a
  workspace slot each, behind a release flag (docs/design/multistage_gemm_q.md).
- Every mbarrier wait is bounded (2 s of %globaltimer, then `trap`): a pipeline bug aborts the
  launch with an error instead of hanging the GPU.
"""

from max.gpu import thread_idx, block_idx, grid_dim, barrier, MAX_THREADS_PER_BLOCK_METADATA
from max.gpu.sync import named_barrier, syncwarp
from max.gpu.host import DeviceContext, FuncAttribute, Dim, DeviceAttribute
from max.gpu.host.nvidia.tma import TensorMapSwizzle
from max.gpu.memory import AddressSpace, external_memory
from max.gpu.intrinsics import warpgroup_reg_alloc, warpgroup_reg_dealloc
from max.gpu.compute.mma import wgmma_fence_aligned, wgmma_commit_group_sync, wgmma_wait_group_sync
from max.gpu.primitives.cluster import cluster_sync, load_cluster_smem
from layout import TileTensor, Coord, row_major
from layout.tma_async import SharedMemBarrier, TMATensorTile, create_tma_tile
from layout.tensor_core_async import tile_layout_k_major_typed
from std.utils.static_tuple import StaticTuple
from std.sys import inlined_assembly, _RegisterPackType
from std.memory import bitcast
from std.math import ceildiv

from ..config import (
    Int4WgmmaConfig, WG_BK, WG_KT, SMEM_BUDGET_SM90, INT4_MAX_SPLIT, INT4_WAIT_LIMIT_MS,
    wgmma_scale_rows, wgmma_ring_bytes, wgmma_smem_usage, try_resolve_wgmma_config, wgmma_smem_budget,
    cluster_wave_cap,
)
from .mma import magic_value, nibble_pair
from ...common.raster import raster_tile
from ...common.smem_stores import stmatrix_tokens_x4, store_row_piece
from ...common.sync import role_barrier
from ...common.handoff import (
    globaltimer, trap, st_cg_f32x4, ld_cg_f32x4, fence_acq_rel_gpu, st_release_gpu, red_release_add, wait_flag,
    wait_count,
)

comptime F32 = DType.float32
comptime SW128 = TensorMapSwizzle.SWIZZLE_128B
comptime RASTER_GROUP_M = 8
"""M-tiles per raster group when split_k == 1 (see the module doc)."""
comptime WAIT_LIMIT_NS = INT4_WAIT_LIMIT_MS * 1_000_000
"""An mbarrier wait longer than this traps (a bug, never a legitimate wait)."""


# ---- small PTX helpers -------------------------------------------------------------------
@always_inline
def _mbar_try_wait(addr: UInt32, parity: UInt32) -> Bool:
    """mbarrier.try_wait.parity (acquire, CTA scope); the memory clobber keeps later shared-memory
    loads below it."""
    var r = inlined_assembly[
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\nselp.u32 $0, 1, 0, p;\n}",
        UInt32,
        constraints="=r,r,r,~{memory}",
        has_side_effect=True,
    ](addr, parity)
    return r != 0


@always_inline
def _mbar_wait(addr: UInt32, parity: UInt32):
    """Wait for the phase of parity `parity` of the mbarrier at shared address `addr`; trap after
    WAIT_LIMIT_NS (a deadlock would otherwise hang the device)."""
    if _mbar_try_wait(addr, parity):
        return
    var t0 = globaltimer()
    while not _mbar_try_wait(addr, parity):
        if globaltimer() - t0 > UInt64(WAIT_LIMIT_NS):
            trap()


@always_inline
def _fence_mbarrier_init():
    inlined_assembly["fence.mbarrier_init.release.cluster;", NoneType, constraints="~{memory}", has_side_effect=True]()


@always_inline
def _bulk_g2s(dst: UInt32, src: UInt64, nbytes: Int, mbar: UInt32):
    """1-D bulk async copy global -> this CTA's shared memory, completing `nbytes` of transaction
    count on the mbarrier at `mbar` (16-byte aligned addresses, nbytes % 16 == 0)."""
    inlined_assembly[
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
        NoneType,
        constraints="r,l,r,r,~{memory}",
        has_side_effect=True,
    ](dst, src, UInt32(nbytes), mbar)


@always_inline
def _segment(u: UInt32, u_end: UInt32, stages: UInt32) -> Tuple[Int, Int, Int]:
    """(tile, first stage, stages) of the segment of units [u, u_end) that starts at unit u:
    the rest of u's tile, or less where u_end comes first (unit = tile * stages + stage)."""
    var first = u % stages
    return (Int(u // stages), Int(first), Int(min(stages - first, u_end - u)))


@always_inline
def _saddr[T: AnyType](p: Pointer[T, MutUntrackedOrigin, address_space=AddressSpace.SHARED]) -> UInt32:
    return UInt32(Int(p))


@always_inline
def _gaddr[T: AnyType](p: Pointer[T, MutAnyOrigin]) -> UInt64:
    return UInt64(Int(p))


@always_inline
def _x_desc(addr: UInt32) -> Int64:
    """wgmma shared-memory descriptor of a K-major, 128B-swizzled tile of rows of 64 bf16/fp16
    (1 KiB-aligned): start >> 4, LBO 16 B (unused), SBO 1024 B (8 rows), swizzle mode 1."""
    return Int64((Int(addr) & 0x3FFFF) >> 4) | (Int64(1) << 16) | (Int64(64) << 32) | (Int64(1) << 62)


@always_inline
def _pin4(v: SIMD[DType.uint32, 4]) -> SIMD[DType.uint32, 4]:
    """Empty asm that 'redefines' v: everything computing v is scheduled before this point
    (keeps the dequant and descriptor math out of the wgmma.fence ... wgmma region)."""
    var r = inlined_assembly[
        "", _RegisterPackType[UInt32, UInt32, UInt32, UInt32], constraints="=r,=r,=r,=r,0,1,2,3", has_side_effect=True
    ](v[0], v[1], v[2], v[3])
    return SIMD[DType.uint32, 4](r[0], r[1], r[2], r[3])


@always_inline
def _pin64(v: Int64) -> Int64:
    return inlined_assembly["", Int64, constraints="=l,0", has_side_effect=True](v)


@always_inline
def _dq_word[dtype: DType](w: UInt32, s: SIMD[dtype, 2], zm: SIMD[dtype, 2]) -> SIMD[DType.uint32, 4]:
    """wgmma / mma.m16n8k16 A fragment {a0, a1, a2, a3} of one packed word, dequantized:
    ((magic + q) - (magic + z)) * s; s / zm: [row l/4, row l/4 + 8]."""
    var s_lo = SIMD[dtype, 2](s[0])
    var s_hi = SIMD[dtype, 2](s[1])
    var z_lo = SIMD[dtype, 2](zm[0])
    var z_hi = SIMD[dtype, 2](zm[1])
    var a0 = (nibble_pair[dtype, 0](w) - z_lo) * s_lo    # row l/4,     k 2(l%4) + {0, 1}
    var a1 = (nibble_pair[dtype, 8](w) - z_hi) * s_hi    # row l/4 + 8
    var a2 = (nibble_pair[dtype, 4](w) - z_lo) * s_lo    # row l/4,     k + 8
    var a3 = (nibble_pair[dtype, 12](w) - z_hi) * s_hi   # row l/4 + 8, k + 8
    return bitcast[DType.uint32, 4](a0.join(a1).join(a2.join(a3)))


@always_inline
def _wgmma_rs[nt: Int, dtype: DType](a: SIMD[DType.uint32, 4], bdesc: Int64, c: SIMD[F32, nt // 2]) -> SIMD[F32, nt // 2]:
    comptime ab = "bf16" if dtype == DType.bfloat16 else "f16"
    comptime if nt == 64:
        return rebind[SIMD[F32, nt // 2]](_wgmma_rs_n64[ab](a, bdesc, rebind[SIMD[F32, 32]](c)))
    elif nt == 128:
        return rebind[SIMD[F32, nt // 2]](_wgmma_rs_n128[ab](a, bdesc, rebind[SIMD[F32, 64]](c)))
    else:
        comptime assert nt == 256, "wgmma kernel: nt must be 64, 128 or 256"
        return rebind[SIMD[F32, nt // 2]](_wgmma_rs_n256[ab](a, bdesc, rebind[SIMD[F32, 128]](c)))


# ---- the kernel ------------------------------------------------------------------------------
@__llvm_arg_metadata(x_tma, `nvvm.grid_constant`)
@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(cfg.num_threads())),
    `nvvm.minctasm`=SIMDLength(cfg.ctas),
)
def int4_gemm_wgmma_kernel[
    dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool, cfg: Int4WgmmaConfig, staged: Bool,
    streamk: Bool, gsplit: Bool, x_tile: Coord, x_desc: Coord,
](
    x_tma: TMATensorTile[dtype, x_tile, x_desc],
    c_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    qw_ptr: Pointer[UInt32, MutAnyOrigin],
    s_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    z_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    b_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    m_dim: Int32,
    n_dim: Int32,
    kp_dim: Int32,
    np_dim: Int32,
    split_k: Int32,
    tile0: Int32,
    ws_ptr: Pointer[Float32, MutAnyOrigin],
    flag_ptr: Pointer[UInt32, MutAnyOrigin],
):
    """One CTA: tokens [m0, m0 + nt) x bands [band0, band0 + nwg * fpw) x its K share.

    Grid: (tiles * split_k, rows) with (block_idx.y * grid_dim.x + block_idx.x) // split_k +
    tile0 the CTA's tile in raster order (`common/raster.raster_tile`), cluster (split_k, 1, 1) when
    split_k > 1: the whole problem is (ceil(ceil(N/64) / bands) * split_k, ceil(M / nt)) with
    tile0 = 0; a launch of `count` tiles from tile0 on is (count * split_k, 1) (the dispatch's
    data-parallel + split tail schedule); block cfg.num_threads(); dynamic smem
    config.wgmma_smem_usage(...).
    group_size <= 0: per channel (one scale row). staged: the epilogue sums the warp-k
    partitions and the split-K cluster through shared memory (required when split_k > 1 or
    cfg.wk > 1); else (split_k = 1, wk = 1) the tile goes out through the drained ring (`_store_tile_16b`).
    streamk (with staged = False, split_k = 1): grid (G, 1), G <= the units (tile x 64-K stage)
    and every CTA resident; CTA c takes units [c U / G, (c + 1) U / G) of the raster order;
    ws_ptr: G fp32 tiles of nt x bn (the parts), flag_ptr: G words, 0 on entry and on exit.
    gsplit (staged, split_k > 1, launched without a cluster): the cluster split's grid, all of
    it resident; ws_ptr: tiles x split fp32 tiles of nt x bn, flag_ptr: one counter per tile,
    0 on entry. The other tiled launches pass dummies for both.
    """
    comptime NT = cfg.nt
    comptime FPW = cfg.fpw
    comptime NWG = cfg.nwg
    comptime WK = cfg.wk
    comptime NB = cfg.bands()
    comptime S = cfg.stages
    comptime KT = WG_KT
    comptime KG = cfg.kg
    comptime PER_CHANNEL = group_size <= 0
    comptime SR = wgmma_scale_rows(group_size)
    comptime NACC = NT // 2  # fp32 accumulators per wgmma per thread
    comptime NQ4 = NT // 8  # quads (n8 token groups) per wgmma
    comptime NCT = NWG * WK * 128  # consumer threads
    comptime X_STAGE = NT * WG_BK  # elements
    comptime W_STAGE = NB * KT * 512  # bytes
    comptime S_ROW = NB * 64  # elements per scale row of the CTA
    comptime S_STAGE = SR * S_ROW  # elements
    comptime X_BYTES = S * X_STAGE * 2
    comptime W_BYTES = S * W_STAGE
    comptime S_BYTES = S * S_STAGE * 2
    comptime BAR_OFF = wgmma_ring_bytes(cfg, group_size, has_zeros)
    comptime RED_RS = NB * 64 + 4  # row stride (floats) of the output tile, see _store_tile
    comptime STAGE_TX = X_STAGE * 2 + W_STAGE + S_STAGE * 2 * (2 if has_zeros else 1)
    comptime assert cfg.is_valid(), "invalid Int4WgmmaConfig"
    comptime assert staged or WK == 1, "warp-k partitions are summed by the staged epilogue"
    comptime assert staged or not gsplit, "a global split sums its parts in the staged epilogue"
    comptime assert PER_CHANNEL or (group_size % 16 == 0 and (WG_BK % group_size == 0 or group_size % WG_BK == 0)), "group_size"
    comptime assert dtype == DType.bfloat16 or dtype == DType.float16, "bf16 / fp16 only"

    var smem = external_memory[UInt8, address_space=AddressSpace.SHARED, alignment=1024]()
    var x_s = smem.unsafe_bitcast[Scalar[dtype]]()
    var w_s = smem.unsafe_offset(X_BYTES)
    var s_s = smem.unsafe_offset(X_BYTES + W_BYTES).unsafe_bitcast[Scalar[dtype]]()
    var z_s = smem.unsafe_offset(X_BYTES + W_BYTES + S_BYTES).unsafe_bitcast[Scalar[dtype]]()
    var full = smem.unsafe_offset(BAR_OFF).unsafe_bitcast[SharedMemBarrier]()
    var empty = full.unsafe_offset(S)
    var red_s = smem.unsafe_bitcast[Float32]()  # the output tile, once the ring is drained

    var tid = thread_idx.x
    var lane = tid % 32
    var m = Int(m_dim)
    var n = Int(n_dim)
    var kp = Int(kp_dim)
    var np_ = Int(np_dim)
    var nsplit = Int(split_k)
    var nbands = ceildiv(n, 64)
    var npb = np_ // 64  # bands present in memory (>= nbands)
    var ntn = ceildiv(nbands, NB)
    var ntm = ceildiv(m, NT)
    var total_st = kp // WG_BK

    # This CTA's work: a tiled launch has one tile (in raster order) and its K share in the
    # split-K cluster; a stream-K launch an even share [u_begin, u_end) of all (tile, 64-K
    # stage) units, walked as segments of one tile each (`_segment`, 32-bit arithmetic: 64-bit
    # divisions cost the warp-specialized roles their registers).
    var ks = 0
    var lin = 0
    var m0 = 0
    var band0 = 0
    var st_begin = 0
    var nst = 0
    var u_begin = UInt32(0)
    var u_end = UInt32(0)
    comptime if streamk:
        var units = UInt32(ntm * ntn * total_st)
        u_begin = UInt32(block_idx.x) * units // UInt32(grid_dim.x)
        u_end = UInt32(block_idx.x + 1) * units // UInt32(grid_dim.x)
    else:
        ks = block_idx.x % nsplit  # == rank in the (nsplit, 1, 1) cluster (or of the global split)
        lin = Int(tile0) + (block_idx.y * grid_dim.x + block_idx.x) // nsplit
        var tile = raster_tile[RASTER_GROUP_M](lin, ntm, ntn)
        m0 = tile[0] * NT
        band0 = tile[1] * NB
        st_begin = ks * total_st // nsplit
        nst = (ks + 1) * total_st // nsplit - st_begin

    if tid == 0:
        comptime for s in range(S):
            full[unsafe_offset=s].init(1)
            empty[unsafe_offset=s].init(Int32(NWG * 128))  # every thread of the stage's consumers
        _fence_mbarrier_init()
    barrier()

    var wg = tid // 128
    if wg == 0:
        # ------------------------------ producer ------------------------------
        comptime if cfg.uses_setmaxnreg():
            warpgroup_reg_dealloc[cfg.producer_regs()]()
        if tid < 32:
            comptime xlay = tile_layout_k_major_typed[dtype, NT, WG_BK, SW128]
            @always_inline
            @__parameter
            def produce(m0: Int, band0: Int, st0: Int, count: Int, g0: Int):
                """Loads of stages st0 .. st0 + count - 1 of the tile at token m0 and band band0
                into ring positions g0 ..."""
                var contiguous = band0 + NB <= npb  # every band of the CTA is in memory
                var per_row = 1 if contiguous else NB
                var nsc = SR * per_row
                var ncopies = NB + nsc * (2 if has_zeros else 1)
                for it in range(count):
                    var g = g0 + it
                    var s = g % S
                    if g >= S:
                        _mbar_wait(_saddr(empty.unsafe_offset(s)), UInt32(((g // S) & 1) ^ 1))
                    var st = st0 + it
                    var fb = _saddr(full.unsafe_offset(s))
                    if lane == 0:
                        full[unsafe_offset=s].expect_bytes(Int32(STAGE_TX))
                        var dst = TileTensor(x_s.unsafe_offset(s * X_STAGE), xlay)
                        x_tma.async_copy(dst, full[unsafe_offset=s], (st * WG_BK, m0))
                    syncwarp()
                    var grp0 = 0
                    comptime if not PER_CHANNEL:
                        grp0 = st * WG_BK // group_size
                    var c = lane
                    while c < ncopies:
                        if c < NB:
                            # packed tiles of band band0 + c for this stage: KT * 512 contiguous bytes
                            var band = min(band0 + c, npb - 1)
                            var src = qw_ptr.unsafe_offset(band * kp * 8 + st * KT * 128)
                            _bulk_g2s(_saddr(w_s.unsafe_offset(s * W_STAGE + c * KT * 512)), _gaddr(src), KT * 512, fb)
                        else:
                            var e = c - NB
                            var is_z = e >= nsc
                            if is_z:
                                e -= nsc
                            var r = e // per_row
                            var b = e % per_row
                            var band = band0 if contiguous else min(band0 + b, npb - 1)
                            var goff = (grp0 + r) * np_ + band * 64
                            var soff = s * S_STAGE + r * S_ROW + b * 64
                            var nbytes = (NB if contiguous else 1) * 128
                            if is_z:
                                _bulk_g2s(_saddr(z_s.unsafe_offset(soff)), _gaddr(z_ptr.unsafe_offset(goff)), nbytes, fb)
                            else:
                                _bulk_g2s(_saddr(s_s.unsafe_offset(soff)), _gaddr(s_ptr.unsafe_offset(goff)), nbytes, fb)
                        c += 32

            comptime if streamk:
                var g = 0
                var u = u_begin
                while u < u_end:
                    var sg = _segment(u, u_end, UInt32(total_st))
                    var tile = raster_tile[RASTER_GROUP_M](sg[0], ntm, ntn)
                    produce(tile[0] * NT, tile[1] * NB, sg[1], sg[2], g)
                    g += sg[2]
                    u += UInt32(sg[2])
            else:
                produce(m0, band0, st_begin, nst, 0)
        # the consumers' epilogue barriers (split-1 tiles: named barriers of the consumers alone)
        comptime if staged:
            comptime for _ in range(WK):
                role_barrier()
            comptime if gsplit:
                role_barrier()
            else:
                if nsplit > 1:
                    cluster_sync()
                    cluster_sync()
                else:
                    role_barrier()
    else:
        # ------------------------------ consumers ------------------------------
        comptime if cfg.uses_setmaxnreg():
            warpgroup_reg_alloc[cfg.consumer_regs()]()
        var cw = tid - 128  # consumer thread index
        var nw = (cw // 128) % NWG  # this warpgroup's column set
        var kw = (cw // 128) // NWG  # its warp-k partition: stages kw, kw + WK, ...
        var wl = (cw // 32) % 4
        var band_local = nw * FPW + (wl * FPW) // 4  # this warp's band in the CTA
        var jb = (wl * FPW) % 4  # its first m16 block (packed word) in the band
        var acc = Array[SIMD[F32, NACC], FPW](fill=SIMD[F32, NACC](0))
        var magic = magic_value[dtype]()
        var zconst = SIMD[dtype, 2 * FPW]((magic + 8.0).cast[dtype]())
        var w_lane = band_local * KT * 512 + lane * 16 + jb * 4  # bytes in a stage
        var s_lane = band_local * 64 + 8 * (lane // 4) + 2 * jb  # elements in a scale row
        comptime NGB = KT // KG  # wgmma batches per stage

        @always_inline
        @__parameter
        def dequant_batch[g: Int](slot: Int) -> Array[SIMD[DType.uint32, 4], KG * FPW]:
            """A fragments of batch g (k16 steps g*KG ..) of the stage in ring slot `slot`."""
            var wp = w_s.unsafe_offset(slot * W_STAGE + w_lane)
            var sp = s_s.unsafe_offset(slot * S_STAGE + s_lane)
            var zp = z_s.unsafe_offset(slot * S_STAGE + s_lane)
            var afr = Array[SIMD[DType.uint32, 4], KG * FPW](uninitialized=True)
            var sv = SIMD[dtype, 2 * FPW](0)
            var zv = zconst
            comptime for tt in range(KG):
                comptime t = g * KG + tt
                comptime srow = 0 if (PER_CHANNEL or group_size >= WG_BK) else (t * 16) // group_size
                comptime if tt == 0 or (not PER_CHANNEL and group_size < WG_BK and (t * 16) % group_size == 0):
                    sv = sp.unsafe_offset(srow * S_ROW).unsafe_load[width=2 * FPW, alignment=4 * FPW]()
                    comptime if has_zeros:
                        zv = zp.unsafe_offset(srow * S_ROW).unsafe_load[width=2 * FPW, alignment=4 * FPW]() + magic.cast[dtype]()
                var words = wp.unsafe_offset(t * 512).unsafe_bitcast[UInt32]().unsafe_load[width=FPW, alignment=4 * FPW]()
                comptime for i in range(FPW):
                    afr[tt * FPW + i] = _pin4(_dq_word[dtype](
                        words[i],
                        SIMD[dtype, 2](sv[2 * i], sv[2 * i + 1]),
                        SIMD[dtype, 2](zv[2 * i], zv[2 * i + 1]),
                    ))
            return afr^

        @always_inline
        @__parameter
        def mma_batch[g: Int](afr: Array[SIMD[DType.uint32, 4], KG * FPW], slot: Int):
            var bd = _pin64(_x_desc(_saddr(x_s.unsafe_offset(slot * X_STAGE))) + Int64(2 * g * KG))
            wgmma_fence_aligned()
            comptime for tt in range(KG):
                comptime for i in range(FPW):
                    acc[i] = _wgmma_rs[NT, dtype](afr[tt * FPW + i], bd + Int64(2 * tt), acc[i])
            wgmma_commit_group_sync()

        @always_inline
        @__parameter
        def mainloop(g0: Int, nst: Int):
            """The segment's stages g0 .. g0 + nst - 1 of the ring (this partition's share)."""
            for it in range(kw if WK > 1 else 0, nst, WK):
                var s = (g0 + it) % S
                _mbar_wait(_saddr(full.unsafe_offset(s)), UInt32(((g0 + it) // S) & 1))
                comptime for g in range(NGB):
                    var afr = dequant_batch[g](s)
                    mma_batch[g](afr, s)
                    wgmma_wait_group_sync[0]()
                # every wgmma reading this stage has retired and this thread's own shared-memory
                # reads (packed weights, scales) are done: each consumer thread hands the slot back
                # itself, so the producer's wait orders every read before the refill
                _ = empty[unsafe_offset=s].arrive()
            wgmma_wait_group_sync[0]()

        var lane_row = lane // 4
        var lane_col = lane % 4
        comptime if streamk:
            # ------------------------ stream-K segments ------------------------
            # A tile's stages may be spread over consecutive CTAs: the CTA holding its first
            # stage (the "owner": always that CTA's last segment) adds the later parts, which
            # the following CTAs compute first thing and publish through the fp32 workspace
            # (slot = their CTA index, at most one part per CTA) and a release flag.
            comptime SLOT = FPW * NACC * NCT  # floats per workspace slot (one tile)
            var cta = block_idx.x
            var units = UInt32(ntm * ntn * total_st)
            var g = 0
            var u = u_begin
            while u < u_end:
                var sg = _segment(u, u_end, UInt32(total_st))
                comptime for i in range(FPW):
                    acc[i] = SIMD[F32, NACC](0)
                mainloop(g, sg[2])
                g += sg[2]
                u += UInt32(sg[2])
                var tile = raster_tile[RASTER_GROUP_M](sg[0], ntm, ntn)
                var tm0 = tile[0] * NT
                var col0 = tile[1] * NB * 64
                if sg[1] > 0:
                    # a later part of the tile: publish it for the owner
                    var wp = ws_ptr.unsafe_offset(cta * SLOT)
                    comptime for i in range(FPW):
                        comptime for v in range(NACC // 4):
                            st_cg_f32x4(_gaddr(wp.unsafe_offset(((i * (NACC // 4) + v) * NCT + cw) * 4)),
                                         acc[i].slice[4, offset=4 * v]())
                    fence_acq_rel_gpu()
                    named_barrier[Int32(NCT)](2)
                    if cw == 0:
                        st_release_gpu(_gaddr(flag_ptr.unsafe_offset(cta)), 1)
                    continue
                if sg[2] < total_st:
                    # the owner: add the parts of the CTAs after this one that hold the tile's rest
                    var tile_end = UInt32((sg[0] + 1) * total_st)
                    var h = cta + 1
                    while h < grid_dim.x and UInt32(h) * units // UInt32(grid_dim.x) < tile_end:
                        # (the launch has no more CTAs than units: every CTA holds a part)
                        wait_flag[WAIT_LIMIT_NS](_gaddr(flag_ptr.unsafe_offset(h)))
                        var hp = ws_ptr.unsafe_offset(h * SLOT)
                        comptime for i in range(FPW):
                            comptime for v in range(NACC // 4):
                                var part = ld_cg_f32x4(_gaddr(hp.unsafe_offset(((i * (NACC // 4) + v) * NCT + cw) * 4)))
                                comptime for e in range(4):
                                    acc[i][4 * v + e] += part[e]
                        h += 1
                    # every consumer thread has seen the flags: clear them for the next launch
                    # (each part is consumed exactly once, so a launch leaves every flag 0)
                    named_barrier[Int32(NCT)](2)
                    if cw == 0:
                        for f in range(cta + 1, h):
                            flag_ptr[unsafe_offset=f] = 0
                if u >= u_end:
                    # the CTA's last segment: the ring is drained, the tile goes out through it
                    _store_tile_16b[dtype, has_bias, NT, FPW, NB * 64, NCT](
                        acc, smem.unsafe_bitcast[Scalar[dtype]](), c_ptr, b_ptr, tm0, col0,
                        band_local * 64 + 16 * jb, cw, m, n)
                else:
                    # a whole tile with more segments after it: the producer is refilling the ring
                    _store_fragments[dtype, has_bias, NT, FPW](
                        acc, c_ptr, b_ptr, tm0, col0 + band_local * 64 + 16 * jb, lane, m, n)
            return

        mainloop(0, nst)

        # ---------------------------- epilogue ----------------------------
        comptime if not staged:
            # one CTA and one warpgroup own the tile: its bf16 / fp16 values go token-major
            # through the drained ring by stmatrix, then out as 16-byte row pieces (a kernel
            # instance of its own: with the fp32 split-K path compiled into the same kernel
            # behind a runtime branch, split-1 launches were 3-5 % slower)
            comptime assert NT * (NB * 64 + 8) * 2 <= BAR_OFF, "the output tile fits the drained ring"
            _store_tile_16b[dtype, has_bias, NT, FPW, NB * 64, NCT](
                acc, smem.unsafe_bitcast[Scalar[dtype]](), c_ptr, b_ptr, m0, band0 * 64,
                band_local * 64 + 16 * jb, cw, m, n)
            return
        # split K or warp-k partitions: accumulators -> fp32 tile in the drained ring -> sum
        # over the warp-k partitions and the split-K cluster -> bias, cast, row-contiguous
        # 8-byte stores (see _store_tile)
        role_barrier()  # every consumer warpgroup is done with the ring (the producer joins)
        comptime for kp in range(WK):  # warp-k partitions add up in turn
            if kw == kp:
                comptime for i in range(FPW):
                    var col = band_local * 64 + 16 * (jb + i) + lane_row
                    comptime for j in range(NQ4):
                        var p = red_s.unsafe_offset((8 * j + 2 * lane_col) * RED_RS + col)
                        comptime if kp == 0:
                            p[unsafe_offset=0] = acc[i][4 * j]
                            p[unsafe_offset=RED_RS] = acc[i][4 * j + 1]
                            p[unsafe_offset=8] = acc[i][4 * j + 2]
                            p[unsafe_offset=RED_RS + 8] = acc[i][4 * j + 3]
                        else:
                            p[unsafe_offset=0] += acc[i][4 * j]
                            p[unsafe_offset=RED_RS] += acc[i][4 * j + 1]
                            p[unsafe_offset=8] += acc[i][4 * j + 2]
                            p[unsafe_offset=RED_RS + 8] += acc[i][4 * j + 3]
            comptime if kp + 1 < WK:
                role_barrier()
        comptime if gsplit:
            # a split over CTAs without a cluster: each CTA copies its fp32 tile to its
            # workspace slot, the tile's counter (zeroed per launch) counts the copies, then
            # each CTA sums its share of the rows over all the tile's slots from L2
            role_barrier()  # the tile is in shared memory (the producer joins)
            comptime CW = NB * 64
            var base = ws_ptr.unsafe_offset(lin * nsplit * NT * CW)
            var idx = cw
            while idx < NT * CW // 4:
                var row = idx // (CW // 4)
                var c4 = idx % (CW // 4)
                st_cg_f32x4(_gaddr(base.unsafe_offset((ks * NT + row) * CW + 4 * c4)),
                             red_s.unsafe_offset(row * RED_RS + 4 * c4).unsafe_load[width=4, alignment=16]())
                idx += NCT
            fence_acq_rel_gpu()
            named_barrier[Int32(NCT)](2)
            if cw == 0:
                red_release_add(_gaddr(flag_ptr.unsafe_offset(lin)), 1)
            wait_count[WAIT_LIMIT_NS](_gaddr(flag_ptr.unsafe_offset(lin)), UInt32(nsplit))
            _store_tile[dtype, has_bias, NT, CW, NCT, True](red_s, base, c_ptr, b_ptr, cw, ks, nsplit, m0, band0 * 64, m, n)
            return
        if nsplit > 1:
            cluster_sync()
        else:
            role_barrier()
        _store_tile[dtype, has_bias, NT, NB * 64, NCT, False](red_s, ws_ptr, c_ptr, b_ptr, cw, ks, nsplit, m0, band0 * 64, m, n)
        if nsplit > 1:
            cluster_sync()  # peers' shared memory must outlive every remote read


@always_inline
def _store_fragments[dtype: DType, has_bias: Bool, NT: Int, FPW: Int](
    acc: Array[SIMD[F32, NT // 2], FPW],
    c_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    b_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    m0: Int, wcol: Int, lane: Int, m: Int, n: Int,
):
    """C (+ bias) of a tile straight from the fragments, masked to m x n, 2 bytes per store (the
    stream-K segments that end while the ring still streams; see `_store_tile_16b` for the
    layout: acc[i][4j + q] is column wcol + 16 i + 8 (q // 2) + lane / 4, token m0 + 8 j +
    2 (lane % 4) + q % 2)."""
    comptime for i in range(FPW):
        comptime for h in range(2):
            var col = wcol + 16 * i + 8 * h + lane // 4
            if col < n:
                var b: Float32 = 0
                comptime if has_bias:
                    b = b_ptr[unsafe_offset=col].cast[F32]()
                comptime for j in range(NT // 8):
                    comptime for e in range(2):
                        var t = m0 + 8 * j + 2 * (lane % 4) + e
                        if t < m:
                            c_ptr[unsafe_offset=t * n + col] = (acc[i][4 * j + 2 * h + e] + b).cast[dtype]()


@always_inline
def _store_tile_16b[dtype: DType, has_bias: Bool, NT: Int, FPW: Int, CW: Int, NCT: Int](
    acc: Array[SIMD[F32, NT // 2], FPW],
    out_s: Pointer[Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    c_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    b_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    m0: Int, col0: Int, lcol: Int, cw: Int, m: Int, n: Int,
):
    """C (+ bias) of a split-1 tile through the drained ring, masked to m x n: each consumer
    thread writes its rounded fragments token-major with stmatrix (transposed: the fragment's
    8 x 8 blocks of columns x tokens), then the NCT consumer threads store 16-byte pieces of
    token rows (CW / 8 per row). acc[i][4j + q] is column col0 + lcol + 16 i + 8 (q // 2) +
    lane / 4, token m0 + 8 j + 2 (lane % 4) + q % 2 (lcol: the warp's first column in the tile).
    NT / 16 stmatrix and as many row pieces per fragment (common/smem_stores.mojo)."""
    comptime RS = CW + 8  # elements per token row: 16 bytes of padding, conflict-free stmatrix rows
    var lane = cw % 32
    var mi = lane // 8  # the stmatrix matrix whose row address this lane gives
    var mk = lane % 8  # and the row
    named_barrier[Int32(NCT)](1)  # every consumer warpgroup is done with the ring
    comptime for i in range(FPW):
        var bl: Float32 = 0
        var bh: Float32 = 0
        comptime if has_bias:
            var nl = col0 + lcol + 16 * i + lane // 4
            if nl < n:
                bl = b_ptr[unsafe_offset=nl].cast[F32]()
            if nl + 8 < n:
                bh = b_ptr[unsafe_offset=nl + 8].cast[F32]()
        comptime for q in range(NT // 16):
            # matrices e = 0..3: tokens 8 (2q + e // 2) + .., columns + 8 (e % 2)
            var v = SIMD[dtype, 8]()
            comptime for e in range(4):
                comptime j = 2 * q + e // 2
                comptime h = e % 2
                var b = bh if h == 1 else bl
                v[2 * e] = (acc[i][4 * j + 2 * h] + b).cast[dtype]()
                v[2 * e + 1] = (acc[i][4 * j + 2 * h + 1] + b).cast[dtype]()
            var t = 8 * (2 * q + mi // 2) + mk
            stmatrix_tokens_x4(out_s.unsafe_offset(t * RS + lcol + 16 * i + 8 * (mi % 2)), v)
    named_barrier[Int32(NCT)](1)  # the tile is written
    comptime CH = CW // 8  # 16-byte pieces per token row
    var rows = min(NT, m - m0)
    var vec_ok = n % 8 == 0 and Int(c_ptr) % 16 == 0
    var idx = cw
    while idx < rows * CH:
        var t = idx // CH
        var piece = idx % CH
        var col = col0 + 8 * piece
        if col < n:
            var v = out_s.unsafe_offset(t * RS + 8 * piece).unsafe_load[width=8, alignment=16]()
            store_row_piece(c_ptr.unsafe_offset((m0 + t) * n + col), v, col, n, vec_ok)
        idx += NCT


@always_inline
def _store_tile[dtype: DType, has_bias: Bool, NT: Int, CW: Int, NCT: Int, GLOBAL: Bool](
    red_s: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    ws: Pointer[Float32, MutAnyOrigin],
    c_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    b_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    tid: Int, ks: Int, nsplit: Int, m0: Int, col0: Int, m: Int, n: Int,
):
    """C[m0 + t, col0 + c] = sum over the cluster's `nsplit` CTAs of tile[t, c] (+ bias), for the
    share `ks` of the tile's valid rows, by `NCT` threads (`tid` in [0, NCT)).

    The tile is fp32 [NT, CW] at row stride CW + 4 in every CTA's shared memory, or (GLOBAL, a
    split without a cluster) at row stride CW in `nsplit` consecutive workspace slots from `ws`,
    read from L2. Consecutive
    threads take consecutive 4-column groups of a row: conflict-free shared reads, coalesced
    8-byte stores. A runtime loop keeps the code small (the unrolled per-fragment split-K
    stores it replaced, with a `% split_k` test per fragment, were ~3.7k instructions,
    instruction-cache bound); each pass first
    issues all its shared / distributed-shared loads (8 per thread), then sums and stores, so
    the remote-load latency is paid once per pass, not once per load (docs/design/
    multistage_gemm_q.md).
    """
    if nsplit == 1:
        _store_tile_ns[dtype, has_bias, NT, CW, NCT, 1, GLOBAL](red_s, ws, c_ptr, b_ptr, tid, ks, nsplit, m0, col0, m, n)
    elif nsplit == 2:
        _store_tile_ns[dtype, has_bias, NT, CW, NCT, 2, GLOBAL](red_s, ws, c_ptr, b_ptr, tid, ks, nsplit, m0, col0, m, n)
    elif nsplit == 4:
        _store_tile_ns[dtype, has_bias, NT, CW, NCT, 4, GLOBAL](red_s, ws, c_ptr, b_ptr, tid, ks, nsplit, m0, col0, m, n)
    else:
        _store_tile_ns[dtype, has_bias, NT, CW, NCT, 8, GLOBAL](red_s, ws, c_ptr, b_ptr, tid, ks, nsplit, m0, col0, m, n)


@always_inline
def _store_tile_ns[dtype: DType, has_bias: Bool, NT: Int, CW: Int, NCT: Int, NS: Int, GLOBAL: Bool](
    red_s: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    ws: Pointer[Float32, MutAnyOrigin],
    c_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    b_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    tid: Int, ks: Int, nsplit: Int, m0: Int, col0: Int, m: Int, n: Int,
):
    """`_store_tile` for up to NS CTAs per cluster (nsplit <= NS; loads of ranks >= nsplit are
    skipped). CTA `ks` stores rows [ks * rows / nsplit, (ks + 1) * rows / nsplit) of the tile's
    valid rows; a thread keeps one 4-column group (tid % Q) and walks rows NCT / Q apart, so
    the per-item work is one shared address, the loads, the sum and one store."""
    comptime RS = CW + 4
    comptime Q = CW // 4  # float4 groups per tile row
    comptime RPP = NCT // Q  # rows per pass of all threads
    comptime U = max(1, 8 // NS)  # rows per thread per pass
    comptime assert NCT % Q == 0, "a thread keeps one column group"
    var c = (tid % Q) * 4
    var gcol = col0 + c
    if gcol >= n:
        return
    var rows = min(NT, m - m0)
    var r_end = (ks + 1) * rows // nsplit
    var full = n % 4 == 0 and Int(c_ptr) % 8 == 0 and gcol + 4 <= n  # one 8-byte store per row
    var bias = SIMD[F32, 4](0)
    comptime if has_bias:
        comptime for e in range(4):
            if gcol + e < n:
                bias[e] = b_ptr[unsafe_offset=gcol + e].cast[F32]()
    var t = ks * rows // nsplit + tid // Q
    while t < r_end:
        var parts = Array[SIMD[F32, 4], U * NS](fill=SIMD[F32, 4](0))
        comptime for u in range(U):
            var row = min(t + u * RPP, r_end - 1)  # past the share: a re-read
            comptime if GLOBAL:
                comptime for r in range(NS):
                    if r < nsplit:
                        parts[u * NS + r] = ld_cg_f32x4(_gaddr(ws.unsafe_offset((r * NT + row) * CW + c)))
            else:
                var src = red_s.unsafe_offset(row * RS + c)
                comptime if NS == 1:
                    parts[u] = src.unsafe_load[width=4, alignment=16]()
                else:
                    comptime for r in range(NS):
                        if r < nsplit:
                            parts[u * NS + r] = load_cluster_smem[F32, 4](src, UInt32(r))
        comptime for u in range(U):
            var tu = t + u * RPP
            if tu < r_end:
                var tot = parts[u * NS] + bias
                comptime for r in range(1, NS):
                    tot += parts[u * NS + r]
                var v = tot.cast[dtype]()
                var dst = c_ptr.unsafe_offset((m0 + tu) * n + gcol)
                if full:
                    dst.unsafe_store[alignment=8](v)
                else:
                    comptime for e in range(4):
                        if gcol + e < n:
                            dst[unsafe_offset=e] = v[e]
        t += U * RPP


# ---- host side -------------------------------------------------------------------------------
def choose_wgmma_split_k(cfg: Int4WgmmaConfig, m: Int, n: Int, kp: Int) -> Int:
    """CTAs per cluster along K for a fixed `cfg` (the dispatch uses dispatch.wgmma_plan,
    which also picks the tile): the split of 1, 2, 3, 4, 6 with the most CTAs that still run as
    one wave (`cluster_wave_cap`, cfg.ctas CTAs per SM) and >= 8 stages (512 of K) per CTA."""
    var ctas = ceildiv(ceildiv(n, 64), cfg.bands()) * ceildiv(m, cfg.nt)
    var stages_total = kp // WG_BK
    var best = 1
    for s in [2, 3, 4, 6]:
        if ctas * s <= cluster_wave_cap(s, cfg.ctas) and stages_total // s >= 8:
            best = s
    return best


def launch_int4_gemm_wgmma[
    dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool, cfg: Int4WgmmaConfig
](
    output: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    qweight: Pointer[UInt32, MutAnyOrigin],
    scales: Pointer[Scalar[dtype], MutAnyOrigin],
    zeros: Pointer[Scalar[dtype], MutAnyOrigin],
    bias: Pointer[Scalar[dtype], MutAnyOrigin],
    m: Int, n: Int, kp: Int, np_: Int, split_k: Int,
    ctx: DeviceContext,
    dp_tiles: Int = 0,
) raises:
    """Launch `int4_gemm_wgmma_kernel` with `cfg` (stages resolved against the sm_90 smem budget
    at compile time; cfg.ctas = 2: half an SM's smem). split_k: 1..8, or 0 for
    `choose_wgmma_split_k`. dp_tiles > 0 (with split_k > 1): the first dp_tiles tiles of the
    raster order run split 1 in a launch of their own, the rest split_k (the full waves
    without any reduction, the last partial wave spread over all SMs)."""
    comptime r = try_resolve_wgmma_config(cfg, group_size, has_zeros, wgmma_smem_budget(cfg))
    comptime if r.stages == 0:
        raise Error("multistage_gemm_q: wgmma config ", cfg, " does not fit the shared-memory budget")
    else:
        comptime smem = wgmma_smem_usage(r, group_size, has_zeros)
        var split = split_k if split_k > 0 else choose_wgmma_split_k(r, m, n, kp)
        if split < 1 or split > 8:
            raise Error("multistage_gemm_q: split_k must be in 1..8, got ", split)
        var capped = False
        comptime if INT4_MAX_SPLIT < 8:
            # racecheck build (config.INT4_MAX_SPLIT): clusters of at most INT4_MAX_SPLIT; a
            # split capped down to 1 still launches the cluster kernel (as wk = 2 does), so its
            # DSMEM reduction code runs, on one CTA without a cluster launch
            capped = split > INT4_MAX_SPLIT
            split = min(split, INT4_MAX_SPLIT)
        var xt = TileTensor(x, row_major(Coord(m, kp)))
        var tma = create_tma_tile[r.nt, WG_BK, swizzle_mode=SW128](ctx, xt)
        comptime kernel = int4_gemm_wgmma_kernel[
            dtype, group_size, has_zeros, has_bias, r, True, False, False, type_of(tma).tile_shape, type_of(tma).desc_shape
        ]
        comptime direct = int4_gemm_wgmma_kernel[
            dtype, group_size, has_zeros, has_bias, r, False, False, False, type_of(tma).tile_shape, type_of(tma).desc_shape
        ]
        var no_ws = output.unsafe_bitcast[Float32]()  # the tiled launches have no workspace
        var no_flags = output.unsafe_bitcast[UInt32]()
        var ntn = ceildiv(ceildiv(n, 64), r.bands())
        var ntm = ceildiv(m, r.nt)
        var tiles = ntn * ntm
        var dp = dp_tiles if split > 1 and dp_tiles > 0 and dp_tiles < tiles else 0
        var attr = FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(smem))
        comptime if r.wk == 1:
            if dp > 0:
                ctx.enqueue_function[direct](
                    tma, output, qweight, scales, zeros, bias, Int32(m), Int32(n), Int32(kp), Int32(np_), Int32(1),
                    Int32(0), no_ws, no_flags, grid_dim=(dp, 1), block_dim=r.num_threads(), shared_mem_bytes=smem,
                    func_attribute=attr)
            elif split == 1 and not capped:
                ctx.enqueue_function[direct](
                    tma, output, qweight, scales, zeros, bias, Int32(m), Int32(n), Int32(kp), Int32(np_), Int32(1),
                    Int32(0), no_ws, no_flags, grid_dim=(ntn, ntm), block_dim=r.num_threads(), shared_mem_bytes=smem,
                    func_attribute=attr)
                return
        else:
            dp = 0  # warp-k partitions are summed by the staged kernel: one uniform launch
        if split == 1:
            ctx.enqueue_function[kernel](
                tma, output, qweight, scales, zeros, bias, Int32(m), Int32(n), Int32(kp), Int32(np_), Int32(1),
                Int32(0), no_ws, no_flags, grid_dim=(ntn, ntm), block_dim=r.num_threads(), shared_mem_bytes=smem,
                func_attribute=attr)
        else:
            var grid = Dim((tiles - dp) * split, 1) if dp > 0 else Dim(ntn * split, ntm)
            ctx.enqueue_function[kernel](
                tma, output, qweight, scales, zeros, bias, Int32(m), Int32(n), Int32(kp), Int32(np_), Int32(split),
                Int32(dp), no_ws, no_flags, grid_dim=grid, block_dim=r.num_threads(), shared_mem_bytes=smem,
                cluster_dim=Dim(split, 1, 1), func_attribute=attr)


def launch_int4_gemm_wgmma_gsplit[
    dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool, cfg: Int4WgmmaConfig
](
    output: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    qweight: Pointer[UInt32, MutAnyOrigin],
    scales: Pointer[Scalar[dtype], MutAnyOrigin],
    zeros: Pointer[Scalar[dtype], MutAnyOrigin],
    bias: Pointer[Scalar[dtype], MutAnyOrigin],
    m: Int, n: Int, kp: Int, np_: Int, split: Int,
    ctx: DeviceContext,
) raises:
    """`int4_gemm_wgmma_kernel` split `split` ways along K without a cluster: the split CTAs of
    a tile copy their fp32 tiles to a workspace (tiles x split tiles, per call) and each sums
    its share of the tile's rows over the copies from L2 once a per-tile counter (zeroed on the
    stream) has counted them all. Unlike a cluster split, any split packs the SMs; the CTAs of
    a tile wait for each other, so the grid (tiles x split) must be resident at once."""
    comptime r = try_resolve_wgmma_config(cfg, group_size, has_zeros, wgmma_smem_budget(cfg))
    comptime if r.stages == 0:
        raise Error("multistage_gemm_q: wgmma config ", cfg, " does not fit the shared-memory budget")
    else:
        comptime smem = wgmma_smem_usage(r, group_size, has_zeros)
        var ntn = ceildiv(ceildiv(n, 64), r.bands())
        var ntm = ceildiv(m, r.nt)
        var tiles = ntn * ntm
        var sms = ctx.get_attribute(DeviceAttribute.MULTIPROCESSOR_COUNT)
        if split < 2 or split > 8 or kp // WG_BK < split:
            raise Error("multistage_gemm_q: a global split must be 2..8 and at most the K stages, got ", split)
        if tiles * split > sms * r.ctas:
            # a GPU with fewer SMs than the plan counted: the same split over clusters (DSMEM)
            launch_int4_gemm_wgmma[dtype, group_size, has_zeros, has_bias, cfg](
                output, x, qweight, scales, zeros, bias, m, n, kp, np_, split, ctx)
            return
        var ws = ctx.enqueue_create_buffer[DType.float32](tiles * split * r.nt * r.bn())
        var counters = ctx.enqueue_create_buffer[DType.uint32](tiles)
        counters.enqueue_fill(0)
        var xt = TileTensor(x, row_major(Coord(m, kp)))
        var tma = create_tma_tile[r.nt, WG_BK, swizzle_mode=SW128](ctx, xt)
        comptime kernel = int4_gemm_wgmma_kernel[
            dtype, group_size, has_zeros, has_bias, r, True, False, True, type_of(tma).tile_shape, type_of(tma).desc_shape
        ]
        ctx.enqueue_function[kernel](
            tma, output, qweight, scales, zeros, bias, Int32(m), Int32(n), Int32(kp), Int32(np_), Int32(split),
            Int32(0), ws.unsafe_ptr().as_unsafe_any_origin(), counters.unsafe_ptr().as_unsafe_any_origin(),
            grid_dim=(ntn * split, ntm), block_dim=r.num_threads(), shared_mem_bytes=smem,
            func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(smem)))

def streamk_ctas(cfg: Int4WgmmaConfig, m: Int, n: Int, kp: Int, sms: Int) -> Int:
    """CTAs of a stream-K launch of `cfg`: one per SM (cfg.ctas per SM), at most one per unit
    (64-K stage of a tile). Every CTA must be resident at once: an owner waits for the parts
    of the CTAs after it."""
    return min(streamk_units(cfg, m, n, kp), sms * cfg.ctas)


def streamk_units(cfg: Int4WgmmaConfig, m: Int, n: Int, kp: Int) -> Int:
    """(tile, 64-K stage) units of the problem for `cfg`'s tiles; a stream-K launch of G CTAs
    needs units * G < 2^32 (the kernel deals them out in 32-bit arithmetic)."""
    return ceildiv(ceildiv(n, 64), cfg.bands()) * ceildiv(m, cfg.nt) * (kp // WG_BK)


def launch_int4_gemm_wgmma_streamk[
    dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool, cfg: Int4WgmmaConfig
](
    output: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    qweight: Pointer[UInt32, MutAnyOrigin],
    scales: Pointer[Scalar[dtype], MutAnyOrigin],
    zeros: Pointer[Scalar[dtype], MutAnyOrigin],
    bias: Pointer[Scalar[dtype], MutAnyOrigin],
    m: Int, n: Int, kp: Int, np_: Int,
    ctx: DeviceContext,
    ctas: Int = 0,
) raises:
    """`int4_gemm_wgmma_kernel` as a stream-K launch: `ctas` CTAs (0: `streamk_ctas` for this
    GPU's SMs; never more than the problem's units) split the (tile, 64-K stage) units of the
    problem evenly, so every SM works the whole kernel whatever the tile count; a tile split
    between CTAs is summed in fp32 by the CTA holding its first stage, from a workspace of one
    tile per CTA and one flag per CTA (allocated and the flags zeroed on the stream, per call)."""
    comptime r = try_resolve_wgmma_config(cfg, group_size, has_zeros, wgmma_smem_budget(cfg))
    comptime if r.stages == 0 or r.wk != 1:
        raise Error("multistage_gemm_q: stream-K wgmma config ", cfg, " does not fit the budget or has warp-k partitions")
    else:
        comptime assert r.nt * (r.bn() + 8) * 2 <= wgmma_ring_bytes(r, group_size, has_zeros), "the output tile fits the drained ring"
        var sms = ctx.get_attribute(DeviceAttribute.MULTIPROCESSOR_COUNT)
        # at most one CTA per unit: an owner waits for every CTA whose range starts in its tile
        var grid = min(ctas, streamk_ctas(r, m, n, kp, 1 << 30)) if ctas > 0 else streamk_ctas(r, m, n, kp, sms)
        if grid > sms * r.ctas:
            raise Error("multistage_gemm_q: a stream-K launch of ", grid, " CTAs cannot be resident at once on ", sms, " SMs")
        if streamk_units(r, m, n, kp) * grid >= 1 << 32:
            raise Error("multistage_gemm_q: a stream-K launch of ", m, " x ", n, " x ", kp, " over ", grid, " CTAs overflows its 32-bit unit arithmetic")
        var ws = ctx.enqueue_create_buffer[DType.float32](grid * r.nt * r.bn())
        var flags = ctx.enqueue_create_buffer[DType.uint32](grid)
        flags.enqueue_fill(0)
        comptime smem = wgmma_smem_usage(r, group_size, has_zeros)
        var xt = TileTensor(x, row_major(Coord(m, kp)))
        var tma = create_tma_tile[r.nt, WG_BK, swizzle_mode=SW128](ctx, xt)
        comptime kernel = int4_gemm_wgmma_kernel[
            dtype, group_size, has_zeros, has_bias, r, False, True, False, type_of(tma).tile_shape, type_of(tma).desc_shape
        ]
        ctx.enqueue_function[kernel](
            tma, output, qweight, scales, zeros, bias, Int32(m), Int32(n), Int32(kp), Int32(np_), Int32(1),
            Int32(0), ws.unsafe_ptr().as_unsafe_any_origin(), flags.unsafe_ptr().as_unsafe_any_origin(),
            grid_dim=(grid, 1), block_dim=r.num_threads(), shared_mem_bytes=smem,
            func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(smem)))


# ---- generated: register-A wgmma wrappers (one per wgmma N) ---------------------------------

@always_inline
def _wgmma_rs_n64[ab: StaticString](a: SIMD[DType.uint32, 4], bdesc: Int64, c: SIMD[F32, 32]) -> SIMD[F32, 32]:
    """wgmma.mma_async m64n64k16, A from registers (this warp's m16 x k16 fragment), B from the
    shared-memory descriptor `bdesc` (K-major), D = A * B + D in fp32."""
    var o = inlined_assembly[
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." + ab + "." + ab
        + " {$0, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31}, {$32, $33, $34, $35}, $36, p, 1, 1, 0;\n}",
        _RegisterPackType[Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32],
        constraints="=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,r,r,r,r,l,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31",
    ](a[0], a[1], a[2], a[3], bdesc, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13], c[14], c[15], c[16], c[17], c[18], c[19], c[20], c[21], c[22], c[23], c[24], c[25], c[26], c[27], c[28], c[29], c[30], c[31])
    return SIMD[F32, 32](o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9], o[10], o[11], o[12], o[13], o[14], o[15], o[16], o[17], o[18], o[19], o[20], o[21], o[22], o[23], o[24], o[25], o[26], o[27], o[28], o[29], o[30], o[31])

@always_inline
def _wgmma_rs_n128[ab: StaticString](a: SIMD[DType.uint32, 4], bdesc: Int64, c: SIMD[F32, 64]) -> SIMD[F32, 64]:
    """wgmma.mma_async m64n128k16, A from registers (this warp's m16 x k16 fragment), B from the
    shared-memory descriptor `bdesc` (K-major), D = A * B + D in fp32."""
    var o = inlined_assembly[
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." + ab + "." + ab
        + " {$0, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35, $36, $37, $38, $39, $40, $41, $42, $43, $44, $45, $46, $47, $48, $49, $50, $51, $52, $53, $54, $55, $56, $57, $58, $59, $60, $61, $62, $63}, {$64, $65, $66, $67}, $68, p, 1, 1, 0;\n}",
        _RegisterPackType[Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32],
        constraints="=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,r,r,r,r,l,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63",
    ](a[0], a[1], a[2], a[3], bdesc, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13], c[14], c[15], c[16], c[17], c[18], c[19], c[20], c[21], c[22], c[23], c[24], c[25], c[26], c[27], c[28], c[29], c[30], c[31], c[32], c[33], c[34], c[35], c[36], c[37], c[38], c[39], c[40], c[41], c[42], c[43], c[44], c[45], c[46], c[47], c[48], c[49], c[50], c[51], c[52], c[53], c[54], c[55], c[56], c[57], c[58], c[59], c[60], c[61], c[62], c[63])
    return SIMD[F32, 64](o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9], o[10], o[11], o[12], o[13], o[14], o[15], o[16], o[17], o[18], o[19], o[20], o[21], o[22], o[23], o[24], o[25], o[26], o[27], o[28], o[29], o[30], o[31], o[32], o[33], o[34], o[35], o[36], o[37], o[38], o[39], o[40], o[41], o[42], o[43], o[44], o[45], o[46], o[47], o[48], o[49], o[50], o[51], o[52], o[53], o[54], o[55], o[56], o[57], o[58], o[59], o[60], o[61], o[62], o[63])

@always_inline
def _wgmma_rs_n256[ab: StaticString](a: SIMD[DType.uint32, 4], bdesc: Int64, c: SIMD[F32, 128]) -> SIMD[F32, 128]:
    """wgmma.mma_async m64n256k16, A from registers (this warp's m16 x k16 fragment), B from the
    shared-memory descriptor `bdesc` (K-major), D = A * B + D in fp32."""
    var o = inlined_assembly[
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n256k16.f32." + ab + "." + ab
        + " {$0, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35, $36, $37, $38, $39, $40, $41, $42, $43, $44, $45, $46, $47, $48, $49, $50, $51, $52, $53, $54, $55, $56, $57, $58, $59, $60, $61, $62, $63, $64, $65, $66, $67, $68, $69, $70, $71, $72, $73, $74, $75, $76, $77, $78, $79, $80, $81, $82, $83, $84, $85, $86, $87, $88, $89, $90, $91, $92, $93, $94, $95, $96, $97, $98, $99, $100, $101, $102, $103, $104, $105, $106, $107, $108, $109, $110, $111, $112, $113, $114, $115, $116, $117, $118, $119, $120, $121, $122, $123, $124, $125, $126, $127}, {$128, $129, $130, $131}, $132, p, 1, 1, 0;\n}",
        _RegisterPackType[Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32, Float32],
        constraints="=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,=f,r,r,r,r,l,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,80,81,82,83,84,85,86,87,88,89,90,91,92,93,94,95,96,97,98,99,100,101,102,103,104,105,106,107,108,109,110,111,112,113,114,115,116,117,118,119,120,121,122,123,124,125,126,127",
    ](a[0], a[1], a[2], a[3], bdesc, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13], c[14], c[15], c[16], c[17], c[18], c[19], c[20], c[21], c[22], c[23], c[24], c[25], c[26], c[27], c[28], c[29], c[30], c[31], c[32], c[33], c[34], c[35], c[36], c[37], c[38], c[39], c[40], c[41], c[42], c[43], c[44], c[45], c[46], c[47], c[48], c[49], c[50], c[51], c[52], c[53], c[54], c[55], c[56], c[57], c[58], c[59], c[60], c[61], c[62], c[63], c[64], c[65], c[66], c[67], c[68], c[69], c[70], c[71], c[72], c[73], c[74], c[75], c[76], c[77], c[78], c[79], c[80], c[81], c[82], c[83], c[84], c[85], c[86], c[87], c[88], c[89], c[90], c[91], c[92], c[93], c[94], c[95], c[96], c[97], c[98], c[99], c[100], c[101], c[102], c[103], c[104], c[105], c[106], c[107], c[108], c[109], c[110], c[111], c[112], c[113], c[114], c[115], c[116], c[117], c[118], c[119], c[120], c[121], c[122], c[123], c[124], c[125], c[126], c[127])
    return SIMD[F32, 128](o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9], o[10], o[11], o[12], o[13], o[14], o[15], o[16], o[17], o[18], o[19], o[20], o[21], o[22], o[23], o[24], o[25], o[26], o[27], o[28], o[29], o[30], o[31], o[32], o[33], o[34], o[35], o[36], o[37], o[38], o[39], o[40], o[41], o[42], o[43], o[44], o[45], o[46], o[47], o[48], o[49], o[50], o[51], o[52], o[53], o[54], o[55], o[56], o[57], o[58], o[59], o[60], o[61], o[62], o[63], o[64], o[65], o[66], o[67], o[68], o[69], o[70], o[71], o[72], o[73], o[74], o[75], o[76], o[77], o[78], o[79], o[80], o[81], o[82], o[83], o[84], o[85], o[86], o[87], o[88], o[89], o[90], o[91], o[92], o[93], o[94], o[95], o[96], o[97], o[98], o[99], o[100], o[101], o[102], o[103], o[104], o[105], o[106], o[107], o[108], o[109], o[110], o[111], o[112], o[113], o[114], o[115], o[116], o[117], o[118], o[119], o[120], o[121], o[122], o[123], o[124], o[125], o[126], o[127])

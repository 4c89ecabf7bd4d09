"""SM90 (H100 / H200, sm_90a) kernel of `grouped_matmul_sm100_persistent`.

Persistent, warp-specialized, swap-AB:
- grid = number of SMs; every CTA walks the work list of scheduler.mojo (groups x token tiles x
  weight tiles, read from a_offsets / expert_ids / expert_usage_stats on the device), first
  copied into a group table in shared memory (up to TABLE_GROUPS groups, one load per thread),
  so the walk over many empty groups (decode over all experts) reads shared memory;
- swap-AB: the expert's weight rows (matmul columns) sit on wgmma's M side (BM = 128 = 2
  warpgroups x 64) and the tokens on its N side (BN = 32 for decode-sized groups, 256 for
  prefill), so a group of a few tokens still streams whole 128-row weight tiles;
- warpgroup 0 is the producer: one thread issues the TMA loads (128B swizzle, BK = 64
  elements = 128 bytes per row) of the weight tile [128, 64] (b viewed as [E * N, K], row
  expert * N + m) and of the token tile [BN, 64] (a as [A_rows, K], row row0 + plane * T;
  prefill tiles in boxes of BN / WIDTHS rows, only those the tile's wgmma width reads:
  `token_box_rows`) into a ring of STAGES shared-memory stages, each with a "full" and an
  "empty" mbarrier; a stage holds KSUB such 64-column blocks (decode tiles: 2, so each weight
  row is read 256 bytes at a time; a tile's last stage may hold one); STAGES is the most that
  fits in the 227 KiB a CTA may opt into, next to the staged epilogue's round buffers;
- warpgroups 1 and 2 are the consumers: each waits on "full", issues wgmma m64nBNk16 on its
  64 weight rows straight from shared memory with fp32 accumulators in registers (one wgmma
  group kept in flight), releases the stage, and at the end of a tile runs the epilogue
  (SwiGLU / row scale, masks rows past the group's end and columns past N, stores to c). The
  producer is already loading the next tile meanwhile (the ring runs across tiles);
- epilogue stores (`STAGED`): prefill tiles go through shared memory (`_staged_epilogue`:
  stmatrix writes each round of 64 tokens token-major, then 16-byte row pieces go to c); the
  other tiles store from the fragments (2 bytes per thread and store), which keeps their ring
  a stage deeper.
Token rows past the group's end (the next group's rows, or zeros past A_rows) are loaded but
never stored; K past the end is zero-filled by TMA. A group with an invalid expert loads
nothing and its rows are written as zeros.
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
from max.gpu.primitives.warp import shuffle_idx
from max.gpu.sync import named_barrier
from layout import Coord, TileTensor, row_major
from layout.tensor_core_async import TensorCoreAsync, tile_layout_k_major_typed, warpgroup_fence
from layout.tma_async import SharedMemBarrier, TMATensorTile, create_tma_tile

from ...common.handoff import ld_cg_u32
from ...common.smem_stores import stmatrix_tokens_x4, store_row_piece
from ...common.target import SMEM_BUDGET_SM90
from ...common.pdl import launch_dependent_grids, pdl_attributes, wait_on_dependent_grids
from ..epilogue import apply_epilogue
from ..scheduler import (
    ElemPtr,
    F32Ptr,
    GroupedShape,
    GroupedTileScheduler,
    I32Ptr,
    SWIGLU_BLOCK,
    U32Ptr,
    plane_of,
    valid_expert,
)

comptime F32 = DType.float32
comptime SW = TensorMapSwizzle.SWIZZLE_128B
comptime BM = 128
"""Weight rows (matmul columns) per tile: 2 consumer warpgroups x 64."""
comptime BK = 64
"""K per stage: 64 x 2 bytes = one 128-byte swizzle row."""
comptime WG_M = 64
comptime NUM_CONSUMERS = 2
comptime NUM_THREADS = 128 * (1 + NUM_CONSUMERS)
comptime MAX_STAGES = 12


def sm90_stage_bytes[dtype: DType, BN: Int, KSUB: Int = 1]() -> Int:
    """Bytes of one ring stage: KSUB pairs of (weight, token) tiles of BK columns each."""
    return KSUB * (BM + BN) * BK * size_of[dtype]()


comptime EPI_TOKENS = 64
"""Tokens per round of the staged epilogue (`STAGED`): each consumer's round buffer holds
EPI_TOKENS rows of its 64 output columns."""
comptime EPI_STRIDE = WG_M + 8
"""Elements per token row of a round buffer: 64 columns (32 after SwiGLU) and 16 bytes of
padding, so that the 8 token rows one stmatrix writes fall on distinct banks (144-byte rows
start 4 banks apart; 80-byte SwiGLU rows use the same stride)."""


def sm90_epi_bytes[dtype: DType, STAGED: Bool]() -> Int:
    """Shared memory of the staged epilogue's round buffers (one per consumer), 0 without it."""
    return NUM_CONSUMERS * EPI_TOKENS * EPI_STRIDE * size_of[dtype]() if STAGED else 0


comptime TABLE_GROUPS = 256
"""Most groups whose row offsets and expert ids a CTA copies into shared memory at its start
(the group table), so that the scheduler's walk over the groups reads shared memory, not one
dependent global load per group entered. More groups than this keep the walk on global memory."""
comptime TABLE_BYTES = (2 * TABLE_GROUPS + 4) * 4
"""The group table: TABLE_GROUPS + 1 offsets, TABLE_GROUPS ids and the active group count,
rounded to 16 bytes."""


def sm90_stages[dtype: DType, BN: Int, KSUB: Int = 1, STAGED: Bool = False]() -> Int:
    """Pipeline depth: as many stages as fit next to their 2 mbarriers each, the epilogue's
    round buffers and the group table."""
    return min(
        MAX_STAGES,
        (SMEM_BUDGET_SM90 - sm90_epi_bytes[dtype, STAGED]() - TABLE_BYTES) // (sm90_stage_bytes[dtype, BN, KSUB]() + 16),
    )


def sm90_smem_bytes[dtype: DType, BN: Int, KSUB: Int = 1, STAGED: Bool = False]() -> Int:
    comptime stages = sm90_stages[dtype, BN, KSUB, STAGED]()
    return (
        stages * sm90_stage_bytes[dtype, BN, KSUB]() + 2 * stages * 8 + sm90_epi_bytes[dtype, STAGED]() + TABLE_BYTES
    )


@always_inline
def width_index[BN: Int, WIDTHS: Int](rows: Int) -> Int:
    """Index v of the narrowest wgmma width (v + 1) * BN / WIDTHS that covers `rows` (1..BN)
    tokens."""
    return max(ceildiv(rows * WIDTHS, BN), 1) - 1


comptime MIN_TOKEN_BOX_ROWS = 64
"""Fewest token rows per TMA box worth splitting a tile's load into. A tile of BN = 256 in
boxes of 64 rows loads only the boxes its wgmma width reads and runs 0.5-10 % faster on the
prefill shapes; BN = 128 in boxes of 32 rows ran 1-3 % slower where groups fill one tile and
11-25 % slower where they fill many (the four 4 KB copies per block cost the producer more than
the bytes saved; grouped_gpu_harness `tiles`, H100)."""


@always_inline
def token_box_rows[BN: Int, WIDTHS: Int]() -> Int:
    """Token rows per TMA box: BN / WIDTHS where that is at least MIN_TOKEN_BOX_ROWS, so a tile
    loads only the boxes its wgmma width covers; else BN (one box per tile)."""
    return BN // WIDTHS if WIDTHS > 1 and BN // WIDTHS >= MIN_TOKEN_BOX_ROWS else BN


comptime SmemPtr[T: AnyType] = Pointer[T, MutUntrackedOrigin, address_space=AddressSpace.SHARED]


@always_inline
def stage_blocks[KSUB: Int](num_k: Int, kb: Int) -> Int:
    """BK-column blocks in the ring stage that starts at block kb of a tile's num_k: KSUB, or
    the remainder in the tile's last stage (the producer loads and the consumers multiply the
    same count, so no block past K is ever loaded)."""
    comptime assert KSUB == 1 or KSUB == 2, "a stage holds 1 or 2 blocks (a partial stage: one)"
    return min(KSUB, num_k - kb)


@always_inline
def _consume_tile[dtype: DType, BN: Int, NV: Int, STAGES: Int, KSUB: Int](
    w_smem: SmemPtr[Scalar[dtype]],
    x_smem: SmemPtr[Scalar[dtype]],
    full: SmemPtr[SharedMemBarrier],
    empty: SmemPtr[SharedMemBarrier],
    accum_ptr: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.LOCAL],
    mut it: Int,
    num_k: Int,
    sub: Int,
    ctid: Int,
):
    """One consumer warpgroup's mainloop over a tile's `num_k` BK-column blocks, KSUB per ring
    stage (the tile's last stage may hold fewer: `stage_blocks`), with wgmma m64 x NV x 16 on
    the first NV token rows (their fragments are the first 64 NV / 128 registers of the
    m64 x BN accumulator). One wgmma group per stage stays in flight: stage i - 1 is released
    once group i is issued and group i - 1 has completed (wait_group 1)."""
    comptime W_ELEMS = BM * BK
    comptime X_ELEMS = BN * BK
    comptime w_sub_layout = tile_layout_k_major_typed[dtype, WG_M, BK, SW]
    comptime x_layout = tile_layout_k_major_typed[dtype, NV, BK, SW]
    var accum = TileTensor(accum_ptr, row_major[1, WG_M * NV // 128]())
    var mma = TensorCoreAsync[
        F32, dtype, dtype, Index(WG_M, NV, 16), a_swizzle=SW, b_swizzle=SW, transpose_b=True
    ]()
    var prev = -1
    var kb = 0
    while kb < num_k:
        var s = it % STAGES
        var blocks = stage_blocks[KSUB](num_k, kb)
        full[unsafe_offset=s].wait(UInt32((it // STAGES) & 1))
        warpgroup_fence(accum)
        mma.arrive()
        # block 0 of the stage, then (KSUB = 2) block 1 unless the tile's last stage holds one.
        # That branch between wgmmas makes ptxas serialize them (C7520); only the decode tiles
        # take KSUB = 2, and their stages wait on HBM, not on the MMAs.
        var w_t = TileTensor(w_smem.unsafe_offset(s * KSUB * W_ELEMS + sub * WG_M * BK), w_sub_layout)
        var x_t = TileTensor(x_smem.unsafe_offset(s * KSUB * X_ELEMS), x_layout)
        mma.wgmma(w_t, x_t, accum)
        comptime if KSUB == 2:
            if blocks == 2:
                var w_1 = TileTensor(w_smem.unsafe_offset((s * KSUB + 1) * W_ELEMS + sub * WG_M * BK), w_sub_layout)
                var x_1 = TileTensor(x_smem.unsafe_offset((s * KSUB + 1) * X_ELEMS), x_layout)
                mma.wgmma(w_1, x_1, accum)
        mma.commit_group()
        kb += blocks
        warpgroup_fence(accum)
        mma.wait_group[1]()
        if prev >= 0 and ctid == 0:
            _ = empty[unsafe_offset=prev].arrive()
        prev = s
        it += 1
    mma.wait_group[0]()
    warpgroup_fence(accum)
    if ctid == 0 and prev >= 0:
        _ = empty[unsafe_offset=prev].arrive()


@always_inline
def _staged_epilogue[dtype: DType, BN: Int, swiglu: Bool, has_row_scale: Bool](
    accum_ptr: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.LOCAL],
    scales_ptr: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.LOCAL],
    buf: SmemPtr[Scalar[dtype]],
    c: ElemPtr[dtype],
    Nc: Int,
    row0: Int,
    row_end: Int,
    col0: Int,
    sub: Int,
    ctid: Int,
):
    """One consumer's epilogue through shared memory, EPI_TOKENS tokens per round: stmatrix
    (transposed) writes the rounded outputs token-major into the consumer's round buffer `buf`,
    then every thread stores 16-byte row pieces to c (each token's 64 columns, 32 after SwiGLU,
    are contiguous in c: 8 or 4 lanes per token; common/smem_stores.mojo). col0: the
    consumer's first output column; rows >= row_end and columns >= Nc are not stored. Writes
    the same bits as the fragment-order epilogue."""
    comptime assert BN % EPI_TOKENS == 0, "whole rounds per token tile"
    comptime OW = WG_M // 2 if swiglu else WG_M
    """Output columns of one consumer."""
    comptime CHUNKS = OW // 8
    """16-byte pieces per token row."""
    comptime J_ROUND = EPI_TOKENS // 8
    var accum = TileTensor(accum_ptr, row_major[1, WG_M * BN // 128]())
    var scales = TileTensor(scales_ptr, row_major[1, BN // 32 if has_row_scale else 1]())
    var warp = ctid // 32
    var lane = ctid % 32
    var mi = lane // 8  # the stmatrix matrix whose row address this lane gives
    var mk = lane % 8  # and the row
    var vec_ok = Nc % 8 == 0 and Int(c) % 16 == 0
    comptime for r in range(BN // EPI_TOKENS):
        # Fragment of m64nBN: register 4j + {0, 1} holds (weight row 16 warp + lane / 4, tokens
        # 8j + 2 (lane % 4) + {0, 1}); 4j + {2, 3} the same tokens, weight row + 8. Each pair is
        # one row of an 8 x 8 (weight rows x tokens) matrix in mma layout; the transposed
        # stmatrix stores its column t (token t) as 8 consecutive weight rows.
        comptime if swiglu:
            # out column 8 warp + lane / 4 = silu(row lane / 4) * (row lane / 4 + 8): one
            # matrix per j, four per stmatrix
            comptime for q in range(J_ROUND // 4):
                var v = SIMD[dtype, 8]()
                comptime for i in range(4):
                    comptime j = r * J_ROUND + 4 * q + i
                    comptime for h in range(2):
                        var scale = Float32(1)
                        comptime if has_row_scale:
                            scale = shuffle_idx(rebind[Float32](scales[0, j // 4]),
                                                UInt32(8 * (j % 4) + 2 * (lane % 4) + h))
                        v[2 * i + h] = apply_epilogue[True, has_row_scale, 1](
                            rebind[Float32](accum[0, 4 * j + h]), rebind[Float32](accum[0, 4 * j + 2 + h]),
                            scale).cast[dtype]()
                var t = 8 * (4 * q + mi) + mk
                stmatrix_tokens_x4(buf.unsafe_offset(t * EPI_STRIDE + 8 * warp), v)
        else:
            # two matrices per j (weight rows +0 and +8), four per stmatrix
            comptime for q in range(J_ROUND // 2):
                var v = SIMD[dtype, 8]()
                comptime for i in range(4):
                    comptime j = r * J_ROUND + 2 * q + i // 2
                    comptime for h in range(2):
                        var scale = Float32(1)
                        comptime if has_row_scale:
                            scale = shuffle_idx(rebind[Float32](scales[0, j // 4]),
                                                UInt32(8 * (j % 4) + 2 * (lane % 4) + h))
                        v[2 * i + h] = apply_epilogue[False, has_row_scale, 1](
                            rebind[Float32](accum[0, 4 * j + 2 * (i % 2) + h]), 0, scale).cast[dtype]()
                var t = 8 * (2 * q + mi // 2) + mk
                stmatrix_tokens_x4(buf.unsafe_offset(t * EPI_STRIDE + 16 * warp + 8 * (mi % 2)), v)
        named_barrier[128](Int32(2 + sub))  # the round buffer is written
        comptime for step in range(EPI_TOKENS * CHUNKS // 128):
            var idx = ctid + 128 * step
            var t = idx // CHUNKS
            var piece = idx % CHUNKS
            var row = row0 + r * EPI_TOKENS + t
            var col = col0 + 8 * piece
            if row < row_end and col < Nc:
                var v = buf.unsafe_offset(t * EPI_STRIDE + 8 * piece).unsafe_load[width=8, alignment=16]()
                store_row_piece(c.unsafe_offset(row * Nc + col), v, col, Nc, vec_ok)
        named_barrier[128](Int32(2 + sub))  # read out before the next round overwrites it


@__llvm_arg_metadata(w_tma, `nvvm.grid_constant`)
@__llvm_arg_metadata(x_tma, `nvvm.grid_constant`)
@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(NUM_THREADS)))
def grouped_sm90_kernel[
    dtype: DType,
    BN: Int,
    WIDTHS: Int,
    STAGES: Int,
    KSUB: Int,
    s0: Int,
    s1: Int,
    swiglu: Bool,
    has_row_scale: Bool,
    STAGED: Bool,
    EARLY_ROUTING: Bool,
    LATE_RELEASE: Bool,
    w_tile: Coord,
    w_desc: Coord,
    x_tile: Coord,
    x_desc: Coord,
](
    w_tma: TMATensorTile[dtype, w_tile, w_desc],
    x_tma: TMATensorTile[dtype, x_tile, x_desc],
    c: ElemPtr[dtype],
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
    comptime w_layout = tile_layout_k_major_typed[dtype, BM, BK, SW]
    comptime XBOX = token_box_rows[BN, WIDTHS]()
    comptime NARROW = XBOX < BN
    """A tile loads only the token boxes its wgmma width covers."""
    comptime x_layout = tile_layout_k_major_typed[dtype, XBOX, BK, SW]
    comptime W_ELEMS = BM * BK
    comptime X_ELEMS = BN * BK
    comptime XBOX_ELEMS = XBOX * BK
    comptime SLOTS = STAGES * KSUB
    comptime C_FRAG = WG_M * BN // 128
    """fp32 accumulators per consumer thread (m64 x BN wgmma)."""
    comptime PRODUCER_REGS = 56
    comptime CONSUMER_REGS = 224
    """setmaxnreg split of the 384 threads' 168 registers (128 x P + 256 x C <= 64512): the
    producer's loops (token boxes, the first tile's early weight loads) spill below 56; the
    consumers' largest accumulator (m64n256: 128 registers) fits 224."""

    # slot s * KSUB + j of each array holds block j of ring stage s
    var smem = external_memory[Scalar[dtype], address_space=AddressSpace.SHARED, alignment=1024]()
    var w_smem = smem
    var x_smem = smem.unsafe_offset(SLOTS * W_ELEMS)
    var full = smem.unsafe_offset(SLOTS * (W_ELEMS + X_ELEMS)).unsafe_bitcast[SharedMemBarrier]()
    var empty = full.unsafe_offset(STAGES)
    # the staged epilogue's round buffers, one per consumer, after the barriers (16-byte aligned),
    # then the group table
    var epi_smem = empty.unsafe_offset(STAGES).unsafe_bitcast[Scalar[dtype]]()
    var table = epi_smem.unsafe_offset(sm90_epi_bytes[dtype, STAGED]() // size_of[dtype]()).unsafe_bitcast[UInt32]()

    var tid = thread_idx.x
    comptime if not LATE_RELEASE:
        launch_dependent_grids()  # PDL (common/pdl.mojo)
    if tid == 0:
        # the descriptors' first use would fetch them: start that now, before the wait
        w_tma.prefetch_descriptor()
        x_tma.prefetch_descriptor()
        comptime for s in range(STAGES):
            full[unsafe_offset=s].init(1)  # the producer's arrive.expect_tx + the TMA bytes
            empty[unsafe_offset=s].init(NUM_CONSUMERS)  # one thread per consumer warpgroup
    # Every read of a, every write and (unless the routing is read early) every read of the
    # routing (the groups' offsets and ids decide which weights a tile needs) comes after the
    # previous kernel has completed. EARLY_ROUTING reads the routing first when it fits the
    # table (`grouped_matmul_sm90`).
    var G = Int(G32)
    var use_table = G <= TABLE_GROUPS
    var early = EARLY_ROUTING and use_table
    if not early:
        wait_on_dependent_grids()
        comptime if LATE_RELEASE:
            launch_dependent_grids()
    var offsets = a_offsets
    var ids = expert_ids
    var counts = stats
    if use_table:
        # every thread copies at most one entry (from L2: an L1 line could predate the routing's
        # writes): one load latency for the table
        var ids_table = table.unsafe_offset(TABLE_GROUPS + 1).unsafe_bitcast[Int32]()
        var stats_table = table.unsafe_offset(2 * TABLE_GROUPS + 1)
        if tid <= G:
            table[unsafe_offset=tid] = ld_cg_u32(UInt64(Int(a_offsets.unsafe_offset(tid))))
        if tid < G:
            ids_table[unsafe_offset=tid] = Int32(ld_cg_u32(UInt64(Int(expert_ids.unsafe_offset(tid)))))
        if tid == NUM_THREADS - 1:
            stats_table[unsafe_offset=1] = ld_cg_u32(UInt64(Int(stats.unsafe_offset(1))))
        offsets = table.unsafe_address_space_cast[AddressSpace.GENERIC]().unsafe_origin_cast[MutAnyOrigin]()
        ids = ids_table.unsafe_address_space_cast[AddressSpace.GENERIC]().unsafe_origin_cast[MutAnyOrigin]()
        counts = stats_table.unsafe_address_space_cast[AddressSpace.GENERIC]().unsafe_origin_cast[MutAnyOrigin]()
    barrier()  # the mbarriers' init and the table

    var T = Int(T32)
    var K = Int(K32)
    var N = Int(N32)
    var E = Int(E32)
    var num_k = ceildiv(K, BK)
    var sched = GroupedTileScheduler[BM, BN](offsets, ids, counts, T, N, G, block_idx.x, grid_dim.x)
    var wg = tid // 128

    if wg == 0:
        # ---------------- producer: one thread issues every TMA load ----------------
        warpgroup_reg_dealloc[PRODUCER_REGS]()
        if tid != 0:
            return
        var it = 0
        var work = sched.next()
        # EARLY_ROUTING: the first tile's weights fill the ring before the wait (their stages'
        # "full" barriers expect the token bytes too, loaded after it)
        var pre = 0
        if early:
            if not work.done and valid_expert(work.expert, E):
                var w_row0 = work.expert * N + work.m
                var boxes0 = Int32(1)
                comptime if NARROW:
                    boxes0 = Int32(width_index[BN, WIDTHS](min(work.row_end - work.row0, BN)) + 1)
                var kb0 = 0
                while kb0 < num_k and pre < STAGES:
                    var blocks = stage_blocks[KSUB](num_k, kb0)
                    var block_elems = Int32(W_ELEMS) + boxes0 * Int32(XBOX_ELEMS)
                    full[unsafe_offset=pre].expect_bytes(Int32(blocks) * block_elems * Int32(size_of[dtype]()))
                    for j in range(blocks):
                        var w_dst = TileTensor(w_smem.unsafe_offset((pre * KSUB + j) * W_ELEMS), w_layout)
                        w_tma.async_copy(w_dst, full[unsafe_offset=pre], ((kb0 + j) * BK, w_row0))
                    kb0 += blocks
                    pre += 1
            wait_on_dependent_grids()
            comptime if LATE_RELEASE:
                launch_dependent_grids()
        while not work.done:
            if not valid_expert(work.expert, E):
                work = sched.next()
                continue
            var w_row = work.expert * N + work.m
            var x_row = work.row0 + plane_of[s0, s1](work.m) * T
            # the token rows the consumers' wgmma width reads, in boxes of XBOX rows: the last
            # token tile of a group (often a few rows) loads a quarter of a full tile's token rows
            var boxes = Int32(1)
            comptime if NARROW:
                boxes = Int32(width_index[BN, WIDTHS](min(work.row_end - work.row0, BN)) + 1)
            var kb = 0
            # the token blocks of the stages whose weights went out before the wait
            while it < pre:
                var blocks = stage_blocks[KSUB](num_k, kb)
                for j in range(blocks):
                    var slot = it * KSUB + j
                    for bx in range(Int(boxes)):
                        var x_dst = TileTensor(x_smem.unsafe_offset(slot * X_ELEMS + bx * XBOX_ELEMS), x_layout)
                        x_tma.async_copy(x_dst, full[unsafe_offset=it], ((kb + j) * BK, x_row + bx * XBOX))
                kb += blocks
                it += 1
            while kb < num_k:
                var s = it % STAGES
                var blocks = stage_blocks[KSUB](num_k, kb)
                if it >= STAGES:
                    empty[unsafe_offset=s].wait(UInt32(((it // STAGES) & 1) ^ 1))
                var block_elems = Int32(W_ELEMS) + boxes * Int32(XBOX_ELEMS)
                full[unsafe_offset=s].expect_bytes(Int32(blocks) * block_elems * Int32(size_of[dtype]()))
                for j in range(blocks):
                    var slot = s * KSUB + j
                    var w_dst = TileTensor(w_smem.unsafe_offset(slot * W_ELEMS), w_layout)
                    w_tma.async_copy(w_dst, full[unsafe_offset=s], ((kb + j) * BK, w_row))
                    # boxes at XBOX-row offsets of a 1024-byte-aligned slot: the 128B swizzle
                    # is a function of the shared address, so they form the same tile one
                    # BN-row box would
                    for bx in range(Int(boxes)):
                        var x_dst = TileTensor(
                            x_smem.unsafe_offset(slot * X_ELEMS + bx * XBOX_ELEMS), x_layout
                        )
                        x_tma.async_copy(x_dst, full[unsafe_offset=s], ((kb + j) * BK, x_row + bx * XBOX))
                kb += blocks
                it += 1
            work = sched.next()
        return

    # ---------------- consumers: wgmma on 64 weight rows each, then the epilogue ----------------
    warpgroup_reg_alloc[CONSUMER_REGS]()
    if early:
        wait_on_dependent_grids()  # before the first store to c
        comptime if LATE_RELEASE:
            launch_dependent_grids()
    var ctid = tid - 128 * wg  # thread in its warpgroup
    var sub = wg - 1  # which 64 weight rows of the tile
    var warp = ctid // 32
    var lane = ctid % 32
    var Nc = Int(Nc32)
    var accum_ptr = stack_allocation[C_FRAG, Float32, address_space=AddressSpace.LOCAL]()
    var accum = TileTensor(accum_ptr, row_major[1, C_FRAG]())
    comptime SCALE_REGS = BN // 32 if has_row_scale else 1
    var scales_ptr = stack_allocation[SCALE_REGS, Float32, address_space=AddressSpace.LOCAL]()
    var scales = TileTensor(scales_ptr, row_major[1, SCALE_REGS]())
    var it = 0
    while True:
        var work = sched.next()
        if work.done:
            break
        comptime for j in range(C_FRAG):
            accum[0, j] = 0
        # The epilogue's row scales, loaded before the mainloop so that their latency hides
        # behind it: lane l loads rows row0 + 32 i + l (BN / 32 coalesced loads), and the
        # epilogue takes each token's scale from the lane holding it by a shuffle. Loaded next
        # to each store instead (after a store to c, which it may alias, so neither LLVM nor
        # ptxas moves it up), every row waits out a load latency while the tensor cores idle.
        comptime if has_row_scale:
            comptime for i in range(BN // 32):
                var srow = work.row0 + 32 * i + lane
                var sv = Float32(1)
                if srow < work.row_end:
                    sv = row_scale[unsafe_offset=srow]
                scales[0, i] = sv
        if valid_expert(work.expert, E):
            # The tile's rows pick the narrowest of WIDTHS wgmma N widths that covers them, so
            # the last token tile of a group (often a few rows) costs about what its rows need.
            var width = width_index[BN, WIDTHS](min(work.row_end - work.row0, BN))
            comptime for v in range(WIDTHS):
                comptime NV = (v + 1) * BN // WIDTHS
                if width == v:
                    _consume_tile[dtype, BN, NV, STAGES, KSUB](
                        w_smem, x_smem, full, empty, accum_ptr, it, num_k, sub, ctid)

        comptime if STAGED:
            var col0 = (work.m + sub * WG_M) // 2 if swiglu else work.m + sub * WG_M
            _staged_epilogue[dtype, BN, swiglu, has_row_scale](
                accum_ptr, scales_ptr, epi_smem.unsafe_offset(sub * EPI_TOKENS * EPI_STRIDE), c, Nc,
                work.row0, work.row_end, col0, sub, ctid)
        else:
            # Epilogue. Fragment of m64nBN: register 4j + {0, 1} holds (weight row 16 warp + lane/4,
            # tokens 8j + 2 (lane % 4) + {0, 1}); 4j + {2, 3} the same tokens, weight row + 8.
            var n0 = work.m + sub * WG_M + 16 * warp + lane // 4
            comptime for j in range(BN // 8):
                comptime for h in range(2):
                    var row = work.row0 + 8 * j + 2 * (lane % 4) + h
                    var scale = Float32(1)
                    comptime if has_row_scale:  # a shuffle: every lane, outside the row mask
                        scale = shuffle_idx(rebind[Float32](scales[0, j // 4]),
                                            UInt32(8 * (j % 4) + 2 * (lane % 4) + h))
                    if row < work.row_end:
                        var v_lo = rebind[Float32](accum[0, 4 * j + h])
                        var v_hi = rebind[Float32](accum[0, 4 * j + 2 + h])
                        var crow = c.unsafe_offset(row * Nc)
                        comptime if swiglu:
                            # n0 % 16 < 8: n0 is a gate column and n0 + 8 its up column
                            if n0 < N:
                                var o = SWIGLU_BLOCK * (n0 // 16) + n0 % 16
                                crow[unsafe_offset=o] = apply_epilogue[True, has_row_scale, 1](
                                    v_lo, v_hi, scale).cast[dtype]()
                        else:
                            if n0 < N:
                                crow[unsafe_offset=n0] = apply_epilogue[False, has_row_scale, 1](
                                    v_lo, 0, scale).cast[dtype]()
                            if n0 + 8 < N:
                                crow[unsafe_offset=n0 + 8] = apply_epilogue[False, has_row_scale, 1](
                                    v_hi, 0, scale).cast[dtype]()


def grouped_matmul_sm90[
    dtype: DType, BN: Int, WIDTHS: Int, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool,
    KSUB: Int = 1, STAGED: Bool = False, EARLY_ROUTING: Bool = False, LATE_RELEASE: Bool = True,
](
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
    """Enqueues the persistent SM90 kernel with token tile BN and WIDTHS wgmma widths
    BN / WIDTHS, 2 BN / WIDTHS, ..., BN (device pointers), KSUB blocks of BK columns per ring
    stage.

    Programmatic launch (common/pdl.mojo): LATE_RELEASE lets the next kernel start only once
    this one's wait has returned, i.e. once everything this kernel reads is complete; so a
    later kernel may rely on what this one read being complete before it starts.
    EARLY_ROUTING (entry.mojo's routing_settled: the routing was read by an earlier grouped
    matmul of the stream, which released late, and b is never written by the stream) reads
    the routing into the group table and loads the first tile's weights into the ring before
    the wait; the tokens, the row scales and every store come after it.

    Needs K * sizeof(dtype) % 16 == 0 (TMA strides); the entry routes other K to naive.mojo.
    """
    comptime assert BN % (8 * WIDTHS) == 0 and BN <= 256, "BN must be a multiple of 8 WIDTHS up to 256"
    comptime STAGES = sm90_stages[dtype, BN, KSUB, STAGED]()
    comptime SMEM = sm90_smem_bytes[dtype, BN, KSUB, STAGED]()
    comptime assert STAGES >= 2, "shared memory too small for two stages"
    comptime assert NUM_THREADS > TABLE_GROUPS, "one thread per table entry"
    if shape.T == 0 or shape.G == 0:
        return
    var w_tma = create_tma_tile[BM, BK, swizzle_mode=SW](
        ctx, TileTensor(b, row_major(Coord(shape.E * shape.N, shape.K)))
    )
    var x_tma = create_tma_tile[token_box_rows[BN, WIDTHS](), BK, swizzle_mode=SW](
        ctx, TileTensor(a, row_major(Coord(shape.a_rows, shape.K)))
    )
    comptime kernel = grouped_sm90_kernel[
        dtype, BN, WIDTHS, STAGES, KSUB, s0, s1, swiglu, has_row_scale, STAGED, EARLY_ROUTING, LATE_RELEASE,
        type_of(w_tma).tile_shape, type_of(w_tma).desc_shape,
        type_of(x_tma).tile_shape, type_of(x_tma).desc_shape,
    ]
    var num_sms = ctx.get_attribute(DeviceAttribute.MULTIPROCESSOR_COUNT)
    ctx.enqueue_function[kernel](
        w_tma, x_tma, c, a_offsets, expert_ids, stats, row_scale,
        Int32(shape.T), Int32(shape.K), Int32(shape.N), Int32(shape.Nc), Int32(shape.E),
        Int32(shape.G),
        grid_dim=num_sms,
        block_dim=NUM_THREADS,
        shared_mem_bytes=SMEM,
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(SMEM)),
        attributes=pdl_attributes(),
    )

"""SM100 (B200, sm_100a) kernel of `grouped_matmul_sm100_persistent`: tcgen05 + TMEM, persistent.

Same scheduler and swap-AB as sm90.mojo, with Blackwell's asynchronous tensor core:
- grid = number of SMs (a multiple of cta_group); 192 threads = 6 warps:
  warps 0-3 epilogue (warp w owns TMEM lanes 32w..32w+31 = weight rows), warp 4 TMA producer,
  warp 5 MMA issuer (it also allocates and frees TMEM);
- MMA "A" = the expert's weight tile (128 rows per CTA, K-major, 128B swizzle), MMA "B" = the
  token tile (K-major), D = fp32 [weight rows, tokens] in TMEM: MMA_M = 128 * cta_group,
  MMA_N = BN tokens, MMA_K = 16, BK = 64 per stage;
- smem ring of STAGES (as many as fit) with full/empty mbarriers (tcgen05.commit frees a
  stage), ACC_STAGES TMEM accumulators with acc_full / acc_empty mbarriers so the epilogue of
  one tile overlaps the MMAs of the next;
- cta_group = 2: a 2x1x1 cluster computes a 256-row weight tile; each CTA loads its own 128
  weight rows and half of the tokens (signalling the leader's barrier), the leader CTA issues
  tcgen05.mma.cta_group::2 and multicasts the commits; each CTA's TMEM holds its 128 rows x all
  tokens. The pair walks the work list by cluster index.
Epilogue: tcgen05.ld 32x32b (thread = weight row = output column, registers = tokens), then
SwiGLU (gate/up 8 lanes apart: one warp shuffle) / row scale, masked stores to c.
Correctness on hardware: NOT run (no sm_100 machine here); compiled for sm_100a in CI.
"""

from std.math import ceildiv
from std.sys import size_of
from std.utils.index import Index
from std.utils.static_tuple import StaticTuple
from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, barrier, block_idx, grid_dim, lane_id, thread_idx
from max.gpu import warp_id as get_warp_id
from max.gpu.compute.arch.mma_nvidia_sm100 import (
    MMASmemDescriptor,
    UMMAInsDescriptor,
    UMMAKind,
    mma,
    mma_arrive,
    mma_arrive_multicast,
)
from max.gpu.compute.arch.tcgen05 import (
    tcgen05_alloc,
    tcgen05_dealloc,
    tcgen05_fence_after,
    tcgen05_fence_before,
    tcgen05_ld,
    tcgen05_load_wait,
    tcgen05_release_allocation_lock,
)
from max.gpu.host import DeviceAttribute, DeviceContext, FuncAttribute
from max.gpu.host.nvidia.tma import TensorMapSwizzle
from max.gpu.memory import AddressSpace, external_memory, fence_mbarrier_init
from max.gpu.primitives.cluster import block_rank_in_cluster, cluster_sync, elect_one_sync
from max.gpu.primitives.warp import shuffle_down
from max.gpu.sync import umma_arrive_leader_cta
from layout import Coord, TileTensor, row_major
from layout.tensor_core_async import tile_layout_k_major, tile_layout_k_major_typed, tile_to_descriptor
from layout.tma_async import SharedMemBarrier, TMATensorTile, create_tma_tile

from ...common.target import SMEM_BUDGET_SM90
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
"""Weight rows per CTA (TMEM lanes)."""
comptime BK = 64
comptime MMA_K = 16
comptime NUM_THREADS = 192
comptime EPI_THREADS = 128
comptime PRODUCER_WARP = 4
comptime MMA_WARP = 5
comptime ACC_STAGES = 2
comptime MAX_STAGES = 16
comptime LD_CHUNK = 32
"""Token columns read from TMEM per tcgen05.ld (32x32b.x32: 32 registers)."""


def sm100_stage_bytes[dtype: DType, BN: Int, cta_group: Int]() -> Int:
    return (BM + BN // cta_group) * BK * size_of[dtype]()


def sm100_stages[dtype: DType, BN: Int, cta_group: Int]() -> Int:
    """Pipeline depth from shared memory: ring stages (2 mbarriers each) next to the fixed
    part (accumulator barriers and the TMEM address)."""
    comptime fixed = 2 * ACC_STAGES * 8 + 16
    return min(MAX_STAGES, (SMEM_BUDGET_SM90 - fixed) // (sm100_stage_bytes[dtype, BN, cta_group]() + 16))


def sm100_smem_bytes[dtype: DType, BN: Int, cta_group: Int]() -> Int:
    comptime stages = sm100_stages[dtype, BN, cta_group]()
    return stages * sm100_stage_bytes[dtype, BN, cta_group]() + 2 * stages * 8 + 2 * ACC_STAGES * 8 + 16


def tmem_columns[BN: Int]() -> Int:
    """TMEM columns to allocate: ACC_STAGES accumulators of BN fp32 columns, a power of 2 >= 32."""
    var need = ACC_STAGES * BN
    var cols = 32
    while cols < need:
        cols *= 2
    return cols


@__llvm_metadata(`nvvm.cluster_dim`=cluster_shape)
@__llvm_arg_metadata(w_tma, `nvvm.grid_constant`)
@__llvm_arg_metadata(x_tma, `nvvm.grid_constant`)
@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(NUM_THREADS)))
def grouped_sm100_kernel[
    dtype: DType,
    BN: Int,
    cta_group: Int,
    STAGES: Int,
    s0: Int,
    s1: Int,
    swiglu: Bool,
    has_row_scale: Bool,
    w_tile: Coord,
    w_desc: Coord,
    x_tile: Coord,
    x_desc: Coord,
    cluster_shape: StaticTuple[Int32, 3],
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
    comptime XN = BN // cta_group
    """Token rows this CTA loads (its half of the MMA's N with cta_group 2)."""
    comptime MMA_M = BM * cta_group
    comptime W_ELEMS = BM * BK
    comptime X_ELEMS = XN * BK
    comptime STAGE_BYTES = (W_ELEMS + X_ELEMS) * size_of[dtype]()
    comptime TMEM_COLS = tmem_columns[BN]()
    comptime w_layout = tile_layout_k_major_typed[dtype, BM, BK, SW]
    comptime x_layout = tile_layout_k_major_typed[dtype, XN, BK, SW]
    # Shared-memory descriptor strides of the K-major 128B-swizzled tiles (bytes).
    comptime w_canon = tile_to_descriptor[dtype, tile_layout_k_major[dtype, BM, BK, swizzle_mode=SW]()]()
    comptime x_canon = tile_to_descriptor[dtype, tile_layout_k_major[dtype, XN, BK, swizzle_mode=SW]()]()
    comptime W_SBO = w_canon[0].stride[1].value() * size_of[dtype]()
    comptime W_LBO = w_canon[1].stride[1].value() * size_of[dtype]()
    comptime X_SBO = x_canon[0].stride[1].value() * size_of[dtype]()
    comptime X_LBO = x_canon[1].stride[1].value() * size_of[dtype]()

    var smem = external_memory[Scalar[dtype], address_space=AddressSpace.SHARED, alignment=1024]()
    var w_smem = smem
    var x_smem = smem.unsafe_offset(STAGES * W_ELEMS)
    var bars = smem.unsafe_offset(STAGES * (W_ELEMS + X_ELEMS)).unsafe_bitcast[SharedMemBarrier]()
    var full = bars
    var empty = bars.unsafe_offset(STAGES)
    var acc_full = bars.unsafe_offset(2 * STAGES)
    var acc_empty = bars.unsafe_offset(2 * STAGES + ACC_STAGES)
    var tmem_addr_ptr = bars.unsafe_offset(2 * STAGES + 2 * ACC_STAGES).unsafe_bitcast[UInt32]()

    var warp = get_warp_id()
    var rank = 0
    comptime if cta_group == 2:
        rank = Int(block_rank_in_cluster() % 2)
    var is_leader = rank == 0

    if thread_idx.x == 0:
        comptime for s in range(STAGES):
            full[unsafe_offset=s].init(1)  # (leader) expect_tx + the TMA bytes of the pair
            empty[unsafe_offset=s].init(1)  # the MMA warp's tcgen05.commit
        comptime for a in range(ACC_STAGES):
            acc_full[unsafe_offset=a].init(1)  # the MMA warp's commit after a tile's last k
            acc_empty[unsafe_offset=a].init(Int32(4 * cta_group))  # lane 0 of each epilogue warp (pair)
        fence_mbarrier_init()
    if warp == MMA_WARP:
        tcgen05_alloc[Int32(cta_group)](tmem_addr_ptr, UInt32(TMEM_COLS))
        tcgen05_release_allocation_lock[Int32(cta_group)]()
    tcgen05_fence_before()
    barrier()
    comptime if cta_group == 2:
        cluster_sync()  # the peer signals the leader's barriers from now on
    tcgen05_fence_after()
    var tmem_base = tmem_addr_ptr[unsafe_offset=0]

    var T = Int(T32)
    var K = Int(K32)
    var N = Int(N32)
    var E = Int(E32)
    var num_k = ceildiv(K, BK)
    var first = block_idx.x // cta_group
    var stride = grid_dim.x // cta_group
    var sched = GroupedTileScheduler[MMA_M, BN](a_offsets, expert_ids, stats, T, N, Int(G32), first, stride)

    if warp == PRODUCER_WARP:
        # ---------------- TMA producer (one elected lane) ----------------
        if elect_one_sync():
            var it = 0
            while True:
                var work = sched.next()
                if work.done:
                    break
                if not valid_expert(work.expert, E):
                    continue
                var w_row = work.expert * N + work.m + rank * BM
                var x_row = work.row0 + plane_of[s0, s1](work.m) * T + rank * XN
                for kt in range(num_k):
                    var s = it % STAGES
                    if it >= STAGES:
                        empty[unsafe_offset=s].wait(UInt32(((it // STAGES) & 1) ^ 1))
                    if is_leader:
                        full[unsafe_offset=s].expect_bytes(Int32(cta_group * STAGE_BYTES))
                    var w_dst = TileTensor(w_smem.unsafe_offset(s * W_ELEMS), w_layout)
                    var x_dst = TileTensor(x_smem.unsafe_offset(s * X_ELEMS), x_layout)
                    comptime if cta_group == 1:
                        w_tma.async_copy(w_dst, full[unsafe_offset=s], (kt * BK, w_row))
                        x_tma.async_copy(x_dst, full[unsafe_offset=s], (kt * BK, x_row))
                    else:
                        # each CTA fills its own smem; the bytes complete the leader's barrier
                        var own = UInt16(1 << rank)
                        w_tma.async_multicast_load[cta_group](
                            w_dst, full[unsafe_offset=s], (kt * BK, w_row), own)
                        x_tma.async_multicast_load[cta_group](
                            x_dst, full[unsafe_offset=s], (kt * BK, x_row), own)
                    it += 1
    elif warp == MMA_WARP:
        # ---------------- MMA issuer (leader CTA, one elected lane) ----------------
        if is_leader and elect_one_sync():
            var idesc = UMMAInsDescriptor[UMMAKind.KIND_F16].create[
                F32, dtype, dtype, Index[dtype=DType.uint32](MMA_M, BN), transpose_b=True
            ]()
            var it = 0
            var acc_it = 0
            while True:
                var work = sched.next()
                if work.done:
                    break
                if not valid_expert(work.expert, E):
                    continue
                var acc = acc_it % ACC_STAGES
                if acc_it >= ACC_STAGES:
                    acc_empty[unsafe_offset=acc].wait(UInt32(((acc_it // ACC_STAGES) & 1) ^ 1))
                tcgen05_fence_after()
                var d_tmem = tmem_base + UInt32(acc * BN)
                for kt in range(num_k):
                    var s = it % STAGES
                    full[unsafe_offset=s].wait(UInt32((it // STAGES) & 1))
                    tcgen05_fence_after()
                    var wdesc = MMASmemDescriptor.create[W_SBO, W_LBO, SW](w_smem.unsafe_offset(s * W_ELEMS))
                    var xdesc = MMASmemDescriptor.create[X_SBO, X_LBO, SW](x_smem.unsafe_offset(s * X_ELEMS))
                    comptime for kk in range(BK // MMA_K):
                        # K-major 128B swizzle: the next 16 K elements are 32 bytes further
                        comptime koff = kk * MMA_K * size_of[dtype]()
                        var scale_c = UInt32(0 if (kt == 0 and kk == 0) else 1)
                        mma[cta_group](wdesc + koff, xdesc + koff, d_tmem, idesc, c_scale=scale_c)
                    comptime if cta_group == 1:
                        mma_arrive[cta_group](empty.unsafe_offset(s))
                    else:
                        mma_arrive_multicast[cta_group](empty.unsafe_offset(s), UInt16(0b11))
                    it += 1
                comptime if cta_group == 1:
                    mma_arrive[cta_group](acc_full.unsafe_offset(acc))
                else:
                    mma_arrive_multicast[cta_group](acc_full.unsafe_offset(acc), UInt16(0b11))
                acc_it += 1
    elif warp < 4:
        # ---------------- epilogue warps: TMEM -> registers -> c ----------------
        var Nc = Int(Nc32)
        var lane = lane_id()
        var acc_it = 0
        while True:
            var work = sched.next()
            if work.done:
                break
            var n = work.m + rank * BM + 32 * warp + lane  # this thread's matmul column
            var valid = valid_expert(work.expert, E)
            var acc = acc_it % ACC_STAGES
            if valid:
                acc_full[unsafe_offset=acc].wait(UInt32((acc_it // ACC_STAGES) & 1))
                tcgen05_fence_after()
            comptime for ch in range(BN // LD_CHUNK):
                var vals = Array[Float32, LD_CHUNK](fill=0)
                if valid:
                    var addr = tmem_base + UInt32(((32 * warp) << 16) + acc * BN + ch * LD_CHUNK)
                    vals = tcgen05_ld[
                        datapaths=32, bits=32, repeat=LD_CHUNK, dtype=F32, pack=False, width=LD_CHUNK
                    ](addr)
                    tcgen05_load_wait()
                comptime if ch == BN // LD_CHUNK - 1:
                    if valid:
                        tcgen05_fence_before()
                        if lane == 0:
                            comptime if cta_group == 1:
                                _ = acc_empty[unsafe_offset=acc].arrive()
                            else:
                                umma_arrive_leader_cta(acc_empty.unsafe_offset(acc))
                comptime for j in range(LD_CHUNK):
                    var row = work.row0 + ch * LD_CHUNK + j
                    var v = vals[j]
                    comptime if swiglu:
                        var up = shuffle_down(v, UInt32(SWIGLU_BLOCK))  # lane + 8 holds the up row
                        if row < work.row_end and n < N and n % 16 < SWIGLU_BLOCK:
                            var scale = Float32(1)
                            comptime if has_row_scale:
                                scale = row_scale[unsafe_offset=row]
                            var o = SWIGLU_BLOCK * (n // 16) + n % 16
                            c[unsafe_offset=row * Nc + o] = apply_epilogue[True, has_row_scale, 1](
                                v, up, scale).cast[dtype]()
                    else:
                        if row < work.row_end and n < N:
                            var scale = Float32(1)
                            comptime if has_row_scale:
                                scale = row_scale[unsafe_offset=row]
                            c[unsafe_offset=row * Nc + n] = apply_epilogue[False, has_row_scale, 1](
                                v, 0, scale).cast[dtype]()
            if valid:
                acc_it += 1

    # teardown: every role is done with TMEM and the barriers (the pair too)
    tcgen05_fence_before()
    barrier()
    comptime if cta_group == 2:
        cluster_sync()
    if warp == MMA_WARP:
        tcgen05_fence_after()
        tcgen05_dealloc[Int32(cta_group)](tmem_base, UInt32(TMEM_COLS))


def grouped_matmul_sm100[
    dtype: DType, BN: Int, cta_group: Int, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool
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
    """Enqueues the persistent SM100 kernel: token tile BN, cta_group 1 or 2 (device pointers).

    Needs K * sizeof(dtype) % 16 == 0 (TMA strides); the entry routes other K to naive.mojo.
    """
    comptime assert cta_group == 1 or cta_group == 2, "cta_group must be 1 or 2"
    comptime assert BN % (16 * cta_group) == 0 and BN <= 256 and BN % LD_CHUNK == 0, (
        "BN must be a multiple of 32 (and of 16 * cta_group), at most 256")
    comptime STAGES = sm100_stages[dtype, BN, cta_group]()
    comptime SMEM = sm100_smem_bytes[dtype, BN, cta_group]()
    comptime assert STAGES >= 2, "shared memory too small for two stages"
    if shape.T == 0 or shape.G == 0:
        return
    var w_tma = create_tma_tile[BM, BK, swizzle_mode=SW](
        ctx, TileTensor(b, row_major(Coord(shape.E * shape.N, shape.K)))
    )
    var x_tma = create_tma_tile[BN // cta_group, BK, swizzle_mode=SW](
        ctx, TileTensor(a, row_major(Coord(shape.a_rows, shape.K)))
    )
    comptime kernel = grouped_sm100_kernel[
        dtype, BN, cta_group, STAGES, s0, s1, swiglu, has_row_scale,
        type_of(w_tma).tile_shape, type_of(w_tma).desc_shape,
        type_of(x_tma).tile_shape, type_of(x_tma).desc_shape,
        StaticTuple[Int32, 3](Int32(cta_group), 1, 1),
    ]
    var num_sms = ctx.get_attribute(DeviceAttribute.MULTIPROCESSOR_COUNT)
    var grid = (num_sms // cta_group) * cta_group
    ctx.enqueue_function[kernel](
        w_tma, x_tma, c, a_offsets, expert_ids, stats, row_scale,
        Int32(shape.T), Int32(shape.K), Int32(shape.N), Int32(shape.Nc), Int32(shape.E),
        Int32(shape.G),
        grid_dim=grid,
        block_dim=NUM_THREADS,
        shared_mem_bytes=SMEM,
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(SMEM)),
    )

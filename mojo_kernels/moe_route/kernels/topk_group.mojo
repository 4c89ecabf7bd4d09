"""GPU path of `moe_route_topk_group`: two kernels, deterministic, no atomics, both launched as
programmatic dependents (common/pdl.mojo) that wait for their predecessor before any access.

Router (`_router_kernel`, a CTA of ROUTER_THREADS per ROUTER_TOKENS tokens): warp w takes
expert groups w, w + ROUTER_WARPS, ... of ROUTER_EXPERTS experts; lane l reads columns
[8 (l + 32 i), +8) of its experts' weight rows (16-byte loads, coalesced across the warp) and
of the block's token rows, and keeps ROUTER_TOKENS x ROUTER_EXPERTS float32 partial dots, so
every x vector it loads serves ROUTER_EXPERTS experts and every weight vector ROUTER_TOKENS
tokens. Shuffles reduce the partials; the logits go to shared memory [tokens, E]. Then warp i
ranks token i's experts: K rounds of "largest key below the previous pick" (route.mojo), each a
strided scan of the logits plus a warp max; lane 0 writes the ids and the softmax.

Grouping (`_group_kernel`, ONE CTA of GROUP_THREADS): warp w owns the contiguous segment
[w L, (w + 1) L) of the R = T K assignments (L a multiple of 32). A table in shared memory holds
count[e, w] (e-major). Pass 1: the warp walks its segment 32 assignments at a time; match_any
groups the lanes of one expert, whose lowest lane adds the group's size to count[e, w] (only
warp w touches column w, and one lane per expert per step: no atomics). A block-wide exclusive
scan of the table in e-major order (each thread a run of entries, a shuffle scan per warp, a
scan of the warp totals) turns count[e, w] into the first sorted row of (e, w): rows sorted by
(expert, assignment). a_offsets[e] is then table[e, 0], the max rows of one expert a block max.
Pass 2 walks the segments again: an assignment's row is its (e, w) base plus its rank among the
same-expert lanes of its step; the group's lowest lane then advances the base.
"""

from std.math import ceildiv, exp
from std.bit import count_trailing_zeros, pop_count
from std.memory import stack_allocation
from std.utils.static_tuple import StaticTuple
from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, WARP_SIZE, barrier, block_idx, thread_idx
from max.gpu.host import DeviceContext, FuncAttribute
from max.gpu.memory import AddressSpace, external_memory
from max.gpu.primitives.warp import match_any, shuffle_up, shuffle_xor
from max.gpu.primitives.warp import max as warp_max
from max.gpu.sync import syncwarp

from ...common.pdl import launch_dependent_grids, pdl_attributes, wait_on_dependent_grids
from ..route import key_expert, key_logit, logit_key

comptime F32 = DType.float32
comptime ROUTER_THREADS = 512
comptime ROUTER_WARPS = ROUTER_THREADS // WARP_SIZE
comptime ROUTER_TOKENS = 8
"""Tokens per router CTA (each warp ranks one of them)."""
comptime ROUTER_EXPERTS = WARP_SIZE // ROUTER_TOKENS
"""Experts a warp accumulates at once (a warp's partial dots: one per lane)."""
comptime VEC = 8
"""Elements per 16-byte load: H must be a multiple of it (the op's contract)."""
comptime LOG_WARP = 5 if WARP_SIZE == 32 else 6
comptime GROUP_THREADS = 1024
comptime SEGMENTS = GROUP_THREADS // WARP_SIZE
"""One segment of the assignments per warp of the grouping CTA."""


@always_inline
def _reduce_scatter[n: Int](v: SIMD[F32, n], lane: Int) -> Float32:
    """Sums v over the lanes of the warp (n = WARP_SIZE values per lane); lane l gets the sum
    of element l. Each step halves the values: a lane keeps the half its partner does not and
    adds the partner's copy of it (n - 1 shuffles in all instead of n log2(n))."""
    comptime if n == 1:
        return v[0]
    else:
        comptime half = n // 2
        var lo = v.slice[half, offset=0]()
        var hi = v.slice[half, offset=half]()
        var upper = (lane & half) != 0
        var keep = hi if upper else lo
        var send = lo if upper else hi
        comptime for i in range(half):
            keep[i] += shuffle_xor(send[i], UInt32(half))
        return _reduce_scatter[half](keep, lane)


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(ROUTER_THREADS)))
def _router_kernel[dtype: DType](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    w: Pointer[Scalar[dtype], MutAnyOrigin],
    ids: Pointer[Int32, MutAnyOrigin],
    weights: Pointer[Float32, MutAnyOrigin],
    T: Int32,
    H: Int32,
    E: Int32,
    K: Int32,
    x_stride: Int32,
):
    """Tokens [block_idx.x * ROUTER_TOKENS, +ROUTER_TOKENS): logits, top-K ids, softmax weights.
    Dynamic shared memory: ROUTER_TOKENS * E float32 logits."""
    comptime BT = ROUTER_TOKENS
    comptime EPW = ROUTER_EXPERTS
    var logits = external_memory[Float32, address_space=AddressSpace.SHARED, alignment=16]()
    # PDL (common/pdl.mojo): resident early, reading x only once its producer has completed
    launch_dependent_grids()
    wait_on_dependent_grids()
    var warp = thread_idx.x // WARP_SIZE
    var lane = thread_idx.x % WARP_SIZE
    var n_e = Int(E)
    var n_h = Int(H)
    var t0 = block_idx.x * BT
    var nt = min(BT, Int(T) - t0)
    var xs = Int(x_stride)
    for g in range(warp, ceildiv(n_e, EPW), ROUTER_WARPS):
        var e0 = g * EPW
        var acc = SIMD[F32, BT * EPW](0)
        var c = lane * VEC
        while c < n_h:
            var wv = SIMD[F32, EPW * VEC](0)
            comptime for j in range(EPW):
                if e0 + j < n_e:
                    var row = w.unsafe_offset((e0 + j) * n_h + c).unsafe_load[width=VEC, alignment=16](0)
                    wv = wv.insert[offset=j * VEC](row.cast[F32]())
            comptime for i in range(BT):
                if i < nt:
                    var xv = x.unsafe_offset((t0 + i) * xs + c).unsafe_load[width=VEC, alignment=16](0).cast[F32]()
                    comptime for j in range(EPW):
                        var s = acc[i * EPW + j]
                        comptime for v in range(VEC):
                            s = xv[v].fma(wv[j * VEC + v], s)
                        acc[i * EPW + j] = s
            c += WARP_SIZE * VEC
        var dot = _reduce_scatter[BT * EPW](acc, lane)  # lane l: the dot of slot l
        var i = lane // EPW
        var j = lane % EPW
        if i < nt and e0 + j < n_e:
            logits[unsafe_offset=i * n_e + e0 + j] = dot
    barrier()
    if warp >= nt:
        return  # whole warps leave: no shuffle is left waiting
    var t = t0 + warp
    var row = logits.unsafe_offset(warp * n_e)
    var n_k = Int(K)
    var prev = UInt64(0)
    var v0 = Float32(0)
    var total = Float32(0)
    for r in range(n_k):
        var best = UInt64(0)
        for e in range(lane, n_e, WARP_SIZE):
            var key = logit_key(row[unsafe_offset=e], e)
            if (r == 0 or key < prev) and key > best:
                best = key
        best = warp_max(best)
        prev = best
        if lane == 0:
            var v = key_logit(best)
            if r == 0:
                v0 = v
            var p = exp(v - v0)
            total += p
            ids[unsafe_offset=t * n_k + r] = key_expert(best)
            weights[unsafe_offset=t * n_k + r] = p
    if lane == 0:
        for r in range(n_k):
            weights[unsafe_offset=t * n_k + r] = weights[unsafe_offset=t * n_k + r] / total


@always_inline
def _peers(e: Int32) -> UInt64:
    """The lanes of the warp holding the same value as this lane (bit l = lane l)."""
    return match_any(e).cast[DType.uint64]()


@always_inline
def _lanes_below(lane: Int) -> UInt64:
    return (UInt64(1) << UInt64(lane)) - 1


@always_inline
def _warp_inclusive_sum(v: UInt32, lane: Int) -> UInt32:
    var incl = v
    comptime for step in range(LOG_WARP):
        var up = shuffle_up(incl, UInt32(1 << step))
        if lane >= (1 << step):
            incl += up
    return incl


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(GROUP_THREADS)))
def _group_kernel(
    ids: Pointer[Int32, MutAnyOrigin],
    weights: Pointer[Float32, MutAnyOrigin],
    token_index: Pointer[Int64, MutAnyOrigin],
    row_scale: Pointer[Float32, MutAnyOrigin],
    inverse: Pointer[Int64, MutAnyOrigin],
    offsets: Pointer[UInt32, MutAnyOrigin],
    stats: Pointer[UInt32, MutAnyOrigin],
    R: Int32,
    E: Int32,
    K: Int32,
):
    """One CTA: sorts the R assignments by (expert, assignment). Dynamic shared memory: the
    E * SEGMENTS uint32 table."""
    var table = external_memory[UInt32, address_space=AddressSpace.SHARED, alignment=16]()
    var warp_sums = stack_allocation[SEGMENTS, UInt32, address_space=AddressSpace.SHARED]()
    var warp_maxes = stack_allocation[SEGMENTS, UInt32, address_space=AddressSpace.SHARED]()
    # PDL: the ids and weights come from the router kernel just before
    launch_dependent_grids()
    wait_on_dependent_grids()
    var tid = thread_idx.x
    var warp = tid // WARP_SIZE
    var lane = tid % WARP_SIZE
    var n_r = Int(R)
    var n_e = Int(E)
    var n_k = Int(K)
    var n_q = n_e * SEGMENTS
    var seg = ceildiv(ceildiv(n_r, SEGMENTS), WARP_SIZE) * WARP_SIZE
    var a0 = warp * seg
    var a1 = min(n_r, a0 + seg)
    for q in range(tid, n_q, GROUP_THREADS):
        table[unsafe_offset=q] = 0
    barrier()

    # pass 1: count[e, warp]
    var b = a0
    while b < a1:
        var a = b + lane
        var e = ids[unsafe_offset=a] if a < a1 else Int32(-1)
        var peers = _peers(e)
        if e >= 0 and Int(count_trailing_zeros(peers)) == lane:
            table[unsafe_offset=Int(e) * SEGMENTS + warp] += UInt32(pop_count(peers))
        syncwarp()
        b += WARP_SIZE

    barrier()
    # exclusive scan of the table (e-major): thread tid owns entries [tid * per, (tid + 1) * per)
    var per = ceildiv(n_q, GROUP_THREADS)
    var q0 = min(n_q, tid * per)
    var q1 = min(n_q, q0 + per)
    var own = UInt32(0)
    for q in range(q0, q1):
        own += table[unsafe_offset=q]
    var incl = _warp_inclusive_sum(own, lane)
    if lane == WARP_SIZE - 1:
        warp_sums[unsafe_offset=warp] = incl
    barrier()
    if warp == 0:
        var total = warp_sums[unsafe_offset=lane] if lane < SEGMENTS else UInt32(0)
        var wincl = _warp_inclusive_sum(total, lane)
        if lane < SEGMENTS:
            warp_sums[unsafe_offset=lane] = wincl - total
    barrier()
    var run = warp_sums[unsafe_offset=warp] + incl - own
    for q in range(q0, q1):
        var c = table[unsafe_offset=q]
        table[unsafe_offset=q] = run
        run += c
    barrier()

    # a_offsets, stats
    var most = UInt32(0)
    for e in range(tid, n_e, GROUP_THREADS):
        var start = table[unsafe_offset=e * SEGMENTS]
        var end = table[unsafe_offset=(e + 1) * SEGMENTS] if e + 1 < n_e else UInt32(n_r)
        offsets[unsafe_offset=e] = start
        most = max(most, end - start)
    most = warp_max(most)
    if lane == 0:
        warp_maxes[unsafe_offset=warp] = most
    if tid == 0:
        offsets[unsafe_offset=n_e] = UInt32(n_r)
    barrier()
    if warp == 0:
        most = warp_max(warp_maxes[unsafe_offset=lane] if lane < SEGMENTS else UInt32(0))
        if lane == 0:
            stats[unsafe_offset=0] = most
            stats[unsafe_offset=1] = UInt32(n_e)

    # pass 2: rows (the a_offsets reads above finished at the barrier)
    b = a0
    while b < a1:
        var a = b + lane
        var valid = a < a1
        var e = ids[unsafe_offset=a] if valid else Int32(-1)
        var peers = _peers(e)
        var base = UInt32(0)
        if valid:
            base = table[unsafe_offset=Int(e) * SEGMENTS + warp]
            var row = Int(base) + Int(pop_count(peers & _lanes_below(lane)))
            token_index[unsafe_offset=row] = Int64(a // n_k)
            row_scale[unsafe_offset=row] = weights[unsafe_offset=a]
            inverse[unsafe_offset=a] = Int64(row)
        syncwarp()
        if valid and Int(count_trailing_zeros(peers)) == lane:
            table[unsafe_offset=Int(e) * SEGMENTS + warp] = base + UInt32(pop_count(peers))
        syncwarp()
        b += WARP_SIZE


def route_gpu[dtype: DType](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    w: Pointer[Scalar[dtype], MutAnyOrigin],
    ids: Pointer[Int32, MutAnyOrigin],
    weights: Pointer[Float32, MutAnyOrigin],
    token_index: Pointer[Int64, MutAnyOrigin],
    row_scale: Pointer[Float32, MutAnyOrigin],
    inverse: Pointer[Int64, MutAnyOrigin],
    offsets: Pointer[UInt32, MutAnyOrigin],
    stats: Pointer[UInt32, MutAnyOrigin],
    T: Int,
    H: Int,
    E: Int,
    K: Int,
    x_stride: Int,
    ctx: DeviceContext,
) raises:
    """Enqueues the router (nothing for T == 0) and the grouping kernel (always: it writes
    a_offsets and stats for R == 0 too)."""
    if T > 0:
        comptime router = _router_kernel[dtype]
        var smem = ROUTER_TOKENS * E * 4
        ctx.enqueue_function[router](
            x, w, ids, weights, Int32(T), Int32(H), Int32(E), Int32(K), Int32(x_stride),
            grid_dim=ceildiv(T, ROUTER_TOKENS), block_dim=ROUTER_THREADS, shared_mem_bytes=smem,
            func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(smem)),
            attributes=pdl_attributes(),
        )
    var table_bytes = E * SEGMENTS * 4
    ctx.enqueue_function[_group_kernel](
        ids, weights, token_index, row_scale, inverse, offsets, stats, Int32(T * K), Int32(E), Int32(K),
        grid_dim=1, block_dim=GROUP_THREADS, shared_mem_bytes=table_bytes,
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(table_bytes)),
        attributes=pdl_attributes(),
    )

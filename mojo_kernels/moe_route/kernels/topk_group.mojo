"""GPU path of `moe_route_topk_group`: two kernels, deterministic, no atomics, both launched as
programmatic dependents (common/pdl.mojo) that wait for their predecessor before any access.

Router (`_router_kernel`, clusters of CS CTAs of ROUTER_THREADS, a cluster per block of BT
tokens): CTA `rank` of a cluster computes the logits of its share of the experts for the whole
block; warp w takes local experts w, w + ROUTER_WARPS, ... two at a time, each lane holding
CHUNK 16-byte vectors of both weight rows in registers while it runs them over the block's
token rows, float32 partial dots reduced by shuffles into the CTA's shared memory. After a
cluster barrier each CTA ranks BT / CS of the block's tokens, a warp per token reading the
token's E logits from all the cluster's CTAs (distributed shared memory): K rounds of "largest
key below the previous pick" (route.mojo), each a strided scan plus a warp max; lane 0 writes
the ids and the softmax. So even one decode token is routed by CS SMs (the router weight is
read by the whole cluster, not one SM), with no scratch memory and no second kernel. Targets
without clusters (common/target.mojo `has_clusters`) run CS = 1: one CTA per 8 tokens.

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
from max.gpu.host import Dim
from max.gpu.primitives.cluster import block_rank_in_cluster, cluster_sync, load_cluster_smem
from max.gpu.primitives.warp import match_any, shuffle_up, shuffle_xor
from max.gpu.primitives.warp import max as warp_max
from max.gpu.sync import syncwarp

from ...common.pdl import launch_dependent_grids, pdl_attributes, wait_on_dependent_grids
from ...common.target import FORCE_AUTO, gpu_path, has_clusters
from ..route import key_expert, key_logit, logit_key

comptime F32 = DType.float32
comptime ROUTER_WARPS = 8
comptime ROUTER_THREADS = ROUTER_WARPS * WARP_SIZE
comptime CHUNK = 4
"""16-byte vectors of each of a warp's two weight rows a lane holds at once."""
comptime DECODE_TOKENS = 64
"""Up to this many tokens the router runs clusters of 8 CTAs over 8-token blocks (every
cluster's CTAs split the experts: the whole GPU reads the router weight), beyond it clusters of
2 over 16-token blocks (fewer re-reads of x and of the weight)."""
comptime VEC = 8
"""Elements per 16-byte load: H must be a multiple of it (the op's contract)."""
comptime LOG_WARP = 5 if WARP_SIZE == 32 else 6
comptime GROUP_THREADS = 1024
comptime SEGMENTS = GROUP_THREADS // WARP_SIZE
"""One segment of the assignments per warp of the grouping CTA."""
comptime GROUP_UNROLL = 8
"""Steps of 32 assignments whose loads a grouping warp issues together (latency, not
bandwidth, bounds the one CTA)."""


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


@always_inline
def _load_vec[dtype: DType](p: Pointer[Scalar[dtype], MutAnyOrigin], i: Int) -> SIMD[F32, VEC]:
    return p.unsafe_offset(i).unsafe_load[width=VEC, alignment=16](0).cast[F32]()


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(ROUTER_THREADS)))
def _router_kernel[dtype: DType, CS: Int, BT: Int](
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
    """A cluster of CS CTAs routes tokens [cluster * BT, +BT): CTA `rank` computes the logits of
    experts [rank * EPC, +EPC) (EPC = ceil(E / CS)) for all BT tokens into its shared memory,
    then, after a cluster barrier, ranks tokens [rank * BT / CS, +BT / CS) (one warp each) from
    all CTAs' logits (distributed shared memory): top-K ids and the softmax weights.
    Dynamic shared memory: BT * EPC + (BT / CS) * E float32."""
    comptime TPR = BT // CS
    comptime assert TPR * CS == BT and TPR <= ROUTER_WARPS, "BT / CS tokens per CTA, a warp each"
    comptime assert 2 * BT <= WARP_SIZE and WARP_SIZE % (2 * BT) == 0, "2 BT partial dots per lane"
    comptime SPAN = WARP_SIZE * VEC
    """Columns one 16-byte load of every lane covers."""
    var smem = external_memory[Float32, address_space=AddressSpace.SHARED, alignment=16]()
    # PDL (common/pdl.mojo): resident early; the router weight is no earlier kernel's output,
    # but x is, so everything waits (the weight loads then overlap the first x loads)
    launch_dependent_grids()
    var rank = 0
    comptime if CS > 1:
        rank = Int(block_rank_in_cluster())
    var warp = thread_idx.x // WARP_SIZE
    var lane = thread_idx.x % WARP_SIZE
    var n_e = Int(E)
    var n_h = Int(H)
    var xs = Int(x_stride)
    var t0 = (block_idx.x // CS) * BT
    var nt = min(BT, Int(T) - t0)
    var epc = ceildiv(n_e, CS)
    var e_lo = rank * epc
    var mine = max(0, min(n_e, e_lo + epc) - e_lo)
    var part = smem  # [BT, epc]: this CTA's experts' logits
    var ranked = smem.unsafe_offset(BT * epc)  # [TPR, E]: the tokens this CTA ranks
    wait_on_dependent_grids()

    # Warp `warp` owns local experts warp + ROUTER_WARPS * i, two at a time (a, b): each lane
    # keeps CHUNK 16-byte vectors of both weight rows in registers and runs them over the
    # block's tokens (x from L1 / L2), 2 BT float32 partial dots per lane.
    var la = warp
    while la < mine:
        var lb = la + ROUTER_WARPS
        var has_b = lb < mine
        var wa = w.unsafe_offset((e_lo + la) * n_h)
        var wb = w.unsafe_offset((e_lo + (lb if has_b else la)) * n_h)
        var acc = SIMD[F32, 2 * BT](0)
        var c0 = lane * VEC
        while c0 < n_h:
            var va = Array[SIMD[F32, VEC], CHUNK](fill=SIMD[F32, VEC](0))
            var vb = Array[SIMD[F32, VEC], CHUNK](fill=SIMD[F32, VEC](0))
            # No branch around a load, so all of them can be in flight at once: columns past H
            # re-read the last vector against zero weights, tokens past the block re-read the
            # last token (their dots are never stored).
            comptime for i in range(CHUNK):
                var c = c0 + i * SPAN
                var live = c < n_h
                var cc = min(c, n_h - VEC)
                var ra = _load_vec(wa, cc)
                var rb = _load_vec(wb, cc)
                va[i] = ra if live else SIMD[F32, VEC](0)
                vb[i] = rb if live else SIMD[F32, VEC](0)
            comptime for t in range(BT):
                var xr = x.unsafe_offset(min(t0 + t, Int(T) - 1) * xs)
                var sa = SIMD[F32, VEC](0)
                var sb = SIMD[F32, VEC](0)
                comptime for i in range(CHUNK):
                    var xv = _load_vec(xr, min(c0 + i * SPAN, n_h - VEC))
                    sa = xv.fma(va[i], sa)
                    sb = xv.fma(vb[i], sb)
                acc[t] += sa.reduce_add()
                acc[BT + t] += sb.reduce_add()
            c0 += CHUNK * SPAN
        var dot = _reduce_scatter[2 * BT](acc, lane)  # lane l: slot l % (2 BT) over the warp
        comptime for step in range(LOG_WARP):
            comptime off = 1 << step
            comptime if off >= 2 * BT:
                dot += shuffle_xor(dot, UInt32(off))
        var slot = lane % (2 * BT)
        var t = slot % BT
        var le = la if slot < BT else lb
        if lane < 2 * BT and t < nt and (slot < BT or has_b):
            part[unsafe_offset=t * epc + le] = dot
        la += 2 * ROUTER_WARPS
    _cluster_barrier[CS]()  # every CTA's logits are in its shared memory

    var tl = rank * TPR + warp  # this warp's token in the block
    if warp < TPR and tl < nt:
        var row = ranked.unsafe_offset(warp * n_e)
        for e in range(lane, n_e, WARP_SIZE):
            var q = e // epc
            var src = part.unsafe_offset(tl * epc + e - q * epc)
            comptime if CS > 1:
                row[unsafe_offset=e] = load_cluster_smem[F32, 1](src, UInt32(q))[0]
            else:
                row[unsafe_offset=e] = src[unsafe_offset=0]
        syncwarp()
        var t = t0 + tl
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
    comptime if CS > 1:
        cluster_sync()  # peers' shared memory must outlive every remote read


@always_inline
def _cluster_barrier[CS: Int]():
    """A barrier over the cluster (CS > 1, sm_90+) or the CTA (CS = 1: every target)."""
    comptime if CS > 1:
        cluster_sync()
    else:
        barrier()


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

    # pass 1: count[e, warp]; GROUP_UNROLL steps' ids are loaded before any is counted
    var b = a0
    while b < a1:
        var es = SIMD[DType.int32, GROUP_UNROLL](-1)
        comptime for u in range(GROUP_UNROLL):
            var a = b + u * WARP_SIZE + lane
            if a < a1:
                es[u] = ids[unsafe_offset=a]
        comptime for u in range(GROUP_UNROLL):
            var e = es[u]
            var peers = _peers(e)
            if e >= 0 and Int(count_trailing_zeros(peers)) == lane:
                table[unsafe_offset=Int(e) * SEGMENTS + warp] += UInt32(pop_count(peers))
            syncwarp()
        b += GROUP_UNROLL * WARP_SIZE

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
        var es = SIMD[DType.int32, GROUP_UNROLL](-1)
        var ws = SIMD[F32, GROUP_UNROLL](0)
        comptime for u in range(GROUP_UNROLL):
            var a = b + u * WARP_SIZE + lane
            if a < a1:
                es[u] = ids[unsafe_offset=a]
                ws[u] = weights[unsafe_offset=a]
        comptime for u in range(GROUP_UNROLL):
            var a = b + u * WARP_SIZE + lane
            var valid = a < a1
            var e = es[u]
            var peers = _peers(e)
            var base = UInt32(0)
            if valid:
                base = table[unsafe_offset=Int(e) * SEGMENTS + warp]
                var row = Int(base) + Int(pop_count(peers & _lanes_below(lane)))
                token_index[unsafe_offset=row] = Int64(a // n_k)
                row_scale[unsafe_offset=row] = ws[u]
                inverse[unsafe_offset=a] = Int64(row)
            syncwarp()
            if valid and Int(count_trailing_zeros(peers)) == lane:
                table[unsafe_offset=Int(e) * SEGMENTS + warp] = base + UInt32(pop_count(peers))
            syncwarp()
        b += GROUP_UNROLL * WARP_SIZE


def launch_router[dtype: DType, CS: Int, BT: Int](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    w: Pointer[Scalar[dtype], MutAnyOrigin],
    ids: Pointer[Int32, MutAnyOrigin],
    weights: Pointer[Float32, MutAnyOrigin],
    T: Int,
    H: Int,
    E: Int,
    K: Int,
    x_stride: Int,
    ctx: DeviceContext,
) raises:
    """Enqueues the router kernel in clusters of CS CTAs over blocks of BT tokens (T > 0)."""
    comptime router = _router_kernel[dtype, CS, BT]
    var smem = (BT * ceildiv(E, CS) + (BT // CS) * E) * 4
    comptime if CS > 1:
        ctx.enqueue_function[router](
            x, w, ids, weights, Int32(T), Int32(H), Int32(E), Int32(K), Int32(x_stride),
            grid_dim=ceildiv(T, BT) * CS, block_dim=ROUTER_THREADS, shared_mem_bytes=smem,
            cluster_dim=Dim(CS, 1, 1),
            func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(smem)),
            attributes=pdl_attributes(),
        )
    else:
        ctx.enqueue_function[router](
            x, w, ids, weights, Int32(T), Int32(H), Int32(E), Int32(K), Int32(x_stride),
            grid_dim=ceildiv(T, BT), block_dim=ROUTER_THREADS, shared_mem_bytes=smem,
            func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(smem)),
            attributes=pdl_attributes(),
        )


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
        comptime if has_clusters(gpu_path[FORCE_AUTO]()):
            if T <= DECODE_TOKENS:
                launch_router[dtype, 8, 8](x, w, ids, weights, T, H, E, K, x_stride, ctx)
            else:
                launch_router[dtype, 2, 16](x, w, ids, weights, T, H, E, K, x_stride, ctx)
        else:
            launch_router[dtype, 1, 8](x, w, ids, weights, T, H, E, K, x_stride, ctx)
    launch_group(ids, weights, token_index, row_scale, inverse, offsets, stats, T * K, E, K, ctx)


def launch_group(
    ids: Pointer[Int32, MutAnyOrigin],
    weights: Pointer[Float32, MutAnyOrigin],
    token_index: Pointer[Int64, MutAnyOrigin],
    row_scale: Pointer[Float32, MutAnyOrigin],
    inverse: Pointer[Int64, MutAnyOrigin],
    offsets: Pointer[UInt32, MutAnyOrigin],
    stats: Pointer[UInt32, MutAnyOrigin],
    R: Int,
    E: Int,
    K: Int,
    ctx: DeviceContext,
) raises:
    """Enqueues the one-CTA grouping kernel over the R = T K assignments."""
    var table_bytes = E * SEGMENTS * 4
    ctx.enqueue_function[_group_kernel](
        ids, weights, token_index, row_scale, inverse, offsets, stats, Int32(R), Int32(E), Int32(K),
        grid_dim=1, block_dim=GROUP_THREADS, shared_mem_bytes=table_bytes,
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(table_bytes)),
        attributes=pdl_attributes(),
    )

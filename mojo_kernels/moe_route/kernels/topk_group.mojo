"""GPU path of `moe_route_topk_group`: two kernels, deterministic, no atomics, both launched as
programmatic dependents (common/pdl.mojo) that wait for their predecessor before any access.

Router (`_router_kernel`, clusters of CS CTAs of ROUTER_THREADS, a cluster per block of BT
tokens): CTA `rank` of a cluster computes the logits of its share of the experts for the whole
block; warp w takes local experts w, w + ROUTER_WARPS, ... two at a time, each lane holding
CHUNK (LONG_CHUNK for long H slices) 16-byte vectors of both weight rows in registers while it runs them over the block's
token rows, float32 partial dots reduced by shuffles into the CTA's shared memory. After a
cluster barrier each CTA ranks ceil(BT / CS) of the block's tokens, a warp per token reading the
token's E logits from all the cluster's CTAs (distributed shared memory): K rounds of "largest
key below the previous pick" (route.mojo), each a strided scan plus a warp max; lane 0 writes
the ids and the softmax. So even one decode token is routed by CS SMs (the router weight is
read by the whole cluster, not one SM), with no scratch memory and no second kernel. Targets
without clusters (common/target.mojo `has_clusters`) run CS = 1: one CTA per 8 tokens.

Grouping (`_group_kernel`, CTAs of GROUP_THREADS, one per window of `group_window(R)`
assignments: one CTA at decode, up to GROUP_MAX_CTAS at prefill, whose scattered stores one SM
could not issue fast enough): warp w of a CTA owns the contiguous segment w of its window (a
multiple of 32 assignments). A table in shared memory holds count[w, e]. Pass 1: the warp walks
its segment 32 assignments at a time; match_any groups the lanes of one expert, whose lowest
lane adds the group's size to count[w, e] (only warp w touches row w: no atomics). Before it,
the CTA counts the assignments before and after its window the same way (a table pass each,
summed per expert), so every CTA knows each expert's total: a block scan of the totals gives
a_offsets, and count[w, e] becomes the first sorted row of (w, e): a_offsets[e] + the expert's
rows before the window + those of warps below w. Rows are thus sorted by (expert, assignment)
whatever the number of CTAs; CTA 0 writes a_offsets and stats.
Pass 2 walks the segments again: an assignment's row is its (w, e) base plus its rank among the
same-expert lanes of its step; the group's lowest lane then advances the base.

Decode batches of at most DECODE_BLOCK tokens with few assignments (`router_groups`) launch the
router alone: one cluster holds every token in a block of the smallest power of two >= T (a
lane's partial dots cover the block's tokens, so a one-token step computes one dot per weight
vector, not DECODE_BLOCK; targets without clusters keep blocks of DECODE_BLOCK), and after a
cluster barrier its CTA 0 groups them (`_group_small`, the same order), one launch less per MoE
layer.
"""

from std.math import ceildiv, exp
from std.bit import count_trailing_zeros, pop_count
from std.memory import stack_allocation
from std.utils.static_tuple import StaticTuple
from max.gpu.compute.mma import mma
from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, WARP_SIZE, barrier, block_idx, thread_idx
from max.gpu.host import DeviceContext, FuncAttribute
from max.gpu.memory import AddressSpace, external_memory
from max.gpu.host import Dim
from max.gpu.primitives.cluster import block_rank_in_cluster, cluster_sync, load_cluster_smem
from max.gpu.primitives.warp import match_any, shuffle_up, shuffle_xor
from max.gpu.primitives.warp import max as warp_max
from max.gpu.sync import syncwarp

from ...common.pdl import (
    launch_dependent_grids,
    pdl_attributes,
    prefetch_l2,
    wait_on_dependent_grids,
)
from ...common.target import FORCE_AUTO, gpu_path, has_clusters, has_mma_sync
from ..route import key_expert, key_logit, logit_key

comptime F32 = DType.float32
comptime ROUTER_WARPS = 8
comptime ROUTER_THREADS = ROUTER_WARPS * WARP_SIZE
comptime CHUNK = 4
"""16-byte vectors of each of a warp's two weight rows a lane holds at once ..."""
comptime LONG_CHUNK = 8
"""... and, in decode blocks of 8 tokens, where a warp's H slice spans at least this many vectors
per lane (e.g. DeepSeek-V3's H = 7168 over 2 items per warp): twice the bytes in flight of the
latency-bound weight stream (`router_chunk`; ptxas: 255 registers, 0-12 bytes of spill stores;
with 16-token blocks it spills 528 bytes, so those keep CHUNK)."""
comptime DECODE_TOKENS = 64
"""Up to this many tokens the router runs clusters of 8 CTAs over 8-token blocks (every
cluster's CTAs split the experts: the whole GPU reads the router weight), beyond it clusters of
2 over 16-token blocks (fewer re-reads of x and of the weight)."""
comptime DECODE_BLOCK = 8
"""Tokens per cluster (or per CTA without clusters) of the decode router."""
comptime VEC = 8
"""Elements per 16-byte load: H must be a multiple of it (the op's contract)."""
comptime LOG_WARP = 5 if WARP_SIZE == 32 else 6
comptime GROUP_THREADS = 1024
comptime SEGMENTS = GROUP_THREADS // WARP_SIZE
"""One segment of the assignments per warp of the grouping CTA."""
comptime GROUP_UNROLL = 8
"""Steps of 32 assignments whose loads a grouping warp issues together (latency, not
bandwidth, bounds a CTA)."""
comptime GROUP_WINDOW = 1024
"""Fewest assignments a grouping CTA places: decode batches (R = T k <= 1024) take one CTA."""
comptime GROUP_MAX_CTAS = 128
"""Most grouping CTAs (one wave); larger R widen the windows. One CTA's scattered stores
bound the grouping of a prefill (R = 32768: ~100 us on one SM), so the windows spread them."""
comptime SmemU32 = Pointer[UInt32, MutUntrackedOrigin, address_space=AddressSpace.SHARED]
comptime SmemF32 = Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.SHARED]
comptime MMA_TOKENS = 16
"""Tokens per CTA of the tensor-core router (one m16 tile)."""
comptime MMA_KSPLIT = 2
"""Slices of H per expert tile in the tensor-core router (more warps per token block)."""
comptime MMA_MAX_EXPERTS = 256
"""Largest E the tensor-core router takes (its partial logits fill MMA_KSPLIT x MMA_TOKENS x E
float32 of shared memory, 32 KB at 256 experts); larger E take the cluster router."""


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
def _router_kernel[dtype: DType, CS: Int, BT: Int, GROUP: Bool, CH: Int](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    w: Pointer[Scalar[dtype], MutAnyOrigin],
    ids: Pointer[Int32, MutAnyOrigin],
    weights: Pointer[Float32, MutAnyOrigin],
    token_index: Pointer[Int64, MutAnyOrigin],
    row_scale: Pointer[Float32, MutAnyOrigin],
    inverse: Pointer[Int64, MutAnyOrigin],
    offsets: Pointer[UInt32, MutAnyOrigin],
    stats: Pointer[UInt32, MutAnyOrigin],
    T: Int32,
    H: Int32,
    E: Int32,
    K: Int32,
    x_stride: Int32,
    HS: Int32,
):
    """A cluster of CS CTAs routes tokens [cluster * BT, +BT): CTA `rank` computes the logits of
    experts [rank * EPC, +EPC) (EPC = ceil(E / CS)) for all BT tokens into its shared memory,
    then, after a cluster barrier, ranks tokens [rank * TPR, +TPR) of the block (TPR = ceil(BT /
    CS), one warp each; CTAs past the block's tokens rank none) from
    all CTAs' logits (distributed shared memory): top-K ids and the softmax weights.
    HS = `router_h_slices(EPC, H)`: when the CTA has fewer expert pairs than warps, the warps
    split H in HS slices (more loads in flight: the weight stream is latency-bound), partial
    dots summed in slice order. Dynamic shared memory: BT * EPC + TPR * E float32, plus
    HS * BT * EPC when HS > 1. GROUP (one cluster holds every token, `router_groups`): after a
    cluster barrier (release / acquire: every CTA's ids and weights are visible), CTA 0 also
    groups the T * K assignments (`_group_small`; its shared memory is free by then: the barrier
    also ends every remote read), so the op launches one kernel."""
    comptime TPR = ceildiv(BT, CS)
    comptime assert TPR <= ROUTER_WARPS, "ceil(BT / CS) tokens per CTA, a warp each"
    comptime assert 2 * BT <= WARP_SIZE and WARP_SIZE % (2 * BT) == 0, "2 BT partial dots per lane"
    comptime SPAN = WARP_SIZE * VEC
    """Columns one 16-byte load of every lane covers."""
    var smem = external_memory[Float32, address_space=AddressSpace.SHARED, alignment=16]()
    # PDL (common/pdl.mojo): resident early; the router weight is no earlier kernel's output,
    # but x is: the weight rows are prefetched into L2 before the wait, everything else after
    launch_dependent_grids()
    var rank = 0
    comptime if CS > 1:
        rank = Int(block_rank_in_cluster())
    var warp = thread_idx.x // WARP_SIZE
    var lane = thread_idx.x % WARP_SIZE
    var n_e = Int(E)
    var n_h = Int(H)
    var xs = Int(x_stride)
    var hs = Int(HS)
    var t0 = (block_idx.x // CS) * BT
    var nt = min(BT, Int(T) - t0)
    var epc = ceildiv(n_e, CS)
    var e_lo = rank * epc
    var mine = max(0, min(n_e, e_lo + epc) - e_lo)
    var part = smem  # [BT, epc]: this CTA's experts' logits
    var ranked = smem.unsafe_offset(BT * epc)  # [TPR, E]: the tokens this CTA ranks
    # [HS, BT, epc]: partial logits per H slice (HS = 1: the logits themselves)
    var sliced = part if hs == 1 else ranked.unsafe_offset(TPR * n_e)
    var pairs = ceildiv(mine, 2)
    var h_len = ceildiv(ceildiv(n_h, hs), SPAN) * SPAN
    # The weight rows of this warp's first work item (its whole work at decode sizes) start
    # towards L2 before the wait: at one token the router's time is HBM latency, not bytes.
    if warp < pairs * hs:
        var pa = w.unsafe_offset((e_lo + 2 * (warp % pairs)) * n_h)
        var pb = w.unsafe_offset((e_lo + min(2 * (warp % pairs) + 1, mine - 1)) * n_h)
        var c_lo = (warp // pairs) * h_len
        var c_hi = min(n_h, c_lo + h_len)
        var c = c_lo + lane * VEC
        while c < c_hi:
            prefetch_l2(pa, c)
            prefetch_l2(pb, c)
            c += SPAN
    wait_on_dependent_grids()

    # Work item i = (pair i % pairs: local experts 2 p and 2 p + 1, H slice i / pairs); warp
    # `warp` takes items warp, warp + ROUTER_WARPS, ... Each lane keeps CH 16-byte vectors of
    # both weight rows in registers and runs them over the block's tokens (x from L1 / L2),
    # 2 BT float32 partial dots per lane.
    var item = warp
    while item < pairs * hs:
        var la = 2 * (item % pairs)
        var slice = item // pairs
        var lb = la + 1
        var has_b = lb < mine
        var h_lo = slice * h_len
        var h_hi = min(n_h, h_lo + h_len)
        var wa = w.unsafe_offset((e_lo + la) * n_h)
        var wb = w.unsafe_offset((e_lo + (lb if has_b else la)) * n_h)
        var acc = SIMD[F32, 2 * BT](0)
        var c0 = h_lo + lane * VEC
        while c0 < h_hi:
            var va = Array[SIMD[F32, VEC], CH](fill=SIMD[F32, VEC](0))
            var vb = Array[SIMD[F32, VEC], CH](fill=SIMD[F32, VEC](0))
            # No branch around a load, so all of them can be in flight at once: columns past
            # the slice re-read its last vector against zero weights, tokens past the block
            # re-read the last token (their dots are never stored).
            comptime for i in range(CH):
                var c = c0 + i * SPAN
                var live = c < h_hi
                var cc = min(c, h_hi - VEC)
                var ra = _load_vec(wa, cc)
                var rb = _load_vec(wb, cc)
                va[i] = ra if live else SIMD[F32, VEC](0)
                vb[i] = rb if live else SIMD[F32, VEC](0)
            comptime for t in range(BT):
                var xr = x.unsafe_offset(min(t0 + t, Int(T) - 1) * xs)
                var sa = SIMD[F32, VEC](0)
                var sb = SIMD[F32, VEC](0)
                comptime for i in range(CH):
                    var xv = _load_vec(xr, min(c0 + i * SPAN, h_hi - VEC))
                    sa = xv.fma(va[i], sa)
                    sb = xv.fma(vb[i], sb)
                acc[t] += sa.reduce_add()
                acc[BT + t] += sb.reduce_add()
            c0 += CH * SPAN
        var dot = _reduce_scatter[2 * BT](acc, lane)  # lane l: slot l % (2 BT) over the warp
        comptime for step in range(LOG_WARP):
            comptime off = 1 << step
            comptime if off >= 2 * BT:
                dot += shuffle_xor(dot, UInt32(off))
        var slot = lane % (2 * BT)
        var t = slot % BT
        var le = la if slot < BT else lb
        if lane < 2 * BT and t < nt and (slot < BT or has_b):
            sliced[unsafe_offset=(slice * BT + t) * epc + le] = dot
        item += ROUTER_WARPS
    if hs > 1:  # the slices' partial logits, summed in slice order
        barrier()
        for q in range(thread_idx.x, nt * epc, ROUTER_THREADS):
            if q % epc < mine:
                var v = sliced[unsafe_offset=q]
                for sl in range(1, hs):
                    v += sliced[unsafe_offset=sl * BT * epc + q]
                part[unsafe_offset=q] = v
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
        _rank_token(row, t0 + tl, ids, weights, n_e, Int(K), lane)
    comptime if GROUP:
        _cluster_barrier[CS]()  # all ids and weights written; no remote reads pending
        if rank == 0:
            _group_small(ids, weights, token_index, row_scale, inverse, offsets, stats, Int(T) * Int(K), n_e,
                         Int(K), smem.unsafe_bitcast[UInt32]())
    elif CS > 1:
        cluster_sync()  # peers' shared memory must outlive every remote read


@always_inline
def _rank_token(row: SmemF32, t: Int, ids: Pointer[Int32, MutAnyOrigin],
                weights: Pointer[Float32, MutAnyOrigin], n_e: Int, n_k: Int, lane: Int):
    """One warp: token t's top-k of its E logits `row` (route.mojo's key order) and the softmax
    of the picked logits; lane 0 writes ids[t, :] and weights[t, :]."""
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


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(ROUTER_THREADS)))
def _router_mma_kernel[dtype: DType](
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
    """A CTA routes tokens [block * MMA_TOKENS, +MMA_TOKENS) with tensor cores (mma.sync
    m16n8k16, float32 accumulators, fragments straight from global memory as in the grouped
    op's Ampere kernel): work item i of a warp is expert tile i / MMA_KSPLIT (16 experts) over
    the i % MMA_KSPLIT-th slice of H; its float32 partial logits go to shared memory
    [MMA_KSPLIT, MMA_TOKENS, E], summed in slice order (deterministic) before a warp per
    token ranks them (`_rank_token`)."""
    comptime BT = MMA_TOKENS
    comptime NB = 2
    comptime U = 4
    """32-wide k chunks whose loads a warp issues before their MMAs."""
    var part = external_memory[Float32, address_space=AddressSpace.SHARED, alignment=16]()
    launch_dependent_grids()
    var warp = thread_idx.x // WARP_SIZE
    var lane = thread_idx.x % WARP_SIZE
    var gi = lane // 4
    var tig = lane % 4
    var n_e = Int(E)
    var n_h = Int(H)
    var n_t = Int(T)
    var xs = Int(x_stride)
    var t0 = block_idx.x * BT
    var chunks = ceildiv(n_h, 32)
    var per_slice = ceildiv(chunks, MMA_KSPLIT)
    var items = ceildiv(n_e, 8 * NB) * MMA_KSPLIT
    # rows g and g + 8 of the tile; tokens past T re-read the last one (never stored)
    var x_lo = x.unsafe_offset(min(t0 + gi, n_t - 1) * xs)
    var x_hi = x.unsafe_offset(min(t0 + gi + 8, n_t - 1) * xs)
    wait_on_dependent_grids()

    var item = warp
    while item < items:
        var et = item // MMA_KSPLIT
        var ks = item % MMA_KSPLIT
        var acc = Array[SIMD[F32, 4], NB](fill=SIMD[F32, 4](0))
        var w_rows = Array[Pointer[Scalar[dtype], MutAnyOrigin], NB](fill=w)
        var e_in = Array[Bool, NB](fill=False)
        comptime for nb in range(NB):
            var e = et * 8 * NB + nb * 8 + gi
            e_in[nb] = e < n_e
            w_rows[nb] = w.unsafe_offset(min(e, n_e - 1) * n_h)
        var c_end = min(chunks, (ks + 1) * per_slice)
        var c = ks * per_slice
        while c < c_end:
            var a_lo = Array[SIMD[dtype, 8], U](fill=SIMD[dtype, 8](0))
            var a_hi = Array[SIMD[dtype, 8], U](fill=SIMD[dtype, 8](0))
            var bv = Array[SIMD[dtype, 8], U * NB](fill=SIMD[dtype, 8](0))
            comptime for u in range(U):
                var k = (c + u) * 32 + 8 * tig
                if c + u < c_end and k < n_h:
                    a_lo[u] = x_lo.unsafe_offset(k).unsafe_load[width=8, alignment=16](0)
                    a_hi[u] = x_hi.unsafe_offset(k).unsafe_load[width=8, alignment=16](0)
                    comptime for nb in range(NB):
                        if e_in[nb]:
                            bv[u * NB + nb] = w_rows[nb].unsafe_offset(k).unsafe_load[
                                width=8, alignment=16
                            ](0)
            # lanes past H or past the slice hold zeros but still issue: mma.sync is
            # warp-collective
            comptime for u in range(U):
                comptime for h in range(2):
                    var frag = (
                        a_lo[u].slice[2, offset=4 * h]().join(a_hi[u].slice[2, offset=4 * h]())
                    ).join(
                        a_lo[u].slice[2, offset=4 * h + 2]().join(a_hi[u].slice[2, offset=4 * h + 2]())
                    )
                    comptime for nb in range(NB):
                        var d = SIMD[F32, 4](0)
                        mma(d, frag, bv[u * NB + nb].slice[4, offset=4 * h](), acc[nb])
                        acc[nb] = d
            c += U
        # accumulator nb: tokens (g, g + 8) x experts (2 tig, 2 tig + 1) of its 8
        comptime for nb in range(NB):
            comptime for r in range(4):
                var t = gi + 8 * (r // 2)
                var e = et * 8 * NB + nb * 8 + 2 * tig + r % 2
                if e < n_e:
                    part[unsafe_offset=(ks * BT + t) * n_e + e] = acc[nb][r]
        item += ROUTER_WARPS
    barrier()

    var t = warp
    while t < BT and t0 + t < n_t:
        var row = part.unsafe_offset(t * n_e)
        for e in range(lane, n_e, WARP_SIZE):
            var v = row[unsafe_offset=e]
            comptime for ks in range(1, MMA_KSPLIT):
                v += part[unsafe_offset=(ks * BT + t) * n_e + e]
            row[unsafe_offset=e] = v
        syncwarp()
        _rank_token(row, t0 + t, ids, weights, n_e, Int(K), lane)
        t += ROUTER_WARPS


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


@always_inline
def _block_exclusive_sum[WARPS: Int = SEGMENTS](v: UInt32, warp_sums: SmemU32, warp: Int, lane: Int) -> UInt32:
    """Exclusive sum of one value per thread of a CTA of WARPS warps in thread order (every
    thread calls)."""
    comptime assert WARPS <= WARP_SIZE, "one warp scans the warp sums"
    var incl = _warp_inclusive_sum(v, lane)
    if lane == WARP_SIZE - 1:
        warp_sums[unsafe_offset=warp] = incl
    barrier()
    if warp == 0:
        var total = warp_sums[unsafe_offset=lane] if lane < WARPS else UInt32(0)
        var wincl = _warp_inclusive_sum(total, lane)
        if lane < WARPS:
            warp_sums[unsafe_offset=lane] = wincl - total
    barrier()
    return warp_sums[unsafe_offset=warp] + incl - v


comptime SMALL_GROUP_WORK = ROUTER_THREADS
"""`_group_small` takes R assignments when R <= ROUTER_THREADS and R * ceil(E / ROUTER_THREADS)
<= this (each thread scans the R ids once per expert it counts)."""


def router_groups(R: Int, E: Int) -> Bool:
    """Whether the router kernel's CTA 0 groups the R assignments itself (`_group_small`): R
    fits one thread each, and counting E experts over R ids stays short."""
    return 0 < R and R <= ROUTER_THREADS and R * ceildiv(E, ROUTER_THREADS) <= SMALL_GROUP_WORK


@always_inline
def _group_small(
    ids: Pointer[Int32, MutAnyOrigin],
    weights: Pointer[Float32, MutAnyOrigin],
    token_index: Pointer[Int64, MutAnyOrigin],
    row_scale: Pointer[Float32, MutAnyOrigin],
    inverse: Pointer[Int64, MutAnyOrigin],
    offsets: Pointer[UInt32, MutAnyOrigin],
    stats: Pointer[UInt32, MutAnyOrigin],
    n_r: Int,
    n_e: Int,
    n_k: Int,
    smem: SmemU32,
):
    """One CTA of ROUTER_THREADS groups R assignments (`router_groups`) as `_group_kernel` does:
    rows sorted by (expert, assignment), a_offsets and stats. Thread a holds assignment a; the
    experts' counts are scans of the R ids in shared memory (no atomics), a_offsets their CTA
    exclusive sum over contiguous expert chunks, and an assignment's row its expert's offset
    plus the same-expert assignments before it. Shared memory: E + R uint32."""
    var warp_sums = stack_allocation[ROUTER_WARPS, UInt32, address_space=AddressSpace.SHARED]()
    var tid = thread_idx.x
    var warp = tid // WARP_SIZE
    var lane = tid % WARP_SIZE
    var start = smem  # [E]: each expert's first sorted row
    var ids_s = smem.unsafe_offset(n_e)  # [R]
    var e_a = UInt32(0)
    var w_a = Float32(0)
    if tid < n_r:
        e_a = UInt32(ids[unsafe_offset=tid])
        w_a = weights[unsafe_offset=tid]
        ids_s[unsafe_offset=tid] = e_a
    barrier()
    # thread t counts experts [t * per, +per) and sums them: the chunks in thread order
    var per = ceildiv(n_e, ROUTER_THREADS)
    var e0 = min(n_e, tid * per)
    var e1 = min(n_e, e0 + per)
    var chunk = UInt32(0)
    var most = UInt32(0)
    for e in range(e0, e1):
        var c = UInt32(0)
        for a in range(n_r):
            c += UInt32(1) if ids_s[unsafe_offset=a] == UInt32(e) else UInt32(0)
        start[unsafe_offset=e] = c
        chunk += c
        most = max(most, c)
    var run = _block_exclusive_sum[ROUTER_WARPS](chunk, warp_sums, warp, lane)
    for e in range(e0, e1):
        var c = start[unsafe_offset=e]
        start[unsafe_offset=e] = run
        offsets[unsafe_offset=e] = run
        run += c
    if tid == 0:
        offsets[unsafe_offset=n_e] = UInt32(n_r)
    most = warp_max(most)
    barrier()  # every start written; warp_sums free again
    if lane == 0:
        warp_sums[unsafe_offset=warp] = most
    barrier()
    if tid == 0:
        var m = UInt32(0)
        for q in range(ROUTER_WARPS):
            m = max(m, warp_sums[unsafe_offset=q])
        stats[unsafe_offset=0] = m
        stats[unsafe_offset=1] = UInt32(n_e)
    if tid < n_r:
        var rank = 0
        for a in range(tid):
            rank += 1 if ids_s[unsafe_offset=a] == e_a else 0
        var row = Int(start[unsafe_offset=Int(e_a)]) + rank
        token_index[unsafe_offset=row] = Int64(tid // n_k)
        row_scale[unsafe_offset=row] = w_a
        inverse[unsafe_offset=tid] = Int64(row)


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
    window: Int32,
):
    """CTA c places the assignments of window [c * window, +window) in the (expert, assignment)
    order of all R; CTA 0 also writes a_offsets and stats. Dynamic shared memory: the
    [SEGMENTS, E] uint32 table."""
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
    var r0 = min(n_r, block_idx.x * Int(window))
    var r1 = min(n_r, r0 + Int(window))
    for q in range(tid, SEGMENTS * n_e, GROUP_THREADS):
        table[unsafe_offset=q] = 0
    barrier()
    # thread e owns expert e's column of the w-major table (no bank conflicts)
    var e_own = tid
    # the experts' counts before and after the window (several CTAs only), then in it
    var before = _count_rows_and_clear(ids, table, 0, r0, n_e, warp, lane, e_own)
    var after = _count_rows_and_clear(ids, table, r1, n_r, n_e, warp, lane, e_own)
    var seg = _segment(r0, r1)
    var a0 = r0 + warp * seg
    var a1 = min(r1, a0 + seg)
    # pass 1: count[warp, e] over this warp's segment of the window
    _count_segment(ids, table, a0, a1, warp * n_e, lane)
    barrier()
    var total = before + after
    if e_own < n_e:
        for w in range(SEGMENTS):
            total += table[unsafe_offset=w * n_e + e_own]
    var start = _block_exclusive_sum(total, warp_sums, warp, lane)  # E <= GROUP_THREADS
    # the window's rows of expert e start at a_offsets[e] + before[e], warp by warp
    if e_own < n_e:
        var run = start + before
        for w in range(SEGMENTS):
            var c = table[unsafe_offset=w * n_e + e_own]
            table[unsafe_offset=w * n_e + e_own] = run
            run += c
    if block_idx.x == 0:
        var most = warp_max(total)
        if lane == 0:
            warp_maxes[unsafe_offset=warp] = most
        if e_own < n_e:
            offsets[unsafe_offset=e_own] = start
        if tid == 0:
            offsets[unsafe_offset=n_e] = UInt32(n_r)
    barrier()
    if block_idx.x == 0 and warp == 0:
        var most = warp_max(warp_maxes[unsafe_offset=lane] if lane < SEGMENTS else UInt32(0))
        if lane == 0:
            stats[unsafe_offset=0] = most
            stats[unsafe_offset=1] = UInt32(n_e)

    # pass 2: rows
    var b = a0
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
                base = table[unsafe_offset=warp * n_e + Int(e)]
                var row = Int(base) + Int(pop_count(peers & _lanes_below(lane)))
                token_index[unsafe_offset=row] = Int64(a // n_k)
                row_scale[unsafe_offset=row] = ws[u]
                inverse[unsafe_offset=a] = Int64(row)
            syncwarp()
            if valid and Int(count_trailing_zeros(peers)) == lane:
                table[unsafe_offset=warp * n_e + Int(e)] = base + UInt32(pop_count(peers))
            syncwarp()
        b += GROUP_UNROLL * WARP_SIZE


@always_inline
def _count_segment(ids: Pointer[Int32, MutAnyOrigin], table: SmemU32, a0: Int, a1: Int, row: Int,
                   lane: Int):
    """One warp counts the experts of assignments [a0, a1) into table[row + e]; GROUP_UNROLL
    steps' ids are loaded before any is counted; the lowest lane of each expert's lanes adds
    their number (only this warp touches the row: no atomics)."""
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
                table[unsafe_offset=row + Int(e)] += UInt32(pop_count(peers))
            syncwarp()
        b += GROUP_UNROLL * WARP_SIZE


@always_inline
def _segment(lo: Int, hi: Int) -> Int:
    """Assignments per warp segment of [lo, hi): the range split in SEGMENTS multiples of 32."""
    return ceildiv(ceildiv(hi - lo, SEGMENTS), WARP_SIZE) * WARP_SIZE


@always_inline
def _count_rows_and_clear(ids: Pointer[Int32, MutAnyOrigin], table: SmemU32, lo: Int, hi: Int,
                          n_e: Int, warp: Int, lane: Int, e_own: Int) -> UInt32:
    """Expert e_own's count among assignments [lo, hi) (0 past E): every warp counts its
    segment into its row of the zeroed table (`_count_segment`), thread e sums column e and
    zeroes it again. Every thread of the CTA calls (barriers); nothing to do when lo >= hi."""
    if lo >= hi:  # the same for the whole CTA
        return 0
    var seg = _segment(lo, hi)
    var a0 = lo + warp * seg
    _count_segment(ids, table, a0, min(hi, a0 + seg), warp * n_e, lane)
    barrier()
    var n = UInt32(0)
    if e_own < n_e:
        for w in range(SEGMENTS):
            n += table[unsafe_offset=w * n_e + e_own]
            table[unsafe_offset=w * n_e + e_own] = 0
    barrier()
    return n


def launch_router[dtype: DType, CS: Int, BT: Int, GROUP: Bool = False](
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
    """Enqueues the router kernel in clusters of CS CTAs over blocks of BT tokens (T > 0); with
    GROUP (T <= BT and `router_groups(T K, E)`) it also writes the grouping outputs."""
    var epc = ceildiv(E, CS)
    var hs = router_h_slices(epc, H)
    var smem = (BT * epc * (1 + (hs if hs > 1 else 0)) + ceildiv(BT, CS) * E) * 4
    comptime if GROUP:
        smem = max(smem, (E + T * K) * 4)
    comptime if BT <= DECODE_BLOCK:  # 16-token blocks at LONG_CHUNK spill (ptxas: 528 bytes)
        if router_chunk(H, hs) == LONG_CHUNK:
            _enqueue_router[dtype, CS, BT, GROUP, LONG_CHUNK](
                x, w, ids, weights, token_index, row_scale, inverse, offsets, stats, T, H, E, K, x_stride, hs,
                smem, ctx)
            return
    _enqueue_router[dtype, CS, BT, GROUP, CHUNK](
        x, w, ids, weights, token_index, row_scale, inverse, offsets, stats, T, H, E, K, x_stride, hs,
        smem, ctx)


def _enqueue_router[dtype: DType, CS: Int, BT: Int, GROUP: Bool, CH: Int](
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
    hs: Int,
    smem: Int,
    ctx: DeviceContext,
) raises:
    """Enqueues one instantiation of the router kernel (`launch_router` picks it)."""
    comptime router = _router_kernel[dtype, CS, BT, GROUP, CH]
    comptime if CS > 1:
        ctx.enqueue_function[router](
            x, w, ids, weights, token_index, row_scale, inverse, offsets, stats,
            Int32(T), Int32(H), Int32(E), Int32(K), Int32(x_stride), Int32(hs),
            grid_dim=ceildiv(T, BT) * CS, block_dim=ROUTER_THREADS, shared_mem_bytes=smem,
            cluster_dim=Dim(CS, 1, 1),
            func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(smem)),
            attributes=pdl_attributes(),
        )
    else:
        ctx.enqueue_function[router](
            x, w, ids, weights, token_index, row_scale, inverse, offsets, stats,
            Int32(T), Int32(H), Int32(E), Int32(K), Int32(x_stride), Int32(hs),
            grid_dim=ceildiv(T, BT), block_dim=ROUTER_THREADS, shared_mem_bytes=smem,
            func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(smem)),
            attributes=pdl_attributes(),
        )


def router_chunk(H: Int, hs: Int) -> Int:
    """16-byte vectors per weight row a router lane loads at once: LONG_CHUNK where each H slice
    spans at least LONG_CHUNK vectors per lane, else CHUNK (more would load past the slice)."""
    return LONG_CHUNK if ceildiv(ceildiv(H, hs), WARP_SIZE * VEC) >= LONG_CHUNK else CHUNK


def router_h_slices(epc: Int, H: Int) -> Int:
    """Slices of H the cluster router's warps split a CTA's experts into: as many as leave every
    warp an item ((epc / 2 pairs) x slices >= ROUTER_WARPS), each slice at least one 16-byte
    load per lane (WARP_SIZE * VEC columns)."""
    var pairs = max(1, ceildiv(epc, 2))
    return max(1, min(ROUTER_WARPS // pairs, ceildiv(H, WARP_SIZE * VEC)))


def launch_router_mma[dtype: DType](
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
    """Enqueues the tensor-core router over blocks of MMA_TOKENS tokens (T > 0,
    E <= MMA_MAX_EXPERTS, a target with mma.sync)."""
    var smem = MMA_KSPLIT * MMA_TOKENS * E * 4
    ctx.enqueue_function[_router_mma_kernel[dtype]](
        x, w, ids, weights, Int32(T), Int32(H), Int32(E), Int32(K), Int32(x_stride),
        grid_dim=ceildiv(T, MMA_TOKENS), block_dim=ROUTER_THREADS, shared_mem_bytes=smem,
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
    """Enqueues the router (nothing for T == 0) and the grouping kernel (it writes a_offsets and
    stats for R == 0 too), or, when one router cluster holds every token and
    `router_groups(T K, E)`, the router alone grouping in its CTA 0 (decode: one launch)."""
    comptime path = gpu_path[FORCE_AUTO]()
    if 0 < T and T <= DECODE_BLOCK and router_groups(T * K, E):
        comptime if has_clusters(path):
            # the block is the smallest power of two holding the batch: a lane's partial dots
            # cover the block's tokens, so one decode token costs one dot per weight vector, not
            # 8 (targets without clusters keep one block size: one CTA per 8 tokens there)
            comptime assert DECODE_BLOCK == 8, "decode blocks of 1, 2, 4 or 8 tokens"
            comptime for i in range(4):
                comptime bt = 1 << i
                if T <= bt and (i == 0 or T > bt // 2):
                    launch_router[dtype, 8, bt, True](x, w, ids, weights, token_index, row_scale, inverse, offsets,
                                                      stats, T, H, E, K, x_stride, ctx)
                    return
        else:
            launch_router[dtype, 1, DECODE_BLOCK, True](x, w, ids, weights, token_index, row_scale, inverse, offsets,
                                             stats, T, H, E, K, x_stride, ctx)
            return
    if T > 0:
        # prefill with few enough experts: the tensor-core router on every target with mma.sync;
        # otherwise clusters where the target has them (8 CTAs per 8 tokens at decode)
        var prefill_mma = has_mma_sync(path) and T > DECODE_TOKENS and E <= MMA_MAX_EXPERTS
        if prefill_mma:
            comptime if has_mma_sync(path):
                launch_router_mma[dtype](x, w, ids, weights, T, H, E, K, x_stride, ctx)
        else:
            comptime if has_clusters(path):
                if T <= DECODE_TOKENS:
                    launch_router[dtype, 8, DECODE_BLOCK](x, w, ids, weights, token_index, row_scale, inverse, offsets,
                                               stats, T, H, E, K, x_stride, ctx)
                else:
                    launch_router[dtype, 2, 16](x, w, ids, weights, token_index, row_scale, inverse, offsets,
                                                stats, T, H, E, K, x_stride, ctx)
            else:
                launch_router[dtype, 1, DECODE_BLOCK](x, w, ids, weights, token_index, row_scale, inverse, offsets, stats,
                                           T, H, E, K, x_stride, ctx)
    launch_group(ids, weights, token_index, row_scale, inverse, offsets, stats, T * K, E, K, ctx)


def group_window(R: Int) -> Int:
    """Assignments per grouping CTA: at least GROUP_WINDOW, and at most GROUP_MAX_CTAS CTAs
    (each CTA also counts the assignments outside its window, O(R))."""
    return max(GROUP_WINDOW, ceildiv(ceildiv(R, GROUP_MAX_CTAS), WARP_SIZE) * WARP_SIZE)


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
    """Enqueues the grouping kernel over the R = T K assignments: one CTA per window of
    `group_window(R)` assignments (one CTA for R <= GROUP_WINDOW, R = 0 included)."""
    var window = group_window(R)
    var table_bytes = SEGMENTS * E * 4
    ctx.enqueue_function[_group_kernel](
        ids, weights, token_index, row_scale, inverse, offsets, stats, Int32(R), Int32(E), Int32(K),
        Int32(window),
        grid_dim=max(1, ceildiv(R, window)), block_dim=GROUP_THREADS, shared_mem_bytes=table_bytes,
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(table_bytes)),
        attributes=pdl_attributes(),
    )

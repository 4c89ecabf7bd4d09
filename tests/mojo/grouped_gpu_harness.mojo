# GPU harness of grouped_matmul_sm100_persistent (no MAX graph): runs the launcher's fast kernel
# for the build's target (sm_90a -> sm90.mojo, sm_100a -> sm100.mojo) against the simple
# one-thread-per-output kernel on the same device, over ragged groups, an empty group, a single
# token, an expert id of -1, G_active < G (poisoned rows must stay untouched), plane splits and
# the SwiGLU + row-scale epilogue, for bf16 and fp16; decode-sized and prefill-sized groups.
#
# Forced paths (FORCE_* of common/target.mojo) through the same launcher: Ampere runs the
# mma.sync kernel (naive for odd K), portable the naive kernel.
#   scripts/build-gpu-bin tests/mojo/grouped_gpu_harness.mojo
#   LD_LIBRARY_PATH=$PWD/.gpu-bin/lib .gpu-bin/grouped_gpu_harness [bench | sparse | tiles | pair]
# Prints one line per case and "ALL PASS" (exit 0) or raises.
from std.math import ceildiv
from std.sys import argv
from std.time import perf_counter_ns
from max.gpu import global_idx
from max.gpu.host import DeviceContext

from mojo_kernels.common.target import FORCE_AMPERE, FORCE_AUTO, FORCE_PORTABLE, PATH_HOPPER, gpu_path
from mojo_kernels.grouped_gemm.kernels.naive import grouped_matmul_gpu_naive
from mojo_kernels.grouped_gemm.entry import launch_grouped_matmul
from mojo_kernels.grouped_gemm.scheduler import ElemPtr, F32Ptr, GroupedShape, I32Ptr, U32Ptr
from mojo_kernels.grouped_gemm.dispatch import sm90_token_regime
from mojo_kernels.grouped_gemm.kernels.sm90 import grouped_matmul_sm90
from int4_gemm_ref import spin_kernel
from mojo_kernels.grouped_gemm.tuning_sm90 import DECODE_BN, DECODE_KSUB, DECODE_WIDTHS, MID_BN, PREFILL_BN, TILE_WIDTHS

comptime POISON = -777.0


def lcg(mut seed: UInt32) -> Float32:
    seed = seed * 1664525 + 1013904223
    return Float32(Int(seed >> 8) % 2001) / 1000.0 - 1.0


def run_case[
    dtype: DType, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool, force: Int = 0, settled: Bool = False
](
    ctx: DeviceContext, name: StaticString, T: Int, K: Int, N: Int, E: Int,
    offsets: List[Int], ids: List[Int], g_active: Int,
) raises:
    var G = len(ids)
    var a_rows = 3 * T if s0 > 0 else T
    var Nc = N // 2 if swiglu else N
    var a = ctx.enqueue_create_buffer[dtype](max(a_rows * K, 1))
    var b = ctx.enqueue_create_buffer[dtype](E * N * K)
    var offs = ctx.enqueue_create_buffer[DType.uint32](G + 1)
    var eids = ctx.enqueue_create_buffer[DType.int32](G)
    var stats = ctx.enqueue_create_buffer[DType.uint32](2)
    var rs = ctx.enqueue_create_buffer[DType.float32](max(T, 1))
    var c = ctx.enqueue_create_buffer[dtype](max(T * Nc, 1))
    var c_ref = ctx.enqueue_create_buffer[dtype](max(T * Nc, 1))
    var seed: UInt32 = 1234
    with a.map_to_host() as h:
        for i in range(a_rows * K):
            h[i] = lcg(seed).cast[dtype]()
    with b.map_to_host() as h:
        for i in range(E * N * K):
            h[i] = lcg(seed).cast[dtype]()
    with offs.map_to_host() as h:
        for i in range(G + 1):
            h[i] = UInt32(offsets[i])
    with eids.map_to_host() as h:
        for i in range(G):
            h[i] = Int32(ids[i])
    with stats.map_to_host() as h:
        h[0] = UInt32(T)
        h[1] = UInt32(g_active)
    with rs.map_to_host() as h:
        for i in range(T):
            h[i] = 0.5 + 0.25 * lcg(seed)
    c.enqueue_fill(Scalar[dtype](POISON))
    c_ref.enqueue_fill(Scalar[dtype](POISON))
    var shape = GroupedShape(T=T, K=K, N=N, Nc=Nc, E=E, G=G, a_rows=a_rows)
    var ap = a.unsafe_ptr().as_unsafe_any_origin()
    var bp = b.unsafe_ptr().as_unsafe_any_origin()
    var op = offs.unsafe_ptr().as_unsafe_any_origin()
    var ip = eids.unsafe_ptr().as_unsafe_any_origin()
    var sp = stats.unsafe_ptr().as_unsafe_any_origin()
    var rp = rs.unsafe_ptr().as_unsafe_any_origin()
    launch_grouped_matmul[dtype, s0, s1, swiglu, has_row_scale, "gpu", force, settled](
        c.unsafe_ptr().as_unsafe_any_origin(), ap, bp, op, ip, sp, rp, shape, ctx)
    grouped_matmul_gpu_naive[dtype, s0, s1, swiglu, has_row_scale](
        c_ref.unsafe_ptr().as_unsafe_any_origin(), ap, bp, op, ip, sp, rp, shape, ctx)
    ctx.synchronize()
    var err2 = Float64(0)
    var ref2 = Float64(0)
    var bad_poison = 0
    with c.map_to_host() as hc:
        with c_ref.map_to_host() as hr:
            for i in range(T * Nc):
                var x = Float64(hc[i].cast[DType.float32]())
                var r = Float64(hr[i].cast[DType.float32]())
                if r == Float64(Scalar[dtype](POISON).cast[DType.float32]()):
                    if x != r:
                        bad_poison += 1
                    continue
                err2 += (x - r) * (x - r)
                ref2 += r * r
    var rel = (err2 / max(ref2, 1e-30)) ** 0.5
    var ok = rel <= 1e-2 and bad_poison == 0
    print(name, dtype, "T =", T, "K =", K, "N =", N, "G =", G, "rel err =", rel,
          "poison overwritten =", bad_poison, "PASS" if ok else "FAIL")
    if not ok:
        raise Error("grouped harness: case failed: ", name)


def cases[dtype: DType](ctx: DeviceContext) raises:
    # decode-sized ragged groups: empty group, single token, -1 expert, G_active < G
    run_case[dtype, 0, 0, False, False](ctx, "decode_ragged", 40, 256, 200, 6,
        [0, 5, 5, 6, 20, 33, 40], [3, 1, 0, -1, 5, 2], 5)
    # decode tiles load two 64-column blocks per ring stage: an odd block count (the last
    # stage holds one) and a partial last block (K past the end is zero-filled)
    run_case[dtype, 0, 0, False, False](ctx, "decode_odd_blocks", 20, 192, 256, 4,
        [0, 3, 3, 10, 20], [1, 0, 3, 2], 4)
    run_case[dtype, 0, 0, True, True](ctx, "decode_odd_partial_blocks_swiglu_scale", 20, 136, 256, 4,
        [0, 3, 3, 10, 20], [1, 0, 3, 2], 4)
    run_case[dtype, 0, 0, False, True](ctx, "decode_even_partial_blocks_scale", 20, 200, 192, 4,
        [0, 7, 8, 8, 20], [2, 3, -1, 0], 4)
    # many groups, few active (decode over E groups): the scheduler walks long runs of empty
    # groups between the active ones, an invalid expert among them, G_active < G
    run_case[dtype, 0, 0, True, True](ctx, "decode_sparse_groups", 16, 128, 256, 40,
        [0, 1, 1, 1, 1, 1, 1, 1, 3, 4, 4, 4, 4, 4, 4, 4, 4, 7, 7, 7, 7, 7, 7, 7, 8, 9, 9, 9, 9, 9, 9, 9, 11, 11, 11, 11, 11, 16], [0, 7, 14, 21, 28, 35, 2, 9, 16, 23, 30, 37, 4, 11, 18, 25, 32, 39, 6, 13, 20, 27, 34, -1, 8, 15, 22, 29, 36, 3, 10, 17, 24, 31, 38, 5, 12], 37)
    run_case[dtype, 0, 0, False, False](ctx, "decode_sparse_groups_active_29", 16, 128, 256, 40,
        [0, 1, 1, 1, 1, 1, 1, 1, 3, 4, 4, 4, 4, 4, 4, 4, 4, 7, 7, 7, 7, 7, 7, 7, 8, 9, 9, 9, 9, 9, 9, 9, 11, 11, 11, 11, 11, 16], [0, 7, 14, 21, 28, 35, 2, 9, 16, 23, 30, 37, 4, 11, 18, 25, 32, 39, 6, 13, 20, 27, 34, -1, 8, 15, 22, 29, 36, 3, 10, 17, 24, 31, 38, 5, 12], 29)
    # settled routing (read, and the first tile's weights loaded, before the wait): sparse
    # groups with an invalid expert, a tile shorter than the ring, G_active < G, prefill tiles
    run_case[dtype, 0, 0, False, True, 0, True](ctx, "settled_decode_sparse_groups", 16, 128, 256, 40,
        [0, 1, 1, 1, 1, 1, 1, 1, 3, 4, 4, 4, 4, 4, 4, 4, 4, 7, 7, 7, 7, 7, 7, 7, 8, 9, 9, 9, 9, 9, 9, 9, 11, 11, 11, 11, 11, 16], [0, 7, 14, 21, 28, 35, 2, 9, 16, 23, 30, 37, 4, 11, 18, 25, 32, 39, 6, 13, 20, 27, 34, -1, 8, 15, 22, 29, 36, 3, 10, 17, 24, 31, 38, 5, 12], 29)
    run_case[dtype, 0, 0, True, True, 0, True](ctx, "settled_decode_odd_blocks_swiglu_scale", 20, 136, 256, 4,
        [0, 3, 3, 10, 20], [1, -1, 3, 2], 4)
    run_case[dtype, 0, 0, False, False, 0, True](ctx, "settled_decode_long_k", 20, 1100, 256, 4,
        [0, 3, 3, 10, 20], [1, 0, 3, 2], 3)
    run_case[dtype, 0, 0, False, True, 0, True](ctx, "settled_prefill_odd_n_scale", 700, 200, 131, 4,
        [0, 300, 301, 650, 700], [2, 0, 3, 1], 4)
    # odd N (rows of odd length), with and without the row scale
    run_case[dtype, 0, 0, False, True](ctx, "decode_odd_n_scale", 20, 136, 199, 4,
        [0, 7, 8, 8, 20], [2, 3, -1, 0], 4)
    run_case[dtype, 0, 0, False, False](ctx, "prefill_odd_n", 700, 200, 131, 4,
        [0, 300, 301, 650, 700], [2, 0, 3, 1], 4)
    run_case[dtype, 0, 0, False, True](ctx, "prefill_odd_n_scale", 700, 200, 131, 4,
        [0, 300, 301, 650, 700], [2, 0, 3, 1], 4)
    # prefill-sized groups, K and N not multiples of the tiles
    run_case[dtype, 0, 0, False, False](ctx, "prefill", 700, 328, 328, 4,
        [0, 300, 301, 650, 700], [2, 0, 3, 1], 4)
    # many k-tiles and tiles per CTA: the stage ring wraps across tiles
    run_case[dtype, 0, 0, False, False](ctx, "prefill_big", 2000, 1024, 512, 3,
        [0, 900, 1999, 2000], [1, 2, 0], 3)
    # a group of 17 token tiles over 11 weight tiles: the scheduler's panels (8 weight tiles
    # for 132 CTAs, then a narrower last one) next to a one-tile group
    run_case[dtype, 0, 0, False, False](ctx, "prefill_panels", 4200, 72, 1408, 2,
        [0, 4100, 4200], [1, 0], 2)
    # K * 2 bytes not a multiple of 16: the TMA-less fallback
    run_case[dtype, 0, 0, False, False](ctx, "odd_k", 50, 100, 136, 2,
        [0, 20, 50], [1, 0], 2)
    # plane splits over a [3 T, K] stack
    run_case[dtype, 128, 256, False, False](ctx, "planes", 90, 128, 384, 3,
        [0, 30, 31, 90], [0, 2, 1], 3)
    # every wgmma width of the mid (BN = 128) and prefill (BN = 256) token tiles: group sizes
    # just past each width (1, 33, 97, 129, 193, 257 rows) and exactly on it
    run_case[dtype, 0, 0, False, False](ctx, "widths_mid", 652, 136, 264, 8,
        [0, 1, 34, 98, 195, 323, 452, 652], [2, 7, 0, 5, 1, 3, 6], 7)
    run_case[dtype, 0, 0, True, True](ctx, "widths_prefill_swiglu_scale", 1950, 200, 272, 9,
        [0, 1, 66, 194, 387, 643, 900, 1350, 1950], [8, 2, 0, 5, 1, 3, 6, 4], 8)
    # SwiGLU + router weights
    run_case[dtype, 0, 0, True, True](ctx, "swiglu_scale", 200, 192, 256, 5,
        [0, 64, 64, 190, 200], [4, 1, 0, 3], 4)
    # forced Ampere path: the mma.sync kernel (the naive one for odd K)
    run_case[dtype, 0, 0, True, True, FORCE_AMPERE](ctx, "forced_ampere_swiglu_scale", 200, 192, 256, 5,
        [0, 64, 64, 190, 200], [4, 1, 0, 3], 4)
    run_case[dtype, 0, 0, False, False, FORCE_AMPERE](ctx, "forced_ampere_decode_ragged", 40, 256, 200, 6,
        [0, 5, 5, 6, 20, 33, 40], [3, 1, 0, -1, 5, 2], 5)
    run_case[dtype, 0, 0, False, False, FORCE_AMPERE](ctx, "forced_ampere_prefill", 700, 328, 328, 4,
        [0, 300, 301, 650, 700], [2, 0, 3, 1], 4)
    run_case[dtype, 128, 256, False, True, FORCE_AMPERE](ctx, "forced_ampere_planes_scale", 90, 136, 384, 3,
        [0, 30, 31, 90], [0, 2, 1], 3)
    run_case[dtype, 0, 0, False, False, FORCE_AMPERE](ctx, "forced_ampere_odd_k", 50, 100, 136, 2,
        [0, 20, 50], [1, 0], 2)
    # forced portable path: the naive kernel
    run_case[dtype, 128, 256, False, False, FORCE_PORTABLE](ctx, "forced_portable_planes", 90, 128, 384, 3,
        [0, 30, 31, 90], [0, 2, 1], 3)


def _fill_kernel[dtype: DType](p: Pointer[Scalar[dtype], MutAnyOrigin], n: Int64, seed: UInt32):
    var i = global_idx.x
    if i < Int(n):
        var h = UInt32(i) * 2654435761 + seed
        h = (h ^ (h >> 15)) * 2246822519
        h = h ^ (h >> 13)
        p[unsafe_offset=i] = (Float32(Int(h % 2001)) / 1000.0 - 1.0).cast[dtype]()


def bench(ctx: DeviceContext, name: StaticString, tokens_per_group: Int, G: Int, N: Int, K: Int,
          iters: Int) raises:
    """Times the fast kernel on G equal groups (bf16): decode reports weight GB/s, prefill TFLOP/s."""
    comptime dtype = DType.bfloat16
    var T = tokens_per_group * G
    var a = ctx.enqueue_create_buffer[dtype](T * K)
    var b = ctx.enqueue_create_buffer[dtype](G * N * K)
    var c = ctx.enqueue_create_buffer[dtype](T * N)
    var offs = ctx.enqueue_create_buffer[DType.uint32](G + 1)
    var eids = ctx.enqueue_create_buffer[DType.int32](G)
    var stats = ctx.enqueue_create_buffer[DType.uint32](2)
    ctx.enqueue_function[_fill_kernel[dtype]](a.unsafe_ptr().as_unsafe_any_origin(), Int64(T * K),
        UInt32(1), grid_dim=ceildiv(T * K, 256), block_dim=256)
    ctx.enqueue_function[_fill_kernel[dtype]](b.unsafe_ptr().as_unsafe_any_origin(), Int64(G * N * K),
        UInt32(2), grid_dim=ceildiv(G * N * K, 256), block_dim=256)
    with offs.map_to_host() as h:
        for g in range(G + 1):
            h[g] = UInt32(g * tokens_per_group)
    with eids.map_to_host() as h:
        for g in range(G):
            h[g] = Int32(g)
    with stats.map_to_host() as h:
        h[0] = UInt32(tokens_per_group)
        h[1] = UInt32(G)
    var shape = GroupedShape(T=T, K=K, N=N, Nc=N, E=G, G=G, a_rows=T)
    var cp = c.unsafe_ptr().as_unsafe_any_origin()
    var ap = a.unsafe_ptr().as_unsafe_any_origin()
    var bp = b.unsafe_ptr().as_unsafe_any_origin()
    var op = offs.unsafe_ptr().as_unsafe_any_origin()
    var ip = eids.unsafe_ptr().as_unsafe_any_origin()
    var sp = stats.unsafe_ptr().as_unsafe_any_origin()
    for _ in range(3):
        launch_grouped_matmul[dtype, 0, 0, False, False, "gpu"](cp, ap, bp, op, ip, sp, sp.unsafe_bitcast[Float32](), shape, ctx)
    ctx.synchronize()
    var t0 = perf_counter_ns()
    for _ in range(iters):
        launch_grouped_matmul[dtype, 0, 0, False, False, "gpu"](cp, ap, bp, op, ip, sp, sp.unsafe_bitcast[Float32](), shape, ctx)
    ctx.synchronize()
    var dt = Float64(perf_counter_ns() - t0) / 1e9 / Float64(iters)
    var flops = 2.0 * Float64(T) * Float64(N) * Float64(K)
    var wbytes = Float64(G * N * K * 2)
    print("bench", name, "G =", G, "tokens/group =", tokens_per_group, "N =", N, "K =", K,
          "time =", dt * 1e6, "us  TFLOP/s =", flops / dt / 1e12, " weight GB/s =", wbytes / dt / 1e9)


def bench_sparse(ctx: DeviceContext, name: StaticString, G: Int, N: Int, K: Int, swiglu: Bool,
                 iters: Int) raises:
    """Times the fast kernel at decode over G groups (one per expert) of which 8 hold one row
    each, spread over the group list as a router leaves them; 4 rotating sets of active experts
    (the weights come from HBM, not L2). Reports µs per call and the active weights' TB/s."""
    comptime dtype = DType.bfloat16
    comptime SETS = 4
    comptime ACTIVE = 8
    var T = ACTIVE
    var Nc = N // 2 if swiglu else N
    var a = ctx.enqueue_create_buffer[dtype](T * K)
    var b = ctx.enqueue_create_buffer[dtype](G * N * K)
    var c = ctx.enqueue_create_buffer[dtype](T * Nc)
    var rs = ctx.enqueue_create_buffer[DType.float32](T)
    var offs = ctx.enqueue_create_buffer[DType.uint32](SETS * (G + 1))
    var eids = ctx.enqueue_create_buffer[DType.int32](SETS * G)
    var stats = ctx.enqueue_create_buffer[DType.uint32](2)
    ctx.enqueue_function[_fill_kernel[dtype]](a.unsafe_ptr().as_unsafe_any_origin(), Int64(T * K),
        UInt32(1), grid_dim=ceildiv(T * K, 256), block_dim=256)
    ctx.enqueue_function[_fill_kernel[dtype]](b.unsafe_ptr().as_unsafe_any_origin(), Int64(G * N * K),
        UInt32(2), grid_dim=ceildiv(G * N * K, 256), block_dim=256)
    with rs.map_to_host() as h:
        for t in range(T):
            h[t] = 0.125
    with offs.map_to_host() as h:
        for st in range(SETS):
            var row = 0
            for g in range(G + 1):
                h[st * (G + 1) + g] = UInt32(row)
                # one group in every G / ACTIVE is active, at an offset that moves per set
                if g < G and (g + 3 * st) % (G // ACTIVE) == G // ACTIVE - 1:
                    row += 1
    with eids.map_to_host() as h:
        for st in range(SETS):
            for g in range(G):
                h[st * G + g] = Int32(g)
    with stats.map_to_host() as h:
        h[0] = 1
        h[1] = UInt32(G)
    var shape = GroupedShape(T=T, K=K, N=N, Nc=Nc, E=G, G=G, a_rows=T)
    var cp = c.unsafe_ptr().as_unsafe_any_origin()
    var ap = a.unsafe_ptr().as_unsafe_any_origin()
    var bp = b.unsafe_ptr().as_unsafe_any_origin()
    var rp = rs.unsafe_ptr().as_unsafe_any_origin()
    var sp = stats.unsafe_ptr().as_unsafe_any_origin()
    var samples = List[Float64]()
    for rep_i in range(6):
        ctx.synchronize()
        var t0 = perf_counter_ns()
        for i in range(iters):
            var st = i % SETS
            var op = offs.unsafe_ptr().as_unsafe_any_origin().unsafe_offset(st * (G + 1))
            var ip = eids.unsafe_ptr().as_unsafe_any_origin().unsafe_offset(st * G)
            if swiglu:
                launch_grouped_matmul[dtype, 0, 0, True, True, "gpu"](cp, ap, bp, op, ip, sp, rp, shape, ctx)
            else:
                launch_grouped_matmul[dtype, 0, 0, False, True, "gpu"](cp, ap, bp, op, ip, sp, rp, shape, ctx)
        ctx.synchronize()
        if rep_i > 0:
            samples.append(Float64(perf_counter_ns() - t0) / 1e3 / Float64(iters))
    sort(samples)
    var us = samples[len(samples) // 2]
    print("bench_sparse", name, "G =", G, "active = 8 x 1 row  N =", N, "K =", K, "swiglu =", swiglu,
          " time =", us, "us  active weight TB/s =", Float64(ACTIVE * N * K * 2) / us / 1e6)


def bench_tiles(ctx: DeviceContext, name: StaticString, avg_rows: Int, G: Int, N: Int, K: Int) raises:
    """Times the SM90 kernel's token tiles on G groups of about avg_rows rows (+- 2 sqrt(avg_rows),
    like uniform top-k routing), bf16: BN = 32, 128 and 256 with their widths and BN = 256 with
    one width (v0..v3), and which one the dispatch picks (0..2)."""
    comptime dtype = DType.bfloat16
    var offsets = List[Int]()
    offsets.append(0)
    var seed: UInt32 = 77
    var spread = Int(2.0 * Float64(avg_rows) ** 0.5)
    for _ in range(G):
        var r = max(avg_rows + Int(lcg(seed) * Float32(spread)), 0)
        offsets.append(offsets[len(offsets) - 1] + r)
    var T = offsets[G]
    var copies = max(1, ceildiv(200_000_000, G * N * K * 2))
    var a = ctx.enqueue_create_buffer[dtype](T * K)
    var b = ctx.enqueue_create_buffer[dtype](copies * G * N * K)
    var c = ctx.enqueue_create_buffer[dtype](T * N)
    var offs = ctx.enqueue_create_buffer[DType.uint32](G + 1)
    var eids = ctx.enqueue_create_buffer[DType.int32](G)
    var stats = ctx.enqueue_create_buffer[DType.uint32](2)
    ctx.enqueue_function[_fill_kernel[dtype]](a.unsafe_ptr().as_unsafe_any_origin(), Int64(T * K),
        UInt32(1), grid_dim=ceildiv(T * K, 256), block_dim=256)
    ctx.enqueue_function[_fill_kernel[dtype]](b.unsafe_ptr().as_unsafe_any_origin(), Int64(copies * G * N * K),
        UInt32(2), grid_dim=ceildiv(copies * G * N * K, 256), block_dim=256)
    with offs.map_to_host() as h:
        for g in range(G + 1):
            h[g] = UInt32(offsets[g])
    with eids.map_to_host() as h:
        for g in range(G):
            h[g] = Int32(g)
    with stats.map_to_host() as h:
        h[0] = UInt32(T)
        h[1] = UInt32(G)
    var shape = GroupedShape(T=T, K=K, N=N, Nc=N, E=G, G=G, a_rows=T)
    var cp = c.unsafe_ptr().as_unsafe_any_origin()
    var ap = a.unsafe_ptr().as_unsafe_any_origin()
    var op = offs.unsafe_ptr().as_unsafe_any_origin()
    var ip = eids.unsafe_ptr().as_unsafe_any_origin()
    var sp = stats.unsafe_ptr().as_unsafe_any_origin()
    var rp = sp.unsafe_bitcast[Float32]()
    var flops = 2.0 * Float64(T) * Float64(N) * Float64(K)
    var line = String("tiles ", name, " G=", G, " avg=", avg_rows, " T=", T, " N=", N, " K=", K,
                      " picks=", sm90_token_regime(shape))
    comptime if gpu_path[FORCE_AUTO]() != PATH_HOPPER:
        return  # the SM90 kernels exist on sm_90a only (this harness also builds for sm_100a)
    comptime for v in range(4):
        var iters = 20
        var t0 = 0
        for i in range(iters + 3):
            if i == 3:
                ctx.synchronize()
                t0 = perf_counter_ns()
            var bp = b.unsafe_ptr().as_unsafe_any_origin().unsafe_offset((i % copies) * G * N * K)
            comptime if v == 0:
                grouped_matmul_sm90[dtype, DECODE_BN, DECODE_WIDTHS, 0, 0, False, False, DECODE_KSUB](cp, ap, bp, op, ip, sp, rp, shape, ctx)
            elif v == 1:
                grouped_matmul_sm90[dtype, MID_BN, TILE_WIDTHS, 0, 0, False, False](cp, ap, bp, op, ip, sp, rp, shape, ctx)
            elif v == 2:
                grouped_matmul_sm90[dtype, PREFILL_BN, TILE_WIDTHS, 0, 0, False, False](cp, ap, bp, op, ip, sp, rp, shape, ctx)
            else:
                grouped_matmul_sm90[dtype, PREFILL_BN, 1, 0, 0, False, False](cp, ap, bp, op, ip, sp, rp, shape, ctx)
        ctx.synchronize()
        var us = Float64(perf_counter_ns() - t0) / 1e3 / Float64(iters)
        line += String(" v", v, "=", us, "us/", flops / us / 1e6, "TF")
    print(line)


def _pair[early: Bool](
    ctx: DeviceContext, y: ElemPtr[DType.bfloat16], act: ElemPtr[DType.bfloat16], x: ElemPtr[DType.bfloat16],
    up: ElemPtr[DType.bfloat16], down: ElemPtr[DType.bfloat16], op: U32Ptr, ip: I32Ptr, sp: U32Ptr, rp: F32Ptr,
    up_shape: GroupedShape, down_shape: GroupedShape,
) raises:
    """One MoE expert step as the MoE block issues it: gate_up (SwiGLU) then down (row scale);
    `early`: gate_up releases its dependents after its wait and down reads the routing (and
    fills its ring with weights) before its wait."""
    comptime dtype = DType.bfloat16
    grouped_matmul_sm90[dtype, DECODE_BN, DECODE_WIDTHS, 0, 0, True, False, DECODE_KSUB, False, False, early](
        act, x, up, op, ip, sp, rp, up_shape, ctx)
    grouped_matmul_sm90[dtype, DECODE_BN, DECODE_WIDTHS, 0, 0, False, True, DECODE_KSUB, False, early, early](
        y, act, down, op, ip, sp, rp, down_shape, ctx)


def bench_pair(ctx: DeviceContext, name: StaticString, active: Int, rows_per: Int, iters: Int) raises:
    """OLMoE's expert step (64 experts, hidden 2048, intermediate 1024) at decode: `active`
    groups of `rows_per` rows among 64, 4 rotating expert sets; gate_up then down back to back,
    spin-held (device time only), base against early routing, both checked bit-identical."""
    comptime dtype = DType.bfloat16
    comptime G = 64
    comptime H = 2048
    comptime I = 1024
    comptime SETS = 4
    var T = active * rows_per
    var x = ctx.enqueue_create_buffer[dtype](T * H)
    var up = ctx.enqueue_create_buffer[dtype](G * 2 * I * H)
    var down = ctx.enqueue_create_buffer[dtype](G * H * I)
    var act = ctx.enqueue_create_buffer[dtype](T * I)
    var y = ctx.enqueue_create_buffer[dtype](T * H)
    var rs = ctx.enqueue_create_buffer[DType.float32](T)
    var offs = ctx.enqueue_create_buffer[DType.uint32](SETS * (G + 1))
    var eids = ctx.enqueue_create_buffer[DType.int32](SETS * G)
    var stats = ctx.enqueue_create_buffer[DType.uint32](2)
    ctx.enqueue_function[_fill_kernel[dtype]](x.unsafe_ptr().as_unsafe_any_origin(), Int64(T * H),
        UInt32(1), grid_dim=ceildiv(T * H, 256), block_dim=256)
    ctx.enqueue_function[_fill_kernel[dtype]](up.unsafe_ptr().as_unsafe_any_origin(), Int64(G * 2 * I * H),
        UInt32(2), grid_dim=ceildiv(G * 2 * I * H, 256), block_dim=256)
    ctx.enqueue_function[_fill_kernel[dtype]](down.unsafe_ptr().as_unsafe_any_origin(), Int64(G * H * I),
        UInt32(3), grid_dim=ceildiv(G * H * I, 256), block_dim=256)
    with rs.map_to_host() as h:
        for t in range(T):
            h[t] = 0.125
    var stride = G // active
    with offs.map_to_host() as h:
        for st in range(SETS):
            var row = 0
            for g in range(G + 1):
                h[st * (G + 1) + g] = UInt32(row)
                if g < G and (g + 3 * st) % stride == stride - 1:
                    row += rows_per
    with eids.map_to_host() as h:
        for st in range(SETS):
            for g in range(G):
                h[st * G + g] = Int32(g)
    with stats.map_to_host() as h:
        h[0] = UInt32(rows_per)
        h[1] = UInt32(G)
    var up_shape = GroupedShape(T=T, K=H, N=2 * I, Nc=I, E=G, G=G, a_rows=T)
    var down_shape = GroupedShape(T=T, K=I, N=H, Nc=H, E=G, G=G, a_rows=T)
    var yp = y.unsafe_ptr().as_unsafe_any_origin()
    var actp = act.unsafe_ptr().as_unsafe_any_origin()
    var xp = x.unsafe_ptr().as_unsafe_any_origin()
    var upp = up.unsafe_ptr().as_unsafe_any_origin()
    var dp = down.unsafe_ptr().as_unsafe_any_origin()
    var rp = rs.unsafe_ptr().as_unsafe_any_origin()
    var sp = stats.unsafe_ptr().as_unsafe_any_origin()
    var line = String("pair ", name, " active=", active, " rows/group=", rows_per)
    var outs = List[List[Float32]]()
    comptime if gpu_path[FORCE_AUTO]() != PATH_HOPPER:
        return
    comptime for v in range(2):
        var samples = List[Float64]()
        for rep in range(6):
            var spin_ns = Int64(iters * 60_000 + 100_000)
            ctx.synchronize()
            var a0 = perf_counter_ns()
            ctx.enqueue_function[spin_kernel](spin_ns, grid_dim=1, block_dim=32)
            ctx.synchronize()
            var a1 = perf_counter_ns()
            ctx.enqueue_function[spin_kernel](spin_ns, grid_dim=1, block_dim=32)
            for i in range(iters):
                var op = offs.unsafe_ptr().as_unsafe_any_origin().unsafe_offset((i % SETS) * (G + 1))
                var ip = eids.unsafe_ptr().as_unsafe_any_origin().unsafe_offset((i % SETS) * G)
                _pair[v == 1](ctx, yp, actp, xp, upp, dp, op, ip, sp, rp, up_shape, down_shape)
            var enq = perf_counter_ns()
            ctx.synchronize()
            var a2 = perf_counter_ns()
            if Int64(enq - a1) > spin_ns:
                print("   (warning: host enqueue outran the spin)")
            if rep > 0:
                samples.append(Float64(Int(a2 - a1) - Int(a1 - a0)) / 1e3 / Float64(iters))
        sort(samples)
        line += String(" v", v, "=", samples[len(samples) // 2], "us")
        var out = List[Float32]()
        with y.map_to_host() as h:
            for i in range(T * H):
                out.append(h[i].cast[DType.float32]())
        outs.append(out^)
        y.enqueue_fill(Scalar[dtype](POISON))
    var same = True
    for i in range(T * H):
        if outs[0][i] != outs[1][i]:
            same = False
    line += String(" identical=", same)
    print(line)
    if not same:
        raise Error("pair: early routing changed the output")


def main() raises:
    var ctx = DeviceContext()
    cases[DType.bfloat16](ctx)
    cases[DType.float16](ctx)
    print("ALL PASS")
    var args = argv()
    if len(args) > 1 and args[1] == "bench":
        bench(ctx, "decode", 4, 8, 4096, 7168, 50)
        bench(ctx, "decode1", 1, 64, 2048, 7168, 50)
        bench(ctx, "prefill", 1024, 8, 4096, 7168, 10)
    if len(args) > 1 and args[1] == "sparse":
        # decode over all experts' groups: OLMoE (64 experts, gate_up N = 2048 K = 2048, down
        # N = 2048 K = 1024), Qwen3-30B-A3B (128 experts, gate_up N = 1536, down K = 768)
        for _ in range(2):
            bench_sparse(ctx, "olmoe_up", 64, 2048, 2048, True, 200)
            bench_sparse(ctx, "olmoe_down", 64, 2048, 1024, False, 200)
            bench_sparse(ctx, "qwen3_up", 128, 1536, 2048, True, 200)
            bench_sparse(ctx, "qwen3_down", 128, 2048, 768, False, 200)
    if len(args) > 1 and args[1] == "pair":
        for _ in range(2):
            bench_pair(ctx, "olmoe_b1", 8, 1, 40)
            bench_pair(ctx, "olmoe_b8", 32, 2, 20)
            bench_pair(ctx, "olmoe_b64", 64, 8, 10)
    if len(args) > 1 and args[1] == "tiles":
        # OLMoE (64 experts, gate_up N = 2048 K = 2048; down N = 2048 K = 1024) over group sizes
        for r in [16, 32, 48, 64, 96, 128, 160, 192, 256, 512]:
            bench_tiles(ctx, "olmoe_up", r, 64, 2048, 2048)
        bench_tiles(ctx, "olmoe_down", 64, 64, 2048, 1024)
        bench_tiles(ctx, "olmoe_down", 512, 64, 2048, 1024)
        # Qwen3-30B-A3B (128 experts, gate_up N = 1536 K = 2048; down N = 2048 K = 768)
        bench_tiles(ctx, "qwen3_up", 32, 128, 1536, 2048)
        bench_tiles(ctx, "qwen3_up", 256, 128, 1536, 2048)
        bench_tiles(ctx, "qwen3_down", 256, 128, 2048, 768)
        # DeepSeek-V2-Lite (64 experts top-6, gate_up N = 2816 K = 2048) at 4096 tokens: a full
        # token tile and one of about half a tile per group
        bench_tiles(ctx, "dsv2_up", 384, 64, 2816, 2048)
        # Mixtral (8 experts, gate_up N = 28672 K = 4096; down N = 4096 K = 14336)
        bench_tiles(ctx, "mixtral_up", 128, 8, 28672, 4096)
        bench_tiles(ctx, "mixtral_up", 1024, 8, 28672, 4096)
        bench_tiles(ctx, "mixtral_down", 1024, 8, 4096, 14336)
        # Llama-4-Scout (16 experts, gate_up N = 16384 K = 5120) at 1024 rows per expert
        bench_tiles(ctx, "scout_up", 1024, 16, 16384, 5120)

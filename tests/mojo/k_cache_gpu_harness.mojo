# Standalone GPU check + timing of k_matmul_ragged_paged_scale, its V twin and quantize_fp8_rows
# (no MAX graph): each op's GPU path on device buffers vs its CPU path on host copies (the CPU
# paths are checked against float64 by tests/test_k_cache.py and tests/test_fp8_quantize_op.py).
# The K/V ops write a poisoned paged cache; "one-sided" counts elements only one of them wrote
# (must be 0). Covers the wgmma (both tile configs), mma.sync split-K and SIMT kernels, K and V
# halves, bf16/fp8 caches, padded page_stride, bad LUT entries, T = 0; the quantizer must match
# the CPU bit for bit. Then times decode and prefill (N = 1024, K = 7168) with a host loop and
# with device events. Forced Ampere / portable paths (FORCE_* of common/target.mojo) run the
# mma.sync and SIMT kernels through the same launcher. fp8_blockwise_matmul (the same kernels,
# dense output) must equal the K op's cache rows bit for bit; the prefill tile candidates
# (LARGE_PERSISTENT, TALL, TALL_PERSISTENT) must match LARGE and are timed against it (`--tiles`:
# only that, over issue 21's shapes). From the repository root:
#   scripts/build-gpu-bin tests/mojo/k_cache_gpu_harness.mojo
#   LD_LIBRARY_PATH=$PWD/.gpu-bin/lib .gpu-bin/k_cache_gpu_harness [--sanitize | --tiles]
# --sanitize (scripts/gpu-check --sanitize): every correctness case, no timing (the timing-only
# cases are skipped, repeat checks run twice), so that compute-sanitizer's tools stay quick.
from extensibility import InputTensor, OutputTensor, _MutableInputTensor, StaticTensorSpec
from extensibility.managed_tensor_slice import get_row_major_tensor_spec_static
from max.gpu.host import DeviceContext
from std.memory import bitcast
from std.sys import size_of
from std.memory.alloc import unsafe_alloc
from std.time import perf_counter_ns
from std.utils.index import IndexList
from std.math import ceildiv
from std.sys import argv

from mojo_kernels.common.target import FORCE_AMPERE, FORCE_PORTABLE, gpu_arch, gpu_path, has_fp8_mma

from mojo_kernels.k_cache_matmul.entry import cache_matmul, half_matmul_ragged_paged_scale
from mojo_kernels.k_cache_matmul.dense import fp8_blockwise_matmul
from mojo_kernels.k_cache_matmul.kernels.wgmma import (
    LARGE, LARGE_PERSISTENT, TALL, TALL_PERSISTENT, WgmmaConfig, launch_wgmma,
)
from mojo_kernels.k_cache_matmul.sink import DenseRows
from mojo_kernels.k_cache_matmul.dispatch import k_cache_gpu_plan_text
from mojo_kernels.k_cache_matmul.layout import KV_BOTH, K_HALF, V_HALF
from mojo_kernels.k_cache_matmul.plan import plan_shape
from mojo_kernels.fp8_quant.entry import quantize_fp8_rows
from int4_gemm_ref import spin_kernel

comptime U8 = DType.uint8
comptime FP8 = DType.float8_e4m3fn
comptime F32 = DType.float32
comptime In2[dt: DType] = InputTensor[static_spec=StaticTensorSpec[dt, 2, ...].get_unknown()]
comptime In1[dt: DType] = InputTensor[static_spec=StaticTensorSpec[dt, 1, ...].get_unknown()]
comptime Out2[dt: DType] = OutputTensor[static_spec=StaticTensorSpec[dt, 2, ...].get_unknown()]


struct Rng:
    var s: UInt64

    def __init__(out self, seed: UInt64):
        self.s = seed * 6364136223846793005 + 1442695040888963407

    def next(mut self) -> Float32:
        """Uniform in [-1, 1)."""
        self.s = self.s * 6364136223846793005 + 1442695040888963407
        return Float32(Int((self.s >> 33) % 2000001)) / 1000000.0 - 1.0


def has_flag(flag: String) -> Bool:
    """Whether `flag` is on the command line."""
    var args = argv()
    for i in range(1, len(args)):
        if args[i] == flag:
            return True
    return False


def sanitize_mode() -> Bool:
    """`--sanitize` on the command line: correctness only (see the file comment)."""
    return has_flag("--sanitize")


def run_case[
    cache_dtype: DType, H: Int, D: Int, L: Int, PAGE: Int, PAGES: Int, gm: Int, gn: Int, gk: Int,
    half: Int = K_HALF, force: Int = 0,
](
    ctx: DeviceContext, name: String, K: Int, lengths: List[Int], cache_lens: List[Int],
    pad: Int, per_head_scale: Bool, check: Bool, iters: Int, bad_lut: Bool = False, wcopies: Int = 1,
    repeats: Int = 0,
) raises:
    """Runs the op once on the GPU, checks it against the CPU path (check), then times `iters`
    calls. wcopies > 1: the timed calls rotate over that many copies of the weight, so that a
    weight smaller than L2 is still read from HBM (as in a model, where every layer has its own).
    repeats > 0: runs the op that many more times on a freshly poisoned cache and requires every
    run to be bit-identical to the first (the kernels are deterministic, so a difference is a
    race: e.g. a consumer passing an mbarrier phase early). force: a FORCE_* value.
    Timing: a host loop, device events around the loop, and "spin-held" (a spin kernel holds
    the GPU while the host enqueues the calls, so they run back to back as in a captured
    replay, without host launch gaps).
    In --sanitize mode: no timing, timing-only cases (check False) skipped, at most 2 repeats.
    """
    var quick = sanitize_mode()
    if quick and not check:
        return
    var n_iters = 0 if quick else iters
    var n_repeats = min(repeats, 2) if quick else repeats
    comptime N = H * D
    comptime PAGE_ELEMS = 2 * L * PAGE * N
    comptime Blocks = _MutableInputTensor[
        static_spec=get_row_major_tensor_spec_static[cache_dtype, 6, PAGES, 2, L, PAGE, H, D]()]
    var B = len(lengths)
    var T = 0
    for b in range(B):
        T += lengths[b]
    var kb = ceildiv(K, gk)
    var ts = ceildiv(ceildiv(T, gm), 4) * 4
    if ts == 0:
        ts = 4
    var layer = L - 1
    var stride = PAGE_ELEMS + pad
    var arena_len = PAGES * stride
    var rng = Rng(UInt64(K * 7 + T))

    # ---- host data
    var h_x = unsafe_alloc[Scalar[FP8]](max(T * K, 1))
    var h_w = unsafe_alloc[Scalar[FP8]](N * K)
    var h_as = unsafe_alloc[Float32](kb * ts)
    var h_ws = unsafe_alloc[Float32](ceildiv(N, gn) * kb)
    var h_kvs = unsafe_alloc[Float32](H)
    var h_off = unsafe_alloc[UInt32](B + 1)
    var h_cl = unsafe_alloc[UInt32](max(B, 1))
    var lut_cols = 1
    for b in range(B):
        lut_cols = max(lut_cols, ceildiv(cache_lens[b] + lengths[b], PAGE) + 1)
    var h_lut = unsafe_alloc[UInt32](max(B, 1) * lut_cols)
    var h_arena = unsafe_alloc[Scalar[cache_dtype]](arena_len)
    var h_ps = unsafe_alloc[Int64](1)
    var h_mp = unsafe_alloc[UInt32](1)
    var h_mc = unsafe_alloc[UInt32](1)
    for i in range(T * K):
        h_x[unsafe_offset=i] = (rng.next() * 400.0).cast[FP8]()
    for i in range(N * K):
        h_w[unsafe_offset=i] = (rng.next() * 400.0).cast[FP8]()
    for i in range(kb * ts):
        h_as[unsafe_offset=i] = (rng.next() * 0.5 + 1.0) * 1e-3
    for i in range(ceildiv(N, gn) * kb):
        h_ws[unsafe_offset=i] = (rng.next() * 0.5 + 1.0) * 1e-4
    for h in range(H):
        h_kvs[unsafe_offset=h] = Float32(0.02) * Float32(h + 1) if per_head_scale else Float32(0.05)
    h_off[unsafe_offset=0] = 0
    for b in range(B):
        h_off[unsafe_offset=b + 1] = h_off[unsafe_offset=b] + UInt32(lengths[b])
        h_cl[unsafe_offset=b] = UInt32(cache_lens[b])
    var next_page = 0
    for b in range(B):
        for c in range(lut_cols):
            var need = ceildiv(cache_lens[b] + lengths[b], PAGE)
            if c < need:
                h_lut[unsafe_offset=b * lut_cols + c] = UInt32((next_page * 11) % (PAGES - 1))
                next_page += 1
            else:
                h_lut[unsafe_offset=b * lut_cols + c] = UInt32(PAGES - 1)   # the null page
    if next_page > PAGES - 1:
        raise Error("not enough pages")
    if bad_lut and B > 0:
        h_lut[unsafe_offset=0] = UInt32(PAGES + 1000)   # out of range: the op must skip those rows
    var poison = Scalar[cache_dtype](-77.0)
    for i in range(arena_len):
        h_arena[unsafe_offset=i] = poison
    h_ps[unsafe_offset=0] = Int64(-1) if pad == 0 else Int64(stride)
    h_mp[unsafe_offset=0] = 1
    h_mc[unsafe_offset=0] = 1

    # ---- device copies
    var d_x = ctx.enqueue_create_buffer[FP8](max(T * K, 1))
    var d_w = ctx.enqueue_create_buffer[FP8](wcopies * N * K)
    var d_as = ctx.enqueue_create_buffer[F32](kb * ts)
    var d_ws = ctx.enqueue_create_buffer[F32](ceildiv(N, gn) * kb)
    var d_kvs = ctx.enqueue_create_buffer[F32](H)
    var d_off = ctx.enqueue_create_buffer[DType.uint32](B + 1)
    var d_cl = ctx.enqueue_create_buffer[DType.uint32](max(B, 1))
    var d_lut = ctx.enqueue_create_buffer[DType.uint32](max(B, 1) * lut_cols)
    var d_arena = ctx.enqueue_create_buffer[cache_dtype](arena_len)
    ctx.enqueue_copy(d_x, h_x)
    for cp in range(wcopies):
        ctx.enqueue_copy(d_w.create_sub_buffer[FP8](cp * N * K, N * K), h_w)
    ctx.enqueue_copy(d_as, h_as)
    ctx.enqueue_copy(d_ws, h_ws)
    ctx.enqueue_copy(d_kvs, h_kvs)
    ctx.enqueue_copy(d_off, h_off)
    ctx.enqueue_copy(d_cl, h_cl)
    ctx.enqueue_copy(d_lut, h_lut)
    ctx.enqueue_copy(d_arena, h_arena)
    ctx.synchronize()

    var nkv = H if per_head_scale else 1
    var calls = unsafe_alloc[Int](1)  # which weight copy the next call reads (copy 0 first)
    calls[] = 0

    @always_inline
    def run_gpu() raises {var d_x, var d_w, var d_as, var d_ws, var d_kvs, var d_off, var d_cl, var d_lut,
                          var d_arena, var h_ps, var h_mp, var h_mc, var T, var K, var kb, var ts, var B,
                          var lut_cols, var nkv, var layer, var ctx, var calls, var wcopies}:
        var w_ptr = d_w.unsafe_ptr().unsafe_offset((calls[] % wcopies) * N * K)
        calls[] += 1
        half_matmul_ragged_paged_scale[gm, gn, gk, half, "gpu", force](
            In2[FP8](d_x.unsafe_ptr(), IndexList[2](T, K)),
            In1[DType.uint32](d_off.unsafe_ptr(), IndexList[1](B + 1)),
            In2[FP8](w_ptr, IndexList[2](N, K)),
            In2[F32](d_as.unsafe_ptr(), IndexList[2](kb, ts)),
            In2[F32](d_ws.unsafe_ptr(), IndexList[2](ceildiv(N, gn), kb)),
            In1[F32](d_kvs.unsafe_ptr(), IndexList[1](nkv)),
            Blocks(d_arena.unsafe_ptr(), IndexList[6](PAGES, 2, L, PAGE, H, D)),
            In1[DType.int64](h_ps, IndexList[1](1)),
            In1[DType.uint32](d_cl.unsafe_ptr(), IndexList[1](B)),
            In2[DType.uint32](d_lut.unsafe_ptr(), IndexList[2](B, lut_cols)),
            In1[DType.uint32](h_mp, IndexList[1](1)),
            In1[DType.uint32](h_mc, IndexList[1](1)),
            UInt32(layer), ctx)

    run_gpu()
    ctx.synchronize()
    print("==", name, ": half", "K" if half == K_HALF else "V", " T =", T, " B =", B, " K =", K, " N =", N, " gran =", gm, gn, gk,
          " cache", cache_dtype, " pad", pad)
    print("   plan:", k_cache_gpu_plan_text[gm, gn, gk, gpu_path[force](), has_fp8_mma(gpu_arch())](
        plan_shape(T, N, K, K, K)))

    if check:
        var g_arena = unsafe_alloc[Scalar[cache_dtype]](arena_len)
        ctx.enqueue_copy(g_arena, d_arena)
        ctx.synchronize()
        var host = DeviceContext(api="cpu")
        half_matmul_ragged_paged_scale[gm, gn, gk, half, "cpu"](
            In2[FP8](h_x, IndexList[2](T, K)),
            In1[DType.uint32](h_off, IndexList[1](B + 1)),
            In2[FP8](h_w, IndexList[2](N, K)),
            In2[F32](h_as, IndexList[2](kb, ts)),
            In2[F32](h_ws, IndexList[2](ceildiv(N, gn), kb)),
            In1[F32](h_kvs, IndexList[1](nkv)),
            Blocks(h_arena, IndexList[6](PAGES, 2, L, PAGE, H, D)),
            In1[DType.int64](h_ps, IndexList[1](1)),
            In1[DType.uint32](h_cl, IndexList[1](B)),
            In2[DType.uint32](h_lut, IndexList[2](B, lut_cols)),
            In1[DType.uint32](h_mp, IndexList[1](1)),
            In1[DType.uint32](h_mc, IndexList[1](1)),
            UInt32(layer), host)
        var written = 0
        var same = 0
        var one_sided = 0
        var d2 = Float64(0)
        var r2 = Float64(0)
        for i in range(arena_len):
            var c = h_arena[unsafe_offset=i]
            var g = g_arena[unsafe_offset=i]
            var cb = bits[cache_dtype](c)
            var gb = bits[cache_dtype](g)
            var pb = bits[cache_dtype](poison)
            if cb != pb:
                written += 1
            if cb == gb:
                same += 1
                if cb != pb:
                    r2 += Float64(c.cast[F32]()) ** 2
                continue
            if cb == pb or gb == pb:
                one_sided += 1
                continue
            var cf = Float64(c.cast[F32]())
            var gf = Float64(g.cast[F32]())
            d2 += (cf - gf) ** 2
            r2 += cf ** 2
        var rel = (d2 / r2) ** 0.5 if r2 > 0 else 0.0
        var expect = T * N
        print("   written", written, "(expected <=", expect, ")  bit-identical", same, "of", arena_len,
              "  one-sided", one_sided, "  rel err vs CPU", rel,
              "PASS" if one_sided == 0 and rel < 1e-2 and written <= expect and (written > expect * 9 // 10 or expect == 0 or bad_lut) else "FAIL")
        g_arena.unsafe_free()

    if n_repeats > 0:
        var first = unsafe_alloc[Scalar[cache_dtype]](arena_len)
        var again = unsafe_alloc[Scalar[cache_dtype]](arena_len)
        ctx.enqueue_copy(first, d_arena)
        ctx.synchronize()
        var differing_runs = 0
        for _ in range(n_repeats):
            for i in range(arena_len):
                again[unsafe_offset=i] = poison
            ctx.enqueue_copy(d_arena, again)
            run_gpu()
            ctx.enqueue_copy(again, d_arena)
            ctx.synchronize()
            var differing = 0
            for i in range(arena_len):
                if bits[cache_dtype](again[unsafe_offset=i]) != bits[cache_dtype](first[unsafe_offset=i]):
                    differing += 1
            if differing > 0:
                differing_runs += 1
        print("   repeats", n_repeats, " runs differing from the first:", differing_runs,
              "PASS" if differing_runs == 0 else "FAIL")
        first.unsafe_free()
        again.unsafe_free()

    if n_iters > 0:
        for _ in range(3):
            run_gpu()
        ctx.synchronize()
        var t0 = perf_counter_ns()
        for _ in range(n_iters):
            run_gpu()
        ctx.synchronize()
        var dt = Float64(perf_counter_ns() - t0) / 1e9 / Float64(n_iters)
        var ev = Float64(ctx.execution_time(run_gpu, n_iters)) / 1e9 / Float64(n_iters)
        var gbs = Float64(N * K + T * K) / dt / 1e9
        var tflops = 2.0 * Float64(T) * Float64(N) * Float64(K) / dt / 1e12
        # back to back as in a captured replay: a spin kernel holds the GPU while the host
        # enqueues, so host launch gaps are excluded ((spin + calls) - spin, median of 5)
        var spin_ns = Int64(n_iters * 20_000 + 100_000)
        var samples = List[Float64]()
        for _ in range(5):
            ctx.synchronize()
            var a0 = perf_counter_ns()
            ctx.enqueue_function[spin_kernel](spin_ns, grid_dim=1, block_dim=32)
            ctx.synchronize()
            var a1 = perf_counter_ns()
            ctx.enqueue_function[spin_kernel](spin_ns, grid_dim=1, block_dim=32)
            for _ in range(n_iters):
                run_gpu()
            var enq = perf_counter_ns()
            ctx.synchronize()
            var a2 = perf_counter_ns()
            if Int64(enq - a1) > spin_ns:
                print("   (warning: host enqueue", Float64(enq - a1) / 1e3, "us outran the spin)")
            samples.append(Float64(Int(a2 - a1) - Int(a1 - a0)) / 1e3 / Float64(n_iters))
        sort(samples)
        print("   time/call", dt * 1e6, "us (host loop),", ev * 1e6, "us (device events),",
              samples[2], "us (spin-held)   ", gbs, "GB/s (weights+acts, host loop)   ", tflops, "TFLOP/s")


def fused_case[
    cache_dtype: DType, H: Int, D: Int, L: Int, PAGE: Int, PAGES: Int, gm: Int, gn: Int, gk: Int,
](
    ctx: DeviceContext, name: String, K: Int, lengths: List[Int], cache_lens: List[Int],
    per_head_scale: Bool, iters: Int, wcopies: Int = 4,
) raises:
    """The fused K+V op (`cache_matmul[..., KV_BOTH]`, a weight per half) against the K op then
    the V op on the GPU: both write a poisoned cache and must write the same slots, bit-identical
    where the fused launch takes the per-half plan (the same kernels and sums; the fused
    mma.sync launch only adds grid z); where it takes another mma.sync config (its rows count
    both halves: `k_cache_gpu_plan`'s halves) the sums run in another order, and the rows must
    agree to a rel. Frobenius difference of 1e-2. Then times `iters` calls of each (weights
    rotated over `wcopies` copies), device events."""
    var quick = sanitize_mode()
    var n_iters = 0 if quick else iters
    comptime N = H * D
    comptime PAGE_ELEMS = 2 * L * PAGE * N
    comptime Blocks = _MutableInputTensor[
        static_spec=get_row_major_tensor_spec_static[cache_dtype, 6, PAGES, 2, L, PAGE, H, D]()]
    var B = len(lengths)
    var T = 0
    for b in range(B):
        T += lengths[b]
    var kb = ceildiv(K, gk)
    var ts = max(ceildiv(ceildiv(T, gm), 4) * 4, 4)
    var layer = L - 1
    var arena_len = PAGES * PAGE_ELEMS
    var nkv = H if per_head_scale else 1
    var nws = ceildiv(N, gn) * kb
    var rng = Rng(UInt64(K * 13 + T))
    var h_x = unsafe_alloc[Scalar[FP8]](max(T * K, 1))
    var h_w = unsafe_alloc[Scalar[FP8]](2 * N * K)  # K's weight, then V's
    var h_as = unsafe_alloc[Float32](kb * ts)
    var h_ws = unsafe_alloc[Float32](2 * nws)
    var h_kvs = unsafe_alloc[Float32](2 * nkv)
    var h_off = unsafe_alloc[UInt32](B + 1)
    var h_cl = unsafe_alloc[UInt32](max(B, 1))
    var lut_cols = 1
    for b in range(B):
        lut_cols = max(lut_cols, ceildiv(cache_lens[b] + lengths[b], PAGE) + 1)
    var h_lut = unsafe_alloc[UInt32](max(B, 1) * lut_cols)
    var h_arena = unsafe_alloc[Scalar[cache_dtype]](arena_len)
    var h_ps = unsafe_alloc[Int64](1)
    var h_mp = unsafe_alloc[UInt32](1)
    var h_mc = unsafe_alloc[UInt32](1)
    for i in range(T * K):
        h_x[unsafe_offset=i] = (rng.next() * 400.0).cast[FP8]()
    for i in range(2 * N * K):
        h_w[unsafe_offset=i] = (rng.next() * 400.0).cast[FP8]()
    for i in range(kb * ts):
        h_as[unsafe_offset=i] = (rng.next() * 0.5 + 1.0) * 1e-3
    for i in range(2 * nws):
        h_ws[unsafe_offset=i] = (rng.next() * 0.5 + 1.0) * 1e-4
    for i in range(2 * nkv):
        h_kvs[unsafe_offset=i] = Float32(0.02) * Float32(i + 1)
    h_off[unsafe_offset=0] = 0
    var next_page = 0
    for b in range(B):
        h_off[unsafe_offset=b + 1] = h_off[unsafe_offset=b] + UInt32(lengths[b])
        h_cl[unsafe_offset=b] = UInt32(cache_lens[b])
        for c in range(lut_cols):
            if c < ceildiv(cache_lens[b] + lengths[b], PAGE):
                h_lut[unsafe_offset=b * lut_cols + c] = UInt32((next_page * 11) % (PAGES - 1))
                next_page += 1
            else:
                h_lut[unsafe_offset=b * lut_cols + c] = UInt32(PAGES - 1)
    if next_page > PAGES - 1:
        raise Error("not enough pages")
    var poison = Scalar[cache_dtype](-77.0)
    for i in range(arena_len):
        h_arena[unsafe_offset=i] = poison
    h_ps[unsafe_offset=0] = -1
    h_mp[unsafe_offset=0] = 1
    h_mc[unsafe_offset=0] = 1
    var d_x = ctx.enqueue_create_buffer[FP8](max(T * K, 1))
    var d_w = ctx.enqueue_create_buffer[FP8](wcopies * 2 * N * K)
    var d_as = ctx.enqueue_create_buffer[F32](kb * ts)
    var d_ws = ctx.enqueue_create_buffer[F32](2 * nws)
    var d_kvs = ctx.enqueue_create_buffer[F32](2 * nkv)
    var d_off = ctx.enqueue_create_buffer[DType.uint32](B + 1)
    var d_cl = ctx.enqueue_create_buffer[DType.uint32](max(B, 1))
    var d_lut = ctx.enqueue_create_buffer[DType.uint32](max(B, 1) * lut_cols)
    var d_arena = ctx.enqueue_create_buffer[cache_dtype](arena_len)
    ctx.enqueue_copy(d_x, h_x)
    for cp in range(wcopies):
        ctx.enqueue_copy(d_w.create_sub_buffer[FP8](cp * 2 * N * K, 2 * N * K), h_w)
    ctx.enqueue_copy(d_as, h_as)
    ctx.enqueue_copy(d_ws, h_ws)
    ctx.enqueue_copy(d_kvs, h_kvs)
    ctx.enqueue_copy(d_off, h_off)
    ctx.enqueue_copy(d_cl, h_cl)
    ctx.enqueue_copy(d_lut, h_lut)
    ctx.enqueue_copy(d_arena, h_arena)
    ctx.synchronize()
    var calls = unsafe_alloc[Int](1)
    calls[] = 0

    @always_inline
    def run[fused: Bool]() raises {var d_x, var d_w, var d_as, var d_ws, var d_kvs, var d_off, var d_cl, var d_lut,
                                   var d_arena, var h_ps, var h_mp, var h_mc, var T, var K, var kb, var ts, var B,
                                   var lut_cols, var nkv, var nws, var layer, var ctx, var calls, var wcopies}:
        var kw = d_w.unsafe_ptr().unsafe_offset((calls[] % wcopies) * 2 * N * K)
        var vw = kw.unsafe_offset(N * K)
        calls[] += 1
        var ws = d_ws.unsafe_ptr()
        var x = In2[FP8](d_x.unsafe_ptr(), IndexList[2](T, K))
        var off = In1[DType.uint32](d_off.unsafe_ptr(), IndexList[1](B + 1))
        var a_s = In2[F32](d_as.unsafe_ptr(), IndexList[2](kb, ts))
        var blocks = Blocks(d_arena.unsafe_ptr(), IndexList[6](PAGES, 2, L, PAGE, H, D))
        var ps = In1[DType.int64](h_ps, IndexList[1](1))
        var cl = In1[DType.uint32](d_cl.unsafe_ptr(), IndexList[1](B))
        var lut = In2[DType.uint32](d_lut.unsafe_ptr(), IndexList[2](B, lut_cols))
        var mp = In1[DType.uint32](h_mp, IndexList[1](1))
        var mc = In1[DType.uint32](h_mc, IndexList[1](1))
        var kws = In2[F32](ws, IndexList[2](ceildiv(N, gn), kb))
        var vws = In2[F32](ws.unsafe_offset(nws), IndexList[2](ceildiv(N, gn), kb))
        comptime if fused:
            cache_matmul[gm, gn, gk, KV_BOTH, "gpu"](
                x, off, In2[FP8](kw, IndexList[2](N, K)), In2[FP8](vw, IndexList[2](N, K)), a_s, kws, vws,
                In1[F32](d_kvs.unsafe_ptr(), IndexList[1](2 * nkv)), blocks, ps, cl, lut, mp, mc, UInt32(layer), ctx)
        else:
            half_matmul_ragged_paged_scale[gm, gn, gk, K_HALF, "gpu"](
                x, off, In2[FP8](kw, IndexList[2](N, K)), a_s, kws, In1[F32](d_kvs.unsafe_ptr(), IndexList[1](nkv)),
                blocks, ps, cl, lut, mp, mc, UInt32(layer), ctx)
            half_matmul_ragged_paged_scale[gm, gn, gk, V_HALF, "gpu"](
                x, off, In2[FP8](vw, IndexList[2](N, K)), a_s, vws,
                In1[F32](d_kvs.unsafe_ptr().unsafe_offset(nkv), IndexList[1](nkv)),
                blocks, ps, cl, lut, mp, mc, UInt32(layer), ctx)

    print("== fused K+V", name, ": T =", T, " B =", B, " K =", K, " N =", N, " gran =", gm, gn, gk, " cache",
          cache_dtype)
    var plan_half = k_cache_gpu_plan_text[gm, gn, gk](plan_shape(T, N, K, K, K))
    var plan_fused = k_cache_gpu_plan_text[gm, gn, gk](plan_shape(T, N, K, K, K), 2)
    print("   plan (per half):", plan_half, " fused:", plan_fused)
    var sep = unsafe_alloc[Scalar[cache_dtype]](arena_len)
    var fus = unsafe_alloc[Scalar[cache_dtype]](arena_len)
    run[False]()
    ctx.enqueue_copy(sep, d_arena)
    ctx.enqueue_copy(d_arena, h_arena)
    calls[] = 0
    run[True]()
    ctx.enqueue_copy(fus, d_arena)
    ctx.synchronize()
    var differing = 0
    var written = 0
    var slots_differ = 0
    var d2 = Float64(0)
    var r2 = Float64(0)
    for i in range(arena_len):
        var sb = bits[cache_dtype](sep[unsafe_offset=i])
        var fb = bits[cache_dtype](fus[unsafe_offset=i])
        if sb != fb:
            differing += 1
        if sb != bits[cache_dtype](poison):
            written += 1
        if (sb == bits[cache_dtype](poison)) != (fb == bits[cache_dtype](poison)):
            slots_differ += 1
        elif sb != bits[cache_dtype](poison):
            var a = Float64(sep[unsafe_offset=i].cast[F32]())
            var c = Float64(fus[unsafe_offset=i].cast[F32]())
            d2 += (a - c) * (a - c)
            r2 += a * a
    var expect = 2 * T * N
    var rel = (d2 / max(r2, 1e-30)) ** 0.5
    var same_plan = plan_half == plan_fused
    var agree = differing == 0 if same_plan else (slots_differ == 0 and rel <= 1e-2)
    print("   written", written, "(expected <=", expect, ")  differing from K op + V op:", differing,
          "(rel", rel, ")",
          "PASS" if agree and written <= expect and (written > expect * 9 // 10 or expect == 0) else "FAIL")
    sep.unsafe_free()
    fus.unsafe_free()
    if n_iters > 0:
        @always_inline
        def run_sep() raises {var run}:
            run[False]()

        @always_inline
        def run_fused() raises {var run}:
            run[True]()

        run_sep()
        run_fused()
        ctx.synchronize()
        var t_sep = Float64(ctx.execution_time(run_sep, n_iters)) / 1e3 / Float64(n_iters)
        var t_fus = Float64(ctx.execution_time(run_fused, n_iters)) / 1e3 / Float64(n_iters)
        print("   time/call (device events): K op + V op", t_sep, "us, fused", t_fus, "us")


def dense_case[H: Int, D: Int, PAGE: Int, PAGES: Int, gm: Int, gn: Int, gk: Int](
    ctx: DeviceContext, name: String, M: Int, K: Int, iters: Int, wcopies: Int = 4,
) raises:
    """`fp8_blockwise_matmul` (dense bf16 output) against the K op writing one M-token sequence
    into a bf16 cache (cache length 0, pages in order): the same kernels and sums, so every
    output element must equal its cache slot bit for bit, and every one is written (the
    output is poisoned first). Then times `iters` calls of each (weights rotated over
    `wcopies` copies, device events): the dense op is the GEMM the cache-writing op is held
    to."""
    var quick = sanitize_mode()
    var n_iters = 0 if quick else iters
    comptime N = H * D
    comptime PAGE_ELEMS = 2 * PAGE * N  # one layer
    var pages = PAGES
    if ceildiv(M, PAGE) > PAGES:
        raise Error("dense_case: PAGES < ceil(M / PAGE)")
    comptime Blocks = _MutableInputTensor[
        static_spec=get_row_major_tensor_spec_static[DType.bfloat16, 6, PAGES, 2, 1, PAGE, H, D]()]
    var kb = ceildiv(K, gk)
    var ts = max(ceildiv(ceildiv(M, gm), 4) * 4, 4)
    var rng = Rng(UInt64(K * 7 + M))
    var h_x = unsafe_alloc[Scalar[FP8]](max(M * K, 1))
    var h_w = unsafe_alloc[Scalar[FP8]](N * K)
    var h_as = unsafe_alloc[Float32](kb * ts)
    var h_ws = unsafe_alloc[Float32](ceildiv(N, gn) * kb)
    var h_lut = unsafe_alloc[UInt32](pages)
    var h_ps = unsafe_alloc[Int64](1)
    var h_mp = unsafe_alloc[UInt32](1)
    var h_mc = unsafe_alloc[UInt32](1)
    var h_off = unsafe_alloc[UInt32](2)
    var h_cl = unsafe_alloc[UInt32](1)
    for i in range(M * K):
        h_x[unsafe_offset=i] = (rng.next() * 400.0).cast[FP8]()
    for i in range(N * K):
        h_w[unsafe_offset=i] = (rng.next() * 400.0).cast[FP8]()
    for i in range(kb * ts):
        h_as[unsafe_offset=i] = (rng.next() * 0.5 + 1.0) * 1e-3
    for i in range(ceildiv(N, gn) * kb):
        h_ws[unsafe_offset=i] = (rng.next() * 0.5 + 1.0) * 1e-4
    for i in range(pages):
        h_lut[unsafe_offset=i] = UInt32(i)
    h_ps[unsafe_offset=0] = -1
    h_mp[unsafe_offset=0] = UInt32(M)
    h_mc[unsafe_offset=0] = UInt32(M)
    h_off[unsafe_offset=0] = 0
    h_off[unsafe_offset=1] = UInt32(M)
    h_cl[unsafe_offset=0] = 0
    var poison = BFloat16(-77.0)
    var h_poison = unsafe_alloc[BFloat16](max(M * N, pages * PAGE_ELEMS))
    for i in range(max(M * N, pages * PAGE_ELEMS)):
        h_poison[unsafe_offset=i] = poison
    var d_x = ctx.enqueue_create_buffer[FP8](max(M * K, 1))
    var d_w = ctx.enqueue_create_buffer[FP8](wcopies * N * K)
    var d_as = ctx.enqueue_create_buffer[F32](kb * ts)
    var d_ws = ctx.enqueue_create_buffer[F32](ceildiv(N, gn) * kb)
    var d_off = ctx.enqueue_create_buffer[DType.uint32](2)
    var d_cl = ctx.enqueue_create_buffer[DType.uint32](1)
    var d_lut = ctx.enqueue_create_buffer[DType.uint32](pages)
    var d_kvs = ctx.enqueue_create_buffer[F32](1)
    var d_arena = ctx.enqueue_create_buffer[DType.bfloat16](pages * PAGE_ELEMS)
    var d_out = ctx.enqueue_create_buffer[DType.bfloat16](max(M * N, 1))
    ctx.enqueue_copy(d_x, h_x)
    for cp in range(wcopies):
        ctx.enqueue_copy(d_w.create_sub_buffer[FP8](cp * N * K, N * K), h_w)
    ctx.enqueue_copy(d_as, h_as)
    ctx.enqueue_copy(d_ws, h_ws)
    ctx.enqueue_copy(d_off, h_off)
    ctx.enqueue_copy(d_cl, h_cl)
    ctx.enqueue_copy(d_lut, h_lut)
    ctx.enqueue_copy(d_arena, h_poison)
    ctx.enqueue_copy(d_out, h_poison)
    d_kvs.enqueue_fill(1.0)
    ctx.synchronize()
    var calls = unsafe_alloc[Int](1)
    calls[] = 0

    @always_inline
    def run[dense: Bool]() raises {var d_x, var d_w, var d_as, var d_ws, var d_off, var d_cl, var d_lut, var d_kvs,
                                   var d_arena, var d_out, var h_ps, var h_mp, var h_mc, var M, var K, var kb, var ts,
                                   var pages, var ctx, var calls, var wcopies}:
        var w = d_w.unsafe_ptr().unsafe_offset((calls[] % wcopies) * N * K)
        calls[] += 1
        var x = In2[FP8](d_x.unsafe_ptr(), IndexList[2](M, K))
        var a_s = In2[F32](d_as.unsafe_ptr(), IndexList[2](kb, ts))
        var ws = In2[F32](d_ws.unsafe_ptr(), IndexList[2](ceildiv(N, gn), kb))
        comptime if dense:
            fp8_blockwise_matmul[gm, gn, gk, "gpu"](
                Out2[DType.bfloat16](d_out.unsafe_ptr(), IndexList[2](M, N)), x, a_s,
                In2[FP8](w, IndexList[2](N, K)), ws, ctx)
        else:
            half_matmul_ragged_paged_scale[gm, gn, gk, K_HALF, "gpu"](
                x, In1[DType.uint32](d_off.unsafe_ptr(), IndexList[1](2)), In2[FP8](w, IndexList[2](N, K)), a_s, ws,
                In1[F32](d_kvs.unsafe_ptr(), IndexList[1](1)),
                Blocks(d_arena.unsafe_ptr(), IndexList[6](pages, 2, 1, PAGE, H, D)),
                In1[DType.int64](h_ps, IndexList[1](1)), In1[DType.uint32](d_cl.unsafe_ptr(), IndexList[1](1)),
                In2[DType.uint32](d_lut.unsafe_ptr(), IndexList[2](1, pages)),
                In1[DType.uint32](h_mp, IndexList[1](1)), In1[DType.uint32](h_mc, IndexList[1](1)), UInt32(0), ctx)

    print("== dense", name, ": M =", M, " K =", K, " N =", N, " gran =", gm, gn, gk)
    print("   plan:", k_cache_gpu_plan_text[gm, gn, gk](plan_shape(M, N, K, K, K)))
    run[False]()
    run[True]()
    var h_arena = unsafe_alloc[BFloat16](pages * PAGE_ELEMS)
    var h_out = unsafe_alloc[BFloat16](max(M * N, 1))
    ctx.enqueue_copy(h_arena, d_arena)
    ctx.enqueue_copy(h_out, d_out)
    ctx.synchronize()
    var differing = 0
    var unwritten = 0
    for t in range(M):
        for n in range(N):
            var o = bits[DType.bfloat16](h_out[unsafe_offset=t * N + n])
            var c = bits[DType.bfloat16](h_arena[unsafe_offset=(t // PAGE) * PAGE_ELEMS + (t % PAGE) * N + n])
            if o == bits[DType.bfloat16](poison):
                unwritten += 1
            if o != c:
                differing += 1
    print("   unwritten", unwritten, " differing from the K op's cache rows:", differing,
          "PASS" if differing == 0 and unwritten == 0 else "FAIL")
    h_arena.unsafe_free()
    h_out.unsafe_free()
    if n_iters > 0:
        @always_inline
        def run_paged() raises {var run}:
            run[False]()

        @always_inline
        def run_dense() raises {var run}:
            run[True]()

        run_paged()
        run_dense()
        ctx.synchronize()
        var t_paged = Float64(ctx.execution_time(run_paged, n_iters)) / 1e3 / Float64(n_iters)
        var t_dense = Float64(ctx.execution_time(run_dense, n_iters)) / 1e3 / Float64(n_iters)
        var tflops = 2.0 * Float64(M) * Float64(N) * Float64(K) / t_dense / 1e6
        print("   time/call (device events): K op", t_paged, "us, dense", t_dense, "us (", tflops,
              "TFLOP/s); K op / dense", t_paged / t_dense)


def tile_case[gm: Int, gn: Int, gk: Int](
    ctx: DeviceContext, name: String, M: Int, N: Int, K: Int, iters: Int, wcopies: Int = 4,
    check_all: Bool = True,
) raises:
    """The prefill kernel's tile configs on one dense problem (DenseRows sink): LARGE (what the
    dispatch launches), LARGE_PERSISTENT, TALL (192 x 128, three consumers) and
    TALL_PERSISTENT. Each candidate must write every element and match LARGE within fp32
    summation-order noise; then `iters` calls of each are timed (weights rotated over
    `wcopies` copies)."""
    var quick = sanitize_mode()
    var n_iters = 0 if quick else iters
    var kb = ceildiv(K, gk)
    var ts = max(ceildiv(ceildiv(M, gm), 4) * 4, 4)
    var rng = Rng(UInt64(K * 3 + M + N))
    var h_x = unsafe_alloc[Scalar[FP8]](M * K)
    var h_w = unsafe_alloc[Scalar[FP8]](N * K)
    var h_as = unsafe_alloc[Float32](kb * ts)
    var h_ws = unsafe_alloc[Float32](ceildiv(N, gn) * kb)
    for i in range(M * K):
        h_x[unsafe_offset=i] = (rng.next() * 400.0).cast[FP8]()
    for i in range(N * K):
        h_w[unsafe_offset=i] = (rng.next() * 400.0).cast[FP8]()
    for i in range(kb * ts):
        h_as[unsafe_offset=i] = (rng.next() * 0.5 + 1.0) * 1e-3
    for i in range(ceildiv(N, gn) * kb):
        h_ws[unsafe_offset=i] = (rng.next() * 0.5 + 1.0) * 1e-4
    var poison = BFloat16(-77.0)
    var h_poison = unsafe_alloc[BFloat16](M * N)
    for i in range(M * N):
        h_poison[unsafe_offset=i] = poison
    var d_x = ctx.enqueue_create_buffer[FP8](M * K)
    var d_w = ctx.enqueue_create_buffer[FP8](wcopies * N * K)
    var d_as = ctx.enqueue_create_buffer[F32](kb * ts)
    var d_ws = ctx.enqueue_create_buffer[F32](ceildiv(N, gn) * kb)
    var d_out = ctx.enqueue_create_buffer[DType.bfloat16](M * N)
    ctx.enqueue_copy(d_x, h_x)
    for cp in range(wcopies):
        ctx.enqueue_copy(d_w.create_sub_buffer[FP8](cp * N * K, N * K), h_w)
    ctx.enqueue_copy(d_as, h_as)
    ctx.enqueue_copy(d_ws, h_ws)
    ctx.synchronize()
    var shape = plan_shape(M, N, K, K, K)
    shape.as_stride = Int32(ts)
    shape.ws_stride = Int32(kb)
    var rows = DenseRows[DType.bfloat16](Int(d_out.unsafe_ptr()), N)
    var none = d_as.unsafe_ptr().as_unsafe_any_origin().unsafe_bitcast[UInt32]()
    var calls = unsafe_alloc[Int](1)
    calls[] = 0

    @always_inline
    def run[cfg: WgmmaConfig]() raises {var d_x, var d_w, var d_as, var d_ws, var rows, var none, var shape,
                                        var ctx, var calls, var wcopies, var N, var K}:
        var w = d_w.unsafe_ptr().as_unsafe_any_origin().unsafe_offset((calls[] % wcopies) * N * K)
        calls[] += 1
        var a_s = d_as.unsafe_ptr().as_unsafe_any_origin()
        launch_wgmma[gm, gn, gk, DenseRows[DType.bfloat16], cfg](
            d_x.unsafe_ptr().as_unsafe_any_origin(), none, w, a_s, d_ws.unsafe_ptr().as_unsafe_any_origin(), a_s,
            none, none, rows, shape, ctx)

    print("== tiles", name, ": M =", M, " N =", N, " K =", K)
    var base = unsafe_alloc[BFloat16](M * N)
    var got = unsafe_alloc[BFloat16](M * N)
    ctx.enqueue_copy(d_out, h_poison)
    run[LARGE]()
    ctx.enqueue_copy(base, d_out)
    ctx.synchronize()
    var amax = Float32(0)
    for i in range(M * N):
        amax = max(amax, abs(base[unsafe_offset=i].cast[F32]()))

    @always_inline
    def check[cfg: WgmmaConfig]() raises {var run, var base, var got, var d_out, var h_poison, var ctx, var amax,
                                          var poison, var M, var N}:
        ctx.enqueue_copy(d_out, h_poison)
        run[cfg]()
        ctx.enqueue_copy(got, d_out)
        ctx.synchronize()
        var unwritten = 0
        var off = 0
        for i in range(M * N):
            var gv = got[unsafe_offset=i]
            if bits[DType.bfloat16](gv) == bits[DType.bfloat16](poison):
                unwritten += 1
            var rv = base[unsafe_offset=i].cast[F32]()
            if abs(gv.cast[F32]() - rv) > Float32(1e-2) * abs(rv) + Float32(1e-3) * amax:
                off += 1
        print("  ", String(cfg), ": unwritten", unwritten, " off from LARGE", off,
              "PASS" if unwritten == 0 and off == 0 else "FAIL")

    if check_all:
        check[LARGE_PERSISTENT]()
        check[TALL]()
        check[TALL_PERSISTENT]()
    base.unsafe_free()
    got.unsafe_free()
    if n_iters > 0:
        @always_inline
        def t_large() raises {var run}:
            run[LARGE]()

        @always_inline
        def t_largep() raises {var run}:
            run[LARGE_PERSISTENT]()

        @always_inline
        def t_tall() raises {var run}:
            run[TALL]()

        @always_inline
        def t_tallp() raises {var run}:
            run[TALL_PERSISTENT]()

        var flop = 2.0 * Float64(M) * Float64(N) * Float64(K)
        t_large()
        t_largep()
        t_tall()
        t_tallp()
        ctx.synchronize()
        var us_l = Float64(ctx.execution_time(t_large, n_iters)) / 1e3 / Float64(n_iters)
        var us_lp = Float64(ctx.execution_time(t_largep, n_iters)) / 1e3 / Float64(n_iters)
        var us_t = Float64(ctx.execution_time(t_tall, n_iters)) / 1e3 / Float64(n_iters)
        var us_p = Float64(ctx.execution_time(t_tallp, n_iters)) / 1e3 / Float64(n_iters)
        print("   time/call (device events): LARGE", us_l, "us (", flop / us_l / 1e6, "TFLOP/s), LARGE persistent",
              us_lp, "us (", flop / us_lp / 1e6, "), TALL", us_t, "us (", flop / us_t / 1e6, "), TALL persistent",
              us_p, "us (", flop / us_p / 1e6, ")")


@always_inline
def bits[dt: DType](x: Scalar[dt]) -> Int:
    comptime if dt == DType.bfloat16:
        return Int(bitcast[DType.uint16, 1](x))
    else:
        return Int(bitcast[DType.uint8, 1](x))


def quant_case[in_dtype: DType, block: Int](ctx: DeviceContext, T: Int, H: Int, iters: Int) raises:
    """Checks quantize_fp8_rows on the GPU against the CPU: data bits and scales must be identical.
    Timing-only calls (T * H large, iters > 0) are skipped in --sanitize mode."""
    var quick = sanitize_mode()
    if quick and iters > 0 and T * H > 1 << 20:
        return
    var nkb = ceildiv(H, block)
    var rng = Rng(UInt64(T * 31 + H))
    var h_x = unsafe_alloc[Scalar[in_dtype]](max(T * H, 1))
    for i in range(T * H):
        # magnitudes over 5 decades, a zero row (t == 1) and zero blocks (the amax == 0 case)
        var mag = Float32(1e-3)
        for _ in range((i // H) % 6):
            mag *= 10.0
        var v = rng.next() * mag
        if i // H == 1 or (i % H) // block == 2:
            v = 0.0
        h_x[unsafe_offset=i] = v.cast[in_dtype]()
    var c_q = unsafe_alloc[Scalar[U8]](max(T * H, 1))
    var c_s = unsafe_alloc[Float32](max(nkb * T, 1))
    var g_q = unsafe_alloc[Scalar[U8]](max(T * H, 1))
    var g_s = unsafe_alloc[Float32](max(nkb * T, 1))
    var d_x = ctx.enqueue_create_buffer[in_dtype](max(T * H, 1))
    var d_q = ctx.enqueue_create_buffer[U8](max(T * H, 1))
    var d_s = ctx.enqueue_create_buffer[F32](max(nkb * T, 1))
    ctx.enqueue_copy(d_x, h_x)
    ctx.synchronize()

    @always_inline
    def run_gpu() raises {var d_x, var d_q, var d_s, var T, var H, var nkb, var ctx}:
        quantize_fp8_rows[block, "gpu"](
            Out2[FP8](d_q.unsafe_ptr().unsafe_bitcast[Scalar[FP8]](), IndexList[2](T, H)),
            Out2[F32](d_s.unsafe_ptr(), IndexList[2](nkb, T)),
            In2[in_dtype](d_x.unsafe_ptr(), IndexList[2](T, H)), ctx)

    run_gpu()
    ctx.enqueue_copy(g_q, d_q)
    ctx.enqueue_copy(g_s, d_s)
    ctx.synchronize()
    quantize_fp8_rows[block, "cpu"](
        Out2[U8](c_q, IndexList[2](T, H)), Out2[F32](c_s, IndexList[2](nkb, T)),
        In2[in_dtype](h_x, IndexList[2](T, H)), DeviceContext(api="cpu"))
    var bad_q = 0
    var bad_s = 0
    for i in range(T * H):
        if c_q[unsafe_offset=i] != g_q[unsafe_offset=i]:
            bad_q += 1
    for i in range(nkb * T):
        if c_s[unsafe_offset=i] != g_s[unsafe_offset=i]:
            bad_s += 1
    print("== quantize_fp8_rows", in_dtype, "block", block, ": T =", T, " H =", H, "  differing data",
          bad_q, " differing scales", bad_s, "PASS" if bad_q == 0 and bad_s == 0 else "FAIL")
    if iters > 0 and not quick:
        for _ in range(3):
            run_gpu()
        ctx.synchronize()
        var ev = Float64(ctx.execution_time(run_gpu, iters)) / 1e9 / Float64(iters)
        print("   time/call", ev * 1e6, "us (device events)  ", Float64(T * H * (size_of[in_dtype]() + 1)) / ev / 1e9,
              "GB/s")


def rep(n: Int, v: Int) -> List[Int]:
    var l = List[Int]()
    for _ in range(n):
        l.append(v)
    return l^


def tile_sweep(ctx: DeviceContext) raises:
    """`--tiles`: the prefill tile configs timed on issue 21's shapes (KV widths 256 / 1024 /
    2048 / 8192 x hidden 3072 / 4096 / 7168 x T 512 / 1024 / 4096), for the dispatch rule that
    will choose among them; every config checked against LARGE where M x N <= 8M."""
    for n in [256, 1024, 2048, 8192]:
        for k in [3072, 4096, 7168]:
            for t in [512, 1024, 4096]:
                tile_case[1, 128, 128](ctx, "sweep", t, n, k, 10, 4, t * n <= 8 << 20)


def main() raises:
    var ctx = DeviceContext()
    if has_flag("--tiles"):
        tile_sweep(ctx)
        return
    # correctness vs the CPU path (+ timing): decode (mma.sync split-K), ragged prefill (wgmma)
    run_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "decode bf16", 7168, rep(8, 1), [0, 1, 127, 128, 300, 5, 17, 1000], 0, False, True, 200)
    run_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "ragged bf16 padded (wgmma)", 4096, [3, 0, 1, 150, 37, 0, 64], [5, 0, 127, 30, 0, 9, 200], 512,
        False, True, 50)
    run_case[DType.float8_e4m3fn, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "fp8 per-head (mma 2x2)", 4096, [20, 1, 19], [0, 3, 250], 0, True, True, 50)
    run_case[DType.float8_e4m3fn, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "fp8 per-head (wgmma)", 2048, [100, 1, 199], [0, 3, 250], 0, True, True, 0)
    run_case[DType.bfloat16, 4, 128, 2, 128, 64, 128, 64, 256](
        ctx, "wgmma gran 128x64x256 K tail", 1088, [77, 0, 123], [0, 0, 129], 0, False, True, 0)
    run_case[DType.bfloat16, 4, 128, 2, 128, 64, 1, 128, 64](
        ctx, "mma 2x4 gran 1x128x64", 1024, [60, 40], [10, 0], 0, False, True, 0)
    run_case[DType.bfloat16, 2, 64, 2, 128, 16, 2, 64, 32](
        ctx, "simt gran 2x64x32", 200, [5, 0, 12], [3, 0, 120], 0, False, True, 0)
    run_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "bad lut (wgmma)", 1024, [100, 50], [0, 0], 0, False, True, 0, True)
    run_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "bad lut (mma)", 1024, [10, 5], [0, 0], 0, False, True, 0, True)
    run_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "empty", 256, [0, 0], [4, 0], 0, False, True, 0)
    # the wgmma kernel's LARGE tile (128 tokens x 128 columns, >= 120 CTAs): fp8 cache, N not a
    # multiple of the tile with gn = 64, token tiles cut by the sequence ends
    run_case[DType.float8_e4m3fn, 8, 128, 1, 128, 40, 1, 128, 128](
        ctx, "LARGE fp8 per-head", 2048, [1000, 1048], [3, 250], 0, True, True, 0)
    run_case[DType.bfloat16, 5, 128, 1, 128, 40, 1, 64, 128](
        ctx, "LARGE N tail gn=64", 1024, [1500, 1572], [0, 7], 256, False, True, 0)
    run_case[DType.float8_e4m3fn, 8, 128, 1, 128, 40, 1, 128, 128](
        ctx, "LARGE token tails", 1024, [900, 1000], [0, 17], 0, False, True, 0)
    run_case[DType.float8_e4m3fn, 3, 128, 1, 128, 48, 1, 128, 128](
        ctx, "LARGE many tiles", 1024, rep(5, 1024), rep(5, 0), 0, False, True, 0)
    # LARGE with 9 K tiles (odd: the alternating block accumulators end on the other one than
    # with the even counts elsewhere), a K tail and an fp8 per-head cache; head_dim 96 (N tail)
    # with gn = 64 (the one-block-at-a-time path), a padded page_stride, an empty sequence
    run_case[DType.float8_e4m3fn, 45, 128, 1, 128, 16, 1, 128, 128](
        ctx, "LARGE odd K tiles fp8 per-head K tail", 1040, [100, 157], [3, 250], 0, True, True, 0)
    run_case[DType.bfloat16, 61, 96, 1, 128, 16, 1, 64, 128](
        ctx, "LARGE N tail D=96 gn=64 padded", 1024, [200, 0, 57], [0, 9, 130], 4, False, True, 0)
    # N >= 4096 (LARGE_N): the decode configs with more weight rows per CTA (T <= 16, and
    # 16 < T <= 128 with token tails), bf16 and fp8 per-head caches
    run_case[DType.bfloat16, 33, 128, 1, 128, 16, 1, 128, 128](
        ctx, "large-N decode (mma)", 2048, rep(8, 1), [0, 1, 127, 128, 300, 5, 17, 200], 0, False, True, 0)
    run_case[DType.bfloat16, 33, 128, 1, 128, 16, 1, 64, 128](
        ctx, "large-N T=100 (mma) gn=64", 1024, [60, 1, 39], [0, 130, 7], 0, False, True, 0)
    run_case[DType.float8_e4m3fn, 33, 128, 1, 128, 16, 1, 128, 128](
        ctx, "large-N T=17 fp8 per-head (mma)", 1024, [16, 1], [3, 250], 0, True, True, 0)
    # N / 64 >= 100 CTAs and T <= 64: the swap-AB wgmma decode kernel (kernels/wgmma_decode.mojo):
    # tn = 8 / 16 / 32 / 64, pages crossed, fp8 per-head cache, head_dim 96 (N tail of 32 rows,
    # K tail), padded page_stride (unaligned rows: scalar stores), bad lookup-table entries
    run_case[DType.bfloat16, 64, 128, 1, 128, 16, 1, 128, 128](
        ctx, "swap-AB decode T=8", 2048, rep(8, 1), [0, 1, 127, 128, 300, 5, 17, 200], 0, False, True, 0)
    run_case[DType.bfloat16, 64, 128, 1, 128, 16, 1, 128, 128](
        ctx, "swap-AB T=16 padded", 1024, [9, 0, 7], [120, 4, 0], 4, False, True, 0)
    run_case[DType.float8_e4m3fn, 56, 128, 1, 128, 16, 1, 64, 128](
        ctx, "swap-AB T=31 fp8 per-head gn=64", 2048, [16, 1, 14], [3, 250, 0], 0, True, True, 0)
    run_case[DType.bfloat16, 67, 96, 1, 128, 16, 1, 128, 128](
        ctx, "swap-AB T=64 D=96 N tail K tail", 1088, [30, 34], [100, 0], 0, False, True, 0)
    # swap-AB scale paths: weight scales per 32 rows (not folded into the token scales), token
    # groups of 4 with gk = 256 (two 128-wide blocks per scale), rotated walks at tn = 64 / 32
    run_case[DType.bfloat16, 64, 128, 1, 128, 16, 1, 32, 128](
        ctx, "swap-AB T=40 gn=32 (row scales)", 2304, [17, 23], [5, 130], 0, False, True, 0)
    run_case[DType.float8_e4m3fn, 52, 128, 1, 128, 16, 4, 128, 256](
        ctx, "swap-AB T=22 gm=4 gk=256 fp8", 1920, [9, 13], [0, 127], 0, True, True, 0)
    run_case[DType.float8_e4m3fn, 64, 128, 1, 128, 16, 1, 128, 128](
        ctx, "swap-AB T=1 fp8 per-tensor", 4096, rep(1, 1), rep(1, 129), 0, False, True, 0)
    run_case[DType.bfloat16, 64, 128, 1, 128, 16, 1, 128, 128](
        ctx, "N=8192 T=100", 1024, [60, 1, 39], [0, 130, 7], 0, False, True, 0)
    # K split over clusters of 4 (small N, 16 < T <= 64): a rank without a K tile (K = 1088:
    # 3 tiles of 512), fp8 per-head with gn = 64, token groups of 4 with gk = 256
    run_case[DType.bfloat16, 8, 128, 2, 128, 48, 1, 128, 128](
        ctx, "split decode T=64 K=8192", 8192, rep(4, 16), rep(4, 300), 0, False, True, 0, False, 1, 10)
    run_case[DType.bfloat16, 8, 128, 2, 128, 48, 1, 128, 128](
        ctx, "split decode T=40 K=1088", 1088, [17, 23], [5, 130], 0, False, True, 0)
    run_case[DType.float8_e4m3fn, 7, 128, 1, 128, 40, 1, 64, 128](
        ctx, "split decode T=20 fp8 per-head gn=64", 2048, [3, 0, 17], [0, 9, 250], 0, True, True, 0)
    run_case[DType.bfloat16, 4, 128, 1, 128, 16, 4, 128, 256](
        ctx, "split decode T=33 gm=4 gk=256", 2048, [33], [127], 0, False, True, 0)
    # the 3-stage ring two consumers share (tn = 64): 30 more runs must be bit-identical
    run_case[DType.bfloat16, 64, 128, 1, 128, 16, 1, 128, 128](
        ctx, "swap-AB T=64 K=8192 repeats", 8192, rep(4, 16), rep(4, 300), 0, False, True, 0, False, 1, 30)
    run_case[DType.bfloat16, 64, 128, 1, 128, 16, 1, 128, 128](
        ctx, "bad lut (swap-AB)", 1024, [10, 5], [0, 0], 0, False, True, 0, True)
    # the V twin: same kernels, V half
    run_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128, V_HALF](
        ctx, "V decode (mma)", 7168, rep(8, 1), [0, 1, 127, 128, 300, 5, 17, 1000], 0, False, True, 0)
    run_case[DType.float8_e4m3fn, 8, 128, 2, 128, 64, 1, 128, 128, V_HALF](
        ctx, "V fp8 per-head (wgmma)", 2048, [100, 1, 199], [0, 3, 250], 512, True, True, 0)
    run_case[DType.bfloat16, 2, 64, 2, 128, 16, 2, 64, 32, V_HALF](
        ctx, "V simt gran 2x64x32", 200, [5, 0, 12], [3, 0, 120], 0, False, True, 0)
    # forced paths (the kernels an Ampere GPU or the portable path runs, on this GPU): the
    # mma.sync configs MMA_DECODE (T <= 16), MMA_MID (T <= 128), MMA_PREFILL (T > 128),
    # MMA_DECODE_LARGE_N and MMA_MID_LARGE_N (N >= 4096), then the SIMT kernel for every call
    run_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128, K_HALF, FORCE_AMPERE](
        ctx, "forced ampere decode", 1024, rep(8, 1), [0, 1, 127, 128, 300, 5, 17, 200], 0, False, True, 0)
    run_case[DType.float8_e4m3fn, 8, 128, 2, 128, 64, 1, 128, 128, K_HALF, FORCE_AMPERE](
        ctx, "forced ampere T=40 fp8 per-head", 1024, [17, 23], [5, 130], 0, True, True, 0)
    run_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128, K_HALF, FORCE_AMPERE](
        ctx, "forced ampere T=300 padded", 1024, [150, 0, 150], [3, 0, 200], 512, False, True, 0)
    run_case[DType.bfloat16, 33, 128, 1, 128, 16, 1, 128, 128, K_HALF, FORCE_AMPERE](
        ctx, "forced ampere large-N T=8", 1024, rep(8, 1), [0, 1, 127, 128, 300, 5, 17, 200], 0, False, True, 0)
    run_case[DType.bfloat16, 33, 128, 1, 128, 16, 1, 128, 128, K_HALF, FORCE_AMPERE](
        ctx, "forced ampere large-N T=100", 1024, [60, 1, 39], [0, 130, 7], 0, False, True, 0)
    run_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128, K_HALF, FORCE_PORTABLE](
        ctx, "forced portable T=40", 1024, [17, 23], [5, 130], 0, False, True, 0)
    run_case[DType.float8_e4m3fn, 8, 128, 2, 128, 64, 1, 128, 128, V_HALF, FORCE_PORTABLE](
        ctx, "forced portable V fp8 per-head T=200", 1024, [100, 1, 99], [0, 3, 250], 0, True, True, 0)
    # the activation quantizer: bit-identical to the CPU path
    quant_case[DType.bfloat16, 128](ctx, 37, 7168, 0)
    quant_case[DType.float16, 64](ctx, 5, 200, 0)
    quant_case[DType.float32, 128](ctx, 3, 96, 0)
    quant_case[DType.bfloat16, 128](ctx, 0, 256, 0)
    # timing only (N = 1024, K = 7168)
    run_case[DType.bfloat16, 8, 128, 2, 128, 48, 1, 128, 128](
        ctx, "decode T=1", 7168, rep(1, 1), rep(1, 100), 0, False, False, 500)
    run_case[DType.bfloat16, 8, 128, 2, 128, 48, 1, 128, 128](
        ctx, "decode T=8", 7168, rep(8, 1), rep(8, 100), 0, False, False, 500)
    run_case[DType.bfloat16, 8, 128, 2, 128, 48, 1, 128, 128](
        ctx, "decode T=32", 7168, rep(32, 1), rep(32, 100), 0, False, False, 200)
    run_case[DType.bfloat16, 8, 128, 2, 128, 48, 1, 128, 128](
        ctx, "T=64", 7168, rep(1, 64), rep(1, 0), 0, False, False, 200)
    run_case[DType.bfloat16, 8, 128, 2, 128, 48, 1, 128, 128](
        ctx, "prefill T=128", 7168, rep(1, 128), rep(1, 0), 0, False, False, 100)
    run_case[DType.bfloat16, 8, 128, 2, 128, 48, 1, 128, 128](
        ctx, "prefill T=256", 7168, rep(1, 256), rep(1, 0), 0, False, False, 100)
    run_case[DType.bfloat16, 8, 128, 2, 128, 48, 1, 128, 128](
        ctx, "prefill T=1024", 7168, rep(1, 1024), rep(1, 0), 0, False, False, 50)
    run_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "prefill T=4096", 7168, rep(4, 1024), rep(4, 0), 0, False, False, 20)
    quant_case[DType.bfloat16, 128](ctx, 1, 7168, 500)
    quant_case[DType.bfloat16, 128](ctx, 4096, 7168, 50)
    # the fused K+V op: bit-identical to the K op then the V op on every plan (mma.sync: one
    # launch, grid z = 2; wgmma decode / split / prefill and SIMT: a launch per half), timed at
    # OLMoE's K/V projection (N = 2048, K = 2048) and a GQA one (N = 1024, K = 4096)
    fused_case[DType.bfloat16, 16, 128, 2, 128, 64, 1, 128, 128](ctx, "decode T=1", 2048, rep(1, 1), [300], False, 200)
    fused_case[DType.bfloat16, 16, 128, 2, 128, 64, 1, 128, 128](
        ctx, "decode T=8", 2048, rep(8, 1), [0, 1, 127, 128, 300, 5, 17, 1000], False, 200)
    fused_case[DType.bfloat16, 16, 128, 2, 128, 64, 1, 128, 128](ctx, "T=32", 2048, rep(8, 4), rep(8, 100), False, 200)
    fused_case[DType.bfloat16, 16, 128, 2, 128, 64, 1, 128, 128](ctx, "T=64", 2048, rep(8, 8), rep(8, 100), False, 200)
    fused_case[DType.bfloat16, 16, 128, 2, 128, 64, 1, 128, 128](ctx, "T=48", 2048, rep(8, 6), rep(8, 100), False, 200)
    fused_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128](ctx, "GQA T=8", 4096, rep(8, 1), rep(8, 500), False, 200)
    fused_case[DType.bfloat16, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "GQA T=40 (split decode)", 4096, [17, 23], [5, 130], False, 100)
    fused_case[DType.float8_e4m3fn, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "fp8 per-head T=20 (mma)", 2048, [3, 0, 17], [0, 9, 250], True, 0)
    fused_case[DType.float8_e4m3fn, 8, 128, 2, 128, 64, 1, 128, 128](
        ctx, "fp8 per-tensor T=300 (wgmma)", 2048, [100, 200], [0, 3], False, 0)
    fused_case[DType.bfloat16, 64, 128, 1, 128, 16, 1, 128, 128](
        ctx, "swap-AB T=8", 2048, rep(8, 1), rep(8, 17), False, 0)
    fused_case[DType.bfloat16, 2, 64, 2, 128, 16, 2, 64, 32](ctx, "simt gran 2x64x32", 200, [5, 0, 12], [3, 0, 120], True, 0)
    # fp8_blockwise_matmul: the K op's kernels with a dense output, bit-identical to the K op's
    # cache rows on every plan; timed against it where the issue's bar applies (the fused write
    # within 5 % of the dense GEMM at T >= 1024) and at the dense op's own bar shape (8192^3)
    dense_case[3, 64, 128, 1, 1, 128, 128](ctx, "mma.sync T=1, N tail", 1, 2048, 0)
    dense_case[8, 128, 128, 1, 1, 128, 128](ctx, "split decode T=40", 40, 4096, 0)
    dense_case[64, 128, 128, 1, 1, 128, 128](ctx, "swap-AB T=16", 16, 4096, 100)
    dense_case[3, 64, 128, 3, 1, 128, 128](ctx, "wgmma small T=300, N tail", 300, 1024, 0)
    dense_case[2, 64, 128, 1, 2, 64, 32](ctx, "simt gran 2x64x32", 37, 200, 0)
    dense_case[8, 128, 128, 32, 1, 128, 128](ctx, "prefill N=1024 K=7168", 4096, 7168, 20)
    dense_case[64, 128, 128, 32, 1, 128, 128](ctx, "prefill N=8192 K=4096", 4096, 4096, 10)
    dense_case[64, 128, 128, 64, 1, 128, 128](ctx, "8192^3", 8192, 8192, 5)
    # the prefill kernel's tile configs (LARGE is dispatched; TALL / TALL_PERSISTENT are
    # candidates): every element written, equal to LARGE within summation-order noise, timed
    tile_case[1, 128, 128](ctx, "ragged tails", 333, 320, 1024, 0)
    tile_case[1, 128, 128](ctx, "N=1024 K=7168", 4096, 1024, 7168, 20)
    tile_case[1, 128, 128](ctx, "N=8192 K=4096", 4096, 8192, 4096, 10)
    tile_case[1, 128, 128](ctx, "N=2048 K=5120", 1024, 2048, 5120, 20)
    tile_case[1, 128, 128](ctx, "8192^3", 8192, 8192, 8192, 5)

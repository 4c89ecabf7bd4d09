# Standalone GPU check + timing of moe_route_topk_group's GPU path (no MAX graph): the router and
# grouping kernels on device buffers (outputs poisoned first) vs the CPU path on host copies (the
# CPU path is checked against float64 numpy by tests/test_moe_route.py); then moe_combine_rows
# on the routing's inverse, GPU vs CPU path, bit for bit. ids and every grouping
# output must match exactly (the data has no near-ties: integer-valued x and w make every float32
# logit exact in any summation order), weights to 1e-6. Then times decode and prefill at OLMoE
# sizes (H = 2048, E = 64, k = 8) with a host loop. From the repository root:
#   scripts/build-gpu-bin tests/mojo/moe_route_gpu_harness.mojo
#   LD_LIBRARY_PATH=$PWD/.gpu-bin/lib .gpu-bin/moe_route_gpu_harness [--sanitize]
# --sanitize (scripts/gpu-check --sanitize): the same cases without timing. Exit code 1 on any
# failure.
from max.gpu.host import DeviceContext
from std.memory.alloc import unsafe_alloc
from std.sys import argv, exit
from std.time import perf_counter_ns

from mojo_kernels.moe_route.cpu import group_rows_cpu, route_tokens_cpu
from mojo_kernels.moe_route.kernels.topk_group import route_gpu
from mojo_kernels.moe_combine.cpu import combine_rows_cpu
from mojo_kernels.moe_combine.kernels.gather_sum import combine_rows_gpu


@always_inline
def any[dt: DType](p: Pointer[Scalar[dt], MutUntrackedOrigin]) -> Pointer[Scalar[dt], MutAnyOrigin]:
    return p.as_unsafe_any_origin()


struct Rng:
    var s: UInt64

    def __init__(out self, seed: UInt64):
        self.s = seed * 6364136223846793005 + 1442695040888963407

    def next_int(mut self, n: Int) -> Int:
        """Uniform in [0, n)."""
        self.s = self.s * 6364136223846793005 + 1442695040888963407
        return Int((self.s >> 33) % UInt64(n))


def run_case[dtype: DType](ctx: DeviceContext, T: Int, H: Int, E: Int, K: Int, iters: Int) raises -> Bool:
    var R = T * K
    var rng = Rng(UInt64(T * 131 + E * 7 + K))
    var h_x = unsafe_alloc[Scalar[dtype]](max(T * H, 1))
    var h_w = unsafe_alloc[Scalar[dtype]](E * H)
    # small integers: exact products and sums in float32, so logits are order-independent;
    # ties are possible and must be broken towards the lower expert on both paths
    for i in range(T * H):
        h_x[unsafe_offset=i] = Scalar[dtype](Float32(rng.next_int(7) - 3))
    for i in range(E * H):
        h_w[unsafe_offset=i] = Scalar[dtype](Float32(rng.next_int(5) - 2))
    var n_r = max(R, 1)
    var c_ids = unsafe_alloc[Int32](n_r)
    var c_wts = unsafe_alloc[Float32](n_r)
    var c_tok = unsafe_alloc[Int64](n_r)
    var c_rs = unsafe_alloc[Float32](n_r)
    var c_inv = unsafe_alloc[Int64](n_r)
    var c_off = unsafe_alloc[UInt32](E + 1)
    var c_st = unsafe_alloc[UInt32](2)
    route_tokens_cpu[dtype](any(h_x), any(h_w), any(c_ids), any(c_wts), T, H, E, K, H)
    group_rows_cpu(any(c_ids), any(c_wts), any(c_tok), any(c_rs), any(c_inv), any(c_off), any(c_st), R, E, K)

    var d_x = ctx.enqueue_create_buffer[dtype](max(T * H, 1))
    var d_w = ctx.enqueue_create_buffer[dtype](E * H)
    var d_ids = ctx.enqueue_create_buffer[DType.int32](n_r)
    var d_wts = ctx.enqueue_create_buffer[DType.float32](n_r)
    var d_tok = ctx.enqueue_create_buffer[DType.int64](n_r)
    var d_rs = ctx.enqueue_create_buffer[DType.float32](n_r)
    var d_inv = ctx.enqueue_create_buffer[DType.int64](n_r)
    var d_off = ctx.enqueue_create_buffer[DType.uint32](E + 1)
    var d_st = ctx.enqueue_create_buffer[DType.uint32](2)
    ctx.enqueue_copy(d_x, h_x)
    ctx.enqueue_copy(d_w, h_w)
    d_ids.enqueue_fill(-7)
    d_wts.enqueue_fill(-7.0)
    d_tok.enqueue_fill(-7)
    d_rs.enqueue_fill(-7.0)
    d_inv.enqueue_fill(-7)
    d_off.enqueue_fill(77777)
    d_st.enqueue_fill(77777)

    @always_inline
    def run_gpu() raises {var d_x, var d_w, var d_ids, var d_wts, var d_tok, var d_rs, var d_inv, var d_off,
                          var d_st, var T, var H, var E, var K, var ctx}:
        route_gpu[dtype](d_x.unsafe_ptr().as_unsafe_any_origin(), d_w.unsafe_ptr().as_unsafe_any_origin(), d_ids.unsafe_ptr().as_unsafe_any_origin(), d_wts.unsafe_ptr().as_unsafe_any_origin(),
                         d_tok.unsafe_ptr().as_unsafe_any_origin(), d_rs.unsafe_ptr().as_unsafe_any_origin(), d_inv.unsafe_ptr().as_unsafe_any_origin(), d_off.unsafe_ptr().as_unsafe_any_origin(),
                         d_st.unsafe_ptr().as_unsafe_any_origin(), T, H, E, K, H, ctx)

    run_gpu()
    var g_ids = unsafe_alloc[Int32](n_r)
    var g_wts = unsafe_alloc[Float32](n_r)
    var g_tok = unsafe_alloc[Int64](n_r)
    var g_rs = unsafe_alloc[Float32](n_r)
    var g_inv = unsafe_alloc[Int64](n_r)
    var g_off = unsafe_alloc[UInt32](E + 1)
    var g_st = unsafe_alloc[UInt32](2)
    ctx.enqueue_copy(g_ids, d_ids)
    ctx.enqueue_copy(g_wts, d_wts)
    ctx.enqueue_copy(g_tok, d_tok)
    ctx.enqueue_copy(g_rs, d_rs)
    ctx.enqueue_copy(g_inv, d_inv)
    ctx.enqueue_copy(g_off, d_off)
    ctx.enqueue_copy(g_st, d_st)
    ctx.synchronize()
    var bad = 0
    var wbad = 0
    for i in range(R):
        bad += Int(g_ids[unsafe_offset=i] != c_ids[unsafe_offset=i]) + Int(g_tok[unsafe_offset=i] != c_tok[unsafe_offset=i])
        bad += Int(g_inv[unsafe_offset=i] != c_inv[unsafe_offset=i])
        wbad += Int(abs(g_wts[unsafe_offset=i] - c_wts[unsafe_offset=i]) > 1e-6)
        wbad += Int(abs(g_rs[unsafe_offset=i] - c_rs[unsafe_offset=i]) > 1e-6)
    for e in range(E + 1):
        bad += Int(g_off[unsafe_offset=e] != c_off[unsafe_offset=e])
    bad += Int(g_st[unsafe_offset=0] != c_st[unsafe_offset=0]) + Int(g_st[unsafe_offset=1] != c_st[unsafe_offset=1])
    # moe_combine_rows on the routing's inverse: rows of y summed back per token (x's columns,
    # plus one index out of range), GPU vs the CPU path: the same float32 additions in the same
    # order, so bit-identical
    var cbad = 0
    if R > 0:
        var h_y = unsafe_alloc[Scalar[dtype]](R * H)
        for i in range(R * H):
            h_y[unsafe_offset=i] = Scalar[dtype](Float32(rng.next_int(2001) - 1000) / 64.0)
        var h_inv = unsafe_alloc[Int64](R)
        for i in range(R):
            h_inv[unsafe_offset=i] = g_inv[unsafe_offset=i]
        h_inv[unsafe_offset=R - 1] = Int64(R + 5)  # adds nothing
        var c_out = unsafe_alloc[Scalar[dtype]](T * H)
        combine_rows_cpu[dtype](any(c_out), any(h_y), any(h_inv), T, R, H, K)
        var d_y = ctx.enqueue_create_buffer[dtype](R * H)
        var d_iv = ctx.enqueue_create_buffer[DType.int64](R)
        var d_out = ctx.enqueue_create_buffer[dtype](T * H)
        ctx.enqueue_copy(d_y, h_y)
        ctx.enqueue_copy(d_iv, h_inv)
        d_out.enqueue_fill(Scalar[dtype](-77.0))
        combine_rows_gpu[dtype](d_out.unsafe_ptr().as_unsafe_any_origin(), d_y.unsafe_ptr().as_unsafe_any_origin(),
                                d_iv.unsafe_ptr().as_unsafe_any_origin(), T, R, H, K, ctx)
        var g_out = unsafe_alloc[Scalar[dtype]](T * H)
        ctx.enqueue_copy(g_out, d_out)
        ctx.synchronize()
        for i in range(T * H):
            cbad += Int(g_out[unsafe_offset=i] != c_out[unsafe_offset=i])
        _ = d_y^
        _ = d_iv^
        _ = d_out^
    var ok = bad == 0 and wbad == 0 and cbad == 0
    var us = Float64(0)
    var quick = False  # --sanitize: no timing loop
    var args = argv()
    for i in range(1, len(args)):
        quick = quick or args[i] == "--sanitize"
    if iters > 0 and not quick:
        for _ in range(3):
            run_gpu()
        ctx.synchronize()
        var t0 = perf_counter_ns()
        for _ in range(iters):
            run_gpu()
        ctx.synchronize()
        us = Float64(perf_counter_ns() - t0) / Float64(iters) / 1000.0
    print("==", dtype, "T =", T, "H =", H, "E =", E, "K =", K, ": mismatches", bad, "weights off", wbad, "combine off", cbad,
          "stats", g_st[unsafe_offset=0], g_st[unsafe_offset=1], "  us/call (host loop, both kernels)", us,
          "PASS" if ok else "FAIL")
    return ok


def main() raises:
    var ctx = DeviceContext()
    var ok = True
    ok = run_case[DType.bfloat16](ctx, 0, 64, 5, 2, 0) and ok
    ok = run_case[DType.bfloat16](ctx, 1, 200, 16, 2, 0) and ok
    ok = run_case[DType.float16](ctx, 7, 96, 5, 5, 0) and ok
    ok = run_case[DType.bfloat16](ctx, 33, 64, 37, 1, 0) and ok
    ok = run_case[DType.float16](ctx, 129, 256, 100, 7, 0) and ok
    ok = run_case[DType.bfloat16](ctx, 300, 128, 1024, 3, 0) and ok
    ok = run_case[DType.float16](ctx, 5, 520, 1024, 9, 0) and ok
    ok = run_case[DType.bfloat16](ctx, 65, 264, 3, 3, 0) and ok
    ok = run_case[DType.bfloat16](ctx, 1, 2048, 64, 8, 500) and ok
    ok = run_case[DType.bfloat16](ctx, 8, 2048, 64, 8, 500) and ok
    ok = run_case[DType.bfloat16](ctx, 64, 2048, 64, 8, 500) and ok
    ok = run_case[DType.bfloat16](ctx, 512, 2048, 64, 8, 200) and ok
    ok = run_case[DType.bfloat16](ctx, 4096, 2048, 64, 8, 50) and ok
    # the router's CTA 0 grouping (T <= 8, router_groups): E past the CTA's threads (4 experts
    # a thread at E = 1024, above), DeepSeek-V3's decode router, top-1
    ok = run_case[DType.bfloat16](ctx, 8, 7168, 256, 8, 200) and ok
    # decode blocks of 1 and 2 tokens at DeepSeek-V3's router size and of 4 at OLMoE's (one
    # cluster, grouped by its CTA 0)
    ok = run_case[DType.bfloat16](ctx, 1, 7168, 256, 8, 200) and ok
    ok = run_case[DType.float16](ctx, 2, 7168, 256, 8, 0) and ok
    ok = run_case[DType.bfloat16](ctx, 4, 2048, 64, 8, 200) and ok
    ok = run_case[DType.bfloat16](ctx, 3, 136, 300, 1, 0) and ok
    ok = run_case[DType.float16](ctx, 8, 64, 1000, 32, 0) and ok
    # LONG_CHUNK (H slices of >= 8 vectors per lane) without the CTA grouping, an H tail
    ok = run_case[DType.bfloat16](ctx, 33, 4104, 128, 8, 200) and ok
    # several grouping CTAs (windows of group_window(R)): ragged last window, E = 1024, and
    # R past GROUP_MAX_CTAS windows of GROUP_WINDOW (wider windows)
    ok = run_case[DType.bfloat16](ctx, 1000, 64, 64, 6, 0) and ok
    ok = run_case[DType.float16](ctx, 700, 64, 1024, 3, 0) and ok
    ok = run_case[DType.bfloat16](ctx, 2048, 256, 256, 8, 20) and ok
    ok = run_case[DType.bfloat16](ctx, 20000, 64, 128, 8, 0) and ok
    print("ALL PASS" if ok else "SOME FAILED")
    if not ok:
        exit(1)

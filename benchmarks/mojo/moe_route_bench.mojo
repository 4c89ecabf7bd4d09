# Device time of moe_route_topk_group's two GPU kernels (router, grouping), of the op and of
# moe_combine_rows (the rows of y = T k x H summed back per token), on the
# H200, at decode and prefill sizes of OLMoE (H = 2048, E = 64, k = 8) and DeepSeek-V3
# (H = 7168, E = 256, k = 8); the router also in every cluster shape it can launch, to check the
# op's choice (kernels/topk_group.mojo: route_gpu). Correctness is
# tests/mojo/moe_route_gpu_harness.mojo's. From the repository root:
#   scripts/build-gpu-bin benchmarks/mojo/moe_route_bench.mojo
#   LD_LIBRARY_PATH=$PWD/.gpu-bin/lib .gpu-bin/moe_route_bench
# Timing: a spin kernel holds the GPU while the host enqueues ITERS launches, so host gaps are
# excluded: (spin + launches + sync) - (spin + sync), over ITERS; median of 5 (µs).
from max.gpu.host import DeviceContext
from std.time import perf_counter_ns

from mojo_kernels.moe_route.kernels.topk_group import launch_group, launch_router, launch_router_mma, route_gpu
from mojo_kernels.moe_combine.kernels.gather_sum import combine_rows_gpu
from int4_gemm_ref import spin_kernel

comptime BF16 = DType.bfloat16
comptime ITERS = 50
comptime SPIN_NS = Int64(3_000_000)


comptime P[dt: DType] = Pointer[Scalar[dt], MutAnyOrigin]


def timed_combine(ctx: DeviceContext, outp: P[BF16], y: P[BF16], inv: P[DType.int64], T: Int, H: Int, K: Int) raises -> Float64:
    """Median device µs of one moe_combine_rows call (y [T K, H] -> [T, H])."""
    var samples = List[Float64]()
    for _ in range(5):
        ctx.synchronize()
        var a0 = perf_counter_ns()
        ctx.enqueue_function[spin_kernel](SPIN_NS, grid_dim=1, block_dim=32)
        ctx.synchronize()
        var a1 = perf_counter_ns()
        ctx.enqueue_function[spin_kernel](SPIN_NS, grid_dim=1, block_dim=32)
        for _ in range(ITERS):
            combine_rows_gpu[BF16](outp, y, inv, T, T * K, H, K, ctx)
        ctx.synchronize()
        var a2 = perf_counter_ns()
        samples.append(Float64(Int(a2 - a1) - Int(a1 - a0)) / 1e3 / Float64(ITERS))
    sort(samples)
    return samples[2]


def timed[what: Int, CS: Int, BT: Int](
    ctx: DeviceContext, x: P[BF16], w: P[BF16], ids: P[DType.int32], wts: P[DType.float32],
    tok: P[DType.int64], rs: P[DType.float32], inv: P[DType.int64], off: P[DType.uint32],
    st: P[DType.uint32], T: Int, H: Int, E: Int, K: Int,
) raises -> Float64:
    """Median device µs per call. what: 0 = the op (route_gpu), 1 = router <CS, BT>, 2 = grouping,
    3 = the tensor-core router."""

    @always_inline
    def once() raises {var ctx, var x, var w, var ids, var wts, var tok, var rs, var inv, var off, var st,
                       var T, var H, var E, var K}:
        comptime if what == 0:
            route_gpu[BF16](x, w, ids, wts, tok, rs, inv, off, st, T, H, E, K, H, ctx)
        elif what == 1:
            launch_router[BF16, CS, BT](x, w, ids, wts, tok, rs, inv, off, st, T, H, E, K, H, ctx)
        elif what == 2:
            launch_group(ids, wts, tok, rs, inv, off, st, T * K, E, K, ctx)
        else:
            launch_router_mma[BF16](x, w, ids, wts, T, H, E, K, H, ctx)

    for _ in range(3):
        once()
    var samples = List[Float64]()
    for _ in range(5):
        ctx.synchronize()
        var a0 = perf_counter_ns()
        ctx.enqueue_function[spin_kernel](SPIN_NS, grid_dim=1, block_dim=32)
        ctx.synchronize()
        var a1 = perf_counter_ns()
        ctx.enqueue_function[spin_kernel](SPIN_NS, grid_dim=1, block_dim=32)
        for _ in range(ITERS):
            once()
        ctx.synchronize()
        var a2 = perf_counter_ns()
        samples.append(Float64(Int(a2 - a1) - Int(a1 - a0)) / 1e3 / Float64(ITERS))
    sort(samples)
    return samples[2]


def main() raises:
    var ctx = DeviceContext()
    print("model T | op | group | router CS x BT: 8x8 4x8 2x16 4x16 8x16 | mma | combine")
    for m in range(2):
        var H = 2048 if m == 0 else 7168
        var E = 64 if m == 0 else 256
        var K = 8
        for T in [1, 8, 64, 512, 4096]:
            var bx = ctx.enqueue_create_buffer[BF16](T * H)
            var bw = ctx.enqueue_create_buffer[BF16](E * H)
            var bi = ctx.enqueue_create_buffer[DType.int32](T * K)
            var bwt = ctx.enqueue_create_buffer[DType.float32](T * K)
            var bt = ctx.enqueue_create_buffer[DType.int64](T * K)
            var br = ctx.enqueue_create_buffer[DType.float32](T * K)
            var bv = ctx.enqueue_create_buffer[DType.int64](T * K)
            var bo = ctx.enqueue_create_buffer[DType.uint32](E + 1)
            var bs = ctx.enqueue_create_buffer[DType.uint32](2)
            # a spread of logits: x and w as ramps modulo primes
            with bx.map_to_host() as h:
                for i in range(T * H):
                    h[i] = BFloat16(Float32((i * 7919) % 251) / 251.0 - 0.5)
            with bw.map_to_host() as h:
                for i in range(E * H):
                    h[i] = BFloat16(Float32((i * 104729) % 241) / 241.0 - 0.5)
            var x = bx.unsafe_ptr().as_unsafe_any_origin()
            var w = bw.unsafe_ptr().as_unsafe_any_origin()
            var ids = bi.unsafe_ptr().as_unsafe_any_origin()
            var wts = bwt.unsafe_ptr().as_unsafe_any_origin()
            var tok = bt.unsafe_ptr().as_unsafe_any_origin()
            var rs = br.unsafe_ptr().as_unsafe_any_origin()
            var inv = bv.unsafe_ptr().as_unsafe_any_origin()
            var off = bo.unsafe_ptr().as_unsafe_any_origin()
            var st = bs.unsafe_ptr().as_unsafe_any_origin()
            var op = timed[0, 1, 1](ctx, x, w, ids, wts, tok, rs, inv, off, st, T, H, E, K)
            var grp = timed[2, 1, 1](ctx, x, w, ids, wts, tok, rs, inv, off, st, T, H, E, K)
            var r88 = timed[1, 8, 8](ctx, x, w, ids, wts, tok, rs, inv, off, st, T, H, E, K)
            var r48 = timed[1, 4, 8](ctx, x, w, ids, wts, tok, rs, inv, off, st, T, H, E, K)
            var r216 = timed[1, 2, 16](ctx, x, w, ids, wts, tok, rs, inv, off, st, T, H, E, K)
            var r416 = timed[1, 4, 16](ctx, x, w, ids, wts, tok, rs, inv, off, st, T, H, E, K)
            var r816 = timed[1, 8, 16](ctx, x, w, ids, wts, tok, rs, inv, off, st, T, H, E, K)
            var rmma = timed[3, 1, 1](ctx, x, w, ids, wts, tok, rs, inv, off, st, T, H, E, K)
            var by = ctx.enqueue_create_buffer[BF16](T * K * H)
            var bc = ctx.enqueue_create_buffer[BF16](T * H)
            by.enqueue_fill(BFloat16(0.25))
            var comb = timed_combine(ctx, bc.unsafe_ptr().as_unsafe_any_origin(), by.unsafe_ptr().as_unsafe_any_origin(), inv, T, H, K)
            _ = by^; _ = bc^
            _ = bx^; _ = bw^; _ = bi^; _ = bwt^; _ = bt^; _ = br^; _ = bv^; _ = bo^; _ = bs^
            print("olmoe" if m == 0 else "dsv3", T, "|", op, "|", grp, "|", r88, r48, r216, r416, r816, "| mma", rmma, "| combine", comb)

"""Host cost of one `int4_gemm_gpu` call (dispatch + launch) against its device time.

    ../shared/gpu/bundle-bin -I . -I tests/mojo benchmarks/mojo/int4_host_cost.mojo
    run carry=[".gpu-bin"]: LD_LIBRARY_PATH=$PWD/.gpu-bin/lib .gpu-bin/int4_host_cost

Per (layer, M): device µs/call (a spin kernel holds the GPU while the host enqueues N calls:
(spin + N calls + sync) − (spin + sync), over N), host µs/call (the enqueue loop alone, GPU
busy), and free-running µs/call (N calls enqueued back to back without the spin, then sync:
what a host-driven loop such as a MAX graph sees when the host is the bottleneck).
Why: in a MAX graph of 16 ops our small-M op took 10–16 µs more than alone (RESULTS.md).
"""

from max.gpu.host import DeviceContext
from std.time import perf_counter_ns

from mojo_kernels.int4_gemm.gpu_dispatch import int4_gemm_gpu, int4_gemm_gpu_config
from int4_gemm_ref import fill_uniform, fill_u32, spin_kernel

comptime BF16 = DType.bfloat16
comptime G = 128


def probe(ctx: DeviceContext, n: Int, kp: Int, m: Int) raises:
    var qwords = n // 64 * kp * 8
    var swords = kp // G * n
    var copies = max(4, 200_000_000 // (qwords * 4 + swords * 2) + 1)
    var qw = ctx.enqueue_create_buffer[DType.uint32](qwords * copies)
    var sc = ctx.enqueue_create_buffer[BF16](swords * copies)
    var x = ctx.enqueue_create_buffer[BF16](m * kp)
    var out = ctx.enqueue_create_buffer[BF16](m * n)
    var qp = qw.unsafe_ptr().as_unsafe_any_origin()
    var sp = sc.unsafe_ptr().as_unsafe_any_origin()
    var xp = x.unsafe_ptr().as_unsafe_any_origin()
    var op = out.unsafe_ptr().as_unsafe_any_origin()
    fill_u32(ctx, qp, qwords * copies, 7)
    fill_uniform[BF16](ctx, sp, swords * copies, 8, 0.002, 0.01)
    fill_uniform[BF16](ctx, xp, m * kp, 9, -1.0, 1.0)
    ctx.synchronize()
    comptime ITERS = 200
    for i in range(8):
        int4_gemm_gpu[BF16, G, False, False](op, xp, qp.unsafe_offset((i % copies) * qwords), sp.unsafe_offset((i % copies) * swords), sp, sp, m, n, kp, ctx)
    ctx.synchronize()
    var dev = List[Float64]()
    var host = List[Float64]()
    var free = List[Float64]()
    for rep in range(5):
        var spin_ns = Int64(ITERS * 40_000 + 200_000)
        ctx.synchronize()
        var a0 = perf_counter_ns()
        ctx.enqueue_function[spin_kernel](spin_ns, grid_dim=1, block_dim=32)
        ctx.synchronize()
        var a1 = perf_counter_ns()
        ctx.enqueue_function[spin_kernel](spin_ns, grid_dim=1, block_dim=32)
        var e0 = perf_counter_ns()
        for i in range(ITERS):
            var c = rep * ITERS + i
            int4_gemm_gpu[BF16, G, False, False](op, xp, qp.unsafe_offset((c % copies) * qwords), sp.unsafe_offset((c % copies) * swords), sp, sp, m, n, kp, ctx)
        var e1 = perf_counter_ns()
        ctx.synchronize()
        var a2 = perf_counter_ns()
        dev.append(Float64(Int(a2 - a1) - Int(a1 - a0)) / 1e3 / Float64(ITERS))
        host.append(Float64(e1 - e0) / 1e3 / Float64(ITERS))
        var f0 = perf_counter_ns()
        for i in range(ITERS):
            var c = rep * ITERS + i
            int4_gemm_gpu[BF16, G, False, False](op, xp, qp.unsafe_offset((c % copies) * qwords), sp.unsafe_offset((c % copies) * swords), sp, sp, m, n, kp, ctx)
        ctx.synchronize()
        free.append(Float64(perf_counter_ns() - f0) / 1e3 / Float64(ITERS))
    sort(dev)
    sort(host)
    sort(free)
    print("N=", n, " K=", kp, " M=", m, " device_us=", dev[2], " host_us=", host[2], " free_us=", free[2],
          " config=", int4_gemm_gpu_config(m, n, kp, G, False), flush=True)


def main() raises:
    var ctx = DeviceContext()
    var shapes = [(6144, 4096), (4096, 4096), (4096, 14336), (28672, 4096), (57344, 8192)]
    for s in shapes:
        for m in [1, 16, 64, 128]:
            probe(ctx, s[0], s[1], m)

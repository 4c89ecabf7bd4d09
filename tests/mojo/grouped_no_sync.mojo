# Evidence that `grouped_matmul_sm100_persistent`'s GPU call has no host synchronisation and no
# device-to-host read inside (so it can be captured in a device graph), on the build's target:
#
# 1. a spin kernel holds the GPU for SPIN_NS; queued behind it on the same stream: device-to-
#    device copies that install NEW routing data (a_offsets, expert_ids, expert_usage_stats) over
#    the OLD data the op's inputs hold, and a poison fill of the output;
# 2. the host then calls the registered op's execute["gpu"] CALLS times and times each call;
# 3. PASS when every call returned within 5% of the spin, all of them returned while the GPU was
#    still spinning (the final synchronize waited for the rest of the spin), and the output -
#    computed after the spin, so from the NEW routing - matches the simple one-thread-per-output
#    GPU kernel, with the rows of inactive groups still poisoned. A call that synchronised would
#    have waited for the spin; one that read the routing on the host would have seen OLD data.
# Both token tiles (decode BN = 32, prefill BN = 256) are covered.
#
#   mojo build -I . --target-accelerator sm_90a tests/mojo/grouped_no_sync.mojo -o ns && ./ns
# Prints one line per case and "NO HOST SYNC: PASS" (exit 0), or raises.
from std.math import ceildiv
from std.sys import inlined_assembly
from std.time import perf_counter_ns
from std.utils.index import IndexList
from extensibility import InputTensor, OutputTensor, StaticTensorSpec
from max.gpu import global_idx, thread_idx
from max.gpu.host import DeviceBuffer, DeviceContext

from mojo_kernels.grouped_gemm.kernels.naive import grouped_matmul_gpu_naive
from mojo_kernels.grouped_gemm.scheduler import GroupedShape
from mojo_kernels.registrations import GroupedMatmulSm100Persistent

comptime BF16 = DType.bfloat16
comptime SPIN_NS = 300_000_000
comptime CALLS = 8
comptime POISON = -777.0
comptime Op = GroupedMatmulSm100Persistent[0, 0, False, False]
comptime Out2 = OutputTensor[static_spec=StaticTensorSpec[BF16, 2, ...].get_unknown()]
comptime In2 = InputTensor[static_spec=StaticTensorSpec[BF16, 2, ...].get_unknown()]
comptime In3 = InputTensor[static_spec=StaticTensorSpec[BF16, 3, ...].get_unknown()]
comptime InU32 = InputTensor[static_spec=StaticTensorSpec[DType.uint32, 1, ...].get_unknown()]
comptime InI32 = InputTensor[static_spec=StaticTensorSpec[DType.int32, 1, ...].get_unknown()]
comptime InF32 = InputTensor[static_spec=StaticTensorSpec[DType.float32, 1, ...].get_unknown()]


@always_inline
def _globaltimer_ns() -> UInt64:
    return inlined_assembly["mov.u64 $0, %globaltimer;", UInt64, constraints="=l",
                            has_side_effect=True]()


def spin_kernel(ns: Int64):
    """Keeps one thread busy for `ns` nanoseconds of GPU time."""
    if thread_idx.x == 0:
        var t0 = _globaltimer_ns()
        while Int64(_globaltimer_ns() - t0) < ns:
            pass


def fill_kernel(p: Pointer[BFloat16, MutAnyOrigin], n: Int64, seed: UInt32):
    """Writes a hash of (i, seed), mapped to [-1, 1], to p[i]."""
    var i = global_idx.x
    if i < Int(n):
        var h = UInt32(i) * 2654435761 + seed
        h = (h ^ (h >> 15)) * 2246822519
        h = h ^ (h >> 13)
        p[unsafe_offset=i] = (Float32(Int(h % 2001)) / 1000.0 - 1.0).cast[BF16]()


def upload_u32(ctx: DeviceContext, values: List[Int]) raises -> DeviceBuffer[DType.uint32]:
    var buf = ctx.enqueue_create_buffer[DType.uint32](len(values))
    with buf.map_to_host() as h:
        for i in range(len(values)):
            h[i] = UInt32(values[i])
    return buf


def upload_i32(ctx: DeviceContext, values: List[Int]) raises -> DeviceBuffer[DType.int32]:
    var buf = ctx.enqueue_create_buffer[DType.int32](len(values))
    with buf.map_to_host() as h:
        for i in range(len(values)):
            h[i] = Int32(values[i])
    return buf


def run_case(
    ctx: DeviceContext, name: StaticString, T: Int, K: Int, N: Int, E: Int,
    old_offsets: List[Int], old_ids: List[Int], old_active: Int,
    new_offsets: List[Int], new_ids: List[Int], new_active: Int,
) raises:
    var G = len(new_ids)
    var a = ctx.enqueue_create_buffer[BF16](T * K)
    var b = ctx.enqueue_create_buffer[BF16](E * N * K)
    var c = ctx.enqueue_create_buffer[BF16](T * N)
    var c_ref = ctx.enqueue_create_buffer[BF16](T * N)
    var rs = ctx.enqueue_create_buffer[DType.float32](1)
    ctx.enqueue_function[fill_kernel](a.unsafe_ptr().as_unsafe_any_origin(), Int64(T * K),
                                      UInt32(11), grid_dim=ceildiv(T * K, 256), block_dim=256)
    ctx.enqueue_function[fill_kernel](b.unsafe_ptr().as_unsafe_any_origin(), Int64(E * N * K),
                                      UInt32(12), grid_dim=ceildiv(E * N * K, 256), block_dim=256)
    # the op's routing inputs start with OLD data; NEW data waits in separate device buffers
    var offs = upload_u32(ctx, old_offsets)
    var ids = upload_i32(ctx, old_ids)
    var stats = upload_u32(ctx, [T, old_active])
    var offs_new = upload_u32(ctx, new_offsets)
    var ids_new = upload_i32(ctx, new_ids)
    var stats_new = upload_u32(ctx, [T, new_active])

    @always_inline
    def call_op() raises {var c, var a, var b, var offs, var ids, var stats, var rs, var ctx,
                          var T, var K, var N, var E, var G}:
        Op.execute["gpu"](
            Out2(c.unsafe_ptr(), IndexList[2](T, N)),
            In2(a.unsafe_ptr(), IndexList[2](T, K)),
            In3(b.unsafe_ptr(), IndexList[3](E, N, K)),
            InU32(offs.unsafe_ptr(), IndexList[1](G + 1)),
            InI32(ids.unsafe_ptr(), IndexList[1](G)),
            InU32(stats.unsafe_ptr(), IndexList[1](2)),
            InF32(rs.unsafe_ptr(), IndexList[1](1)),
            ctx,
        )

    call_op()  # warm-up: loads the kernel module, builds nothing lazily later
    ctx.synchronize()

    var t0 = perf_counter_ns()
    ctx.enqueue_function[spin_kernel](Int64(SPIN_NS), grid_dim=1, block_dim=32)
    ctx.enqueue_copy(offs, offs_new)
    ctx.enqueue_copy(ids, ids_new)
    ctx.enqueue_copy(stats, stats_new)
    c.enqueue_fill(Scalar[BF16](POISON))
    var t1 = perf_counter_ns()
    var worst_ns = 0
    for _ in range(CALLS):
        var s = perf_counter_ns()
        call_op()
        worst_ns = max(worst_ns, Int(perf_counter_ns() - s))
    var t2 = perf_counter_ns()
    ctx.synchronize()
    var t3 = perf_counter_ns()

    # reference: the simple kernel on the NEW routing (the op's inputs hold it now)
    c_ref.enqueue_fill(Scalar[BF16](POISON))
    var shape = GroupedShape(T=T, K=K, N=N, Nc=N, E=E, G=G, a_rows=T)
    grouped_matmul_gpu_naive[BF16, 0, 0, False, False](
        c_ref.unsafe_ptr().as_unsafe_any_origin(), a.unsafe_ptr().as_unsafe_any_origin(),
        b.unsafe_ptr().as_unsafe_any_origin(), offs.unsafe_ptr().as_unsafe_any_origin(),
        ids.unsafe_ptr().as_unsafe_any_origin(), stats.unsafe_ptr().as_unsafe_any_origin(),
        rs.unsafe_ptr().as_unsafe_any_origin(), shape, ctx)
    ctx.synchronize()
    var err2 = Float64(0)
    var ref2 = Float64(0)
    var poison_mismatch = 0
    var poisoned_rows = 0
    var poison = Float64(Scalar[BF16](POISON).cast[DType.float32]())
    with c.map_to_host() as hc:
        with c_ref.map_to_host() as hr:
            for i in range(T * N):
                var x = Float64(hc[i].cast[DType.float32]())
                var r = Float64(hr[i].cast[DType.float32]())
                if r == poison or x == poison:
                    if x != r:
                        poison_mismatch += 1
                    elif i % N == 0:
                        poisoned_rows += 1
                    continue
                err2 += (x - r) * (x - r)
                ref2 += r * r
    var rel = (err2 / max(ref2, 1e-30)) ** 0.5
    var spin_ms = Float64(SPIN_NS) / 1e6
    var worst_ms = Float64(worst_ns) / 1e6
    var returned_ms = Float64(Int(t2 - t0)) / 1e6
    var total_ms = Float64(Int(t3 - t0)) / 1e6
    var fast = worst_ms < 0.05 * spin_ms and returned_ms < 0.5 * spin_ms
    var waited = total_ms >= 0.9 * spin_ms
    var ok = fast and waited and rel <= 1e-2 and poison_mismatch == 0 and ref2 > 0
    print(name, "T =", T, "K =", K, "N =", N, "G =", G, "| spin", spin_ms, "ms; slowest of",
          CALLS, "op calls", worst_ms, "ms; all returned after", returned_ms,
          "ms; synchronize returned after", total_ms, "ms | rel err", rel,
          "| poison mismatches", poison_mismatch, "| inactive rows kept", poisoned_rows,
          "PASS" if ok else "FAIL")
    if not ok:
        raise Error("grouped no-sync: case failed: ", name)


def main() raises:
    var ctx = DeviceContext()
    # decode tiles (40 rows over G = 6: a typical group fits BN = 32): OLD = one group; NEW = ragged groups, an empty group, a
    # -1 expert, and G_active = 5 < G = 6 so rows 33..40 keep the poison
    run_case(ctx, "decode", 40, 1024, 512, 6,
             [0, 40, 40, 40, 40, 40, 40], [0, 0, 0, 0, 0, 0], 1,
             [0, 5, 5, 6, 20, 33, 40], [3, 1, 0, -1, 5, 2], 5)
    # prefill tiles (1200 rows over G = 4: a typical group exceeds BN = 128): OLD = experts in order; NEW = other experts, ragged,
    # G_active = 3 < G = 4 so rows 1100..1200 keep the poison
    run_case(ctx, "prefill", 1200, 512, 384, 4,
             [0, 300, 600, 900, 1200], [0, 1, 2, 3], 4,
             [0, 517, 518, 1100, 1200], [2, 3, 0, 1], 3)
    print("NO HOST SYNC: PASS")

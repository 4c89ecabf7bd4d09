"""Benchmark of the W4A16 tensor-core path (`int4_gemm_gpu`) on the 8 Llama-3 layers, g = 128,
bf16, symmetric, no bias, M in {64, 128, 256, 1024, 4096} (the wgmma kernel's range; M = 1 / 16
are the mma.sync kernels', unchanged since v6); standalone program for the H200.

    ../shared/gpu/bundle-bin -I . -I tests/mojo benchmarks/mojo/int4_gemm_bench.mojo
    run carry=[".gpu-bin"]: LD_LIBRARY_PATH=$PWD/.gpu-bin/lib .gpu-bin/int4_gemm_bench [layer|-1] [noprev] [pp]
(noprev: skip timing the v6 mma.sync selection; pp: also time the experimental pipelined configs)

Per layer: fresh random weights (enough rotating copies, >= 4 and >= 200 MB, that L2 never
serves them), x, scales. One naive fp32 GPU reference per layer, of x rows 0..255 and 64 rows
sampled over 256..4095 (every residue mod 8); for each M every timed config is first checked
against the reference rows < M (output poisoned with NaN, rel. Frobenius error <= 1e-2).
Per M: "prev" = the mma.sync selection of v6 (`int4_gemm_gpu_mma`), "default" = `int4_gemm_gpu`
(the dispatch with the wgmma kernel), then a sweep of wgmma configs and splits. Timing: a spin kernel holds the GPU while the host enqueues N
launches that rotate over the weight copies; (host time of spin + N launches + sync) minus
(spin + sync), over N; median of 5. So launch gaps of the host are excluded, as in the cuBLAS
baseline (triton do_bench, events around single calls after an L2 flush).
Prints one line per config and a final table; writes $OUT/int4_gemm_bench.json when $OUT is set.
"""

from max.gpu.host import DeviceContext, DeviceBuffer
from std.math import ceildiv, sqrt, log, exp
from std.time import perf_counter_ns
from std.sys import argv
from std.os import getenv

from mojo_kernels.int4_gemm.config import (
    Int4GemmConfig, Int4WgmmaConfig, SMEM_BUDGET_SM90, try_resolve_config, try_resolve_wgmma_config,
)
from mojo_kernels.int4_gemm.gpu_dispatch import (
    launch_int4_gemm_mma, int4_gemm_gpu, int4_gemm_gpu_config, int4_gemm_gpu_mma, int4_gemm_gpu_mma_config,
    CFG_M8, WG_CFG_64, WG_CFG_64W, WG_CFG_128, WG_CFG_64P, WG_CFG_128P, wgmma_plan,
    WG_VAR_64, WG_VAR_64W, WG_VAR_128,
)
from mojo_kernels.int4_gemm.gpu_wgmma import launch_int4_gemm_wgmma, choose_wgmma_split_k
from int4_gemm_ref import F32, fill_uniform, fill_u32, fill_nan, run_reference, compare_rows, spin_kernel

comptime BF16 = DType.bfloat16
comptime G = 128
comptime HBM_TBPS = 4.24
comptime PEAK_TFLOPS = 728.0
comptime NUM_M = 5
comptime REF_DENSE = 256
comptime REF_SAMPLED = 64
comptime REF_STEP = 60
"""Reference rows: 0..255, then 256 + 60 j + j % 8 (j < 64, the last 4043)."""



def layer_name(i: Int) -> String:
    var names: List[String] = ["8B.qkv", "8B.o", "8B.gate_up", "8B.down", "70B.qkv", "70B.o", "70B.gate_up", "70B.down"]
    return names[i]


def layer_nk(i: Int) -> Tuple[Int, Int]:
    var ns: List[Int] = [6144, 4096, 28672, 4096, 10240, 8192, 57344, 8192]
    var ks: List[Int] = [4096, 4096, 4096, 14336, 8192, 8192, 8192, 28672]
    return (ns[i], ks[i])


def m_value(j: Int) -> Int:
    var ms: List[Int] = [64, 128, 256, 1024, 4096]
    return ms[j]


def cublas_us(layer: Int, mj: Int) -> Float64:
    """The cuBLAS bf16 (torch.matmul) µs on our H200: shared/reference/h200-2026-11-29/baselines_torch.json."""
    var t: List[Float64] = [
        22.752, 23.360, 26.912, 72.160, 281.088,        # 8B.qkv
        18.080, 19.552, 24.576, 47.072, 188.032,        # 8B.o
        70.752, 75.584, 98.528, 338.464, 1351.488,      # 8B.gate_up
        44.704, 45.504, 53.024, 159.552, 666.560,       # 8B.down
        52.224, 54.016, 64.544, 241.664, 980.768,       # 70B.qkv
        46.688, 46.048, 52.800, 188.624, 786.240,       # 70B.o
        233.488, 253.440, 357.472, 1391.008, 5482.768,  # 70B.gate_up
        132.912, 130.368, 176.848, 674.336, 2660.704,   # 70B.down
    ]
    return t[layer * NUM_M + mj]


struct Layer:
    var n: Int
    var kp: Int
    var np_: Int
    var copies: Int
    var qwords: Int
    var swords: Int
    var qw: DeviceBuffer[DType.uint32]
    var sc: DeviceBuffer[BF16]
    var x: DeviceBuffer[BF16]
    var out: DeviceBuffer[BF16]
    var qwp: Pointer[UInt32, MutUntrackedOrigin]
    var scp: Pointer[BFloat16, MutUntrackedOrigin]
    var xp: Pointer[BFloat16, MutUntrackedOrigin]
    var outp: Pointer[BFloat16, MutUntrackedOrigin]

    def __init__(out self, ctx: DeviceContext, n: Int, kp: Int, max_m: Int, seed: UInt32) raises:
        self.n = n
        self.kp = kp
        self.np_ = ceildiv(n, 64) * 64
        self.qwords = self.np_ // 64 * kp * 8
        self.swords = kp // G * self.np_
        var wbytes = self.qwords * 4 + self.swords * 2
        self.copies = max(4, ceildiv(200_000_000, wbytes))
        self.qw = ctx.enqueue_create_buffer[DType.uint32](self.qwords * self.copies)
        self.sc = ctx.enqueue_create_buffer[BF16](self.swords * self.copies)
        self.x = ctx.enqueue_create_buffer[BF16](max_m * kp)
        self.out = ctx.enqueue_create_buffer[BF16](max_m * n)
        self.qwp = self.qw.unsafe_ptr().unsafe_origin_cast[MutUntrackedOrigin]()
        self.scp = self.sc.unsafe_ptr().unsafe_origin_cast[MutUntrackedOrigin]()
        self.xp = self.x.unsafe_ptr().unsafe_origin_cast[MutUntrackedOrigin]()
        self.outp = self.out.unsafe_ptr().unsafe_origin_cast[MutUntrackedOrigin]()
        fill_u32(ctx, self.qwp.as_unsafe_any_origin(), self.qwords * self.copies, seed)
        fill_uniform[BF16](ctx, self.scp.as_unsafe_any_origin(), self.swords * self.copies, seed + 1, 0.002, 0.01)
        fill_uniform[BF16](ctx, self.xp.as_unsafe_any_origin(), max_m * kp, seed + 2, -1.0, 1.0)

    def weight_bytes(self) -> Int:
        return self.qwords * 4 + self.swords * 2

    def qw_ptr(self, i: Int) -> Pointer[UInt32, MutAnyOrigin]:
        return self.qwp.unsafe_offset((i % self.copies) * self.qwords).as_unsafe_any_origin()

    def sc_ptr(self, i: Int) -> Pointer[BFloat16, MutAnyOrigin]:
        return self.scp.unsafe_offset((i % self.copies) * self.swords).as_unsafe_any_origin()


comptime KIND_DEFAULT = 0
"""Kind: `int4_gemm_gpu` (the dispatch)."""
comptime KIND_PREV = 1
"""Kind: `int4_gemm_gpu_mma` (the v6 mma.sync selection)."""
comptime KIND_WGMMA = 2
"""Kind: `launch_int4_gemm_wgmma[cfg]` with the given split (0: its heuristic)."""


def launch_cfg[cfg: Int4WgmmaConfig](ctx: DeviceContext, L: Layer, m: Int, kind: Int, split: Int, i: Int) raises:
    var sp = L.sc_ptr(i)
    var op = L.outp.as_unsafe_any_origin()
    var xp = L.xp.as_unsafe_any_origin()
    if kind == KIND_DEFAULT:
        int4_gemm_gpu[BF16, G, False, False](op, xp, L.qw_ptr(i), sp, sp, sp, m, L.n, L.kp, ctx)
    elif kind == KIND_PREV:
        int4_gemm_gpu_mma[BF16, G, False, False](op, xp, L.qw_ptr(i), sp, sp, sp, m, L.n, L.kp, ctx)
    else:
        launch_int4_gemm_wgmma[BF16, G, False, False, cfg](op, xp, L.qw_ptr(i), sp, sp, sp, m, L.n, L.kp, L.np_, split, ctx)


def time_cfg[cfg: Int4WgmmaConfig](ctx: DeviceContext, L: Layer, m: Int, kind: Int, split: Int) raises -> Float64:
    """Median µs per launch (see the module doc)."""
    # estimate, to size the loop
    for w in range(3):
        launch_cfg[cfg](ctx, L, m, kind, split, w)
    ctx.synchronize()
    var t0 = perf_counter_ns()
    for w in range(3):
        launch_cfg[cfg](ctx, L, m, kind, split, w + 3)
    ctx.synchronize()
    var est_us = Float64(perf_counter_ns() - t0) / 3e3
    var iters = max(3, min(200, Int(3000.0 / max(est_us, 1.0))))
    var spin_ns = Int64(iters * 20_000 + 100_000)
    var samples = List[Float64]()
    for rep in range(5):
        ctx.synchronize()
        var a0 = perf_counter_ns()
        ctx.enqueue_function[spin_kernel](spin_ns, grid_dim=1, block_dim=32)
        ctx.synchronize()
        var a1 = perf_counter_ns()
        ctx.enqueue_function[spin_kernel](spin_ns, grid_dim=1, block_dim=32)
        for i in range(iters):
            launch_cfg[cfg](ctx, L, m, kind, split, rep * iters + i)
        var enq = perf_counter_ns()
        ctx.synchronize()
        var a2 = perf_counter_ns()
        if Int64(enq - a1) > spin_ns:
            print("      (warning: host enqueue", Float64(enq - a1) / 1e3, "us outran the spin)")
        samples.append(Float64(Int(a2 - a1) - Int(a1 - a0)) / 1e3 / Float64(iters))
    sort(samples)
    return samples[2]


struct Best(Copyable, Movable):
    var us: Float64
    var desc: String

    def __init__(out self):
        self.us = 1e30
        self.desc = String("")


def try_cfg[cfg: Int4WgmmaConfig](
    ctx: DeviceContext, L: Layer, m: Int, kind: Int, split: Int, ref_rows: DeviceBuffer[F32],
    nrows: Int, mut best: Best, mut all_ok: Bool,
) raises -> Float64:
    """Check (output poisoned), then time; returns the µs (1e30 if the check failed)."""
    var op = L.outp.as_unsafe_any_origin()
    fill_nan[BF16](ctx, op, m * L.n)
    launch_cfg[cfg](ctx, L, m, kind, split, 0)
    var r = compare_rows[BF16](ctx, op, ref_rows, L.n, REF_STEP, nrows, REF_DENSE)
    var good = r.rel_err <= 1e-2 and r.nan_count == 0
    all_ok = all_ok and good
    var desc: String
    if kind == KIND_DEFAULT:
        desc = String("default ", int4_gemm_gpu_config(m, L.n, L.kp, G, False))
    elif kind == KIND_PREV:
        desc = String("prev ", int4_gemm_gpu_mma_config(m, L.n, L.kp, G, False))
    else:
        var rc = try_resolve_wgmma_config(cfg, G, False, SMEM_BUDGET_SM90)
        desc = String(rc.with_split_k(split if split > 0 else choose_wgmma_split_k(rc, m, L.n, L.kp)))
    var us = time_cfg[cfg](ctx, L, m, kind, split)
    var tflops = 2.0 * Float64(m) * Float64(L.n) * Float64(L.kp) / us / 1e6
    print("    M=", m, " ", desc, ": ", us, " us, ", tflops, " TFLOP/s, rel err ", r.rel_err,
          " unwritten ", r.nan_count, " ", "ok" if good else "WRONG", flush=True)
    if not good:
        return 1e30
    if us < best.us:
        best.us = us
        best.desc = desc
    return us


def ref_rows_below(m: Int) -> Int:
    """Reference rows (sample_row order) that are < m."""
    var cnt = 0
    for i in range(REF_DENSE + REF_SAMPLED):
        var r = i if i < REF_DENSE else REF_DENSE + (i - REF_DENSE) * REF_STEP + (i - REF_DENSE) % 8
        if r < m:
            cnt += 1
    return cnt


def main() raises:
    var ctx = DeviceContext()
    var only = -1
    var args = argv()
    if len(args) > 1:
        only = Int(String(args[1]))
    var with_prev = True
    var with_pp = False
    for ai in range(2, len(args)):
        if String(args[ai]) == "noprev":
            with_prev = False
        if String(args[ai]) == "pp":
            with_pp = True
    var all_ok = True
    var prev = List[Float64]()
    var prev_desc = List[String]()
    var dflt = List[Float64]()
    var bestv = List[Float64]()
    var best_desc = List[String]()
    var dflt_desc = List[String]()
    var wbytes = List[Int]()
    var layers = List[Int]()
    for li in range(8):
        if only >= 0 and li != only:
            continue
        var nk = layer_nk(li)
        var n = nk[0]
        var kp = nk[1]
        print("==", layer_name(li), " N=", n, " K=", kp, flush=True)
        var L = Layer(ctx, n, kp, 4096, UInt32(1000 + 17 * li))
        layers.append(li)
        wbytes.append(L.weight_bytes())
        var nref = REF_DENSE + REF_SAMPLED
        var ref_rows = ctx.enqueue_create_buffer[F32](nref * n)
        var sp0 = L.sc_ptr(0)
        run_reference[BF16, G, False, False](
            ctx, ref_rows.unsafe_ptr().as_unsafe_any_origin(), L.xp.as_unsafe_any_origin(),
            L.qw_ptr(0), sp0, sp0, sp0, n, kp, L.np_, REF_STEP, nref, REF_DENSE)
        for mj in range(NUM_M):
            var m = m_value(mj)
            var nrows = ref_rows_below(m)
            var best = Best()
            var p_us: Float64 = 0
            if with_prev:
                p_us = try_cfg[WG_CFG_128](ctx, L, m, KIND_PREV, 0, ref_rows, nrows, best, all_ok)
            var p_desc = best.desc
            var best_new = Best()
            var d_us = try_cfg[WG_CFG_128](ctx, L, m, KIND_DEFAULT, 0, ref_rows, nrows, best_new, all_ok)
            var d_desc = best_new.desc
            # the plan's tile with the other splits of {1, 2, 4}, the other tile, and (flag `pp`)
            # the experimental software-pipelined twin
            var plan = wgmma_plan(m, n, kp)
            for sp in [1, 2, 4]:
                if sp != plan[1]:
                    if plan[0] == WG_VAR_64:
                        _ = try_cfg[WG_CFG_64](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best_new, all_ok)
                    elif plan[0] == WG_VAR_128 and m <= 256:
                        _ = try_cfg[WG_CFG_128](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best_new, all_ok)
            if plan[0] == WG_VAR_128 and m <= 256:
                _ = try_cfg[WG_CFG_64](ctx, L, m, KIND_WGMMA, 0, ref_rows, nrows, best_new, all_ok)
            if m <= 64:
                _ = try_cfg[WG_CFG_64W](ctx, L, m, KIND_WGMMA, 0, ref_rows, nrows, best_new, all_ok)
            if with_pp:
                if plan[0] == WG_VAR_64:
                    _ = try_cfg[WG_CFG_64P](ctx, L, m, KIND_WGMMA, plan[1], ref_rows, nrows, best_new, all_ok)
                elif plan[0] == WG_VAR_128:
                    _ = try_cfg[WG_CFG_128P](ctx, L, m, KIND_WGMMA, plan[1], ref_rows, nrows, best_new, all_ok)
            prev.append(p_us)
            prev_desc.append(p_desc)
            dflt.append(d_us)
            dflt_desc.append(d_desc)
            bestv.append(best_new.us)
            best_desc.append(best_new.desc)

    # ---- summary ----
    print("\nlayer        M   prev_us  xcuBLAS | new_us  TFLOP/s  xcuBLAS | best_us  xcuBLAS | floor_us | best config")
    var json = String("{\"gpu\": \"H200\", \"dtype\": \"bfloat16\", \"group_size\": 128, \"rows\": [")
    var lg_p = List[Float64](length=NUM_M, fill=0.0)
    var lg_d = List[Float64](length=NUM_M, fill=0.0)
    var lg_b = List[Float64](length=NUM_M, fill=0.0)
    for i in range(len(layers)):
        var li = layers[i]
        var nk = layer_nk(li)
        for mj in range(NUM_M):
            var m = m_value(mj)
            var idx = i * NUM_M + mj
            var wb = Float64(wbytes[i])
            var flop = 2.0 * Float64(m) * Float64(nk[0]) * Float64(nk[1])
            var floor_us = max(wb / (HBM_TBPS * 1e6), flop / (PEAK_TFLOPS * 1e6))
            var cb = cublas_us(li, mj)
            lg_p[mj] += log(cb / prev[idx]) if prev[idx] > 0 else 0.0
            lg_d[mj] += log(cb / dflt[idx])
            lg_b[mj] += log(cb / bestv[idx])
            print(layer_name(li), " ", m, "  ", prev[idx], " ", cb / prev[idx] if prev[idx] > 0 else 0.0, " | ", dflt[idx], " ",
                  flop / dflt[idx] / 1e6, " ", cb / dflt[idx], " | ", bestv[idx], " ", cb / bestv[idx],
                  " | ", floor_us, " | ", best_desc[idx])
            if idx > 0:
                json += ", "
            json += String("{\"layer\": \"", layer_name(li), "\", \"M\": ", m, ", \"N\": ", nk[0], ", \"K\": ", nk[1],
                           ", \"prev_us\": ", prev[idx], ", \"prev_config\": \"", prev_desc[idx],
                           "\", \"us\": ", dflt[idx], ", \"config\": \"", dflt_desc[idx], "\", \"best_us\": ", bestv[idx],
                           ", \"best_config\": \"", best_desc[idx], "\", \"cublas_us\": ", cb,
                           ", \"weight_bytes\": ", wbytes[i], ", \"floor_us\": ", floor_us, "}")
    json += "]}"
    var nl = Float64(len(layers))
    for mj in range(NUM_M):
        print("geomean xcuBLAS  M=", m_value(mj), ": prev ", exp(lg_p[mj] / nl) if with_prev else 0.0, "  default ", exp(lg_d[mj] / nl),
              "  best ", exp(lg_b[mj] / nl))
    var outdir = getenv("OUT")
    if outdir != "":
        with open(outdir + "/int4_gemm_bench.json", "w") as f:
            f.write(json)
    print("int4_gemm_bench:", "ALL CHECKS PASS" if all_ok else "SOME CHECKS FAILED", flush=True)

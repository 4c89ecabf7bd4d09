"""Benchmark of the W4A16 tensor-core path (`int4_gemm_gpu`) on the 8 Llama-3 layers, g = 128,
bf16, symmetric, no bias, M in {16, 32, 64, 128, 256, 1024, 4096}; standalone program for the
H200. At M = 32 the dispatch takes a 64-token wgmma tile (mostly empty); the other 64-token tiles
are timed next to it, and the mma.sync selection too unless `noprev`.

    scripts/build-gpu-bin benchmarks/mojo/int4_gemm_bench.mojo
    run carry=[".gpu-bin"]: LD_LIBRARY_PATH=$PWD/.gpu-bin/lib .gpu-bin/int4_gemm_bench [layer|-1] [noprev] [wk] [xs] [m=16,64]
(noprev: skip timing the mma.sync selection (the v6 columns);
wk: also the warp-k config WG_CFG_128K with splits 1, 2, 4 at 64 < M <= 128;
xs: also the cluster sizes the plan avoids or caps (3, 5, 6, 7, 8) at 16 < M <= 128;
m=...: only these M values, e.g. m=16,64 for the small-M rows alone)

Per M and layer (the labels of the output columns and JSON keys): "v6" = the mma.sync selection
(`int4_gemm_gpu_mma`, M > 16 only), "v7" = the rule without pins (`prev_m16_choice` at M = 16,
`dispatch.wgmma_rule` above; timed, tagged "v7", only where a pin changes the launch, else equal
to default), "default" =
`int4_gemm_gpu` (the current dispatch), then a sweep: M = 16 the PIPE_WARP configs (CFG_M16,
CFG_M16_NARROW, CFG_M16_K8) x split_k {1, 2, 4}; M > 16 the wgmma configs and splits around the
plan of the rule without pins and the stream-K launches of the tiles the rule weighs, for
M <= 64 WG_CFG_64N (64 x 128, 2 CTAs per SM) x split_k {1, 2, 4, 8}, and for 64 < M <= 256
WG_CFG_64N and WG_CFG_128N (128 x 128, 2 CTAs per SM) x split_k {1, 2, 4, 8}. "best" is the
fastest checked launch of all of them.

Per layer: fresh random weights (enough rotating copies, >= 4 and >= 200 MB, that L2 never
serves them), x, scales. One naive fp32 GPU reference per layer, of x rows 0..255 and 64 rows
sampled over 256..4095 (every residue mod 8); for each M every timed config is first checked
against the reference rows < M (output poisoned with NaN, rel. Frobenius error <= 1e-2).
Timing: a spin kernel holds the GPU while the host enqueues N
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
from mojo_kernels.int4_gemm.dispatch import (
    launch_int4_gemm_mma, int4_gemm_gpu, int4_gemm_gpu_config, int4_gemm_gpu_mma, int4_gemm_gpu_mma_config,
    wgmma_plan, wgmma_rule, wgmma_dp_tiles,
)
from mojo_kernels.int4_gemm.tuning_sm90 import (
    CFG_M8, WG_CFG_64, WG_CFG_64W, WG_CFG_128, WG_VAR_64, WG_VAR_64W, WG_VAR_128,
    CFG_M16, CFG_M16_NARROW, CFG_M16_K8, WG_CFG_64N, WG_CFG_128K, WG_CFG_256, WG_VAR_256,
)
from mojo_kernels.int4_gemm.config import wgmma_smem_budget, smem_usage, wgmma_smem_usage
from mojo_kernels.int4_gemm.kernels.wgmma import (
    launch_int4_gemm_wgmma, launch_int4_gemm_wgmma_streamk, choose_wgmma_split_k, streamk_ctas,
)
from int4_gemm_ref import F32, fill_uniform, fill_u32, fill_nan, run_reference, compare_rows, spin_kernel

comptime BF16 = DType.bfloat16
comptime G = 128
comptime WG_CFG_128N = Int4WgmmaConfig(nt=128, fpw=2, nwg=1, stages=8, kg=4, ctas=2)
"""128 tokens x 128 columns, one consumer warpgroup, 2 CTAs per SM (5 stages in ~113 KB; not
dispatched: at M = 128 within 1-2 % of the 128 x 256 tiles where it came closest)."""
comptime HBM_TBPS = 4.24
comptime PEAK_TFLOPS = 728.0
comptime NUM_M = 7
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
    var ms: List[Int] = [16, 32, 64, 128, 256, 1024, 4096]
    return ms[j]


def cublas_us(layer: Int, m: Int) -> Float64:
    """The cuBLAS bf16 (torch.matmul) µs measured on the H200 (do_bench, L2 flushed) for the
    benchmark's layers at M = 16, 64, 128, 256, 1024, 4096; M = 32 takes the M = 64 time (not
    measured at 32: on these layers cuBLAS's M = 16 and 64 times differ by 1-8 %)."""
    var ms: List[Int] = [16, 64, 128, 256, 1024, 4096]
    var mj = 0
    for j in range(len(ms)):
        if ms[j] == (64 if m == 32 else m):
            mj = j
    var t: List[Float64] = [
        23.008, 22.752, 23.360, 26.912, 72.160, 281.088,        # 8B.qkv
        19.200, 18.080, 19.552, 24.576, 47.072, 188.032,        # 8B.o
        69.024, 70.752, 75.584, 98.528, 338.464, 1351.488,      # 8B.gate_up
        42.016, 44.704, 45.504, 53.024, 159.552, 666.560,       # 8B.down
        56.256, 52.224, 54.016, 64.544, 241.664, 980.768,       # 70B.qkv
        43.744, 46.688, 46.048, 52.800, 188.624, 786.240,       # 70B.o
        240.896, 233.488, 253.440, 357.472, 1391.008, 5482.768, # 70B.gate_up
        123.296, 132.912, 130.368, 176.848, 674.336, 2660.704,  # 70B.down
    ]
    return t[layer * len(ms) + mj]


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
"""Kind: `int4_gemm_gpu_mma` (the mma.sync selection: the "v6" columns)."""
comptime KIND_WGMMA = 2
"""Kind: `launch_int4_gemm_wgmma[cfg]` with the given split (0: its heuristic)."""
comptime KIND_MMA = 3
"""Kind: `launch_int4_gemm_mma[mcfg]` (the mma.sync kernels) with the given split (>= 1)."""
comptime KIND_STREAMK = 4
"""Kind: `launch_int4_gemm_wgmma_streamk[cfg]`, one CTA per SM (the split is ignored)."""


def launch_cfg[cfg: Int4WgmmaConfig, mcfg: Int4GemmConfig](ctx: DeviceContext, L: Layer, m: Int, kind: Int, split: Int, i: Int) raises:
    var sp = L.sc_ptr(i)
    var op = L.outp.as_unsafe_any_origin()
    var xp = L.xp.as_unsafe_any_origin()
    if kind == KIND_DEFAULT:
        int4_gemm_gpu[BF16, G, False, False](op, xp, L.qw_ptr(i), sp, sp, sp, m, L.n, L.kp, ctx)
    elif kind == KIND_PREV:
        int4_gemm_gpu_mma[BF16, G, False, False](op, xp, L.qw_ptr(i), sp, sp, sp, m, L.n, L.kp, ctx)
    elif kind == KIND_MMA:
        launch_int4_gemm_mma[BF16, G, False, False, mcfg](op, xp, L.qw_ptr(i), sp, sp, sp, m, L.n, L.kp, L.np_, split, ctx)
    elif kind == KIND_STREAMK:
        launch_int4_gemm_wgmma_streamk[BF16, G, False, False, cfg](op, xp, L.qw_ptr(i), sp, sp, sp, m, L.n, L.kp, L.np_, ctx)
    else:
        launch_int4_gemm_wgmma[BF16, G, False, False, cfg](op, xp, L.qw_ptr(i), sp, sp, sp, m, L.n, L.kp, L.np_, split, ctx)


def time_cfg[cfg: Int4WgmmaConfig, mcfg: Int4GemmConfig](ctx: DeviceContext, L: Layer, m: Int, kind: Int, split: Int) raises -> Float64:
    """Median µs per launch (see the module doc)."""
    # estimate, to size the loop
    for w in range(3):
        launch_cfg[cfg, mcfg](ctx, L, m, kind, split, w)
    ctx.synchronize()
    var t0 = perf_counter_ns()
    for w in range(3):
        launch_cfg[cfg, mcfg](ctx, L, m, kind, split, w + 3)
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
            launch_cfg[cfg, mcfg](ctx, L, m, kind, split, rep * iters + i)
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


def try_cfg[cfg: Int4WgmmaConfig, mcfg: Int4GemmConfig = CFG_M8](
    ctx: DeviceContext, L: Layer, m: Int, kind: Int, split: Int, ref_rows: DeviceBuffer[F32],
    nrows: Int, mut best: Best, mut all_ok: Bool, tag: String = "",
) raises -> Float64:
    """Check (output poisoned), then time; returns the µs (1e30 if the check failed)."""
    var op = L.outp.as_unsafe_any_origin()
    fill_nan[BF16](ctx, op, m * L.n)
    launch_cfg[cfg, mcfg](ctx, L, m, kind, split, 0)
    var r = compare_rows[BF16](ctx, op, ref_rows, L.n, REF_STEP, nrows, REF_DENSE)
    var good = r.rel_err <= 1e-2 and r.nan_count == 0
    all_ok = all_ok and good
    var desc: String
    if kind == KIND_DEFAULT:
        desc = String("default ", int4_gemm_gpu_config(m, L.n, L.kp, G, False))
    elif kind == KIND_PREV:
        desc = String("prev ", int4_gemm_gpu_mma_config(m, L.n, L.kp, G, False))
    elif kind == KIND_MMA:
        var rm = try_resolve_config(mcfg, G, False, SMEM_BUDGET_SM90).with_split_k(split)
        var ctas = ceildiv(ceildiv(L.n, 64), rm.bn // 64) * split * ceildiv(m, rm.bm)
        desc = String(tag, "int4_gemm_mma ", rm, " smem=", smem_usage(rm, G, False), " ctas=", ctas)
    elif kind == KIND_STREAMK:
        var rs = try_resolve_wgmma_config(cfg, G, False, wgmma_smem_budget(cfg))
        desc = String(tag, rs.with_split_k(1), " streamk ctas=", streamk_ctas(rs, m, L.n, L.kp, 132),
                      " smem=", wgmma_smem_usage(rs, G, False))
    else:
        var rc = try_resolve_wgmma_config(cfg, G, False, wgmma_smem_budget(cfg))
        var sk = split if split > 0 else choose_wgmma_split_k(rc, m, L.n, L.kp)
        var ctas = ceildiv(ceildiv(L.n, 64), rc.bands()) * sk * ceildiv(m, rc.nt)
        desc = String(tag, rc.with_split_k(sk), " smem=", wgmma_smem_usage(rc, G, False), " ctas=", ctas)
    var us = time_cfg[cfg, mcfg](ctx, L, m, kind, split)
    var tflops = 2.0 * Float64(m) * Float64(L.n) * Float64(L.kp) / us / 1e6
    print("    M=", m, " ", desc, ": ", us, " us, ", tflops, " TFLOP/s, rel err ", r.rel_err,
          " unwritten ", r.nan_count, " ", "ok" if good else "WRONG", flush=True)
    if not good:
        return 1e30
    if us < best.us:
        best.us = us
        best.desc = desc
    return us


def prev_m16_choice(n: Int, kp: Int) -> Tuple[Int, Int]:
    """The `tuned_choice` row without the CFG_M16_K8 pins (variant 0 = CFG_M16, 1 =
    CFG_M16_NARROW; split) at 9 <= M <= 16 for the shapes `tuned_choice` pins to CFG_M16_K8,
    else (-1, 0) (where the pins leave the dispatch as the rule has it)."""
    if kp == 4096 and n == 6144:
        return (1, 1)
    if kp == 4096 and n == 4096:
        return (1, 2)
    if kp == 14336 and n == 4096:
        return (1, 2)
    if kp == 8192 and n == 8192:
        return (0, 2)
    return (-1, 0)


def sweep_m16(
    ctx: DeviceContext, L: Layer, m: Int, ref_rows: DeviceBuffer[F32], nrows: Int,
    mut best: Best, mut all_ok: Bool,
) raises:
    """M <= 16: the PIPE_WARP configs over split_k {1, 2, 4}, for grids of 32..264 CTAs with
    >= 1 group-aligned unit of K per warp."""
    var bands = ceildiv(L.n, 64)
    var units = L.kp // 128  # K parts are multiples of 128 (g = 128)

    @always_inline
    @__parameter
    def one[c: Int4GemmConfig]() raises:
        for sp in [1, 2, 4]:
            var ctas = ceildiv(bands, c.bn // 64) * sp
            if ctas >= 32 and ctas <= 264 and units >= sp * c.warp_k:
                _ = try_cfg[WG_CFG_128, c](ctx, L, m, KIND_MMA, sp, ref_rows, nrows, best, all_ok)

    one[CFG_M16_NARROW]()
    one[CFG_M16]()
    one[CFG_M16_K8]()


def try_v7_wgmma(
    ctx: DeviceContext, L: Layer, m: Int, plan: Tuple[Int, Int], ref_rows: DeviceBuffer[F32],
    nrows: Int, mut best: Best, mut all_ok: Bool,
) raises -> Float64:
    """The wgmma launch of a plan of the rule without pins (variant >= 0, split)."""
    if plan[0] == WG_VAR_64:
        return try_cfg[WG_CFG_64](ctx, L, m, KIND_WGMMA, plan[1], ref_rows, nrows, best, all_ok, "v7 ")
    if plan[0] == WG_VAR_64W:
        return try_cfg[WG_CFG_64W](ctx, L, m, KIND_WGMMA, plan[1], ref_rows, nrows, best, all_ok, "v7 ")
    return try_cfg[WG_CFG_128](ctx, L, m, KIND_WGMMA, plan[1], ref_rows, nrows, best, all_ok, "v7 ")


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
    var with_wk = False
    var with_xs = False
    var m_only = List[Int]()
    for ai in range(2, len(args)):
        var a = String(args[ai])
        if a == "noprev":
            with_prev = False
        if a == "wk":
            with_wk = True
        if a == "xs":
            with_xs = True
        if a.startswith("m="):
            var parts = a[byte=2:].split(",")
            for pi in range(len(parts)):
                m_only.append(Int(String(parts[pi])))
    var m_sel = List[Int]()  # indices into m_value
    for mj in range(NUM_M):
        var keep = len(m_only) == 0
        for pi in range(len(m_only)):
            if m_only[pi] == m_value(mj):
                keep = True
        if keep:
            m_sel.append(mj)
    var max_m = 16
    for si in range(len(m_sel)):
        max_m = max(max_m, m_value(m_sel[si]))
    var all_ok = True
    var prev = List[Float64]()
    var prev_desc = List[String]()
    var dflt = List[Float64]()
    var bestv = List[Float64]()
    var best_desc = List[String]()
    var v7 = List[Float64]()
    var v7d = List[String]()
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
        var L = Layer(ctx, n, kp, max_m, UInt32(1000 + 17 * li))
        layers.append(li)
        wbytes.append(L.weight_bytes())
        var nref = ref_rows_below(max_m)
        var ref_rows = ctx.enqueue_create_buffer[F32](nref * n)
        var sp0 = L.sc_ptr(0)
        run_reference[BF16, G, False, False](
            ctx, ref_rows.unsafe_ptr().as_unsafe_any_origin(), L.xp.as_unsafe_any_origin(),
            L.qw_ptr(0), sp0, sp0, sp0, n, kp, L.np_, REF_STEP, nref, REF_DENSE)
        for si in range(len(m_sel)):
            var mj = m_sel[si]
            var m = m_value(mj)
            var nrows = ref_rows_below(m)
            var best = Best()
            var p_us: Float64 = 0  # the mma.sync selection (M > 16; the v6 columns)
            var p_desc = String("")
            if m > 16 and with_prev:
                p_us = try_cfg[WG_CFG_128](ctx, L, m, KIND_PREV, 0, ref_rows, nrows, best, all_ok)
                p_desc = best.desc
            var bd = Best()
            var d_us = try_cfg[WG_CFG_128](ctx, L, m, KIND_DEFAULT, 0, ref_rows, nrows, bd, all_ok)
            var d_desc = bd.desc
            if bd.us < best.us:
                best.us = bd.us
                best.desc = bd.desc
            # the rule without pins (the v7 columns): timed where a pin changes the plan, else = default
            var v7_us = d_us
            var v7_desc = String("= default")
            var b7 = Best()
            if m <= 16:
                var pv = prev_m16_choice(n, kp)
                if pv[0] == 1:
                    v7_us = try_cfg[WG_CFG_128, CFG_M16_NARROW](ctx, L, m, KIND_MMA, pv[1], ref_rows, nrows, b7, all_ok, "v7 ")
                    v7_desc = b7.desc
                elif pv[0] == 0:
                    v7_us = try_cfg[WG_CFG_128, CFG_M16](ctx, L, m, KIND_MMA, pv[1], ref_rows, nrows, b7, all_ok, "v7 ")
                    v7_desc = b7.desc
                sweep_m16(ctx, L, m, ref_rows, nrows, best, all_ok)
            var rule = wgmma_rule(m, n, kp)
            var plan = wgmma_plan(m, n, kp)
            if m > 16 and (rule[0] != plan[0] or rule[1] != plan[1]):
                if rule[0] < 0 and with_prev:  # the rule stays on mma.sync: the mma.sync selection
                    v7_us = p_us
                    v7_desc = String("v7 ", p_desc)
                elif rule[0] < 0:
                    v7_us = try_cfg[WG_CFG_128](ctx, L, m, KIND_PREV, 0, ref_rows, nrows, b7, all_ok)
                    v7_desc = String("v7 ", b7.desc)
                else:
                    v7_us = try_v7_wgmma(ctx, L, m, rule, ref_rows, nrows, b7, all_ok)
                    v7_desc = b7.desc
            if b7.us < best.us:
                best.us = b7.us
                best.desc = b7.desc
            if m > 16:
                # the rule's tile with the other splits of {1, 2, 4} and the other tile
                for sp in [1, 2, 4]:
                    if sp != rule[1]:
                        if rule[0] == WG_VAR_64:
                            _ = try_cfg[WG_CFG_64](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best, all_ok)
                        elif rule[0] == WG_VAR_128 and m <= 256:
                            _ = try_cfg[WG_CFG_128](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best, all_ok)
                if rule[0] == WG_VAR_128 and m <= 256:
                    _ = try_cfg[WG_CFG_64](ctx, L, m, KIND_WGMMA, 0, ref_rows, nrows, best, all_ok)
                if m <= 64:
                    _ = try_cfg[WG_CFG_64W](ctx, L, m, KIND_WGMMA, 0, ref_rows, nrows, best, all_ok)
            if m > 16 and m <= 64:
                # 64 x 128 tiles built for 2 CTAs per SM over split_k {1, 2, 4, 8}
                var bands = ceildiv(n, 64)
                for sp in [1, 2, 4, 8]:
                    var ctas = ceildiv(bands, 2) * sp
                    if ctas >= 64 and ctas <= 264 and kp // 64 // sp >= 4:
                        _ = try_cfg[WG_CFG_64N](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best, all_ok)
            if m > 64 and m <= 256:
                # the 2-CTA-per-SM tiles (64 x 128 and 128 x 128) over split_k {1, 2, 4, 8}
                var bands2 = ceildiv(ceildiv(n, 64), 2)
                for sp in [1, 2, 4, 8]:
                    if kp // 64 // sp >= 4:
                        if bands2 * ceildiv(m, 64) * sp <= 264:
                            _ = try_cfg[WG_CFG_64N](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best, all_ok)
                        if bands2 * ceildiv(m, 128) * sp <= 264:
                            _ = try_cfg[WG_CFG_128N](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best, all_ok)
            if m > 256 and (rule[0] != WG_VAR_128 or rule[1] != 1):
                # the one-wave-or-split-1 rule's choice at large M, next to the cost model's
                _ = try_cfg[WG_CFG_128](ctx, L, m, KIND_WGMMA, 1, ref_rows, nrows, best, all_ok)
            if m > 256 and wgmma_dp_tiles(m, n, kp, rule[0], rule[1]) > 0:
                # the rule's split as one uniform grid, next to its data-parallel + tail launch
                if rule[0] == WG_VAR_128:
                    _ = try_cfg[WG_CFG_128](ctx, L, m, KIND_WGMMA, rule[1], ref_rows, nrows, best, all_ok)
                elif rule[0] == WG_VAR_256:
                    _ = try_cfg[WG_CFG_256](ctx, L, m, KIND_WGMMA, rule[1], ref_rows, nrows, best, all_ok)
            if m >= 256:
                for sp in [1, 2]:
                    _ = try_cfg[WG_CFG_256](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best, all_ok)
            # the stream-K launches of the tiles the rule weighs at this M (the dispatch's own
            # pick among them is the default row)
            if m > 16 and m <= 64:
                _ = try_cfg[WG_CFG_64](ctx, L, m, KIND_STREAMK, 0, ref_rows, nrows, best, all_ok)
            if m > 64 and m <= 256:
                _ = try_cfg[WG_CFG_128](ctx, L, m, KIND_STREAMK, 0, ref_rows, nrows, best, all_ok)
            if m > 128:
                _ = try_cfg[WG_CFG_256](ctx, L, m, KIND_STREAMK, 0, ref_rows, nrows, best, all_ok)
            if with_xs and m > 16 and m <= 128:
                # cluster sizes the plan avoids (3, 5, 6, 7, 8): how they pack on this GPU
                for sp in [3, 5, 6, 7, 8]:
                    if kp // 64 // sp >= 4:
                        if m > 64:
                            _ = try_cfg[WG_CFG_128](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best, all_ok)
                        if sp <= 6:
                            _ = try_cfg[WG_CFG_64N](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best, all_ok)
                            if m > 64:
                                _ = try_cfg[WG_CFG_128K](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best, all_ok)
            if with_wk and m > 64 and m <= 128:
                var tiles = ceildiv(ceildiv(n, 64), 2) * ceildiv(m, 128)
                for sp in [1, 2, 4]:
                    var ctas = tiles * sp
                    if ctas <= 132 * 2 and kp // 64 // sp >= 4:
                        _ = try_cfg[WG_CFG_128K](ctx, L, m, KIND_WGMMA, sp, ref_rows, nrows, best, all_ok)
            prev.append(p_us)
            prev_desc.append(p_desc)
            v7.append(v7_us)
            v7d.append(v7_desc)
            dflt.append(d_us)
            dflt_desc.append(d_desc)
            bestv.append(best.us)
            best_desc.append(best.desc)

    # ---- summary ----
    print("\nlayer        M   v6_us  xcuBLAS | v7_us  xcuBLAS | new_us  TFLOP/s  xcuBLAS | best_us  xcuBLAS | floor_us | new config | best config")
    var json = String("{\"gpu\": \"H200\", \"dtype\": \"bfloat16\", \"group_size\": 128, \"rows\": [")
    var lg_p = List[Float64](length=NUM_M, fill=0.0)
    var lg_7 = List[Float64](length=NUM_M, fill=0.0)
    var lg_d = List[Float64](length=NUM_M, fill=0.0)
    var lg_b = List[Float64](length=NUM_M, fill=0.0)
    var nsel = len(m_sel)
    for i in range(len(layers)):
        var li = layers[i]
        var nk = layer_nk(li)
        for si in range(nsel):
            var mj = m_sel[si]
            var m = m_value(mj)
            var idx = i * nsel + si
            var wb = Float64(wbytes[i])
            var flop = 2.0 * Float64(m) * Float64(nk[0]) * Float64(nk[1])
            var floor_us = max(wb / (HBM_TBPS * 1e6), flop / (PEAK_TFLOPS * 1e6))
            var cb = cublas_us(li, m)
            var xp = cb / prev[idx] if prev[idx] > 0 else 0.0
            lg_p[mj] += log(xp) if prev[idx] > 0 else 0.0
            lg_7[mj] += log(cb / v7[idx])
            lg_d[mj] += log(cb / dflt[idx])
            lg_b[mj] += log(cb / bestv[idx])
            print(layer_name(li), " ", m, "  ", prev[idx], " ", xp, " | ", v7[idx], " ", cb / v7[idx], " | ",
                  dflt[idx], " ", flop / dflt[idx] / 1e6, " ", cb / dflt[idx], " | ", bestv[idx], " ", cb / bestv[idx],
                  " | ", floor_us, " | ", dflt_desc[idx], " | ", best_desc[idx])
            if idx > 0:
                json += ", "
            json += String("{\"layer\": \"", layer_name(li), "\", \"M\": ", m, ", \"N\": ", nk[0], ", \"K\": ", nk[1],
                           ", \"v6_us\": ", prev[idx], ", \"v6_config\": \"", prev_desc[idx],
                           "\", \"v7_us\": ", v7[idx], ", \"v7_config\": \"", v7d[idx],
                           "\", \"us\": ", dflt[idx], ", \"config\": \"", dflt_desc[idx], "\", \"best_us\": ", bestv[idx],
                           ", \"best_config\": \"", best_desc[idx], "\", \"cublas_us\": ", cb,
                           ", \"weight_bytes\": ", wbytes[i], ", \"floor_us\": ", floor_us, "}")
    json += "]}"
    var nl = Float64(len(layers))
    for si in range(nsel):
        var mj = m_sel[si]
        var has_v6 = with_prev and m_value(mj) > 16
        print("geomean xcuBLAS  M=", m_value(mj), ": v6 ", exp(lg_p[mj] / nl) if has_v6 else 0.0,
              "  v7 ", exp(lg_7[mj] / nl), "  default ", exp(lg_d[mj] / nl), "  best ", exp(lg_b[mj] / nl))
    var outdir = getenv("OUT")
    if outdir != "":
        with open(outdir + "/int4_gemm_bench.json", "w") as f:
            f.write(json)
    print("int4_gemm_bench:", "ALL CHECKS PASS" if all_ok else "SOME CHECKS FAILED", flush=True)

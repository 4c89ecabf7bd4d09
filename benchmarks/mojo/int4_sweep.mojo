"""Sweep of every launch the W4A16 dispatch (`int4_gemm_gpu`) could choose, per (N, K) shape and
M, on the H200: the measurements a shape-independent dispatch rule (issue 19) is derived from
(scripts/int4_sweep_table.py reads the output). bf16, g = 128, symmetric, no bias.

    scripts/build-gpu-bin benchmarks/mojo/int4_sweep.mojo
    run carry=[".gpu-bin"]: LD_LIBRARY_PATH=$PWD/.gpu-bin/lib .gpu-bin/int4_sweep [options]

Options (each also as --name=value):
    --m 1,16,64,128,256   M values (default these five)
    --shapes A,B,...      layers of the built-in public set by name (8B.qkv, 405B.down, ...) or
                          NxK literals (6144x4096); default: the whole public set
                          (int4_sweep_shapes.mojo, generated from bench_int4_matmul.py's MODELS)
    --models 8B,70B       only the public layers of these models (prefix before the dot)
    --budget-s 540        start no new shape after this many seconds (the rest is listed as
                          skipped), so one 600 s device call always ends with its records written
    --reps 5              timed repetitions per candidate (median)
    --dry                 no GPU: print the candidate records (no timings) and a run-time estimate

Candidates at each M (config x split_k, both as the dispatch names them):
    M <= 8      CFG_M8, CFG_M8_NARROW, CFG_M8_K8        x {1, 2, 3, 4, 6, 8}
    9..16       CFG_M16, CFG_M16_NARROW, CFG_M16_K8     x {1, 2, 3, 4, 6, 8}
    17..64      WG_CFG_64, WG_CFG_64W, WG_CFG_64N       x {1, 2, 3, 4, 6} (cluster split)
                and CFG_M32 x {1, 2, 3, 4, 6, 8} (the mma.sync path the dispatch keeps there for
                shapes `tuned_choice` sends to it: one or two 32-token M-blocks)
    > 64        WG_CFG_128, WG_CFG_128K, WG_CFG_64      x {1, 2, 3, 4, 6} (`wgmma_rule` weighs
                WG_CFG_64 above 64 tokens too)
A split is left out where a CTA (PIPE_WARP: a warp) would get too little K: PIPE_WARP needs one
128-element unit of K per warp (kp / 128 >= split * warp_k), PIPE_CTA and wgmma >= 4 stages per
CTA (per warp-k partition). The dispatch's own choice and the rule's (`wgmma_tile_rule` /
band rule + `choose_split_k` without the exceptions) are added if that leaves them out (as one
uniform grid: where the rule's cost model picks the data-parallel + split tail launch,
`dispatch.wgmma_dp_tiles`, only the "dispatch" record times that). Plus one record "dispatch":
`int4_gemm_gpu` itself, timed through its own entry point.

Per shape: fresh random weights in enough rotating copies (>= 4 and >= 200 MB) that L2 never
serves them, one naive fp32 GPU reference of x rows 0..255 and 64 rows sampled above (every
residue mod 8). Each candidate is checked first (output poisoned with NaN; rel. Frobenius error
<= 1e-2 against the reference rows < M, no NaN left; computed on the GPU), then timed: a spin
kernel holds the GPU while the host enqueues `iters` launches rotating over the copies; (spin +
launches + sync) - (spin + sync), over iters; median of --reps (as int4_gemm_bench.mojo).
iters adapts to the launch time (~3 ms of launches per repetition, 3..200).

Output: one JSON object per line and (shape, M, candidate), printed and appended to
$OUT/int4_sweep.json when $OUT is set (the file is rewritten at start; every line is written
as soon as it is measured, so a run cut short keeps what it measured). Keys:
    layer, model, N, K, M, config, split, kernel ("mma" | "wgmma" | "dispatch"), choice (the
    dispatch record: "CONFIG/sSPLIT"), is_dispatch, is_rule, ok, rel_err, us, tbps (all bytes
    moved: weights + scales + x + out, over us), tflops, error (a launch that raised)
and the derived quantities of the launch:
    bands (ceil(N / 64)), bm (tokens per CTA), bands_cta, bk, stages (resolved), warp_k (PIPE_WARP:
    K parts per band; wgmma: warp-k warpgroups), threads, smem, ctas_per_sm (wgmma: cfg.ctas;
    mma: by shared memory and threads, PIPE_CTA at most 1 as choose_split_k assumes; registers
    are not counted), tiles, ctas, waves (ctas / (132 ctas_per_sm)), wave_cap
    (config.cluster_wave_cap: CTAs one wave of these clusters holds, 0 = never one wave),
    k_steps_cta (kp / bk / split), k_steps_part (per warp-k part), bytes_cta (weights + scales +
    activations one CTA reads), inflight_cta (weight + scale bytes of the CTA's full ring),
    inflight_sm (inflight_cta x min(ctas_per_sm, ctas / 132)).
"""

from max.gpu import global_idx
from max.gpu.host import DeviceContext, DeviceBuffer
from std.math import ceildiv, sqrt
from std.time import perf_counter_ns
from std.sys import argv
from std.os import getenv

from mojo_kernels.int4_gemm.config import (
    Int4GemmConfig, Int4WgmmaConfig, INT4_SMEM_BUDGET, PIPE_WARP, WG_BK, cluster_wave_cap,
    scale_rows_per_stage, smem_usage, try_resolve_config, try_resolve_wgmma_config,
    wgmma_scale_rows, wgmma_smem_budget, wgmma_smem_usage,
)
from mojo_kernels.int4_gemm.dispatch import (
    small_m_rule, choose_split_k, int4_gemm_gpu, int4_gemm_gpu_config, launch_int4_gemm_mma,
    tile_config_for, wgmma_plan, wgmma_tile_rule,
)
from mojo_kernels.int4_gemm.tuning_sm90 import (
    CFG_LARGE, CFG_M8, CFG_M8_K8, CFG_M8_NARROW, CFG_M16, CFG_M16_K8, CFG_M16_NARROW, CFG_M32, CFG_M64,
    WG_CFG_64, WG_CFG_64N, WG_CFG_64W, WG_CFG_128, WG_CFG_128K,
    WG_VAR_64, WG_VAR_64N, WG_VAR_64W, WG_VAR_128, WG_VAR_128K, WGMMA_MIN_M, tuned_choice,
)
from mojo_kernels.int4_gemm.kernels.wgmma import launch_int4_gemm_wgmma
from int4_gemm_ref import F32, fill_uniform, fill_u32, fill_nan, run_reference, sample_row, spin_kernel
from int4_sweep_shapes import NUM_PUBLIC, public_name, public_nk

comptime BF16 = DType.bfloat16
comptime G = 128
comptime SMS = 132
comptime SM_SMEM = 228 * 1024
"""Shared memory of one H200 SM; every resident CTA also reserves 1 KiB of it."""
comptime REF_DENSE = 256
comptime REF_SAMPLED = 64
comptime REF_STEP = 60
"""Reference rows: 0..255, then 256 + 60 j + j % 8 (j < 64, the last 4043)."""
comptime CMP_BLOCKS = 264
comptime CMP_THREADS = 256
comptime HBM_BYTES_PER_US = 3.0e6
"""--dry's time estimate: ~3 TB/s of weights (the int4 kernels' measured range is 2-3.5)."""
comptime EST_FLOPS_PER_US = 4.0e8
"""--dry's time estimate: ~400 TFLOP/s where the launch is compute bound."""

# ---- the candidate configs, by index (names as in tuning_sm90.mojo) ---------------------------

comptime NUM_CFG = 14
comptime FIRST_WG = 9
"""Indices < FIRST_WG: mma.sync configs (`launch_int4_gemm_mma`); the rest: wgmma configs."""


def cfg_name(i: Int) -> String:
    if i < 0 or i >= NUM_CFG:
        return String("unknown")
    var names: List[String] = [
        "CFG_M8", "CFG_M8_NARROW", "CFG_M16", "CFG_M16_NARROW", "CFG_M16_K8", "CFG_M32", "CFG_M64",
        "CFG_LARGE", "CFG_M8_K8", "WG_CFG_64", "WG_CFG_64W", "WG_CFG_64N", "WG_CFG_128", "WG_CFG_128K",
    ]
    return names[i]


def mma_cfg(i: Int) -> Int4GemmConfig:
    if i == 0:
        return CFG_M8
    if i == 1:
        return CFG_M8_NARROW
    if i == 2:
        return CFG_M16
    if i == 3:
        return CFG_M16_NARROW
    if i == 4:
        return CFG_M16_K8
    if i == 5:
        return CFG_M32
    if i == 6:
        return CFG_M64
    if i == 7:
        return CFG_LARGE
    return CFG_M8_K8


def wg_cfg(i: Int) -> Int4WgmmaConfig:
    if i == 9:
        return WG_CFG_64
    if i == 10:
        return WG_CFG_64W
    if i == 11:
        return WG_CFG_64N
    if i == 12:
        return WG_CFG_128
    return WG_CFG_128K


def wg_index(v: Int) -> Int:
    """Config index of a wgmma variant code (WG_VAR_*)."""
    if v == WG_VAR_64:
        return 9
    if v == WG_VAR_64W:
        return 10
    if v == WG_VAR_64N:
        return 11
    if v == WG_VAR_128:
        return 12
    if v == WG_VAR_128K:
        return 13
    return -1


def mma_index(c: Int4GemmConfig) -> Int:
    """Config index of an (unresolved) mma.sync tile config, -1 if it is none of the named ones."""
    for j in range(FIRST_WG):
        var d = mma_cfg(j)
        if (d.bm == c.bm and d.bn == c.bn and d.bk == c.bk and d.wm == c.wm and d.stages == c.stages
                and d.warp_k == c.warp_k and d.pipeline == c.pipeline and d.dequant_first == c.dequant_first):
            return j
    return -1


def resolved_mma(i: Int) -> Int4GemmConfig:
    return try_resolve_config(mma_cfg(i), G, False, INT4_SMEM_BUDGET)


def resolved_wg(i: Int) -> Int4WgmmaConfig:
    return try_resolve_wgmma_config(wg_cfg(i), G, False, wgmma_smem_budget(wg_cfg(i)))


# ---- the dispatch's choice and the rule's ------------------------------------------------------


def dispatch_choice(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:
    """(config index, split) of the launch `int4_gemm_gpu` makes (split_k = 0), as in
    dispatch.int4_gemm_gpu / int4_gemm_gpu_mma."""
    var plan = wgmma_plan(m, n, kp)
    if plan[0] >= 0:
        return (wg_index(plan[0]), plan[1])
    var cfg = tile_config_for(m, n, kp)
    var t = tuned_choice(m, n, kp)
    var split = t[1] if t[1] > 0 else choose_split_k(cfg, m, n, kp)
    return (mma_index(cfg), split)


def rule_choice(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:
    """(config index, split) the dispatch makes without `tuned_choice` / `tuned_wgmma`: the
    fallback a derived table leaves in place where it has no entry."""
    if m >= WGMMA_MIN_M:
        var r = wgmma_tile_rule(m, n, kp)
        return (wg_index(r[0]), r[1])
    var ci = 5
    var v = small_m_rule(n, kp)
    if m <= 8:
        ci = 8 if v == 2 else (1 if v == 1 else 0)
    elif m <= 16:
        ci = 4 if v == 2 else (3 if v == 1 else 2)
    return (ci, choose_split_k(mma_cfg(ci), m, n, kp))


# ---- candidates and their derived quantities ----------------------------------------------------


def valid_split(ci: Int, split: Int, kp: Int) -> Bool:
    """Enough K per CTA (PIPE_WARP: per warp) for `split` CTAs per cluster (module doc)."""
    if split < 1 or split > 8:
        return False
    if ci >= FIRST_WG:
        var w = resolved_wg(ci)
        return w.stages > 0 and kp // WG_BK // (split * w.wk) >= 4
    var r = resolved_mma(ci)
    if r.stages == 0:
        return False
    if r.pipeline == PIPE_WARP:
        return kp // 128 >= split * r.warp_k
    return kp // r.bk // split >= 4


def candidates(m: Int, kp: Int, mut cis: List[Int], mut sps: List[Int]):
    var mcfg = List[Int]()
    var wcfg = List[Int]()
    if m <= 8:
        mcfg = [0, 1, 8]
    elif m <= 16:
        mcfg = [2, 3, 4]
    elif m <= 64:
        wcfg = [9, 10, 11]
        mcfg = [5]
    else:
        wcfg = [12, 13, 9]
    for wi in range(len(wcfg)):
        for sp in [1, 2, 3, 4, 6]:
            if valid_split(wcfg[wi], sp, kp):
                cis.append(wcfg[wi])
                sps.append(sp)
    for mi in range(len(mcfg)):
        for sp in [1, 2, 3, 4, 6, 8]:
            if valid_split(mcfg[mi], sp, kp):
                cis.append(mcfg[mi])
                sps.append(sp)


def add_if_missing(ci: Int, sp: Int, mut cis: List[Int], mut sps: List[Int]):
    if ci < 0:
        return
    for i in range(len(cis)):
        if cis[i] == ci and sps[i] == sp:
            return
    cis.append(ci)
    sps.append(sp)


def total_bytes(m: Int, n: Int, kp: Int) -> Int:
    """Packed weights + scales + x + out of one launch."""
    var np_ = ceildiv(n, 64) * 64
    return np_ // 64 * kp * 8 * 4 + kp // G * np_ * 2 + m * kp * 2 + m * n * 2


def derived_json(ci: Int, split: Int, m: Int, n: Int, kp: Int) -> String:
    """The derived-quantity keys of one launch (module doc), as `"key": value, ...`."""
    var bands = ceildiv(n, 64)
    var bm: Int
    var nb: Int
    var bk: Int
    var stages: Int
    var wk: Int
    var threads: Int
    var smem: Int
    var cps: Int
    var inflight_cta: Int
    if ci >= FIRST_WG:
        var r = resolved_wg(ci)
        bm = r.nt
        nb = r.bands()
        bk = WG_BK
        stages = r.stages
        wk = r.wk
        threads = r.num_threads()
        smem = wgmma_smem_usage(r, G, False)
        cps = r.ctas
        inflight_cta = stages * (nb * (WG_BK // 16) * 512 + wgmma_scale_rows(G) * nb * 64 * 2)
    else:
        var r = resolved_mma(ci)
        bm = r.bm
        nb = r.bn // 64
        bk = r.bk
        stages = r.stages
        wk = r.warp_k
        threads = r.num_threads()
        smem = smem_usage(r, G, False)
        cps = min(SM_SMEM // (smem + 1024), 2048 // threads)
        if r.pipeline == PIPE_WARP:
            # every warp (nb bands x wk K parts) has its own ring of `stages` chunks
            inflight_cta = nb * wk * stages * ((bk // 16) * 512 + max(1, bk // G) * 512)
        else:
            cps = min(cps, 1)
            inflight_cta = stages * (nb * (bk // 16) * 512 + scale_rows_per_stage(bk, G) * nb * 64 * 2)
    cps = max(cps, 1)
    var tiles = ceildiv(bands, nb) * ceildiv(m, bm)
    var ctas = tiles * split
    var k_cta = Float64(kp) / Float64(split)
    var k_steps = k_cta / Float64(bk)
    var w_cta = Float64(nb * 64) * k_cta / 2.0 + k_cta / Float64(G) * Float64(nb * 64 * 2)
    var x_cta = Float64(min(m, bm)) * k_cta * 2.0
    var resident = min(Float64(cps), Float64(ctas) / Float64(SMS))
    return String(
        "\"bands\": ", bands, ", \"bm\": ", bm, ", \"bands_cta\": ", nb, ", \"bk\": ", bk,
        ", \"stages\": ", stages, ", \"warp_k\": ", wk, ", \"threads\": ", threads, ", \"smem\": ", smem,
        ", \"ctas_per_sm\": ", cps, ", \"tiles\": ", tiles, ", \"ctas\": ", ctas,
        ", \"waves\": ", Float64(ctas) / Float64(SMS * cps), ", \"wave_cap\": ", cluster_wave_cap(split, cps),
        ", \"k_steps_cta\": ", k_steps, ", \"k_steps_part\": ", k_steps / Float64(wk),
        ", \"bytes_cta\": ", w_cta + x_cta, ", \"inflight_cta\": ", inflight_cta,
        ", \"inflight_sm\": ", Float64(inflight_cta) * resident,
    )


def est_us(m: Int, n: Int, kp: Int) -> Float64:
    """--dry: a launch's rough time (weights at HBM_BYTES_PER_US, or compute bound)."""
    var flop = 2.0 * Float64(m) * Float64(n) * Float64(kp)
    return max(Float64(total_bytes(m, n, kp)) / HBM_BYTES_PER_US, flop / EST_FLOPS_PER_US) + 3.0


def iters_for(us: Float64) -> Int:
    return max(3, min(200, Int(3000.0 / max(us, 1.0))))


def spin_ns_for(iters: Int) -> Int64:
    return Int64(iters * 20_000 + 100_000)


def est_candidate_s(us: Float64, reps: Int) -> Float64:
    """--dry: wall time of checking and timing one candidate: warm-up, reps x (two spins +
    iters launches), ~2 ms of check and host work."""
    var iters = iters_for(us)
    var rep_us = 2.0 * Float64(spin_ns_for(iters)) / 1e3 + Float64(iters) * us
    return (Float64(reps) * rep_us + 6.0 * us + 2000.0) / 1e6


# ---- device data, check, timing -----------------------------------------------------------------


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

    def qw_ptr(self, i: Int) -> Pointer[UInt32, MutAnyOrigin]:
        return self.qwp.unsafe_offset((i % self.copies) * self.qwords).as_unsafe_any_origin()

    def sc_ptr(self, i: Int) -> Pointer[BFloat16, MutAnyOrigin]:
        return self.scp.unsafe_offset((i % self.copies) * self.swords).as_unsafe_any_origin()


def launch_cand(ctx: DeviceContext, L: Layer, m: Int, ci: Int, split: Int, i: Int) raises:
    """One launch of candidate (ci, split) on weight copy i % copies; ci = -1: `int4_gemm_gpu`."""
    var sp = L.sc_ptr(i)
    var op = L.outp.as_unsafe_any_origin()
    var xp = L.xp.as_unsafe_any_origin()
    var qp = L.qw_ptr(i)
    if ci < 0:
        int4_gemm_gpu[BF16, G, False, False](op, xp, qp, sp, sp, sp, m, L.n, L.kp, ctx)
        return
    comptime for j in range(NUM_CFG):
        if ci == j:
            comptime if j < FIRST_WG:
                comptime c = mma_cfg(j)
                launch_int4_gemm_mma[BF16, G, False, False, c](
                    op, xp, qp, sp, sp, sp, m, L.n, L.kp, L.np_, split, ctx)
            else:
                comptime w = wg_cfg(j)
                launch_int4_gemm_wgmma[BF16, G, False, False, w](
                    op, xp, qp, sp, sp, sp, m, L.n, L.kp, L.np_, split, ctx)


def cmp_kernel(
    got: Pointer[BFloat16, MutAnyOrigin], ref_out: Pointer[Float32, MutAnyOrigin],
    part: Pointer[Float64, MutAnyOrigin], n32: Int32, nrows32: Int32,
):
    """Per thread: Σ (got - ref)², Σ ref², NaN count over a grid-stride share of the reference
    rows (sample_row order) -> part[3 * thread + 0..2]."""
    var tid = global_idx.x
    var n = Int(n32)
    var total = n * Int(nrows32)
    var d2: Float64 = 0
    var r2: Float64 = 0
    var nans: Float64 = 0
    var i = tid
    while i < total:
        var row = sample_row(i // n, REF_DENSE, REF_STEP)
        var g = got[unsafe_offset=row * n + i % n].cast[DType.float64]()
        var r = ref_out[unsafe_offset=i].cast[DType.float64]()
        if g != g:
            nans += 1
        else:
            d2 += (g - r) * (g - r)
            r2 += r * r
        i += CMP_BLOCKS * CMP_THREADS
    part[unsafe_offset=3 * tid] = d2
    part[unsafe_offset=3 * tid + 1] = r2
    part[unsafe_offset=3 * tid + 2] = nans


struct Checker:
    var part: DeviceBuffer[DType.float64]

    def __init__(out self, ctx: DeviceContext) raises:
        self.part = ctx.enqueue_create_buffer[DType.float64](3 * CMP_BLOCKS * CMP_THREADS)

    def check(self, ctx: DeviceContext, L: Layer, m: Int, ci: Int, split: Int,
              ref_rows: DeviceBuffer[F32], nrows: Int) raises -> Tuple[Float64, Int]:
        """(rel. Frobenius error, NaN count) of one launch into a NaN-poisoned output."""
        var op = L.outp.as_unsafe_any_origin()
        fill_nan[BF16](ctx, op, m * L.n)
        launch_cand(ctx, L, m, ci, split, 0)
        ctx.enqueue_function[cmp_kernel](
            op, ref_rows.unsafe_ptr().as_unsafe_any_origin(), self.part.unsafe_ptr().as_unsafe_any_origin(),
            Int32(L.n), Int32(nrows), grid_dim=CMP_BLOCKS, block_dim=CMP_THREADS)
        var h = ctx.enqueue_create_host_buffer[DType.float64](3 * CMP_BLOCKS * CMP_THREADS)
        ctx.enqueue_copy(h, self.part)
        ctx.synchronize()
        var d2: Float64 = 0
        var r2: Float64 = 0
        var nans: Float64 = 0
        for t in range(CMP_BLOCKS * CMP_THREADS):
            d2 += h[3 * t]
            r2 += h[3 * t + 1]
            nans += h[3 * t + 2]
        var rel = sqrt(d2) / sqrt(r2) if r2 > 0 else sqrt(d2)
        return (rel, Int(nans))


def time_cand(ctx: DeviceContext, L: Layer, m: Int, ci: Int, split: Int, reps: Int) raises -> Float64:
    """Median µs per launch (module doc)."""
    for w in range(3):
        launch_cand(ctx, L, m, ci, split, w)
    ctx.synchronize()
    var t0 = perf_counter_ns()
    for w in range(3):
        launch_cand(ctx, L, m, ci, split, w + 3)
    ctx.synchronize()
    var iters = iters_for(Float64(perf_counter_ns() - t0) / 3e3)
    var spin_ns = spin_ns_for(iters)
    var samples = List[Float64]()
    for rep in range(reps):
        ctx.synchronize()
        var a0 = perf_counter_ns()
        ctx.enqueue_function[spin_kernel](spin_ns, grid_dim=1, block_dim=32)
        ctx.synchronize()
        var a1 = perf_counter_ns()
        ctx.enqueue_function[spin_kernel](spin_ns, grid_dim=1, block_dim=32)
        for i in range(iters):
            launch_cand(ctx, L, m, ci, split, rep * iters + i)
        var enq = perf_counter_ns()
        ctx.synchronize()
        var a2 = perf_counter_ns()
        if Int64(enq - a1) > spin_ns:
            print("      (warning: host enqueue", Float64(enq - a1) / 1e3, "us outran the spin)")
        samples.append(Float64(Int(a2 - a1) - Int(a1 - a0)) / 1e3 / Float64(iters))
    sort(samples)
    return samples[len(samples) // 2]


def ref_rows_below(m: Int) -> Int:
    """Reference rows (sample_row order) that are < m."""
    var cnt = 0
    for i in range(REF_DENSE + REF_SAMPLED):
        if sample_row(i, REF_DENSE, REF_STEP) < m:
            cnt += 1
    return cnt


# ---- output -------------------------------------------------------------------------------------


struct Sink:
    var path: String

    def __init__(out self) raises:
        var outdir = getenv("OUT")
        self.path = outdir + "/int4_sweep.json" if outdir != "" else String("")
        if self.path != "":
            with open(self.path, "w") as f:
                f.write("")

    def emit(self, line: String) raises:
        print(line, flush=True)
        if self.path != "":
            with open(self.path, "a") as f:
                f.write(line + "\n")


def json_num(v: Float64) -> String:
    """A JSON number, or null for a value that is not one (a failed or skipped measurement)."""
    if v != v or v > 1e300 or v < -1e300:
        return String("null")
    return String(v)


def record(
    name: String, n: Int, kp: Int, m: Int, ci: Int, split: Int, is_dispatch: Bool, is_rule: Bool,
    ok: Bool, rel: Float64, us: Float64, error: String, choice: Tuple[Int, Int] = (-1, 0),
) -> String:
    """One JSON line; ci = -1: the "dispatch" record, whose derived quantities are those of
    `choice` (config index, split: the launch the dispatch makes)."""
    var parts = name.split(".")
    var model = String(parts[0]) if len(parts) > 1 else String("custom")
    var cfg = String("dispatch") if ci < 0 else cfg_name(ci)
    var kernel = String("dispatch") if ci < 0 else (String("wgmma") if ci >= FIRST_WG else String("mma"))
    var bytes = Float64(total_bytes(m, n, kp))
    var flop = 2.0 * Float64(m) * Float64(n) * Float64(kp)
    var good_us = ok and us == us and us > 0
    var s = String(
        "{\"layer\": \"", name, "\", \"model\": \"", model, "\", \"N\": ", n, ", \"K\": ", kp, ", \"M\": ", m,
        ", \"config\": \"", cfg, "\", \"split\": ", split, ", \"kernel\": \"", kernel, "\"",
        ", \"is_dispatch\": ", "true" if is_dispatch else "false", ", \"is_rule\": ", "true" if is_rule else "false",
        ", \"ok\": ", "true" if ok else "false", ", \"rel_err\": ", json_num(rel),
        ", \"us\": ", json_num(us) if good_us else String("null"),
        ", \"tbps\": ", json_num(bytes / us / 1e6) if good_us else String("null"),
        ", \"tflops\": ", json_num(flop / us / 1e6) if good_us else String("null"),
    )
    if ci < 0:
        s += String(", \"choice\": \"", cfg_name(choice[0]), "/s", choice[1], "\"")
    if error != "":
        s += String(", \"error\": \"", error.replace("\"", "'").replace("\n", " "), "\"")
    var dci = choice[0] if ci < 0 else ci
    var dsplit = choice[1] if ci < 0 else split
    return s + ", " + derived_json(dci, dsplit, m, n, kp) + "}"


# ---- main ---------------------------------------------------------------------------------------


def parse_ints(s: String) raises -> List[Int]:
    var out = List[Int]()
    var parts = s.split(",")
    for i in range(len(parts)):
        if parts[i].byte_length() > 0:
            out.append(Int(String(parts[i])))
    return out^


def main() raises:
    var args = argv()
    var ms: List[Int] = [1, 16, 64, 128, 256]
    var names = List[String]()
    var ns = List[Int]()
    var ks = List[Int]()
    var shape_arg = String("")
    var model_arg = String("")
    var budget_s: Float64 = 540
    var reps = 5
    var dry = False
    var ai = 1
    while ai < len(args):
        var a = String(args[ai])
        var key = a
        var val = String("")
        var eq = a.split("=")
        if len(eq) == 2:
            key = String(eq[0])
            val = String(eq[1])
        elif a != "--dry" and ai + 1 < len(args):
            ai += 1
            val = String(args[ai])
        if key == "--m":
            ms = parse_ints(val)
        elif key == "--shapes":
            shape_arg = val
        elif key == "--models":
            model_arg = val
        elif key == "--budget-s":
            budget_s = Float64(Int(val))
        elif key == "--reps":
            reps = max(1, Int(val))
        elif key == "--dry":
            dry = True
        else:
            raise Error("int4_sweep: unknown option ", a, " (see the module doc)")
        ai += 1
    if shape_arg != "":
        var toks = shape_arg.split(",")
        for ti in range(len(toks)):
            var t = String(toks[ti])
            var nk = t.split("x")
            if len(nk) == 2:
                names.append(t)
                ns.append(Int(String(nk[0])))
                ks.append(Int(String(nk[1])))
                continue
            var found = False
            for i in range(NUM_PUBLIC):
                if public_name(i) == t:
                    names.append(t)
                    ns.append(public_nk(i)[0])
                    ks.append(public_nk(i)[1])
                    found = True
            if not found:
                raise Error("int4_sweep: unknown shape ", t, " (a public layer name or NxK)")
    else:
        var models = model_arg.split(",")
        for i in range(NUM_PUBLIC):
            var keep = model_arg == ""
            for mi in range(len(models)):
                if String(public_name(i).split(".")[0]) == String(models[mi]):
                    keep = True
            if keep:
                names.append(public_name(i))
                ns.append(public_nk(i)[0])
                ks.append(public_nk(i)[1])
    var max_m = 16
    for i in range(len(ms)):
        max_m = max(max_m, ms[i])
    var sink = Sink()

    if dry:
        var total_s: Float64 = 0
        var count = 0
        for si in range(len(names)):
            for mi in range(len(ms)):
                var m = ms[mi]
                var cis = List[Int]()
                var sps = List[Int]()
                candidates(m, ks[si], cis, sps)
                var d = dispatch_choice(m, ns[si], ks[si])
                var r = rule_choice(m, ns[si], ks[si])
                add_if_missing(d[0], d[1], cis, sps)
                add_if_missing(r[0], r[1], cis, sps)
                var u = est_us(m, ns[si], ks[si])
                total_s += Float64(len(cis) + 1) * est_candidate_s(u, reps)
                count += len(cis) + 1
                sink.emit(record(names[si], ns[si], ks[si], m, -1, d[1], False, False, False, Float64.MAX,
                                 Float64.MAX, "", d))
                for c in range(len(cis)):
                    sink.emit(record(names[si], ns[si], ks[si], m, cis[c], sps[c],
                                     cis[c] == d[0] and sps[c] == d[1], cis[c] == r[0] and sps[c] == r[1],
                                     False, Float64.MAX, Float64.MAX, ""))
        print("int4_sweep --dry:", count, "timings, estimated", total_s, "s of timing (plus ~60 s of",
              "PTX JIT on a cold cache, weight setup and references)")
        return

    var ctx = DeviceContext()
    var checker = Checker(ctx)
    var t_start = perf_counter_ns()
    var all_ok = True
    for si in range(len(names)):
        var elapsed = Float64(perf_counter_ns() - t_start) / 1e9
        if elapsed > budget_s:
            print("int4_sweep: budget of", budget_s, "s spent; skipped:", names[si], flush=True)
            continue
        var n = ns[si]
        var kp = ks[si]
        if n % 8 != 0 or kp % 128 != 0:
            print("int4_sweep: skipped", names[si], "(N % 8 == 0 and K % 128 == 0 needed)")
            continue
        print("==", names[si], " N=", n, " K=", kp, " (", elapsed, "s)", flush=True)
        var L = Layer(ctx, n, kp, max_m, UInt32(1000 + 17 * si))
        var nref = ref_rows_below(max_m)
        var ref_rows = ctx.enqueue_create_buffer[F32](nref * n)
        var sp0 = L.sc_ptr(0)
        run_reference[BF16, G, False, False](
            ctx, ref_rows.unsafe_ptr().as_unsafe_any_origin(), L.xp.as_unsafe_any_origin(),
            L.qw_ptr(0), sp0, sp0, sp0, n, kp, L.np_, REF_STEP, nref, REF_DENSE)
        ctx.synchronize()
        for mi in range(len(ms)):
            var m = ms[mi]
            var nrows = ref_rows_below(m)
            var cis = List[Int]()
            var sps = List[Int]()
            candidates(m, kp, cis, sps)
            var d = dispatch_choice(m, n, kp)
            var r = rule_choice(m, n, kp)
            add_if_missing(d[0], d[1], cis, sps)
            add_if_missing(r[0], r[1], cis, sps)
            var best_us: Float64 = 1e30
            var best_desc = String("")
            var disp_us: Float64 = 0
            for c in range(-1, len(cis)):
                var ci = cis[c] if c >= 0 else -1
                var split = sps[c] if c >= 0 else d[1]
                var rel: Float64 = Float64.MAX
                var nans = 0
                var us: Float64 = Float64.MAX
                var err = String("")
                try:
                    var chk = checker.check(ctx, L, m, ci, split, ref_rows, nrows)
                    rel = chk[0]
                    nans = chk[1]
                    if rel <= 1e-2 and nans == 0:
                        us = time_cand(ctx, L, m, ci, split, reps)
                except e:
                    err = String(e)
                var ok = err == "" and rel <= 1e-2 and nans == 0
                if not ok:
                    all_ok = False
                    print("    FAILED:", "dispatch" if ci < 0 else cfg_name(ci), "split", split, "rel err", rel,
                          "unwritten", nans, err)
                var is_d = c >= 0 and ci == d[0] and split == d[1]
                var is_r = c >= 0 and ci == r[0] and split == r[1]
                sink.emit(record(names[si], n, kp, m, ci, split, is_d, is_r, ok, rel, us, err, d))
                if ok and ci < 0:
                    disp_us = us
                if ok and ci >= 0 and us < best_us:
                    best_us = us
                    best_desc = String(cfg_name(ci), "/s", split)
            print("  ", names[si], " M=", m, ": best ", best_desc, " ", best_us, " us; dispatch ",
                  int4_gemm_gpu_config(m, n, kp, G, False), " ", disp_us, " us (",
                  (disp_us / best_us - 1.0) * 100.0, " % over best)", flush=True)
    print("int4_sweep:", "ALL CHECKS PASS" if all_ok else "SOME CHECKS FAILED",
          "in", Float64(perf_counter_ns() - t_start) / 1e9, "s", flush=True)

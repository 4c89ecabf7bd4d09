"""GPU tests of the W4A16 tensor-core path (standalone program; needs an NVIDIA GPU).

    python tests/mojo/int4_gemm_fixture.py .gpu-bin/int4_gemm_fixture.bin
    scripts/build-gpu-bin tests/mojo/int4_gemm_gpu_test.mojo
    LD_LIBRARY_PATH=$PWD/.gpu-bin/lib .gpu-bin/int4_gemm_gpu_test [fixture] [small]

1. The config resolver, with reduced budgets (stages first, then warp-k partitions, then Error).
2. Fixture problems packed by python/mojo_gemm/int4/layout.py with float64 results: the
   naive reference kernel and `int4_gemm_gpu` (each tile config, several split_k) must match,
   and so must every wgmma config (kernels/wgmma.mojo) launched directly with split_k 1, 2, 3, and
   every mma.sync PIPE_WARP config launched directly with split_k 1, 2, 3.
3. Random problems (dtypes, group sizes, zeros, bias, N tails, many M-tiles) against the naive
   reference: `int4_gemm_gpu`, every wgmma config, and (M <= 16) every PIPE_WARP config; on
   some of them the forced Ampere path (every mma.sync config without clusters at the sm_89
   budget, launched directly, and the launcher with FORCE_AMPERE) and the forced portable path
   (the launcher with FORCE_PORTABLE: kernels/portable.mojo).
`small` (second argument; scripts/gpu-check --sanitize uses it under racecheck): skips the two
largest random problems (1200 x 2112 and 520 x 6144 tokens x columns), whose kernels and configs
the other problems also launch.
Builds with -D INT4_SMEM_BUDGET / INT4_MAX_SPLIT / INT4_SETMAXNREG (int4_gemm/config.mojo) run the
same checks with the capped configs; the printed splits are the ones launched.
Every output is poisoned with NaN before each run. Exit code 1 on any failure.
"""

from max.gpu.host import DeviceContext, DeviceBuffer
from std.sys import argv, exit
from std.math import ceildiv

from mojo_kernels.int4_gemm.config import (
    Int4GemmConfig, resolve_config, smem_usage, SMEM_BUDGET_SM90,
)
from mojo_kernels.int4_gemm.config import Int4WgmmaConfig, INT4_MAX_SPLIT, INT4_SMEM_BUDGET, INT4_SETMAXNREG
from mojo_kernels.int4_gemm.dispatch import int4_gemm_gpu, int4_gemm_gpu_config, launch_int4_gemm_mma
from mojo_kernels.int4_gemm.entry import int4_gpu_plan_text, launch_int4_gemm
from mojo_kernels.common.target import FORCE_AMPERE, FORCE_PORTABLE, SMEM_BUDGET_AMPERE_SMALL
from std.utils.index import IndexList
from mojo_kernels.int4_gemm.kernels.wgmma import (
    launch_int4_gemm_wgmma, launch_int4_gemm_wgmma_gsplit, launch_int4_gemm_wgmma_streamk,
)
from mojo_kernels.int4_gemm.tuning_sm90 import (
    WG_CFG_64, WG_CFG_64W, WG_CFG_128, WG_CFG_64N, WG_CFG_128K, WG_CFG_256, CFG_M8, CFG_M8_NARROW, CFG_M16, CFG_M16_NARROW,
    CFG_M16_K8, CFG_M8_K8, CFG_M32, CFG_M64, CFG_LARGE,
)
from int4_gemm_ref import (
    F32, fill_uniform, fill_u32, fill_codes, fill_nan, run_reference, compare_rows, CheckResult,
)

comptime TOL = 1e-2


def small_mode() -> Bool:
    """`small` as the second argument (see the module doc)."""
    var args = argv()
    return len(args) > 2 and args[2] == "small"


def announce(what: String):
    """In small mode (the sanitizer runs), names each launch before it is made, so that a log
    that ends in a launch error shows which kernel and config failed."""
    if small_mode():
        print("  launching ", what, flush=True)


def check_resolver() raises -> Bool:
    """Stages are reduced first (down to 3), then warp-k partitions, then an Error."""
    var ok = True
    # 64 x 128 tile, 8 partitions: the 7 fp32 partial tiles (224 KiB) dominate every stage
    # count, so only halving the partitions helps.
    var cfg = Int4GemmConfig(bm=64, bn=128, bk=128, wm=64, wn=64, stages=4, warp_k=8, split_k=1)
    var b1 = smem_usage(cfg.with_warp_k(4), 128, False)
    var r1 = resolve_config(cfg, 128, False, b1)
    print("resolver: usage(", cfg, ") =", smem_usage(cfg, 128, False), "; budget", b1, "->", r1)
    ok = ok and r1.warp_k == 4 and r1.stages == 4
    ok = ok and resolve_config(cfg, 128, False, SMEM_BUDGET_SM90).warp_k == 8
    # ring-dominated: fits only at 3 stages with the requested partitions
    var cfg2 = Int4GemmConfig(bm=64, bn=256, bk=128, wm=64, wn=64, stages=6, warp_k=2, split_k=1)
    var b2 = smem_usage(cfg2.with_stages(3), 128, False)
    var r2 = resolve_config(cfg2, 128, False, b2)
    print("resolver: budget", b2, "->", r2)
    ok = ok and r2.stages == 3 and r2.warp_k == 2
    # fits only with fewer partitions (and then the stage search restarts from 4)
    var b3 = smem_usage(cfg.with_warp_k(2).with_stages(3), 128, False)
    var r3 = resolve_config(cfg, 128, False, b3)
    print("resolver: budget", b3, "->", r3)
    ok = ok and r3.warp_k == 2 and r3.stages == 3
    var raised = False
    try:
        _ = resolve_config(cfg, 128, False, 4096)
    except e:
        raised = True
        print("resolver: budget 4096 -> Error:", e)
    ok = ok and raised
    print("resolver:", "PASS" if ok else "FAIL")
    return ok


def wgmma_checks[dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool](
    ctx: DeviceContext, op: Pointer[Scalar[dtype], MutAnyOrigin], xp: Pointer[Scalar[dtype], MutAnyOrigin],
    qp: Pointer[UInt32, MutAnyOrigin], sp: Pointer[Scalar[dtype], MutAnyOrigin],
    zp: Pointer[Scalar[dtype], MutAnyOrigin], bp: Pointer[Scalar[dtype], MutAnyOrigin],
    refbuf: DeviceBuffer[F32], m: Int, n: Int, kp: Int, np_: Int, splits: List[Int],
) raises -> Bool:
    """Every wgmma config, launched directly with each split, against `refbuf` (all M rows);
    the 1-CTA-per-SM tiles also as the dispatch's data-parallel + split tail schedule (the
    first third of the tiles split 1, the rest split sk), as stream-K launches of one CTA per
    SM and of 7 and 61 CTAs (tiles spread over many CTAs; CTAs with whole tiles before their
    last segment) and split 2, 3, 5, 8 ways without a cluster (where every CTA fits an SM)."""
    var ok = True

    @always_inline
    @__parameter
    def one[cfg: Int4WgmmaConfig](sk: Int, dp_part: Bool = False) raises:
        var dp = 0
        if dp_part:
            dp = ceildiv(ceildiv(n, 64), cfg.bands()) * ceildiv(m, cfg.nt) // 3
        var what = String(cfg.with_split_k(min(sk, INT4_MAX_SPLIT)), " dp_tiles=", dp, " M=", m, " N=", n, " Kp=", kp)
        fill_nan[dtype](ctx, op, m * n)
        announce(what)
        launch_int4_gemm_wgmma[dtype, group_size, has_zeros, has_bias, cfg](op, xp, qp, sp, zp, bp, m, n, kp, np_, sk, ctx, dp)
        var r = compare_rows[dtype](ctx, op, refbuf, n, 1, m)
        var good = r.rel_err <= TOL and r.nan_count == 0
        print("    direct ", what, ": rel err ", r.rel_err, " unwritten ", r.nan_count, " ", "PASS" if good else "FAIL", flush=True)
        ok = ok and good

    for i in range(len(splits)):
        one[WG_CFG_64](splits[i])
        one[WG_CFG_64W](splits[i])
        one[WG_CFG_128](splits[i])
        one[WG_CFG_64N](splits[i])
        one[WG_CFG_128K](splits[i])
        one[WG_CFG_256](splits[i])
        if splits[i] > 1:
            one[WG_CFG_64](splits[i], True)
            one[WG_CFG_128](splits[i], True)
            one[WG_CFG_256](splits[i], True)

    @always_inline
    @__parameter
    def streamk[cfg: Int4WgmmaConfig](ctas: Int) raises:
        var what = String(cfg.with_split_k(1), " streamk ctas=", ctas, " M=", m, " N=", n, " Kp=", kp)
        fill_nan[dtype](ctx, op, m * n)
        announce(what)
        launch_int4_gemm_wgmma_streamk[dtype, group_size, has_zeros, has_bias, cfg](op, xp, qp, sp, zp, bp, m, n, kp, np_, ctx, ctas)
        var r = compare_rows[dtype](ctx, op, refbuf, n, 1, m)
        var good = r.rel_err <= TOL and r.nan_count == 0
        print("    direct ", what, ": rel err ", r.rel_err, " unwritten ", r.nan_count, " ", "PASS" if good else "FAIL", flush=True)
        ok = ok and good

    for ctas in [0, 7, 61]:
        streamk[WG_CFG_64](ctas)
        streamk[WG_CFG_128](ctas)
        streamk[WG_CFG_256](ctas)

    @always_inline
    @__parameter
    def gsplit[cfg: Int4WgmmaConfig](sk: Int) raises:
        var tiles = ceildiv(ceildiv(n, 64), cfg.bands()) * ceildiv(m, cfg.nt)
        if tiles * sk > 132 or kp // 64 < sk:
            return  # a global split's CTAs must all be resident
        var what = String(cfg.with_split_k(sk), " gsplit M=", m, " N=", n, " Kp=", kp)
        fill_nan[dtype](ctx, op, m * n)
        announce(what)
        launch_int4_gemm_wgmma_gsplit[dtype, group_size, has_zeros, has_bias, cfg](op, xp, qp, sp, zp, bp, m, n, kp, np_, sk, ctx)
        var r = compare_rows[dtype](ctx, op, refbuf, n, 1, m)
        var good = r.rel_err <= TOL and r.nan_count == 0
        print("    direct ", what, ": rel err ", r.rel_err, " unwritten ", r.nan_count, " ", "PASS" if good else "FAIL", flush=True)
        ok = ok and good

    for sk in [2, 3, 5, 8]:
        gsplit[WG_CFG_64](sk)
        gsplit[WG_CFG_128](sk)
        gsplit[WG_CFG_256](sk)
    return ok


def mma_warp_checks[dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool](
    ctx: DeviceContext, op: Pointer[Scalar[dtype], MutAnyOrigin], xp: Pointer[Scalar[dtype], MutAnyOrigin],
    qp: Pointer[UInt32, MutAnyOrigin], sp: Pointer[Scalar[dtype], MutAnyOrigin],
    zp: Pointer[Scalar[dtype], MutAnyOrigin], bp: Pointer[Scalar[dtype], MutAnyOrigin],
    refbuf: DeviceBuffer[F32], m: Int, n: Int, kp: Int, np_: Int, splits: List[Int],
) raises -> Bool:
    """Every PIPE_WARP (M <= 16 decode kernel) config launched directly with each split (>= 1), against `refbuf` (all M rows)."""
    var ok = True

    @always_inline
    @__parameter
    def one[cfg: Int4GemmConfig](sk: Int) raises:
        fill_nan[dtype](ctx, op, m * n)
        announce(String("mma ", cfg.with_split_k(min(sk, INT4_MAX_SPLIT)), " M=", m, " N=", n, " Kp=", kp))
        launch_int4_gemm_mma[dtype, group_size, has_zeros, has_bias, cfg](op, xp, qp, sp, zp, bp, m, n, kp, np_, sk, ctx)
        var r = compare_rows[dtype](ctx, op, refbuf, n, 1, m)
        var good = r.rel_err <= TOL and r.nan_count == 0
        print("    direct mma ", cfg.with_split_k(min(sk, INT4_MAX_SPLIT)), " M=", m, " N=", n, " Kp=", kp, ": rel err ",
              r.rel_err, " unwritten ", r.nan_count, " ", "PASS" if good else "FAIL", flush=True)
        ok = ok and good

    for i in range(len(splits)):
        if m <= 8:
            one[CFG_M8](splits[i])
            one[CFG_M8_NARROW](splits[i])
            one[CFG_M8_K8](splits[i])
        one[CFG_M16](splits[i])
        one[CFG_M16_NARROW](splits[i])
        one[CFG_M16_K8](splits[i])
    return ok


def forced_checks[dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool](
    ctx: DeviceContext, op: Pointer[Scalar[dtype], MutAnyOrigin], xp: Pointer[Scalar[dtype], MutAnyOrigin],
    qp: Pointer[UInt32, MutAnyOrigin], sp: Pointer[Scalar[dtype], MutAnyOrigin],
    zp: Pointer[Scalar[dtype], MutAnyOrigin], bp: Pointer[Scalar[dtype], MutAnyOrigin],
    refbuf: DeviceBuffer[F32], m: Int, n: Int, kp: Int, np_: Int,
) raises -> Bool:
    """The kernels of the forced Ampere and portable paths on this GPU, against `refbuf`: every
    mma.sync config built as the Ampere path builds it (no clusters, split 1, the sm_89 shared
    memory budget; PIPE_WARP configs for M <= 16, the CTA-ring ones above), then the op's
    launcher with FORCE_AMPERE and FORCE_PORTABLE."""
    var ok = True

    @always_inline
    @__parameter
    def check(what: String) raises:
        var r = compare_rows[dtype](ctx, op, refbuf, n, 1, m)
        var good = r.rel_err <= TOL and r.nan_count == 0
        print("    ", what, " M=", m, " N=", n, " Kp=", kp, ": rel err ", r.rel_err, " unwritten ",
              r.nan_count, " ", "PASS" if good else "FAIL", flush=True)
        ok = ok and good

    @always_inline
    @__parameter
    def ampere[cfg: Int4GemmConfig]() raises:
        fill_nan[dtype](ctx, op, m * n)
        announce(String("ampere mma ", cfg, " M=", m, " N=", n, " Kp=", kp))
        launch_int4_gemm_mma[dtype, group_size, has_zeros, has_bias, cfg, False, SMEM_BUDGET_AMPERE_SMALL](
            op, xp, qp, sp, zp, bp, m, n, kp, np_, 1, ctx)
        check(String("ampere direct mma ", cfg))

    if m <= 8:
        ampere[CFG_M8]()
        ampere[CFG_M8_NARROW]()
        ampere[CFG_M8_K8]()
    if m <= 16:
        ampere[CFG_M16]()
        ampere[CFG_M16_NARROW]()
        ampere[CFG_M16_K8]()
    else:
        ampere[CFG_M32]()
        ampere[CFG_M64]()
        ampere[CFG_LARGE]()
    var groups = 1 if group_size <= 0 else kp // group_size
    var out_shape = IndexList[2](m, n)
    var x_shape = IndexList[2](m, kp)
    var q_shape = IndexList[2](np_ // 64, kp * 8)
    var s_shape = IndexList[2](groups, np_)
    fill_nan[dtype](ctx, op, m * n)
    announce(String("forced ampere M=", m, " N=", n, " Kp=", kp))
    launch_int4_gemm[dtype, group_size, has_zeros, has_bias, "gpu", FORCE_AMPERE](
        op, xp, qp, sp, zp, bp, out_shape, x_shape, q_shape, s_shape, s_shape, n, ctx)
    check(String("forced ampere ", int4_gpu_plan_text(m, n, kp, group_size, has_zeros, "sm_90a", FORCE_AMPERE)))
    fill_nan[dtype](ctx, op, m * n)
    announce(String("forced portable M=", m, " N=", n, " Kp=", kp))
    launch_int4_gemm[dtype, group_size, has_zeros, has_bias, "gpu", FORCE_PORTABLE](
        op, xp, qp, sp, zp, bp, out_shape, x_shape, q_shape, s_shape, s_shape, n, ctx)
    check(String("forced portable ", int4_gpu_plan_text(m, n, kp, group_size, has_zeros, "sm_90a", FORCE_PORTABLE)))
    return ok


def _upload_f32_as[dtype: DType](ctx: DeviceContext, src: Pointer[Float32, MutAnyOrigin], n: Int) raises -> DeviceBuffer[dtype]:
    var h = ctx.enqueue_create_host_buffer[dtype](n)
    ctx.synchronize()
    for i in range(n):
        h[i] = src[unsafe_offset=i].cast[dtype]()
    var d = ctx.enqueue_create_buffer[dtype](n)
    ctx.enqueue_copy(d, h)
    return d


def fixture_case[dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool](
    ctx: DeviceContext, base: Pointer[UInt8, MutAnyOrigin], mut off: Int
) raises -> Bool:
    var hdr = base.unsafe_offset(off).unsafe_bitcast[Int32]()
    var m = Int(hdr[unsafe_offset=0])
    var n = Int(hdr[unsafe_offset=1])
    var np_ = Int(hdr[unsafe_offset=2])
    var kp = Int(hdr[unsafe_offset=3])
    var g = Int(hdr[unsafe_offset=4])
    off += 32
    var groups = kp // (kp if g <= 0 else g)
    comptime want_dt = 0 if dtype == DType.bfloat16 else 1
    if g != group_size or Bool(Int(hdr[unsafe_offset=5])) != has_zeros or Bool(Int(hdr[unsafe_offset=6])) != has_bias or Int(hdr[unsafe_offset=7]) != want_dt:
        print("fixture header does not match the instantiation")
        return False
    var nw = np_ // 64 * kp * 8
    var hq = ctx.enqueue_create_host_buffer[DType.uint32](nw)
    ctx.synchronize()
    var qsrc = base.unsafe_offset(off).unsafe_bitcast[UInt32]()
    for i in range(nw):
        hq[i] = qsrc[unsafe_offset=i]
    off += nw * 4
    var qw = ctx.enqueue_create_buffer[DType.uint32](nw)
    ctx.enqueue_copy(qw, hq)
    var x = _upload_f32_as[dtype](ctx, base.unsafe_offset(off).unsafe_bitcast[Float32](), m * kp)
    off += m * kp * 4
    var s = _upload_f32_as[dtype](ctx, base.unsafe_offset(off).unsafe_bitcast[Float32](), groups * np_)
    off += groups * np_ * 4
    var z = _upload_f32_as[dtype](ctx, base.unsafe_offset(off).unsafe_bitcast[Float32](), groups * np_)
    off += groups * np_ * 4
    var b = _upload_f32_as[dtype](ctx, base.unsafe_offset(off).unsafe_bitcast[Float32](), n)
    off += n * 4
    var ref64 = _upload_f32_as[F32](ctx, base.unsafe_offset(off).unsafe_bitcast[Float32](), m * n)
    off += m * n * 4

    var ok = True
    var out = ctx.enqueue_create_buffer[dtype](m * n)
    var refn = ctx.enqueue_create_buffer[F32](m * n)
    var op = out.unsafe_ptr().as_unsafe_any_origin()
    # naive GPU reference vs the float64 fixture result (validates the reference + layout map)
    run_reference[dtype, group_size, has_zeros, has_bias](
        ctx, refn.unsafe_ptr().as_unsafe_any_origin(), x.unsafe_ptr().as_unsafe_any_origin(),
        qw.unsafe_ptr().as_unsafe_any_origin(), s.unsafe_ptr().as_unsafe_any_origin(),
        z.unsafe_ptr().as_unsafe_any_origin(), b.unsafe_ptr().as_unsafe_any_origin(), n, kp, np_, 1, m)
    var rr = compare_rows[F32](ctx, refn.unsafe_ptr().as_unsafe_any_origin(), ref64, n, 1, m)
    print("fixture M=", m, " N=", n, " Np=", np_, " Kp=", kp, " g=", g, " zeros=", has_zeros,
          " bias=", has_bias, " ", dtype, ": naive ref rel err ", rr.rel_err)
    ok = ok and rr.rel_err < 1e-5
    var splits: List[Int] = [0, 1, 2, 3, 8]
    for si in range(len(splits)):
        var sk = splits[si]
        fill_nan[dtype](ctx, op, m * n)
        announce(String(int4_gemm_gpu_config(m, n, kp, group_size, has_zeros, sk), " M=", m, " N=", n, " Kp=", kp))
        int4_gemm_gpu[dtype, group_size, has_zeros, has_bias](
            op, x.unsafe_ptr().as_unsafe_any_origin(), qw.unsafe_ptr().as_unsafe_any_origin(),
            s.unsafe_ptr().as_unsafe_any_origin(), z.unsafe_ptr().as_unsafe_any_origin(),
            b.unsafe_ptr().as_unsafe_any_origin(), m, n, kp, ctx, np_=np_, split_k=sk)
        var r = compare_rows[dtype](ctx, op, ref64, n, 1, m)
        var good = r.rel_err <= TOL and r.nan_count == 0
        print("    ", int4_gemm_gpu_config(m, n, kp, group_size, has_zeros, sk), ": rel err ",
              r.rel_err, " unwritten ", r.nan_count, " ", "PASS" if good else "FAIL", flush=True)
        ok = ok and good
    var wsplits: List[Int] = [1, 2, 3]
    ok = wgmma_checks[dtype, group_size, has_zeros, has_bias](
        ctx, op, x.unsafe_ptr().as_unsafe_any_origin(), qw.unsafe_ptr().as_unsafe_any_origin(),
        s.unsafe_ptr().as_unsafe_any_origin(), z.unsafe_ptr().as_unsafe_any_origin(),
        b.unsafe_ptr().as_unsafe_any_origin(), ref64, m, n, kp, np_, wsplits) and ok
    ok = mma_warp_checks[dtype, group_size, has_zeros, has_bias](
        ctx, op, x.unsafe_ptr().as_unsafe_any_origin(), qw.unsafe_ptr().as_unsafe_any_origin(),
        s.unsafe_ptr().as_unsafe_any_origin(), z.unsafe_ptr().as_unsafe_any_origin(),
        b.unsafe_ptr().as_unsafe_any_origin(), ref64, m, n, kp, np_, wsplits) and ok
    return ok


def random_case[dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool, forced: Bool = False](
    ctx: DeviceContext, m: Int, n: Int, kp: Int
) raises -> Bool:
    """Parameter `forced`: also `forced_checks` (compiled for a few instantiations only: each one builds
    every mma.sync config once more, without clusters)."""
    var np_ = (n + 63) // 64 * 64
    var groups = kp // (kp if group_size <= 0 else group_size)
    var qw = ctx.enqueue_create_buffer[DType.uint32](np_ // 64 * kp * 8)
    var x = ctx.enqueue_create_buffer[dtype](m * kp)
    var s = ctx.enqueue_create_buffer[dtype](groups * np_)
    var z = ctx.enqueue_create_buffer[dtype](groups * np_)
    var b = ctx.enqueue_create_buffer[dtype](n)
    var out = ctx.enqueue_create_buffer[dtype](m * n)
    var refn = ctx.enqueue_create_buffer[F32](m * n)
    var qp = qw.unsafe_ptr().as_unsafe_any_origin()
    var xp = x.unsafe_ptr().as_unsafe_any_origin()
    var sp = s.unsafe_ptr().as_unsafe_any_origin()
    var zp = z.unsafe_ptr().as_unsafe_any_origin()
    var bp = b.unsafe_ptr().as_unsafe_any_origin()
    var op = out.unsafe_ptr().as_unsafe_any_origin()
    fill_u32(ctx, qp, np_ // 64 * kp * 8, 11)
    fill_uniform[dtype](ctx, xp, m * kp, 12, -1.0, 1.0)
    fill_uniform[dtype](ctx, sp, groups * np_, 13, 0.002, 0.01)
    fill_codes[dtype](ctx, zp, groups * np_, 14)
    fill_uniform[dtype](ctx, bp, n, 15, -1.0, 1.0)
    run_reference[dtype, group_size, has_zeros, has_bias](
        ctx, refn.unsafe_ptr().as_unsafe_any_origin(), xp, qp, sp, zp, bp, n, kp, np_, 1, m)
    var ok = True
    var splits: List[Int] = [0, 1, 4, 8]
    for si in range(len(splits)):
        fill_nan[dtype](ctx, op, m * n)
        announce(String(int4_gemm_gpu_config(m, n, kp, group_size, has_zeros, splits[si]), " M=", m, " N=", n, " Kp=", kp))
        int4_gemm_gpu[dtype, group_size, has_zeros, has_bias](op, xp, qp, sp, zp, bp, m, n, kp, ctx, split_k=splits[si])
        var r = compare_rows[dtype](ctx, op, refn, n, 1, m)
        var good = r.rel_err <= TOL and r.nan_count == 0
        print("random M=", m, " N=", n, " Kp=", kp, " g=", group_size, " ", dtype, " ",
              int4_gemm_gpu_config(m, n, kp, group_size, has_zeros, splits[si]), ": rel err ",
              r.rel_err, " unwritten ", r.nan_count, " ", "PASS" if good else "FAIL", flush=True)
        ok = ok and good
    var wsplits: List[Int] = [0, 1, 4, 5, 6]
    ok = wgmma_checks[dtype, group_size, has_zeros, has_bias](ctx, op, xp, qp, sp, zp, bp, refn, m, n, kp, np_, wsplits) and ok
    if m <= 16:
        var msplits: List[Int] = [1, 2, 4, 8]
        ok = mma_warp_checks[dtype, group_size, has_zeros, has_bias](ctx, op, xp, qp, sp, zp, bp, refn, m, n, kp, np_, msplits) and ok
    comptime if forced:
        ok = forced_checks[dtype, group_size, has_zeros, has_bias](ctx, op, xp, qp, sp, zp, bp, refn, m, n, kp, np_) and ok
    return ok


def main() raises:
    var ok = check_resolver()
    var ctx = DeviceContext()
    var path = String(".gpu-bin/int4_gemm_fixture.bin")
    var args = argv()
    if len(args) > 1:
        path = String(args[1])
    var small = small_mode()
    # the build's racecheck switches (all at their defaults in the normal build)
    print("build: INT4_SMEM_BUDGET=", INT4_SMEM_BUDGET, " INT4_MAX_SPLIT=", INT4_MAX_SPLIT,
          " INT4_SETMAXNREG=", INT4_SETMAXNREG, " small=", small, flush=True)
    var data: List[UInt8]
    with open(path, "r") as f:
        data = f.read_bytes()
    var base = data.unsafe_ptr().as_unsafe_any_origin()
    var ncases = Int(base.unsafe_bitcast[Int32]()[unsafe_offset=0])
    var off = 4
    # the instantiations follow CASES in int4_gemm_fixture.py
    ok = fixture_case[DType.bfloat16, 128, True, True](ctx, base, off) and ok
    ok = fixture_case[DType.float16, 64, True, False](ctx, base, off) and ok
    ok = fixture_case[DType.float16, -1, False, False](ctx, base, off) and ok
    ok = fixture_case[DType.bfloat16, 32, False, True](ctx, base, off) and ok
    ok = fixture_case[DType.bfloat16, 128, False, False](ctx, base, off) and ok
    if ncases != 5 or off != len(data):
        print("fixture: expected 5 cases and", len(data), "bytes, read", off, flush=True)
        ok = False
    # forced = True: also the forced Ampere / portable paths (M = 33: CFG_M64, M = 130:
    # CFG_LARGE, M = 7 / 3: the M <= 8 configs, M = 16: the 9..16 ones, all without clusters)
    ok = random_case[DType.float16, 128, True, True, True](ctx, 33, 1000, 2048) and ok
    ok = random_case[DType.bfloat16, -1, True, False, True](ctx, 3, 4096, 4096) and ok
    ok = random_case[DType.bfloat16, 32, True, True, True](ctx, 7, 520, 1024) and ok
    ok = random_case[DType.float16, 128, False, True, True](ctx, 16, 1536, 3072) and ok
    # wgmma-sized: many M-tiles (raster groups), N tails (partial CTA band sets), per-channel, g32
    if not small:
        ok = random_case[DType.bfloat16, 64, True, False](ctx, 1200, 2112, 1024) and ok
    ok = random_case[DType.float16, -1, False, True](ctx, 200, 4096, 2048) and ok
    ok = random_case[DType.bfloat16, 32, True, True, True](ctx, 130, 1000, 1024) and ok
    # 17..32 tokens: the wgmma dispatch with a 64-token tile mostly empty (or the table's CFG_M32)
    ok = random_case[DType.bfloat16, 128, False, False](ctx, 24, 2112, 2048) and ok
    if not small:
        ok = random_case[DType.bfloat16, 128, False, False](ctx, 520, 6144, 4096) and ok
        # a long-K layer (Gemma-2-27B's down projection) at 256 tokens: the dispatch's stream-K;
        # Llama-3 8B's down projection at 128 tokens: its split without a cluster
        ok = random_case[DType.bfloat16, 128, False, True](ctx, 256, 4608, 36864) and ok
    ok = random_case[DType.float16, 128, True, True](ctx, 128, 4096, 14336) and ok
    print("int4_gemm_gpu_test:", "ALL PASS" if ok else "FAILED", flush=True)
    if not ok:
        exit(1)

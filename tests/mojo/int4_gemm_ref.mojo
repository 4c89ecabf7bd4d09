"""Helpers shared by the W4A16 GPU test and benchmark (standalone programs, built with
scripts/build-gpu-bin): random fills on the device, a naive fp32 reference kernel that decodes
the packed layout element by element (inverse index map of mojo_gemm/int4/layout.py), comparison, and a
GPU-timed launch loop.
"""

from max.gpu import thread_idx, block_idx, block_dim, global_idx
from max.gpu.host import DeviceContext, DeviceBuffer
from std.math import ceildiv, sqrt
from std.sys import inlined_assembly
from std.utils.numerics import nan

comptime F32 = DType.float32
comptime U32Ptr = Pointer[UInt32, MutAnyOrigin]
comptime F32Ptr = Pointer[Float32, MutAnyOrigin]


@always_inline
def hash32(v: UInt32) -> UInt32:
    """A cheap integer hash (lowbias32) for reproducible device-side random data."""
    var x = v
    x ^= x >> 16
    x *= 0x7FEB352D
    x ^= x >> 15
    x *= 0x846CA68B
    x ^= x >> 16
    return x


def fill_u32_kernel(p: U32Ptr, n: Int64, seed: UInt32):
    var i = global_idx.x
    if i < Int(n):
        p[unsafe_offset=i] = hash32(UInt32(i) * 0x9E3779B9 + seed)


def fill_uniform_kernel[dtype: DType](p: Pointer[Scalar[dtype], MutAnyOrigin], n: Int64, seed: UInt32, lo: Float32, hi: Float32):
    var i = global_idx.x
    if i < Int(n):
        var u = Float32(hash32(UInt32(i) * 0x9E3779B9 + seed) >> 8) / 16777216.0
        p[unsafe_offset=i] = (lo + (hi - lo) * u).cast[dtype]()


def fill_codes_kernel[dtype: DType](p: Pointer[Scalar[dtype], MutAnyOrigin], n: Int64, seed: UInt32):
    """Integer zero points 0..15 (exact in bf16 / fp16)."""
    var i = global_idx.x
    if i < Int(n):
        p[unsafe_offset=i] = Float32(hash32(UInt32(i) * 0x9E3779B9 + seed) & 15).cast[dtype]()


def fill_nan_kernel[dtype: DType](p: Pointer[Scalar[dtype], MutAnyOrigin], n: Int64):
    """Poison: every element NaN, so an unwritten output can never pass a check."""
    var i = global_idx.x
    if i < Int(n):
        p[unsafe_offset=i] = nan[dtype]()


def fill_uniform[dtype: DType](ctx: DeviceContext, p: Pointer[Scalar[dtype], MutAnyOrigin], n: Int, seed: UInt32, lo: Float32, hi: Float32) raises:
    ctx.enqueue_function[fill_uniform_kernel[dtype]](p, Int64(n), seed, lo, hi, grid_dim=ceildiv(n, 256), block_dim=256)


def fill_u32(ctx: DeviceContext, p: U32Ptr, n: Int, seed: UInt32) raises:
    ctx.enqueue_function[fill_u32_kernel](p, Int64(n), seed, grid_dim=ceildiv(n, 256), block_dim=256)


def fill_codes[dtype: DType](ctx: DeviceContext, p: Pointer[Scalar[dtype], MutAnyOrigin], n: Int, seed: UInt32) raises:
    ctx.enqueue_function[fill_codes_kernel[dtype]](p, Int64(n), seed, grid_dim=ceildiv(n, 256), block_dim=256)


def fill_nan[dtype: DType](ctx: DeviceContext, p: Pointer[Scalar[dtype], MutAnyOrigin], n: Int) raises:
    ctx.enqueue_function[fill_nan_kernel[dtype]](p, Int64(n), grid_dim=ceildiv(n, 256), block_dim=256)


comptime REF_ROWS = 16
"""Rows of x per reference thread (the packed word is decoded once for all of them)."""


@always_inline
def sample_row(i: Int, dense: Int, row_step: Int) -> Int:
    """Row of x / C checked as sample i: rows 0..dense-1, then every row_step-th row after them,
    shifted by i % 8 when row_step >= 8 so that all 8 token positions of an n8 MMA tile are hit
    (with dense = 0 and row_step < 8 this is just i * row_step)."""
    if i < dense:
        return i
    var j = i - dense
    return dense + j * row_step + (j % 8 if row_step >= 8 else 0)


def ref_kernel[dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool](
    ref_out: F32Ptr,
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    qw: U32Ptr,
    s: Pointer[Scalar[dtype], MutAnyOrigin],
    z: Pointer[Scalar[dtype], MutAnyOrigin],
    b: Pointer[Scalar[dtype], MutAnyOrigin],
    n32: Int32, kp32: Int32, np32: Int32, row_step32: Int32, nrows32: Int32, dense32: Int32,
):
    """ref_out[i, n] = Σ_k x[sample_row(i), k] · W[n, k] (+ bias[n]) in fp32, i < nrows.

    W is decoded one element at a time with the inverse of int4/layout.py's map:
    band T = n / 64, nl = n % 64, r = nl % 16, w = nl / 16, kt = k / 16, kl = k % 16,
    lane = 4 (r % 8) + (kl % 8) / 2, nibble j = 4 (kl % 2) + 2 (r / 8) + kl / 8,
    word = T·Kp·8 + kt·128 + 4·lane + w; scale column 64T + 8 (nl % 8) + nl / 8.
    """
    var n = block_idx.x * block_dim.x + thread_idx.x
    var i0 = block_idx.y * REF_ROWS
    var N = Int(n32)
    var kp = Int(kp32)
    var np_ = Int(np32)
    var row_step = Int(row_step32)
    var nrows = Int(nrows32)
    var dense = Int(dense32)
    if n >= N:
        return
    var acc = Array[Float32, REF_ROWS](fill=0)
    var band = n // 64
    var nl = n % 64
    var r = nl % 16
    var w = nl // 16
    var scol = band * 64 + 8 * (nl % 8) + nl // 8
    var gs = kp if group_size <= 0 else group_size
    for k in range(kp):
        var kt = k // 16
        var kl = k % 16
        var lane = 4 * (r % 8) + (kl % 8) // 2
        var j = 4 * (kl % 2) + 2 * (r // 8) + kl // 8
        var word = qw[unsafe_offset=band * kp * 8 + kt * 128 + 4 * lane + w]
        var q = Float32((word >> UInt32(4 * j)) & 0xF)
        var grp = k // gs
        var sc = s[unsafe_offset=grp * np_ + scol].cast[F32]()
        var zz: Float32 = 8.0
        comptime if has_zeros:
            zz = z[unsafe_offset=grp * np_ + scol].cast[F32]()
        var wv = (q - zz) * sc
        comptime for ii in range(REF_ROWS):
            if i0 + ii < nrows:
                acc[ii] += x[unsafe_offset=sample_row(i0 + ii, dense, row_step) * kp + k].cast[F32]() * wv
    var bias: Float32 = 0
    comptime if has_bias:
        bias = b[unsafe_offset=n].cast[F32]()
    comptime for ii in range(REF_ROWS):
        if i0 + ii < nrows:
            ref_out[unsafe_offset=(i0 + ii) * N + n] = acc[ii] + bias


def run_reference[dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool](
    ctx: DeviceContext, ref_out: F32Ptr, x: Pointer[Scalar[dtype], MutAnyOrigin], qw: U32Ptr,
    s: Pointer[Scalar[dtype], MutAnyOrigin], z: Pointer[Scalar[dtype], MutAnyOrigin],
    b: Pointer[Scalar[dtype], MutAnyOrigin], n: Int, kp: Int, np_: Int, row_step: Int, nrows: Int,
    dense: Int = 0,
) raises:
    ctx.enqueue_function[ref_kernel[dtype, group_size, has_zeros, has_bias]](
        ref_out, x, qw, s, z, b, Int32(n), Int32(kp), Int32(np_), Int32(row_step), Int32(nrows), Int32(dense),
        grid_dim=(ceildiv(n, 128), ceildiv(nrows, REF_ROWS)), block_dim=128,
    )


def gather_rows_kernel[dtype: DType](dst: F32Ptr, src: Pointer[Scalar[dtype], MutAnyOrigin], n32: Int32, row_step32: Int32, nrows32: Int32, dense32: Int32):
    var i = global_idx.x
    var N = Int(n32)
    if i < N * Int(nrows32):
        dst[unsafe_offset=i] = src[unsafe_offset=sample_row(i // N, Int(dense32), Int(row_step32)) * N + i % N].cast[F32]()


@fieldwise_init
struct CheckResult(ImplicitlyCopyable, Movable):
    var rel_err: Float64
    var nan_count: Int
    var ref_norm: Float64


def compare_rows[dtype: DType](
    ctx: DeviceContext, got_ptr: Pointer[Scalar[dtype], MutAnyOrigin], ref_out: DeviceBuffer[F32],
    n: Int, row_step: Int, nrows: Int, dense: Int = 0,
) raises -> CheckResult:
    """Rel. Frobenius error of out[sample_row(i), :] vs ref_out[i, :], i < nrows (+ NaN count)."""
    var cnt = n * nrows
    var got = ctx.enqueue_create_buffer[F32](cnt)
    ctx.enqueue_function[gather_rows_kernel[dtype]](
        got, got_ptr, Int32(n), Int32(row_step), Int32(nrows), Int32(dense), grid_dim=ceildiv(cnt, 256), block_dim=256)
    var hg = ctx.enqueue_create_host_buffer[F32](cnt)
    var hr = ctx.enqueue_create_host_buffer[F32](cnt)
    ctx.enqueue_copy(hg, got)
    ctx.enqueue_copy(hr, ref_out)
    ctx.synchronize()
    var d2: Float64 = 0
    var r2: Float64 = 0
    var nans = 0
    for i in range(cnt):
        var g = Float64(hg[i])
        var r = Float64(hr[i])
        if g != g:
            nans += 1
            continue
        d2 += (g - r) * (g - r)
        r2 += r * r
    var rel = sqrt(d2) / sqrt(r2) if r2 > 0 else sqrt(d2)
    if nans > 0:
        rel = Float64.MAX
    return CheckResult(rel, nans, sqrt(r2))


@always_inline
def _globaltimer() -> UInt64:
    return inlined_assembly["mov.u64 $0, %globaltimer;", UInt64, constraints="=l", has_side_effect=True]()


def spin_kernel(ns: Int64):
    """Keeps the GPU busy for `ns` nanoseconds, so the launches queued behind it run back to back
    (the host enqueues them meanwhile): the timed loop then measures device time only."""
    if thread_idx.x == 0:
        var t0 = _globaltimer()
        while Int64(_globaltimer() - t0) < ns:
            pass

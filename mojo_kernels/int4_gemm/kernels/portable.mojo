"""Portable GPU path of `multistage_gemm_q` (AMD, and a forced path on NVIDIA): a tiled fp32
kernel written with vendor-neutral primitives only (shared-memory tiles, barrier()).

One CTA of THREADS threads computes C[m0 : m0 + BM, n0 : n0 + 64] (one packed band). Per step
of BK = 32 K rows it stages the x rows (fp32) and the band's two packed tiles, dequantized to
fp32 w = (q - z) · s with the index maps of layout.mojo, then every thread accumulates its
column over BM / 4 tokens. Correctness first: no tensor cores, the packed words are read once
per code (the 8 codes of a word are decoded by the 8 threads that need them).
"""

from std.math import ceildiv
from std.memory import stack_allocation
from max.gpu import barrier, block_idx, thread_idx
from max.gpu.host import DeviceContext
from max.gpu.memory import AddressSpace

from ..layout import K_TILE, N_TILE, WORDS_PER_TILE, permuted_col, tile_k_local, tile_n_local

comptime F32 = DType.float32
comptime THREADS = 256
comptime BM = 32
"""Tokens per CTA."""
comptime BK = 32
"""K rows per shared-memory step (two packed tiles; Kp is a multiple of 128)."""
comptime ROWS_PER_THREAD = BM * N_TILE // THREADS


@always_inline
def packed_word(n_local: Int, k_local: Int) -> Int:
    """Word (0..127) of a packed 16 x 64 tile holding column `n_local`, K row `k_local`: the
    inverse of layout.tile_n_local / tile_k_local (lane = 4 (n % 8) + (k / 2) % 4, word =
    4 lane + n / 16)."""
    return 4 * (4 * (n_local % 8) + (k_local // 2) % 4) + n_local // 16


@always_inline
def packed_nibble(n_local: Int, k_local: Int) -> Int:
    """Nibble (0..7) of `packed_word(n_local, k_local)` holding that code."""
    return k_local // 8 + 2 * ((n_local // 8) % 2) + 4 * (k_local % 2)


def packed_maps_are_inverse() -> Bool:
    """True when `packed_word` / `packed_nibble` invert layout.tile_n_local / tile_k_local for
    every code of a tile (checked at compile time by the kernel)."""
    for word in range(WORDS_PER_TILE):
        for nibble in range(8):
            var nl = tile_n_local(word, nibble)
            var kl = tile_k_local(word, nibble)
            if packed_word(nl, kl) != word or packed_nibble(nl, kl) != nibble:
                return False
    return True


def _int4_portable_kernel[dtype: DType, has_zeros: Bool, has_bias: Bool](
    c_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    x_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    qw_ptr: Pointer[UInt32, MutAnyOrigin],
    s_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    z_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    b_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    m_dim: Int32,
    n_dim: Int32,
    kp_dim: Int32,
    np_dim: Int32,
    group_dim: Int32,
):
    """Grid (ceil(N / 64), ceil(M / BM)), block THREADS: thread t owns column t % 64 of the
    band and tokens ROWS_PER_THREAD * (t // 64) + i."""
    comptime assert packed_maps_are_inverse(), "packed_word / packed_nibble disagree with layout.mojo"
    var x_sh = stack_allocation[BM * BK, Float32, address_space=AddressSpace.SHARED]()
    var w_sh = stack_allocation[BK * N_TILE, Float32, address_space=AddressSpace.SHARED]()
    var tid = thread_idx.x
    var col = tid % N_TILE
    var rg = tid // N_TILE
    var band = block_idx.x
    var m0 = block_idx.y * BM
    var m = Int(m_dim)
    var n = Int(n_dim)
    var kp = Int(kp_dim)
    var np_ = Int(np_dim)
    var group = Int(group_dim)
    var band_words = qw_ptr.unsafe_offset(band * kp * 8)
    var acc = SIMD[F32, ROWS_PER_THREAD](0)
    for k0 in range(0, kp, BK):
        for e in range(tid, BM * BK, THREADS):
            var r = e // BK
            var tok = m0 + r
            x_sh[unsafe_offset=e] = x_ptr[unsafe_offset=tok * kp + k0 + e % BK].cast[F32]() if tok < m else Float32(0)
        for e in range(tid, BK * N_TILE, THREADS):
            var kr = e // N_TILE
            var nl = e % N_TILE
            var k = k0 + kr
            var kl = k % K_TILE
            var word = band_words[unsafe_offset=(k // K_TILE) * WORDS_PER_TILE + packed_word(nl, kl)]
            var q = ((word >> UInt32(4 * packed_nibble(nl, kl))) & 0xF).cast[F32]()
            var off = (k // group) * np_ + permuted_col(band * N_TILE + nl)
            var z = Float32(8)
            comptime if has_zeros:
                z = z_ptr[unsafe_offset=off].cast[F32]()
            w_sh[unsafe_offset=e] = (q - z) * s_ptr[unsafe_offset=off].cast[F32]()
        barrier()
        for kr in range(BK):
            var w = w_sh[unsafe_offset=kr * N_TILE + col]
            comptime for i in range(ROWS_PER_THREAD):
                acc[i] += x_sh[unsafe_offset=(rg * ROWS_PER_THREAD + i) * BK + kr] * w
        barrier()
    var nn = band * N_TILE + col
    if nn >= n:
        return
    var bias = Float32(0)
    comptime if has_bias:
        bias = b_ptr[unsafe_offset=nn].cast[F32]()
    comptime for i in range(ROWS_PER_THREAD):
        var tok = m0 + rg * ROWS_PER_THREAD + i
        if tok < m:
            c_ptr[unsafe_offset=tok * n + nn] = (acc[i] + bias).cast[dtype]()


def int4_gemm_gpu_portable[dtype: DType, has_zeros: Bool, has_bias: Bool](
    output: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    qweight: Pointer[UInt32, MutAnyOrigin],
    scales: Pointer[Scalar[dtype], MutAnyOrigin],
    zeros: Pointer[Scalar[dtype], MutAnyOrigin],
    bias: Pointer[Scalar[dtype], MutAnyOrigin],
    m: Int,
    n: Int,
    kp: Int,
    np_: Int,
    group: Int,
    ctx: DeviceContext,
) raises:
    """Computes output[M, N] = x[M, Kp] · W[N, Kp]ᵀ (+ bias) with the portable kernel (device pointers;
    shapes as validated by Int4GemmShape: group = K rows per scale row, Kp for per-channel)."""
    if m == 0 or n == 0:
        return
    ctx.enqueue_function[_int4_portable_kernel[dtype, has_zeros, has_bias]](
        output, x, qweight, scales, zeros, bias, Int32(m), Int32(n), Int32(kp), Int32(np_), Int32(group),
        grid_dim=(ceildiv(n, N_TILE), ceildiv(m, BM)),
        block_dim=THREADS,
    )


def int4_portable_plan_text(m: Int, n: Int) -> String:
    """The launch of `int4_gemm_gpu_portable`, for the plan op."""
    return String("int4_gemm_portable BMxBNxBK=", BM, "x", N_TILE, "x", BK, " grid=",
                  ceildiv(n, N_TILE), "x", ceildiv(m, BM))

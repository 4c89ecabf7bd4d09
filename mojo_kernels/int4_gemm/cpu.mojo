"""CPU path of `multistage_gemm_q`: out = x · dequant(qweight)ᵀ (+ bias), fp32 accumulation.

Work split: (64-column band) x (block of up to MB_MAX rows) items run in parallel. An item walks
K in blocks of KB rows. Per K block it dequantizes the band ONCE into an fp32 [kb][64] buffer
(columns in the row-view order of layout.mojo, which makes the nibble decode plain SIMD shifts),
converts the matching x block to fp32 once, and then runs an MR-row x 64-column
register-blocked FMA micro-kernel over all of its rows. Items of at most FUSED_MAX_ROWS rows
(decode-style M) skip the buffer: each dequantized vector goes straight into the FMAs. The fp32
accumulators of the item live in a [rows][64] buffer between K blocks; the epilogue maps
row-view columns back to logical columns, adds the bias, casts and writes only columns n < N."""

from std.math import ceildiv
from std.memory.alloc import unsafe_alloc
from std.sys import num_logical_cores
from max.algorithm import sync_parallelize

from ..common.int4 import nibble_codes
from .layout import (
    Int4GemmShape,
    K_TILE,
    N_TILE,
    PACK_FACTOR,
    ROW_VIEW_LANES,
    row_view_is_consistent,
    row_view_n_local,
    row_view_nibble,
    row_view_scale_mask,
    row_view_word,
    tile_word_offset,
)

comptime F32 = DType.float32
comptime F32Ptr = Pointer[Float32, MutAnyOrigin]
comptime U32Ptr = Pointer[UInt32, MutAnyOrigin]
comptime ElemPtr[dtype: DType] = Pointer[Scalar[dtype], MutAnyOrigin]

comptime KB = 256
"""K rows dequantized per step: the [KB][64] fp32 weight buffer (64 KiB) stays in L2."""
comptime MB_MAX = 128
"""Most rows per work item: bounds the fp32 x block (MB_MAX x KB) and the accumulators."""
comptime MR = 4
"""Rows per micro-kernel call: MR x 64 fp32 accumulators held in SIMD registers."""
comptime FUSED_MAX_ROWS = MR
"""Items with at most this many rows skip the weight buffer (`_k_block` fused mode)."""
comptime ITEMS_PER_WORKER = 4
"""Target work items per core, so that uneven items still balance."""


@always_inline
def _gather_row_view[b: Int, h: Int](tile: U32Ptr) -> SIMD[DType.uint32, ROW_VIEW_LANES]:
    """The 16 words of half `h` of the row view for K rows with (k_local >> 1) & 3 == b."""
    comptime assert row_view_is_consistent(), "row view disagrees with the tile index maps"
    var c0 = tile.unsafe_load[width=4](row_view_word(b, h, 0))
    var c1 = tile.unsafe_load[width=4](row_view_word(b, h, 4))
    var c2 = tile.unsafe_load[width=4](row_view_word(b, h, 8))
    var c3 = tile.unsafe_load[width=4](row_view_word(b, h, 12))
    return c0.join(c1).join(c2.join(c3))


@always_inline
def _load_group_params[dtype: DType, has_zeros: Bool](
    scale_row: ElemPtr[dtype], zero_row: ElemPtr[dtype], s_out: F32Ptr, zs_out: F32Ptr
):
    """Scales s and offsets -z*s of one group of one band, in row-view order.

    scale_row / zero_row: the band's 64 stored (permuted) entries of the group's row.
    s_out / zs_out: 64 fp32 each. z = 8 when not has_zeros (zero_row is not read).
    """
    var st = scale_row.unsafe_load[width=N_TILE](0).cast[F32]()
    var zt = SIMD[F32, N_TILE](8)
    comptime if has_zeros:
        zt = zero_row.unsafe_load[width=N_TILE](0).cast[F32]()
    comptime for j1 in range(2):
        comptime mask = row_view_scale_mask[j1]()
        comptime for h in range(2):
            comptime lo = 32 * h
            comptime hi = 32 * h + 16
            var s = st.slice[16, offset=lo]().shuffle[mask](st.slice[16, offset=hi]())
            var z = zt.slice[16, offset=lo]().shuffle[mask](zt.slice[16, offset=hi]())
            s_out.unsafe_store(32 * j1 + 16 * h, s)
            zs_out.unsafe_store(32 * j1 + 16 * h, -z * s)


@always_inline
def _dequant_tile(tile: U32Ptr, s: F32Ptr, zs: F32Ptr, dst: F32Ptr):
    """Dequantize one packed 16 x 64 tile (128 words) into dst: 16 rows x 64 fp32, row-view
    column order; w = q * s + (-z * s) with s, zs from `_load_group_params`."""
    comptime for b in range(4):
        var u0 = _gather_row_view[b, 0](tile)
        var u1 = _gather_row_view[b, 1](tile)
        # The four K rows served by these words: k_local = 2b + 8*j0 + j2.
        comptime for q in range(4):
            comptime k_local = 2 * b + 8 * (q >> 1) + (q & 1)
            var row = dst.unsafe_offset(k_local * N_TILE)
            comptime for j1 in range(2):
                comptime shift = 4 * row_view_nibble(k_local, j1)
                comptime p0 = 32 * j1
                comptime p1 = 32 * j1 + 16
                row.unsafe_store(p0, nibble_codes(u0, shift).fma(
                    s.unsafe_load[width=16](p0), zs.unsafe_load[width=16](p0)))
                row.unsafe_store(p1, nibble_codes(u1, shift).fma(
                    s.unsafe_load[width=16](p1), zs.unsafe_load[width=16](p1)))


@always_inline
def _fused_tile[rows: Int, sets: Int](
    tile: U32Ptr, s: F32Ptr, zs: F32Ptr, xs: F32Ptr, x_stride: Int,
    mut c: Array[SIMD[F32, 16], 4 * rows * sets],
):
    """Dequantize one packed tile and FMA it straight into register accumulators (few rows).

    xs: the tile's 16 K columns of `rows` fp32 x rows (row stride x_stride). c[(set*rows + r)*4
    + v] accumulates row r, row-view columns 16v..16v+15; K rows alternate over `sets` sets.
    """
    comptime for b in range(4):
        var u0 = _gather_row_view[b, 0](tile)
        var u1 = _gather_row_view[b, 1](tile)
        comptime for q in range(4):
            comptime k_local = 2 * b + 8 * (q >> 1) + (q & 1)
            comptime base = (q % sets) * rows * 4
            comptime for j1 in range(2):
                comptime shift = 4 * row_view_nibble(k_local, j1)
                comptime for h in range(2):
                    comptime p = 32 * j1 + 16 * h
                    var w = nibble_codes(u0 if h == 0 else u1, shift).fma(
                        s.unsafe_load[width=16](p), zs.unsafe_load[width=16](p))
                    comptime for r in range(rows):
                        comptime i = base + r * 4 + 2 * j1 + h
                        c[i] = SIMD[F32, 16](xs[unsafe_offset=r * x_stride + k_local]).fma(w, c[i])


@always_inline
def _micro_kernel[rows: Int](w: F32Ptr, xs: F32Ptr, x_stride: Int, acc: F32Ptr, kb: Int):
    """acc[r][0:64] += sum_{k < kb} xs[r * x_stride + k] * w[k][0:64] for r < rows.

    w: [kb][64] fp32; xs: fp32 rows with stride x_stride; acc: [rows][64] fp32; kb % 4 == 0.
    """
    # With few rows, one accumulator set per row is a chain of dependent FMAs (latency bound):
    # split k over `ku` accumulator sets and add them up at the end.
    comptime ku = 4 if rows == 1 else (2 if rows < MR else 1)
    var c = Array[SIMD[F32, N_TILE], rows * ku](fill=0)
    comptime for r in range(rows):
        c[r] = acc.unsafe_load[width=N_TILE](r * N_TILE)
    for k0 in range(0, kb, ku):
        comptime for u in range(ku):
            var wk = w.unsafe_load[width=N_TILE]((k0 + u) * N_TILE)
            comptime for r in range(rows):
                c[u * rows + r] = SIMD[F32, N_TILE](xs[unsafe_offset=r * x_stride + k0 + u]).fma(
                    wk, c[u * rows + r])
    comptime for r in range(rows):
        comptime for u in range(1, ku):
            c[r] += c[u * rows + r]
        acc.unsafe_store(r * N_TILE, c[r])


def _k_block[dtype: DType, has_zeros: Bool, fused_rows: Int](
    qband: U32Ptr,
    scales: ElemPtr[dtype],
    zeros: ElemPtr[dtype],
    shape: Int4GemmShape,
    col0: Int,
    k0: Int,
    kb: Int,
    s: F32Ptr,
    zs: F32Ptr,
    xbuf: F32Ptr,
    wbuf: F32Ptr,
    acc: F32Ptr,
):
    """Walk the packed tiles of K rows [k0, k0 + kb) of one band.

    fused_rows == 0: dequantize them into wbuf ([kb][64] fp32, row-view order).
    fused_rows > 0: FMA them straight into acc ([fused_rows][64] fp32) with the x block
    xbuf ([fused_rows][kb] fp32); for so few rows the wbuf round trip would dominate.
    """
    comptime rows = max(fused_rows, 1)  # accumulator rows (unused when fused_rows == 0)
    comptime sets = 2 if rows <= 2 else 1  # independent FMA chains per row
    var c = Array[SIMD[F32, 16], 4 * rows * sets](fill=0)
    # Group params change at most once per tile (g is a multiple of 16).
    var group = -1
    for t in range(kb // K_TILE):
        var k = k0 + t * K_TILE
        if k // shape.group != group:
            group = k // shape.group
            var off = group * shape.Np + col0
            _load_group_params[dtype, has_zeros](
                scales.unsafe_offset(off), zeros.unsafe_offset(off), s, zs
            )
        var tile = qband.unsafe_offset(tile_word_offset(k))
        comptime if fused_rows == 0:
            _dequant_tile(tile, s, zs, wbuf.unsafe_offset(t * K_TILE * N_TILE))
        else:
            _fused_tile[rows, sets](tile, s, zs, xbuf.unsafe_offset(t * K_TILE), kb, c)
    comptime if fused_rows > 0:
        comptime for r in range(fused_rows):
            comptime for v in range(4):
                var sum = acc.unsafe_load[width=16](r * N_TILE + 16 * v)
                comptime for set in range(sets):
                    sum += c[(set * fused_rows + r) * 4 + v]
                acc.unsafe_store(r * N_TILE + 16 * v, sum)


def _band_item[dtype: DType, has_zeros: Bool, has_bias: Bool](
    output: ElemPtr[dtype],
    x: ElemPtr[dtype],
    qweight: U32Ptr,
    scales: ElemPtr[dtype],
    zeros: ElemPtr[dtype],
    bias: ElemPtr[dtype],
    shape: Int4GemmShape,
    band: Int,
    m0: Int,
    rows: Int,
    scratch: F32Ptr,
):
    """Output rows [m0, m0 + rows) x columns of band `band` (64 wide), all of K.

    scratch: fp32, at least `_scratch_floats()` entries (weight block, x block, params, acc).
    """
    var wbuf = scratch
    var xbuf = wbuf.unsafe_offset(KB * N_TILE)
    var s = xbuf.unsafe_offset(MB_MAX * KB)
    var zs = s.unsafe_offset(N_TILE)
    var acc = zs.unsafe_offset(N_TILE)
    for i in range(rows * N_TILE // 16):
        acc.unsafe_store(i * 16, SIMD[F32, 16](0))

    var Kp = shape.Kp
    var col0 = band * N_TILE
    var qband = qweight.unsafe_offset(band * Kp * PACK_FACTOR)
    for k0 in range(0, Kp, KB):
        var kb = min(KB, Kp - k0)

        # x block to fp32, [rows][kb] (kb is a multiple of 128).
        for r in range(rows):
            var src = x.unsafe_offset((m0 + r) * Kp + k0)
            var dst = xbuf.unsafe_offset(r * kb)
            for i in range(0, kb, 16):
                dst.unsafe_store(i, src.unsafe_load[width=16](i).cast[F32]())

        if rows <= FUSED_MAX_ROWS:
            comptime for n in range(1, FUSED_MAX_ROWS + 1):
                if rows == n:
                    _k_block[dtype, has_zeros, n](
                        qband, scales, zeros, shape, col0, k0, kb, s, zs, xbuf, wbuf, acc
                    )
            continue

        _k_block[dtype, has_zeros, 0](
            qband, scales, zeros, shape, col0, k0, kb, s, zs, xbuf, wbuf, acc
        )
        var r = 0
        while r + MR <= rows:
            _micro_kernel[MR](
                wbuf, xbuf.unsafe_offset(r * kb), kb, acc.unsafe_offset(r * N_TILE), kb
            )
            r += MR
        comptime for tail in range(1, MR):
            if rows - r == tail:
                _micro_kernel[tail](
                    wbuf, xbuf.unsafe_offset(r * kb), kb, acc.unsafe_offset(r * N_TILE), kb
                )

    # Epilogue: row-view position p holds logical column col0 + row_view_n_local(p).
    var N = shape.N
    for r in range(rows):
        var orow = output.unsafe_offset((m0 + r) * N)
        for p in range(N_TILE):
            var n = col0 + row_view_n_local(p)
            if n < N:
                var v = acc[unsafe_offset=r * N_TILE + p]
                comptime if has_bias:
                    v += bias[unsafe_offset=n].cast[F32]()
                orow[unsafe_offset=n] = v.cast[dtype]()


@always_inline
def _scratch_floats() -> Int:
    """fp32 scratch per work item: weight block, x block, s and -z*s, accumulators."""
    return KB * N_TILE + MB_MAX * KB + 2 * N_TILE + MB_MAX * N_TILE


def int4_gemm_cpu[dtype: DType, has_zeros: Bool, has_bias: Bool](
    output: ElemPtr[dtype],
    x: ElemPtr[dtype],
    qweight: U32Ptr,
    scales: ElemPtr[dtype],
    zeros: ElemPtr[dtype],
    bias: ElemPtr[dtype],
    shape: Int4GemmShape,
) raises:
    """Int4-weight GEMM on the CPU (all pointers host memory, dense row-major).

    output [M, N] dtype; x [M, Kp] dtype; qweight uint32 [Np/64, Kp*8] (layout.mojo);
    scales / zeros [Kp/g, Np] dtype, permuted (zeros read only when has_zeros);
    bias [N] dtype (read only when has_bias). `shape` must come from Int4GemmShape.validate.
    """
    var M = shape.M
    if M == 0:
        return
    var n_bands = ceildiv(shape.N, N_TILE)  # bands past N are padding only
    # Split M only as far as needed to give every core a few items: each M block re-dequantizes
    # the band, so fewer, taller items are cheaper.
    var m_blocks_wanted = ceildiv(ITEMS_PER_WORKER * num_logical_cores(), n_bands)
    var mb = min(MB_MAX, ceildiv(ceildiv(M, m_blocks_wanted), MR) * MR)
    var m_blocks = ceildiv(M, mb)

    def item(i: Int) {
        var output, var x, var qweight, var scales, var zeros, var bias, var shape,
        var n_bands, var mb
    }:
        var band = i % n_bands
        var m0 = (i // n_bands) * mb
        var scratch = unsafe_alloc[Float32](_scratch_floats(), alignment=64)
        _band_item[dtype, has_zeros, has_bias](
            output, x, qweight, scales, zeros, bias, shape, band, m0, min(mb, shape.M - m0),
            scratch.as_unsafe_any_origin(),
        )
        scratch.unsafe_free()

    sync_parallelize(item, n_bands * m_blocks)

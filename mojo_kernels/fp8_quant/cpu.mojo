"""CPU path of `quantize_fp8_rows`: token rows in parallel, each block vectorized."""

from std.math import ceildiv
from std.sys import num_logical_cores
from max.algorithm import sync_parallelize

from .rows import F32, FP8, U32, abs_bits, quantize, scale_from_amax

comptime VW = 16
"""SIMD width of the loads, the amax and the stores."""
comptime ITEMS_PER_CORE = 4
"""Work items per core (rows are split into this many chunks per core, at most one per row)."""


def quantize_rows_cpu[in_dtype: DType, block: Int](
    x: Pointer[Scalar[in_dtype], MutAnyOrigin],
    data: Pointer[Scalar[FP8], MutAnyOrigin],
    scales: Pointer[Float32, MutAnyOrigin],
    T: Int,
    H: Int,
    x_stride: Int,
) raises:
    """Quantizes x [T, H] (row stride x_stride) to dense e4m3 data [T, H] and scales [ceil(H/block), T]."""
    if T == 0:
        return
    var items = min(T, ITEMS_PER_CORE * num_logical_cores())
    var rows_per_item = ceildiv(T, items)
    var n_kb = ceildiv(H, block)

    def item(i: Int) raises {var x, var data, var scales, var T, var H, var x_stride, var rows_per_item, var n_kb}:
        for t in range(i * rows_per_item, min(T, (i + 1) * rows_per_item)):
            var src = x.unsafe_offset(t * x_stride)
            var dst = data.unsafe_offset(t * H)
            for kb in range(n_kb):
                var c0 = kb * block
                var c1 = min(H, c0 + block)
                var vmax = SIMD[U32, VW](0)
                var c = c0
                while c + VW <= c1:
                    vmax = max(vmax, abs_bits[VW](src.unsafe_load[width=VW](c).cast[F32]()))
                    c += VW
                var amax = vmax.reduce_max()
                while c < c1:
                    amax = max(amax, abs_bits[1](src[unsafe_offset=c].cast[F32]()))
                    c += 1
                var s = scale_from_amax(amax)
                scales[unsafe_offset=kb * T + t] = s
                c = c0
                while c + VW <= c1:
                    dst.unsafe_store(c, quantize[VW](src.unsafe_load[width=VW](c).cast[F32](), s, amax))
                    c += VW
                while c < c1:
                    dst[unsafe_offset=c] = quantize[1](src[unsafe_offset=c].cast[F32](), s, amax)
                    c += 1

    sync_parallelize(item, ceildiv(T, rows_per_item))

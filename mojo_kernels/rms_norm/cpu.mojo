"""CPU path of `rms_norm_rows` / `add_rms_norm_rows`: a plain loop per token (norm.mojo's rule)."""

from std.math import sqrt

from ..fp8_quant.cpu import quantize_rows_cpu
from ..fp8_quant.rows import FP8
from .norm import F32


def rms_norm_rows_cpu[h_dtype: DType, y_dtype: DType, out_dtype: DType, has_y: Bool, QB: Int](
    sum: Pointer[Float32, MutAnyOrigin],
    normed: Pointer[Scalar[out_dtype], MutAnyOrigin],
    data: Pointer[Scalar[FP8], MutAnyOrigin],
    scales: Pointer[Float32, MutAnyOrigin],
    h: Pointer[Scalar[h_dtype], MutAnyOrigin],
    y: Pointer[Scalar[y_dtype], MutAnyOrigin],
    w: Pointer[Float32, MutAnyOrigin],
    T: Int,
    H: Int,
    eps: Float32,
    write_sum: Bool,
) raises:
    """Writes normed [T, H] (and sum [T, H] when write_sum) from h [T, H] (+ y [T, H] when has_y);
    QB > 0: then the normed rows' e4m3 data [T, H] and scales [ceil(H / QB), T], by the
    quantizer's own CPU path."""
    for t in range(T):
        var ss = Float32(0)
        for c in range(H):
            var s = h[unsafe_offset=t * H + c].cast[F32]()
            comptime if has_y:
                s += y[unsafe_offset=t * H + c].cast[F32]()
            ss += s * s
        var rstd = 1 / sqrt(ss / Float32(H) + eps)
        for c in range(H):
            var s = h[unsafe_offset=t * H + c].cast[F32]()
            comptime if has_y:
                s += y[unsafe_offset=t * H + c].cast[F32]()
            if write_sum:
                sum[unsafe_offset=t * H + c] = s
            normed[unsafe_offset=t * H + c] = (s * rstd * w[unsafe_offset=c]).cast[out_dtype]()
    comptime if QB > 0:
        quantize_rows_cpu[out_dtype, QB](normed, data, scales, T, H, H)

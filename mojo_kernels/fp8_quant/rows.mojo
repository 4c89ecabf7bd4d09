"""The arithmetic of `quantize_fp8_rows`, shared by the CPU and GPU paths so both round alike.

Per token t and block kb of `block` columns: scale = amax(|x[t, block kb]|) / 448 (1.0 when the
block is all zeros), q = round_e4m3(clamp(x / scale, ±448)). The division by 448 and by the
scale run in float64 and are rounded once to float32, then to e4m3 (nearest even): exactly what
mojo_gemm.quant.fp8.quantize_fp8_input computes on the host with numpy and ml_dtypes.
"""

comptime F32 = DType.float32
comptime F64 = DType.float64
comptime FP8 = DType.float8_e4m3fn
comptime E4M3_MAX = 448.0
comptime OP_NAME = "quantize_fp8_rows"


@always_inline
def scale_from_amax(amax: Float32) -> Float32:
    """The scale amax / 448 rounded to float32 (computed in float64), or 1.0 for amax == 0."""
    if amax > 0:
        return (Float64(amax) / E4M3_MAX).cast[F32]()
    return 1.0


@always_inline
def quantize[width: Int](x: SIMD[F32, width], scale: Float32) -> SIMD[FP8, width]:
    """The e4m3 value of x / scale (float64, rounded to float32), clamped to ±448, rounded to e4m3."""
    var q = (x.cast[F64]() / Float64(scale)).cast[F32]()
    return q.clamp(-E4M3_MAX, E4M3_MAX).cast[FP8]()

"""The arithmetic of `quantize_fp8_rows`, shared by the CPU and GPU paths so both round alike.

Per token t and block kb of `block` columns: scale = amax(|x[t, block kb]|) / 448 (1.0 when the
block is all zeros), q = round_e4m3(clamp(x / scale, ±448)). The host quantizer
(mojo_gemm.quant.fp8.quantize_fp8_input) divides in float64 and rounds to float32, then to e4m3
(nearest even). Here both divisions run in float32: every operand is a float32 value (x comes
from bf16/fp16/fp32, the scale is float32), and for such operands the correctly rounded float32
quotient equals the float64 quotient rounded to float32 (53 >= 2·24 + 2 bits: no double-rounding
error), so the results are bit-identical at float32 speed.
"""

comptime F32 = DType.float32
comptime FP8 = DType.float8_e4m3fn
comptime E4M3_MAX = Float32(448.0)
comptime OP_NAME = "quantize_fp8_rows"


@always_inline
def scale_from_amax(amax: Float32) -> Float32:
    """The scale amax / 448 (float32, correctly rounded), or 1.0 for amax == 0."""
    if amax > 0:
        return amax / E4M3_MAX
    return 1.0


@always_inline
def quantize[width: Int](x: SIMD[F32, width], scale: Float32) -> SIMD[FP8, width]:
    """The e4m3 value of x / scale (float32, correctly rounded), clamped to ±448."""
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).cast[FP8]()

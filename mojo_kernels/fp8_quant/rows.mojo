"""The arithmetic of `quantize_fp8_rows`, shared by the CPU and GPU paths so both round alike.

Per token t and block kb of `block` columns: scale = amax(|x[t, block kb]|) / 448 (1.0 when the
block is all zeros), q = round_e4m3(clamp(x / scale, ±448)). The host quantizer
(mojo_gemm.quantize_fp8_input) divides in float64 and rounds to float32, then to e4m3
(nearest even). For blocks with amax >= 2^-100 both divisions run in float32: every operand is
a float32 value (x comes from bf16/fp16/fp32, the scale is float32), and for such operands the
correctly rounded float32 quotient equals the float64 quotient rounded to float32 (53 >= 2·24
+ 2 bits: no double-rounding error), so the results are bit-identical at float32 speed.

Subnormals: the CPU runtime treats float32 subnormal operands as zero (DAZ) and flushes
subnormal results (FTZ), and the GPU may too, so nothing here may depend on the floating-point
mode for them:
- amax is the integer max of the |x| bit patterns (monotone in |x| for every non-NaN float32);
- a scale below float32's normal range (amax < 448 · 2^-126) is amax / 448 rounded to nearest
  even in integer arithmetic (both are multiples of 2^-149: the quotient's bits are the
  subnormal encoding);
- a block with amax < 2^-100 (so x or the scale may be subnormal) divides in float64 from
  operands rebuilt exactly from their bits; for amax >= 2^-100 a subnormal x gives a quotient
  below 2^-17, so its e4m3 value is a signed zero whether or not it was flushed.
Non-finite blocks (a NaN or ±inf anywhere in the block, i.e. amax's bits >= inf's): scale NaN
and every e4m3 value of the block NaN (0x7F), so a poisoned token poisons its block visibly
instead of saturating to ±448 or zero.
"""

from std.memory import bitcast

comptime F32 = DType.float32
comptime F64 = DType.float64
comptime U32 = DType.uint32
comptime FP8 = DType.float8_e4m3fn
comptime E4M3_MAX = Float32(448.0)
comptime OP_NAME = "quantize_fp8_rows"

comptime ABS_MASK = UInt32(0x7FFFFFFF)
comptime INF_BITS = UInt32(0x7F800000)
"""|x| bits at or above this: ±inf or NaN."""
comptime NAN_BITS = UInt32(0x7FC00000)
comptime E4M3_NAN = UInt8(0x7F)
comptime NORMAL_SCALE_BITS = UInt32((9 << 23) | 0x600000)
"""448 · 2^-126 = 1.75 · 2^-118: from this amax on, amax / 448 is a normal float32."""
comptime EXACT_BELOW_BITS = UInt32((127 - 100) << 23)
"""2^-100: blocks with a smaller amax take the float64 path."""


@always_inline
def abs_bits[width: Int](x: SIMD[F32, width]) -> SIMD[U32, width]:
    """|x|'s bit patterns: ordered like |x| for non-NaN values, NaN above +inf."""
    return bitcast[U32, width](x) & ABS_MASK


@always_inline
def scale_from_amax(amax: UInt32) -> Float32:
    """The scale amax / 448 (float32, correctly rounded) of a block whose |x| bits max to
    `amax`: 1.0 for amax == 0, NaN for a non-finite block."""
    if amax == 0:
        return 1.0
    if amax >= INF_BITS:
        return bitcast[F32, 1](NAN_BITS)
    if amax >= NORMAL_SCALE_BITS:
        return bitcast[F32, 1](amax) / E4M3_MAX
    # amax = units · 2^-149 (units < 2^32 here); the scale's bits are round(units / 448)
    var e = amax >> 23
    var m = amax & 0x7FFFFF
    var units = UInt64(m) if e == 0 else UInt64(m | 0x800000) << UInt64(e - 1)
    var q = units // 448
    var r = units % 448
    if r > 224 or (r == 224 and (q & 1) == 1):
        q += 1
    return bitcast[F32, 1](UInt32(q))


@always_inline
def _exact_f64[width: Int](x: SIMD[F32, width]) -> SIMD[F64, width]:
    """x as float64, exact for subnormals too whatever the floating-point mode."""
    var b = bitcast[U32, width](x)
    comptime TWO_M149 = bitcast[F64, 1](UInt64(1023 - 149) << 52)
    var mag = (b & 0x7FFFFF).cast[F64]() * TWO_M149
    var sub = (b & INF_BITS).eq(0)
    var signed = (b >> 31).eq(1).select(-mag, mag)
    return sub.select(signed, x.cast[F64]())


@always_inline
def quantize[width: Int](x: SIMD[F32, width], scale: Float32, amax: UInt32) -> SIMD[FP8, width]:
    """The e4m3 value of x / scale (correctly rounded to float32), clamped to ±448; NaN for
    a non-finite block. `scale` and `amax` are the block's (`scale_from_amax`)."""
    if amax >= INF_BITS:
        return bitcast[FP8, width](SIMD[DType.uint8, width](E4M3_NAN))
    if amax >= EXACT_BELOW_BITS:
        return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).cast[FP8]()
    var q = (_exact_f64[width](x) / _exact_f64[width](SIMD[F32, width](scale))).cast[F32]()
    return q.clamp(-E4M3_MAX, E4M3_MAX).cast[FP8]()

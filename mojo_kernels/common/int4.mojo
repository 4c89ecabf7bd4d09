"""Decoding of 4-bit codes packed 8 per uint32 word (nibble j in bits 4j..4j+3)."""


@always_inline
def nibble_codes[width: SIMDLength](
    words: SIMD[DType.uint32, width], shift: Int
) -> SIMD[DType.float32, width]:
    """The codes (0..15, as float32) at bit `shift` of each word."""
    # Via int32: the values fit, and the signed convert is the cheaper instruction on x86.
    return (((words >> UInt32(shift)) & 0xF).cast[DType.int32]()).cast[DType.float32]()

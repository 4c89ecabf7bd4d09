"""The name, limits and the top-k order of `moe_route_topk_group`, shared by the CPU and GPU paths.

Top-k order: expert e's logit v is ranked by the 64-bit key (ord(v) << 32) | (2^32 - 1 - e),
where ord maps float32 bits to unsigned integers in numeric order (-0.0 counted as +0.0, so
the two zeros tie like they compare). Keys are unique per expert, so "the largest key below
the previous pick" walks the experts by decreasing logit, ties towards the lower expert id,
with no marking of the chosen ones; every id is in [0, E) whatever the logits (NaN included).
"""

from std.memory import bitcast

comptime OP_NAME = "moe_route_topk_group"
comptime MAX_EXPERTS = 1024
"""Largest E: the GPU grouping kernel keeps an [E, 32] uint32 table in shared memory."""
comptime SIGN = UInt32(0x80000000)


@always_inline
def logit_key(v: Float32, e: Int) -> UInt64:
    """The rank key of logit v of expert e (larger key = earlier in the top-k)."""
    var bits = bitcast[DType.uint32, 1](v)
    if bits == SIGN:
        bits = 0
    var ordered = ~bits if (bits & SIGN) != 0 else bits | SIGN
    return (UInt64(ordered) << 32) | UInt64(UInt32(0xFFFFFFFF) - UInt32(e))


@always_inline
def key_expert(key: UInt64) -> Int32:
    """The expert id of a rank key."""
    return Int32(UInt32(0xFFFFFFFF) - UInt32(key & 0xFFFFFFFF))


@always_inline
def key_logit(key: UInt64) -> Float32:
    """The logit of a rank key (-0.0 comes back as +0.0)."""
    var ordered = UInt32(key >> 32)
    var bits = ordered & ~SIGN if (ordered & SIGN) != 0 else ~ordered
    return bitcast[DType.float32, 1](bits)

"""Shapes, run-time checks and the token -> cache-slot map of `k_matmul_ragged_paged_scale` and
its V twin `v_matmul_ragged_paged_scale` (the same kernels writing the cache's V half).

Shared by the CPU and GPU paths so both resolve rows identically:
- token t belongs to the sequence b with offsets[b] <= t < offsets[b + 1] (binary search; with
  empty sequences, the last of several equal offsets, i.e. the non-empty owner);
- its position is pos = cache_lengths[b] + (t - offsets[b]); page column pos // page_size of
  lookup_table row b, slot pos % page_size.
Runtime data (offsets, cache lengths, lookup table) is trusted for correctness but never for
memory safety: a token outside [offsets[0], offsets[B]), a page column past the lookup table's
width, or a page id >= the number of pages of kv_blocks makes the row be SKIPPED (nothing is
written for it); all other rows are written normally. Row addresses come from MAX's own
PagedKVCache (`block_paged_ptr`), so page_stride has MAX's meaning: page p starts p·page_stride
elements into kv_blocks (-1: packed), and a padded stride needs an allocation of
pages·page_stride elements behind kv_blocks, which MAX's allocator provides.
"""

from std.math import ceildiv
from max.gpu import block_idx, grid_dim
from std.builtin.device_passable import DevicePassable, DeviceTypeEncoder
from std.utils.index import IndexList

comptime U32Ptr = Pointer[UInt32, MutAnyOrigin]
comptime F32Ptr = Pointer[Float32, MutAnyOrigin]
comptime Fp8Ptr = Pointer[Float8_e4m3fn, MutAnyOrigin]
comptime K_HALF = 0
"""`half` parameter value selecting the K half of the cache (kv_blocks dim 1 index 0)."""
comptime V_HALF = 1
"""`half` parameter value selecting the V half of the cache (kv_blocks dim 1 index 1)."""
comptime KV_BOTH = 2
"""`half` parameter value of the fused op writing both halves (`kv_matmul_ragged_paged_scale`:
K and V weights, one launch where the kernel allows it)."""


def op_name[half: Int]() -> StaticString:
    """The registered op writing the cache half `half` (K_HALF, V_HALF or KV_BOTH), for error
    messages."""
    comptime assert half == K_HALF or half == V_HALF or half == KV_BOTH, "half must be K_HALF (0), V_HALF (1) or KV_BOTH (2)"
    comptime if half == K_HALF:
        return "k_matmul_ragged_paged_scale"
    elif half == V_HALF:
        return "v_matmul_ragged_paged_scale"
    else:
        return "kv_matmul_ragged_paged_scale"


@fieldwise_init
struct KCacheShape(DevicePassable, ImplicitlyCopyable, TrivialRegisterPassable):
    """Sizes and strides of one call, checked by `validate` (Int32 fields: a kernel argument)."""

    comptime device_type: AnyType = Self

    def _to_device_type(self, mut encoder: Some[DeviceTypeEncoder], target: MutOpaquePointer[_]):
        encoder.encode(self, target)

    @staticmethod
    def get_type_name() -> String:
        return "KCacheShape"

    var T: Int32
    """Tokens (rows of hidden_state)."""
    var K: Int32
    """Reduction size (columns of hidden_state and weight)."""
    var N: Int32
    """Output columns = n_kv_heads * head_dim."""
    var B: Int32
    """Sequences (len(input_row_offsets) - 1)."""
    var as_stride: Int32
    """Row stride of input_scale (>= ceil(T / gm), MAX's quantizer pads it)."""
    var ws_stride: Int32
    """Row stride of weight_scale."""
    var lut_stride: Int32
    """Row stride of lookup_table."""
    var lut_cols: Int32
    """Columns of lookup_table (page columns per sequence)."""
    var num_pages: Int32
    """Pages of kv_blocks (dim 0); a page id >= this skips the row."""
    var n_kv_scale: Int32
    """1 (per tensor) or n_kv_heads (per head)."""
    var a_stride: Int32
    """Row stride of hidden_state."""
    var w_stride: Int32
    """Row stride of weight."""

    @staticmethod
    def validate[gm: Int, gn: Int, gk: Int, half: Int](
        hidden_shape: IndexList[2],
        hidden_strides: IndexList[2],
        offsets_len: Int,
        weight_shape: IndexList[2],
        weight_strides: IndexList[2],
        in_scale_shape: IndexList[2],
        in_scale_strides: IndexList[2],
        w_scale_shape: IndexList[2],
        w_scale_strides: IndexList[2],
        kv_scale_len: Int,
        num_heads: Int,
        head_dim: Int,
        cache_batch: Int,
        lut_shape: IndexList[2],
        lut_strides: IndexList[2],
        num_pages: Int,
    ) raises -> Self:
        """Checks every shape rule the kernels rely on; raises an Error naming the tensor."""
        comptime assert gm > 0 and gn > 0 and gk > 0, "scale granularities must be positive"
        comptime OP_NAME = op_name[half]()
        var T = hidden_shape[0]
        var K = hidden_shape[1]
        var N = weight_shape[0]
        var B = offsets_len - 1
        if K <= 0:
            raise Error(OP_NAME, ": hidden_state has K = ", K, " columns; K must be positive")
        if hidden_strides[1] != 1 or weight_strides[1] != 1:
            raise Error(OP_NAME, ": hidden_state and weight must have unit column stride")
        if weight_shape[1] != K:
            raise Error(OP_NAME, ": weight has ", weight_shape[1], " columns but hidden_state has K = ", K)
        if N != num_heads * head_dim:
            raise Error(OP_NAME, ": weight has N = ", N, " rows but the cache needs n_kv_heads * head_dim = ",
                        num_heads * head_dim)
        if B < 0:
            raise Error(OP_NAME, ": input_row_offsets must have at least one element")
        if cache_batch != B or lut_shape[0] != B:
            raise Error(OP_NAME, ": batch mismatch: len(input_row_offsets) - 1 = ", B, ", cache_lengths has ",
                        cache_batch, ", lookup_table has ", lut_shape[0], " rows")
        check_scales[gm, gn, gk](OP_NAME, "input_scale", "weight_scale", T, N, K, in_scale_shape,
                                 in_scale_strides, w_scale_shape, w_scale_strides)
        if kv_scale_len != 1 and kv_scale_len != num_heads:
            raise Error(OP_NAME, ": kv_scale must have 1 or n_kv_heads = ", num_heads, " elements, got ",
                        kv_scale_len)
        if lut_strides[1] != 1 and lut_shape[1] > 1:
            raise Error(OP_NAME, ": lookup_table must have unit column stride")
        return Self(
            Int32(T), Int32(K), Int32(N), Int32(B),
            Int32(in_scale_strides[0]), Int32(w_scale_strides[0]),
            Int32(lut_strides[0]), Int32(lut_shape[1]), Int32(num_pages), Int32(kv_scale_len),
            Int32(hidden_strides[0]), Int32(weight_strides[0]),
        )


def check_scales[gm: Int, gn: Int, gk: Int](
    op: StaticString,
    in_name: StaticString,
    w_name: StaticString,
    T: Int,
    N: Int,
    K: Int,
    in_scale_shape: IndexList[2],
    in_scale_strides: IndexList[2],
    w_scale_shape: IndexList[2],
    w_scale_strides: IndexList[2],
) raises:
    """The block scales' layout every kernel assumes: input scales [ceil(K/gk), >= ceil(T/gm)]
    (tokens contiguous), weight scales [ceil(N/gn), ceil(K/gk)], unit column strides. Raises an
    Error naming op `op` and the tensor (`in_name` / `w_name`)."""
    var kb = ceildiv(K, gk)
    if in_scale_shape[0] != kb or in_scale_shape[1] < ceildiv(T, gm) or in_scale_strides[1] != 1:
        raise Error(op, ": ", in_name, " must be [ceil(K/gk) = ", kb, ", >= ceil(T/gm) = ",
                    ceildiv(T, gm), "] with unit column stride, got [", in_scale_shape[0], ", ",
                    in_scale_shape[1], "]")
    if w_scale_shape[0] != ceildiv(N, gn) or w_scale_shape[1] != kb or w_scale_strides[1] != 1:
        raise Error(op, ": ", w_name, " must be [ceil(N/gn) = ", ceildiv(N, gn), ", ceil(K/gk) = ",
                    kb, "], got [", w_scale_shape[0], ", ", w_scale_shape[1], "]")


@always_inline
def find_sequence(offsets: U32Ptr, B: Int, t: Int) -> Int:
    """The sequence b with offsets[b] <= t < offsets[b + 1] (the last such b when several
    offsets are equal), or -1 when t is outside [offsets[0], offsets[B]). Always in [-1, B)."""
    if B <= 0:
        return -1
    if t < Int(offsets[unsafe_offset=0]) or t >= Int(offsets[unsafe_offset=B]):
        return -1
    var lo = 0
    var hi = B
    while hi - lo > 1:
        var mid = (lo + hi) // 2
        if Int(offsets[unsafe_offset=mid]) <= t:
            lo = mid
        else:
            hi = mid
    return lo


@always_inline
def token_position(offsets: U32Ptr, cache_lengths: U32Ptr, b: Int, t: Int) -> Int:
    """Cache position of token t of sequence b: cache_lengths[b] + (t - offsets[b])."""
    return Int(cache_lengths[unsafe_offset=b]) + (t - Int(offsets[unsafe_offset=b]))


@always_inline
def slot_is_valid[page_size: Int](lut: U32Ptr, shape: KCacheShape, b: Int, pos: Int) -> Bool:
    """Whether position `pos` of sequence b maps to an existing page: the page column is inside
    the lookup table and its page id is < the number of pages of kv_blocks."""
    if pos < 0:
        return False
    var col = pos // page_size
    if col >= Int(shape.lut_cols):
        return False
    var page = Int(lut[unsafe_offset=b * Int(shape.lut_stride) + col])
    return page < Int(shape.num_pages)


@always_inline
def token_slot[page_size: Int](
    offsets: U32Ptr, cache_lengths: U32Ptr, lut: U32Ptr, shape: KCacheShape, t: Int
) -> Tuple[Int, Int]:
    """(b, pos): token t's sequence and cache position, or b = -1 when nothing is written for
    it (t >= T, t outside the offsets, or a page the lookup table / kv_blocks lacks)."""
    if t >= Int(shape.T):
        return (-1, 0)
    var b = find_sequence(offsets, Int(shape.B), t)
    if b < 0:
        return (-1, 0)
    var pos = token_position(offsets, cache_lengths, b, t)
    if not slot_is_valid[page_size](lut, shape, b, pos):
        return (-1, 0)
    return (b, pos)


@always_inline
def store_cast[cache_dtype: DType, width: Int](v: SIMD[DType.float32, width]) -> SIMD[cache_dtype, width]:
    """Converts fp32 to the cache's dtype (round to nearest; fp8 saturates to +-448)."""
    return v.cast[cache_dtype]()


@always_inline
def is_fp8_cache[cache_dtype: DType]() -> Bool:
    """Whether the cache stores float8_e4m3fn values (k / kv_scale is stored)."""
    return cache_dtype == DType.float8_e4m3fn


@always_inline
def walk_start(steps: Int) -> Int:
    """Where this CTA starts a rotated walk over `steps` K steps: CTA i of the G along x at
    step i * steps / G, so that the CTAs of a wave do not all read the same token rows at the
    same time (the kernels' " rot" configs)."""
    return (block_idx.x * steps) // grid_dim.x


@always_inline
def walk_step(step: Int, start: Int, steps: Int) -> Int:
    """The K step that step `step` of a walk starting at `start` reads: (step + start) mod
    steps, for step, start < steps."""
    var k = step + start
    return k - steps if k >= steps else k

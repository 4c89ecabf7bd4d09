"""Where the FP8 block-scaled kernels write their output rows: a `RowSink`.

The kernels compute out[t, n] for tokens t < T and columns n < N in fp32, then ask the sink
where token t's row goes: its slot (b, pos) (`slot`; b = -1: nothing is written for t) and the
slot's row address (`slot_addr`), or both at once (`row_addr`; 0 = not written), and store the
token's column segment there (elements `dtype`, column n at row address + n elements). The
mma.sync and SIMT kernels keep slots in shared memory and take addresses in the epilogue (a
paged sink's address math stays out of the main loop's registers); the wgmma kernels resolve
addresses up front.
Destinations of dtype float8_e4m3fn get the value divided by kv_scale of its column group
(`group` columns each, or the whole row when kv_scale has one element) before the cast.

- `PagedRows`: token t's slot in MAX's paged KV cache (the K / V ops; layout.mojo's
  `token_slot` resolves the sequence, position and page, skipping rows without one, and the
  address comes from MAX's own `block_paged_ptr`).
- `DenseRows`: row t of a row-major [T, N] matrix with row stride `ld` elements
  (`fp8_blockwise_matmul`).
"""

from std.builtin.device_passable import DevicePassable, DeviceTypeEncoder
from std.sys import size_of
from kv_cache.types import KVCacheT

from .layout import KCacheShape, U32Ptr, token_slot


trait RowSink(DevicePassable, ImplicitlyCopyable, Deinitable):
    """A destination of output rows (see the module doc)."""

    comptime dtype: DType
    """Element dtype of the destination rows."""
    comptime group: Int
    """Columns per kv_scale entry (float8_e4m3fn destinations with one kv_scale per group)."""

    def slot(self, offsets: U32Ptr, cache_lengths: U32Ptr, lut: U32Ptr, shape: KCacheShape, t: Int) -> Tuple[Int, Int]:
        """Token t's slot (b, pos), b = -1 when nothing is written for t (t >= T included).
        offsets / cache_lengths / lut: the ragged batch's tensors (read by paged sinks only)."""
        ...

    def slot_addr(self, b: Int, pos: Int) -> Int:
        """Address of the row of slot (b, pos) (its column 0), b >= 0."""
        ...


@always_inline
def row_addr[sink_t: RowSink](
    sink: sink_t, offsets: U32Ptr, cache_lengths: U32Ptr, lut: U32Ptr, shape: KCacheShape, t: Int
) -> Int:
    """Address of token t's output row, or 0 when nothing is written for t."""
    var s = sink.slot(offsets, cache_lengths, lut, shape, t)
    return sink.slot_addr(s[0], s[1]) if s[0] >= 0 else 0


@always_inline
def row_ptr[sink_t: RowSink](addr: Int) -> Pointer[Scalar[sink_t.dtype], MutAnyOrigin]:
    """The element pointer of a row address from `row_addr` (non-zero)."""
    return Pointer[Scalar[sink_t.dtype], MutAnyOrigin](unsafe_from_address=addr)


struct PagedRows[cache_t: KVCacheT](RowSink):
    """Rows of one half (K or V) of one layer of MAX's paged cache: `cache` from the collection's
    get_key_cache / get_value_cache."""

    comptime dtype = Self.cache_t.dtype
    comptime group = Self.cache_t.kv_params.head_size
    comptime device_type: AnyType = Self
    var cache: Self.cache_t

    def __init__(out self, cache: Self.cache_t):
        self.cache = cache

    def _to_device_type(self, mut encoder: Some[DeviceTypeEncoder], target: MutOpaquePointer[_]):
        # the struct is the cache alone, so the cache's own encoding is this struct's
        self.cache._to_device_type(encoder, target)

    @staticmethod
    def get_type_name() -> String:
        return "PagedRows"

    @always_inline
    def slot(self, offsets: U32Ptr, cache_lengths: U32Ptr, lut: U32Ptr, shape: KCacheShape, t: Int) -> Tuple[Int, Int]:
        """Token t's sequence and cache position (layout.mojo's `token_slot`)."""
        return token_slot[Self.cache_t.page_size_](offsets, cache_lengths, lut, shape, t)

    @always_inline
    def slot_addr(self, b: Int, pos: Int) -> Int:
        """The cache row of position pos of sequence b (MAX's `block_paged_ptr`)."""
        return Int(self.cache.block_paged_ptr[1](b, pos, 0, 0))


struct DenseRows[out_dtype: DType](RowSink, TrivialRegisterPassable):
    """Rows of a row-major [T, N] matrix at `base` (an address) with row stride `ld` elements."""

    comptime dtype = Self.out_dtype
    comptime group = 1
    comptime device_type: AnyType = Self
    var base: Int64
    var ld: Int64

    def __init__(out self, base: Int, ld: Int):
        self.base = Int64(base)
        self.ld = Int64(ld)

    def _to_device_type(self, mut encoder: Some[DeviceTypeEncoder], target: MutOpaquePointer[_]):
        encoder.encode(self, target)

    @staticmethod
    def get_type_name() -> String:
        return "DenseRows"

    @always_inline
    def slot(self, offsets: U32Ptr, cache_lengths: U32Ptr, lut: U32Ptr, shape: KCacheShape, t: Int) -> Tuple[Int, Int]:
        """(0, t) for t < T, else (-1, 0)."""
        return (0, t) if t < Int(shape.T) else (-1, 0)

    @always_inline
    def slot_addr(self, b: Int, pos: Int) -> Int:
        """Row pos's address."""
        return Int(self.base) + pos * Int(self.ld) * size_of[Self.out_dtype]()

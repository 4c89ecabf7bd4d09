"""CPU path of `k_matmul_ragged_paged_scale`: correct and parallel, any granularity.

Work items are (group of MR tokens) x (NT output columns); they run in parallel. An item walks K
one scale block at a time (gk columns, processed in sub-chunks of at most KC), converts its
tokens' fp8 values to fp32 once per sub-chunk, and for each column accumulates the block's dot
products in fp32 SIMD registers; the block sum is then multiplied by
input_scale[kb, t // gm] * weight_scale[n // gn, kb] and added to the fp32 result (one rounding
per block, like DeepGEMM's promotion). The epilogue divides by kv_scale for an fp8 destination,
casts to its dtype and writes the row straight into the sink's row (sink.mojo: a paged-cache slot
or a dense row).
"""

from std.math import ceildiv
from std.memory import stack_allocation
from max.algorithm import sync_parallelize

from .layout import (
    F32Ptr,
    Fp8Ptr,
    KCacheShape,
    U32Ptr,
    is_fp8_cache,
    store_cast,
)
from .sink import RowSink, row_addr, row_ptr

comptime F32 = DType.float32
comptime MR = 4
"""Tokens per work item."""
comptime NT = 32
"""Output columns per work item."""
comptime KC = 256
"""Most K columns converted to fp32 at once (one scale block is split into such chunks)."""
comptime VW = 16
"""SIMD width of the fp32 dot products."""


@always_inline
def _dot(a: F32Ptr, w: F32Ptr, n: Int) -> Float32:
    """sum_{i < n} a[i] * w[i] in fp32."""
    var acc = SIMD[F32, VW](0)
    var i = 0
    while i + VW <= n:
        acc = a.unsafe_load[width=VW](i).fma(w.unsafe_load[width=VW](i), acc)
        i += VW
    var s = acc.reduce_add()
    while i < n:
        s += a[unsafe_offset=i] * w[unsafe_offset=i]
        i += 1
    return s


def k_cache_matmul_cpu[gm: Int, gn: Int, gk: Int, sink_t: RowSink](
    hidden: Fp8Ptr,
    offsets: U32Ptr,
    weight: Fp8Ptr,
    in_scale: F32Ptr,
    w_scale: F32Ptr,
    kv_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    sink: sink_t,
    shape: KCacheShape,
) raises:
    """Computes the block-scaled product and writes each valid token's row into `sink`."""
    var T = Int(shape.T)
    var N = Int(shape.N)
    if T == 0 or N == 0:
        return
    var n_groups = ceildiv(T, MR)
    var n_tiles = ceildiv(N, NT)

    def item(i: Int) raises {var hidden, var offsets, var weight, var in_scale, var w_scale, var kv_scale,
                              var cache_lengths, var lut, var sink, var shape, var n_tiles}:
        var g = i // n_tiles
        var tile = i % n_tiles
        var T_ = Int(shape.T)
        var K = Int(shape.K)
        var N_ = Int(shape.N)
        var B = Int(shape.B)
        var t0 = g * MR
        var rows = min(MR, T_ - t0)
        var n0 = tile * NT
        var cols = min(NT, N_ - n0)
        # which rows have a destination
        var addrs = stack_allocation[MR, Int]()
        var any_valid = False
        for r in range(MR):
            addrs[unsafe_offset=r] = 0
            if r < rows:
                addrs[unsafe_offset=r] = row_addr(sink, offsets, cache_lengths, lut, shape, t0 + r)
                any_valid = any_valid or addrs[unsafe_offset=r] != 0
        if not any_valid:
            return
        var acc = stack_allocation[MR * NT, Float32]()
        for j in range(MR * NT):
            acc[unsafe_offset=j] = 0
        var a32 = stack_allocation[MR * KC, Float32]().as_unsafe_any_origin()
        var w32 = stack_allocation[KC, Float32]().as_unsafe_any_origin()
        var part = stack_allocation[MR * NT, Float32]()
        var n_kb = ceildiv(K, gk)
        for kb in range(n_kb):
            var kb_end = min(K, (kb + 1) * gk)
            for j in range(MR * NT):
                part[unsafe_offset=j] = 0
            var k0 = kb * gk
            while k0 < kb_end:
                var kc = min(KC, kb_end - k0)
                for r in range(rows):
                    var src = hidden.unsafe_offset((t0 + r) * Int(shape.a_stride) + k0)
                    var dst = a32.unsafe_offset(r * KC)
                    for k in range(kc):
                        dst[unsafe_offset=k] = src[unsafe_offset=k].cast[F32]()
                for c in range(cols):
                    var wrow = weight.unsafe_offset((n0 + c) * Int(shape.w_stride) + k0)
                    for k in range(kc):
                        w32[unsafe_offset=k] = wrow[unsafe_offset=k].cast[F32]()
                    for r in range(rows):
                        part[unsafe_offset=r * NT + c] += _dot(a32.unsafe_offset(r * KC), w32, kc)
                k0 += kc
            for r in range(rows):
                var sa = in_scale[unsafe_offset=kb * Int(shape.as_stride) + (t0 + r) // gm]
                for c in range(cols):
                    var sw = w_scale[unsafe_offset=((n0 + c) // gn) * Int(shape.ws_stride) + kb]
                    acc[unsafe_offset=r * NT + c] += part[unsafe_offset=r * NT + c] * (sa * sw)
        for r in range(rows):
            var addr = addrs[unsafe_offset=r]
            if addr == 0:
                continue
            var dst = row_ptr[sink_t](addr)
            for c in range(cols):
                var n = n0 + c
                var v = acc[unsafe_offset=r * NT + c]
                comptime if is_fp8_cache[sink_t.dtype]():
                    var h = n // sink_t.group if Int(shape.n_kv_scale) > 1 else 0
                    v = v / kv_scale[unsafe_offset=h]
                dst[unsafe_offset=n] = store_cast[sink_t.dtype, 1](SIMD[F32, 1](v))

    sync_parallelize(item, n_groups * n_tiles)

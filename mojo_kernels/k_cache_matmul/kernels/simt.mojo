"""`simt_kernel`: the fallback of every target (any granularity): fp32 FMAs from shared-memory
tiles, written with shared memory and barrier() only."""

from std.math import ceildiv
from std.memory import stack_allocation
from max.gpu import barrier, block_idx, thread_idx
from max.gpu.memory import AddressSpace

from ..layout import F32Ptr, Fp8Ptr, KCacheShape, U32Ptr
from ..sink import RowSink
from .tiles import F32, THREADS, resolve_rows, store_tile


comptime S_BT = 16
"""Tokens per CTA of the SIMT kernel."""
comptime S_BN = 64
"""Output columns per CTA of the SIMT kernel."""
comptime S_KC = 32
"""K values staged in shared memory per step."""


def simt_kernel[sink_t: RowSink, gm: Int, gn: Int, gk: Int](
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
):
    """One CTA: 16 tokens x 64 columns; thread t owns column t % 64 and tokens 4 (t // 64) + i."""
    comptime RPT = S_BT * S_BN // THREADS
    var a_sh = stack_allocation[S_BT * S_KC, Float32, address_space=AddressSpace.SHARED]()
    var w_sh = stack_allocation[S_BN * (S_KC + 1), Float32, address_space=AddressSpace.SHARED]()
    var out_sh = stack_allocation[S_BT * S_BN, Float32, address_space=AddressSpace.SHARED]()
    var rows = stack_allocation[2 * S_BT, Int32, address_space=AddressSpace.SHARED]()
    var tid = thread_idx.x
    var col = tid % S_BN
    var rg = tid // S_BN
    var n0 = block_idx.x * S_BN
    var t0 = block_idx.y * S_BT
    var T = Int(shape.T)
    var K = Int(shape.K)
    var N = Int(shape.N)
    resolve_rows[sink_t, S_BT](rows, sink, offsets, cache_lengths, lut, shape, t0)
    var acc = SIMD[F32, RPT](0)
    var n = n0 + col
    var n_kb = ceildiv(K, gk)
    for kb in range(n_kb):
        var part = SIMD[F32, RPT](0)
        var k_end = min(K, (kb + 1) * gk)
        var k0 = kb * gk
        while k0 < k_end:
            var kc = min(S_KC, k_end - k0)
            for e in range(tid, S_BT * S_KC, THREADS):
                var r = e // S_KC
                var k = e % S_KC
                var t = t0 + r
                a_sh[unsafe_offset=e] = hidden[unsafe_offset=t * Int(shape.a_stride) + k0 + k].cast[F32]() if (
                    t < T and k < kc
                ) else Float32(0)
            for e in range(tid, S_BN * S_KC, THREADS):
                var c = e // S_KC
                var k = e % S_KC
                var nn = n0 + c
                w_sh[unsafe_offset=c * (S_KC + 1) + k] = weight[unsafe_offset=nn * Int(shape.w_stride) + k0 + k].cast[F32]() if (
                    nn < N and k < kc
                ) else Float32(0)
            barrier()
            for k in range(kc):
                var w = w_sh[unsafe_offset=col * (S_KC + 1) + k]
                comptime for i in range(RPT):
                    part[i] += a_sh[unsafe_offset=(rg * RPT + i) * S_KC + k] * w
            barrier()
            k0 += kc
        var sw = w_scale[unsafe_offset=(n // gn) * Int(shape.ws_stride) + kb] if n < N else Float32(0)
        comptime for i in range(RPT):
            var t = t0 + rg * RPT + i
            var sa = in_scale[unsafe_offset=kb * Int(shape.as_stride) + t // gm] if t < T else Float32(0)
            acc[i] += part[i] * (sa * sw)
    comptime for i in range(RPT):
        out_sh[unsafe_offset=(rg * RPT + i) * S_BN + col] = acc[i]
    barrier()
    store_tile[sink_t, S_BT, S_BN](sink, out_sh, rows, kv_scale, shape, n0)

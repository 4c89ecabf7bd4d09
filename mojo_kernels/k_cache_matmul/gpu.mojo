"""GPU paths of `k_matmul_ragged_paged_scale` (no per-call allocation) and the dispatch.

Dispatch: `k_cache_gpu_plan` picks the launch (a PLAN_* code; `k_cache_gpu_plan_text` names
it, plan.mojo writes it for the `k_matmul_ragged_paged_scale_plan` op) and `k_cache_matmul_gpu`
launches what it picked. Both take the GPU path (common/target.mojo) and whether the target has
FP8 mma.sync as parameters: rules 2-3b (TMA + wgmma) apply on the Hopper path only, rule 4
(FP8 mma.sync) where the compile can emit FP8 mma.sync (sm_90a, sm_100a: Hopper, Blackwell and
the Ampere path forced on those; target.has_fp8_mma), rule 5 everywhere: on sm_80 / 86 / 89
and AMD (the portable path) every call takes `simt`, written with shared-memory tiles and
barrier() only. First match wins:
1. T == 0 (or N == 0): nothing is launched.
2. T > WGMMA_MIN_TOKENS, gk % 128 == 0, K % 16 == 0, dense rows: TMA + wgmma (gpu_wgmma.mojo),
   LARGE or SMALL tiles by `wgmma_large_tiles`.
3. T <= MAX_TOKENS (128), ceil(N / 64) >= DECODE_MIN_CTAS, the same operand rules: swap-AB TMA
   + wgmma with the weight on the MMA's M side (gpu_wgmma_decode.mojo; `decode_config` picks
   the token tile): TMA keeps far more weight bytes in flight per SM than 4.'s register
   fragments (up to 4x faster at N = 8192, T = 64-128).
3b. 16 < T <= 64, ceil(N / 64) * SPLIT_MAX <= SPLIT_MAX_CTAS (N <= 1920), the same operand
   rules: the swap-AB kernel with K split over (SPLIT_MAX, 1, 1) clusters, partial sums added
   through distributed shared memory (`decode_split_config`): N = 1024 gives 3. only 16 CTAs,
   and 4.'s 16-row CTAs re-read the tokens from L2 many times (the split is ~30 % faster at
   K = 8192, T = 64).
4. gk % 64 == 0, K and the row strides multiples of 16: `mma_splitk` below, with
   (MT, NB, U) = (1, 1, 4) for T <= 16, (2, 2, 2) for T <= WGMMA_MIN_TOKENS, else (2, 4, 1);
   from N = LARGE_N rows: (1, 2, 2) with late row resolution for T <= 16, (4, 4, 1) up to
   WGMMA_MIN_TOKENS (the MMA_* configs).
5. Anything else (any granularity): `simt`, fp32 FMAs from shared-memory tiles.

`mma_splitk`: warps compute mma.sync m16n8k32 e4m3 tiles (16 tokens on the MMA's M side, 8
weight rows on its N side) with fragments loaded straight from global memory as 16-byte vectors;
the 64 k values one 16-byte load per lane covers are the same permutation of k for both
operands, so no shuffle is needed. A CTA covers 16·MT tokens x 8·NB weight rows, and its 8
warps split K by scale block (intra-CTA split-K: with so few rows per CTA, decode spreads over
all SMs without a cross-CTA reduction buffer). Each block's MMA sum is multiplied by its input
and weight scales in fp32 registers (promotion) and added to the warp's fp32 accumulators; the
warps' partial sums are reduced in shared memory and the epilogue writes the rows straight into
the paged cache.
"""

from std.math import ceildiv
from std.memory import stack_allocation
from max.gpu import barrier, block_idx, thread_idx
from max.gpu.compute.mma import mma
from max.gpu.host import DeviceContext
from max.gpu.memory import AddressSpace
from kv_cache.types import KVCacheT

from ..common.pdl import launch_dependent_grids, pdl_attributes, wait_on_dependent_grids
from ..common.target import PATH_HOPPER, PATH_PORTABLE
from .gpu_wgmma import LARGE, SMALL, launch_wgmma, wgmma_large_tiles, wgmma_path_supported
from .gpu_wgmma_decode import MAX_TOKENS, ROWS, SPLIT_MAX, decode_config, decode_split_config, launch_wgmma_decode
from .layout import (
    F32Ptr,
    Fp8Ptr,
    KCacheShape,
    U32Ptr,
    is_fp8_cache,
    store_cast,
    token_slot,
    walk_start,
    walk_step,
)

comptime F32 = DType.float32
comptime FP8 = DType.float8_e4m3fn
comptime THREADS = 256
comptime WGMMA_MIN_TOKENS = 128
"""More tokens than this (and gk % 128 == 0) take the TMA + wgmma kernel (gpu_wgmma.mojo); up
to it the mma.sync split-K kernel, whose CTAs cover only 8 or 16 weight rows each, keeps more
SMs busy (at N = 1024, T = 64-128 the 64-row wgmma tiles leave most SMs idle)."""
comptime WARPS = THREADS // 32
comptime LARGE_N = 4096
"""From this many weight rows (e.g. a fused QKV projection) the mma.sync kernel takes CTAs of
more rows: with N / 8 CTAs of 8 rows the grid runs ~4 waves of short CTAs at N = 8192, and
fewer, fatter CTAs stream better ((MT, NB, U) = (1, 2, 2) with the rows resolved late for
T <= 16, (4, 4, 1) above; 20-40 % faster there). At N = 1024 both would leave SMs idle."""


@always_inline
def _resolve_rows[page_size: Int, BT: Int](
    rows: Pointer[Int32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    offsets: U32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    shape: KCacheShape,
    t0: Int,
):
    """Threads < BT write (b, pos) of token t0 + tid into rows[2 tid], b = -1 when skipped."""
    var tid = thread_idx.x
    if tid < BT:
        var slot = token_slot[page_size](offsets, cache_lengths, lut, shape, t0 + tid)
        rows[unsafe_offset=2 * tid] = Int32(slot[0])
        rows[unsafe_offset=2 * tid + 1] = Int32(slot[1])


@always_inline
def _store_tile[cache_t: KVCacheT, BT: Int, BN: Int](
    k_cache: cache_t,
    tile: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    rows: Pointer[Int32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    kv_scale: F32Ptr,
    shape: KCacheShape,
    n0: Int,
):
    """Writes the fp32 tile [BT][BN] (columns n0..) into the cache rows resolved in `rows`."""
    comptime head_dim = cache_t.kv_params.head_size
    var tid = thread_idx.x
    for e in range(tid, BT * BN, THREADS):
        var r = e // BN
        var n = n0 + e % BN
        var b = Int(rows[unsafe_offset=2 * r])
        if b < 0 or n >= Int(shape.N):
            continue
        var v = tile[unsafe_offset=e]
        comptime if is_fp8_cache[cache_t.dtype]():
            var h = n // head_dim if Int(shape.n_kv_scale) > 1 else 0
            v = v / kv_scale[unsafe_offset=h]
        var dst = k_cache.block_paged_ptr[1](b, Int(rows[unsafe_offset=2 * r + 1]), 0, 0)
        dst[unsafe_offset=n] = store_cast[cache_t.dtype, 1](SIMD[F32, 1](v))


# ------------------------------------------------------------------------ mma.sync split-K
def _mma_splitk_kernel[
    cache_t: KVCacheT, gm: Int, gn: Int, gk: Int, MT: Int, NB: Int, U: Int, late_rows: Bool, rotate: Bool
](
    hidden: Fp8Ptr,
    offsets: U32Ptr,
    weight: Fp8Ptr,
    in_scale: F32Ptr,
    w_scale: F32Ptr,
    kv_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    k_cache: cache_t,
    shape: KCacheShape,
):
    """One CTA: tokens [t0, t0 + 16 MT) x weight rows [n0, n0 + 8 NB), all of K split by warp.

    A warp takes U consecutive scale blocks at a time and issues all their loads before the
    first MMA, so that U * gk/64 * (NB + 2 MT) 16-byte loads per lane are in flight. late_rows:
    warp 0 resolves the tokens' cache rows after its loads instead of before them (faster with
    NB = 2 at large N, slower with NB = 1; measured, not understood). rotate: the CTAs of one
    token tile start their K walks at different scale blocks (CTA i of G at block i * blocks / G),
    so that they do not all read the same token rows at the same time.
    """
    comptime BT = 16 * MT
    comptime BN = 8 * NB
    comptime CH = gk // 64
    comptime page_size = cache_t.page_size_
    var red = stack_allocation[WARPS * BT * BN, Float32, address_space=AddressSpace.SHARED]()
    var rows = stack_allocation[2 * BT, Int32, address_space=AddressSpace.SHARED]()
    var tid = thread_idx.x
    var warp = tid // 32
    var lane = tid % 32
    var g = lane // 4
    var tig = lane % 4
    var n0 = block_idx.x * BN
    var t0 = block_idx.y * BT
    var T = Int(shape.T)
    var K = Int(shape.K)
    var N = Int(shape.N)
    var a_stride = Int(shape.a_stride)
    var w_stride = Int(shape.w_stride)
    var n_kb = ceildiv(K, gk)
    var rot = walk_start(n_kb) if rotate else 0
    var wv = Array[SIMD[FP8, 16], U * CH * NB](fill=0)

    @always_inline
    @__parameter
    def load_weights(kb0: Int):
        comptime for u in range(U):
            var kbp = walk_step(kb0 + u, rot, n_kb)
            comptime for c in range(CH):
                var kc = kbp * gk + c * 64 + tig * 16
                comptime for nb in range(NB):
                    var n = n0 + nb * 8 + g
                    if kb0 + u < n_kb and kc < K and n < N:
                        wv[(u * CH + c) * NB + nb] = weight.unsafe_offset(n * w_stride + kc).unsafe_load[
                            width=16, alignment=16
                        ](0)
                    else:
                        wv[(u * CH + c) * NB + nb] = SIMD[FP8, 16](0)

    # PDL (common/pdl.mojo): the first step's weights are loaded while the previous kernel may
    # still run; tokens, their scales, the cache rows and the cache itself only after the wait.
    launch_dependent_grids()
    load_weights(warp * U)
    wait_on_dependent_grids()
    comptime if not late_rows:
        _resolve_rows[page_size, BT](rows, offsets, cache_lengths, lut, shape, t0)

    var acc = Array[SIMD[F32, 4], MT * NB](fill=0)
    for kb0 in range(warp * U, n_kb, WARPS * U):
        var a_lo = Array[SIMD[FP8, 16], U * CH * MT](fill=0)
        var a_hi = Array[SIMD[FP8, 16], U * CH * MT](fill=0)
        if kb0 != warp * U:
            load_weights(kb0)
        comptime for u in range(U):
            var kbp = walk_step(kb0 + u, rot, n_kb)  # the scale block of step kb0 + u of the walk
            comptime for c in range(CH):
                var kc = kbp * gk + c * 64 + tig * 16
                if kb0 + u < n_kb and kc < K:
                    comptime for mt in range(MT):
                        var r0 = t0 + mt * 16 + g
                        if r0 < T:
                            a_lo[(u * CH + c) * MT + mt] = hidden.unsafe_offset(r0 * a_stride + kc).unsafe_load[
                                width=16, alignment=16
                            ](0)
                        if r0 + 8 < T:
                            a_hi[(u * CH + c) * MT + mt] = hidden.unsafe_offset((r0 + 8) * a_stride + kc).unsafe_load[
                                width=16, alignment=16
                            ](0)
        comptime for u in range(U):
            var kb = walk_step(kb0 + u, rot, n_kb)
            if kb0 + u < n_kb:
                var tmp = Array[SIMD[F32, 4], MT * NB](fill=0)
                comptime for c in range(CH):
                    comptime for h in range(2):
                        comptime for mt in range(MT):
                            comptime ai = (u * CH + c) * MT + mt
                            var a = (
                                a_lo[ai].slice[4, offset=8 * h]().join(a_hi[ai].slice[4, offset=8 * h]())
                            ).join(
                                a_lo[ai].slice[4, offset=8 * h + 4]().join(a_hi[ai].slice[4, offset=8 * h + 4]())
                            )
                            comptime for nb in range(NB):
                                var d = SIMD[F32, 4](0)
                                mma(d, a, wv[(u * CH + c) * NB + nb].slice[8, offset=8 * h](), tmp[mt * NB + nb])
                                tmp[mt * NB + nb] = d
                # promotion: scale this block's sums in fp32 and add them to the accumulators
                comptime for mt in range(MT):
                    var r0 = t0 + mt * 16 + g
                    var sa0 = in_scale[unsafe_offset=kb * Int(shape.as_stride) + r0 // gm] if r0 < T else Float32(0)
                    var sa1 = in_scale[unsafe_offset=kb * Int(shape.as_stride) + (r0 + 8) // gm] if r0 + 8 < T else Float32(0)
                    comptime for nb in range(NB):
                        var n = n0 + nb * 8 + tig * 2
                        var sw0 = w_scale[unsafe_offset=(n // gn) * Int(shape.ws_stride) + kb] if n < N else Float32(0)
                        var sw1 = w_scale[unsafe_offset=((n + 1) // gn) * Int(shape.ws_stride) + kb] if n + 1 < N else Float32(0)
                        acc[mt * NB + nb] += tmp[mt * NB + nb] * SIMD[F32, 4](sa0 * sw0, sa0 * sw1, sa1 * sw0, sa1 * sw1)

    comptime if late_rows:
        _resolve_rows[page_size, BT](rows, offsets, cache_lengths, lut, shape, t0)
    # reduce the warps' partial sums in shared memory: red[warp][row][col]
    comptime for mt in range(MT):
        comptime for nb in range(NB):
            var v = acc[mt * NB + nb]
            var r = mt * 16 + g
            var col = nb * 8 + tig * 2
            var base = warp * BT * BN
            red[unsafe_offset=base + r * BN + col] = v[0]
            red[unsafe_offset=base + r * BN + col + 1] = v[1]
            red[unsafe_offset=base + (r + 8) * BN + col] = v[2]
            red[unsafe_offset=base + (r + 8) * BN + col + 1] = v[3]
    barrier()
    for e in range(tid, BT * BN, THREADS):
        var s = red[unsafe_offset=e]
        comptime for w in range(1, WARPS):
            s += red[unsafe_offset=w * BT * BN + e]
        red[unsafe_offset=e] = s
    barrier()
    _store_tile[cache_t, BT, BN](k_cache, red, rows, kv_scale, shape, n0)


# ------------------------------------------------------------------------ SIMT fallback
comptime S_BT = 16
"""Tokens per CTA of the SIMT kernel."""
comptime S_BN = 64
"""Output columns per CTA of the SIMT kernel."""
comptime S_KC = 32
"""K values staged in shared memory per step."""


def _simt_kernel[cache_t: KVCacheT, gm: Int, gn: Int, gk: Int](
    hidden: Fp8Ptr,
    offsets: U32Ptr,
    weight: Fp8Ptr,
    in_scale: F32Ptr,
    w_scale: F32Ptr,
    kv_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    k_cache: cache_t,
    shape: KCacheShape,
):
    """One CTA: 16 tokens x 64 columns; thread t owns column t % 64 and tokens 4 (t // 64) + i."""
    comptime page_size = cache_t.page_size_
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
    _resolve_rows[page_size, S_BT](rows, offsets, cache_lengths, lut, shape, t0)
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
    _store_tile[cache_t, S_BT, S_BN](k_cache, out_sh, rows, kv_scale, shape, n0)


# ------------------------------------------------------------------------ dispatch
@fieldwise_init
struct MmaConfig(ImplicitlyCopyable, Writable):
    """Parameters of `_mma_splitk_kernel`: CTAs of 16·mt tokens x 8·nb weight rows, warps taking
    u scale blocks at a time, rows resolved after the loads (late_rows) or before them."""

    var mt: Int
    var nb: Int
    var u: Int
    var late_rows: Bool
    var rotate: Bool

    def write_to(self, mut writer: Some[Writer]):
        writer.write("mma.sync MT=", self.mt, " NB=", self.nb, " U=", self.u)
        if self.late_rows:
            writer.write(" late")
        if self.rotate:
            writer.write(" rot")


comptime MMA_DECODE = MmaConfig(1, 1, 4, False, False)
"""T <= 16."""
comptime MMA_DECODE_LARGE_N = MmaConfig(1, 2, 2, True, False)
"""T <= 16, N >= LARGE_N."""
comptime MMA_MID = MmaConfig(2, 2, 2, False, True)
"""16 < T <= WGMMA_MIN_TOKENS. Rotated K walks: ~5 % faster at N = 1024, K = 8192, T = 64,
~8 % slower at K = 4096 (kept for the larger K, where the op is furthest from its target)."""
comptime MMA_MID_LARGE_N = MmaConfig(4, 4, 1, False, False)
"""16 < T <= WGMMA_MIN_TOKENS, N >= LARGE_N."""
comptime MMA_PREFILL = MmaConfig(2, 4, 1, False, False)
"""T > WGMMA_MIN_TOKENS where the wgmma kernel does not apply (any N)."""

# What `k_cache_gpu_plan` picks (and `k_cache_matmul_gpu` launches).
comptime PLAN_NONE = 0
"""T == 0 or N == 0: nothing is launched."""
comptime PLAN_WGMMA_LARGE = 1
comptime PLAN_WGMMA_SMALL = 2
comptime PLAN_MMA_DECODE = 3
comptime PLAN_MMA_DECODE_LARGE_N = 4
comptime PLAN_MMA_MID = 5
comptime PLAN_MMA_MID_LARGE_N = 6
comptime PLAN_MMA_PREFILL = 7
comptime PLAN_SIMT = 8
comptime PLAN_WGMMA_DECODE = 9
"""The swap-AB decode kernel (gpu_wgmma_decode.mojo)."""
comptime PLAN_WGMMA_DECODE_SPLIT = 10
"""The swap-AB decode kernel with K split over clusters of SPLIT_MAX CTAs (rule 3b)."""
comptime SPLIT_MAX_CTAS = 120
"""Most CTAs the split decode launches: clusters of 4 fit one wave up to 120 CTAs on the H200
(measured with the int4 kernel: `cluster_wave_cap`)."""
comptime DECODE_MIN_CTAS = 100
"""The swap-AB decode kernel (one CTA per 64 weight rows) from this many CTAs on (N >= 6337):
with fewer, too many SMs would sit idle and the mma.sync kernel's smaller CTAs spread better."""


def mma_path_supported[gk: Int](shape: KCacheShape) -> Bool:
    """Whether the tensor-core kernel applies: gk % 64 == 0 and 16-byte aligned rows."""
    comptime if gk % 64 != 0:
        return False
    return Int(shape.K) % 16 == 0 and Int(shape.a_stride) % 16 == 0 and Int(shape.w_stride) % 16 == 0


def k_cache_gpu_plan[gm: Int, gn: Int, gk: Int, path: Int = PATH_HOPPER, fp8_mma: Bool = True](
    shape: KCacheShape
) -> Int:
    """The launch `k_cache_matmul_gpu` makes for this call, a PLAN_* code (the rules in the
    module docstring), on GPU path `path` with (fp8_mma) or without FP8 mma.sync. Host
    arithmetic on T, N, K, a_stride and w_stride only."""
    var T = Int(shape.T)
    if T == 0 or Int(shape.N) == 0:
        return PLAN_NONE
    comptime if path == PATH_PORTABLE or not fp8_mma:
        return PLAN_SIMT
    comptime if gk % 128 == 0 and path == PATH_HOPPER:
        if T > WGMMA_MIN_TOKENS and wgmma_path_supported[gk](shape):
            return PLAN_WGMMA_LARGE if wgmma_large_tiles(shape) else PLAN_WGMMA_SMALL
        if T <= MAX_TOKENS and ceildiv(Int(shape.N), ROWS) >= DECODE_MIN_CTAS and wgmma_path_supported[gk](shape):
            return PLAN_WGMMA_DECODE
        if (16 < T and T <= 64 and ceildiv(Int(shape.N), ROWS) * SPLIT_MAX <= SPLIT_MAX_CTAS
                and wgmma_path_supported[gk](shape)):
            return PLAN_WGMMA_DECODE_SPLIT
    comptime if gk % 64 == 0:
        if mma_path_supported[gk](shape):
            var large_n = Int(shape.N) >= LARGE_N
            if T <= 16:
                return PLAN_MMA_DECODE_LARGE_N if large_n else PLAN_MMA_DECODE
            if T <= WGMMA_MIN_TOKENS:
                return PLAN_MMA_MID_LARGE_N if large_n else PLAN_MMA_MID
            return PLAN_MMA_PREFILL
    return PLAN_SIMT


def k_cache_gpu_plan_text[gm: Int, gn: Int, gk: Int, path: Int = PATH_HOPPER, fp8_mma: Bool = True](
    shape: KCacheShape
) -> String:
    """`k_cache_gpu_plan` as text: "none (T=0)" / "none (N=0)", "wgmma BMxBN" (CTA tile, tokens
    x weight rows), "wgmma swap-AB 64xTN s=S c=C" (weight rows x tokens, stages, consumers),
    "mma.sync MT=.. NB=.. U=.." (+ " late"), or "simt"."""
    var plan = k_cache_gpu_plan[gm, gn, gk, path, fp8_mma](shape)
    if plan == PLAN_NONE:
        return String("none (T=0)") if Int(shape.T) == 0 else String("none (N=0)")
    if plan == PLAN_WGMMA_LARGE:
        return String(LARGE)
    if plan == PLAN_WGMMA_SMALL:
        return String(SMALL)
    if plan == PLAN_WGMMA_DECODE:
        return String(decode_config(Int(shape.T)))
    if plan == PLAN_WGMMA_DECODE_SPLIT:
        return String(decode_split_config(Int(shape.T), SPLIT_MAX))
    if plan == PLAN_MMA_DECODE:
        return String(MMA_DECODE)
    if plan == PLAN_MMA_DECODE_LARGE_N:
        return String(MMA_DECODE_LARGE_N)
    if plan == PLAN_MMA_MID:
        return String(MMA_MID)
    if plan == PLAN_MMA_MID_LARGE_N:
        return String(MMA_MID_LARGE_N)
    if plan == PLAN_MMA_PREFILL:
        return String(MMA_PREFILL)
    return String("simt")


def _launch_mma[cache_t: KVCacheT, gm: Int, gn: Int, gk: Int, cfg: MmaConfig](
    hidden: Fp8Ptr, offsets: U32Ptr, weight: Fp8Ptr, in_scale: F32Ptr, w_scale: F32Ptr,
    kv_scale: F32Ptr, cache_lengths: U32Ptr, lut: U32Ptr, k_cache: cache_t, shape: KCacheShape,
    ctx: DeviceContext,
) raises:
    comptime kernel = _mma_splitk_kernel[cache_t, gm, gn, gk, cfg.mt, cfg.nb, cfg.u, cfg.late_rows, cfg.rotate]
    ctx.enqueue_function[kernel](
        hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape,
        grid_dim=(ceildiv(Int(shape.N), 8 * cfg.nb), ceildiv(Int(shape.T), 16 * cfg.mt)),
        block_dim=THREADS,
        attributes=pdl_attributes(),
    )


def k_cache_matmul_gpu[gm: Int, gn: Int, gk: Int, cache_t: KVCacheT, path: Int = PATH_HOPPER, fp8_mma: Bool = True](
    hidden: Fp8Ptr,
    offsets: U32Ptr,
    weight: Fp8Ptr,
    in_scale: F32Ptr,
    w_scale: F32Ptr,
    kv_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    k_cache: cache_t,
    shape: KCacheShape,
    ctx: DeviceContext,
) raises:
    """Enqueues the kernel `k_cache_gpu_plan` picks for this call's sizes (nothing when T == 0);
    only the kernels `path` and `fp8_mma` allow are instantiated."""
    var plan = k_cache_gpu_plan[gm, gn, gk, path, fp8_mma](shape)
    if plan == PLAN_NONE:
        return
    comptime if gk % 128 == 0 and path == PATH_HOPPER:
        if plan == PLAN_WGMMA_LARGE:
            launch_wgmma[gm, gn, gk, cache_t, LARGE](
                hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape, ctx)
            return
        if plan == PLAN_WGMMA_SMALL:
            launch_wgmma[gm, gn, gk, cache_t, SMALL](
                hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape, ctx)
            return
        if plan == PLAN_WGMMA_DECODE:
            var tn = decode_config(Int(shape.T)).tn
            comptime for i in range(5):
                comptime cfg = decode_config(8 << i)
                if tn == cfg.tn:
                    launch_wgmma_decode[gm, gn, gk, cache_t, cfg](
                        hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache,
                        shape, ctx)
                    return
        if plan == PLAN_WGMMA_DECODE_SPLIT:
            var tn = decode_config(Int(shape.T)).tn
            comptime for i in range(2):
                comptime cfg = decode_split_config(32 << i, SPLIT_MAX)
                if tn == cfg.tn:
                    launch_wgmma_decode[gm, gn, gk, cache_t, cfg](
                        hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache,
                        shape, ctx)
                    return
    comptime if gk % 64 == 0 and path != PATH_PORTABLE and fp8_mma:
        if plan == PLAN_MMA_DECODE_LARGE_N:
            _launch_mma[cache_t, gm, gn, gk, MMA_DECODE_LARGE_N](
                hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape, ctx)
            return
        if plan == PLAN_MMA_DECODE:
            _launch_mma[cache_t, gm, gn, gk, MMA_DECODE](
                hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape, ctx)
            return
        if plan == PLAN_MMA_MID_LARGE_N:
            _launch_mma[cache_t, gm, gn, gk, MMA_MID_LARGE_N](
                hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape, ctx)
            return
        if plan == PLAN_MMA_MID:
            _launch_mma[cache_t, gm, gn, gk, MMA_MID](
                hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape, ctx)
            return
        if plan == PLAN_MMA_PREFILL:
            _launch_mma[cache_t, gm, gn, gk, MMA_PREFILL](
                hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape, ctx)
            return
    if plan != PLAN_SIMT:
        raise Error("k_matmul_ragged_paged_scale: no launch for plan ", plan, " (gk = ", gk, ")")
    comptime kernel = _simt_kernel[cache_t, gm, gn, gk]
    ctx.enqueue_function[kernel](
        hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, k_cache, shape,
        grid_dim=(ceildiv(Int(shape.N), S_BN), ceildiv(Int(shape.T), S_BT)),
        block_dim=THREADS,
    )

"""GPU dispatch of `k_matmul_ragged_paged_scale` (no per-call allocation): the rules, and the
launches that apply them (kernels in kernels/, measured configs in tuning_sm90.mojo).

Dispatch: `k_cache_gpu_plan` picks the launch (a PLAN_* code; `k_cache_gpu_plan_text` names
it, plan.mojo writes it for the `k_matmul_ragged_paged_scale_plan` op) and `k_cache_matmul_gpu`
launches what it picked. Both take the GPU path (common/target.mojo) and whether the target has
FP8 mma.sync as parameters: rules 2-3b (TMA + wgmma) apply on the Hopper path only, rule 4
(FP8 mma.sync) where the compile can emit FP8 mma.sync (sm_90a, sm_100a: Hopper, Blackwell and
the Ampere path forced on those; target.has_fp8_mma), rule 5 everywhere: on sm_80 / 86 / 89
and AMD (the portable path) every call takes `simt_kernel`, written with shared-memory tiles and
barrier() only. First match wins:
1. T == 0 (or N == 0): nothing is launched.
2. T > WGMMA_MIN_TOKENS, gk % 128 == 0, K % 16 == 0, dense rows: TMA + wgmma (kernels/wgmma.mojo),
   TALL_PERSISTENT by `wgmma_tall_tiles` (many waves of tiles, K >= 4096), else LARGE or SMALL
   tiles by `wgmma_large_tiles`.
3. T <= MAX_TOKENS (128), ceil(N / 64) >= DECODE_MIN_CTAS, the same operand rules: swap-AB TMA
   + wgmma with the weight on the MMA's M side (kernels/wgmma_decode.mojo; `decode_config` picks
   the token tile): TMA keeps far more weight bytes in flight per SM than 4.'s register
   fragments (up to 4x faster at N = 8192, T = 64-128).
3b. 16 < T <= 64, ceil(N / 64) * SPLIT_MAX <= SPLIT_MAX_CTAS (N <= 1920), the same operand
   rules: the swap-AB kernel with K split over (SPLIT_MAX, 1, 1) clusters, partial sums added
   through distributed shared memory (`decode_split_config`): N = 1024 gives 3. only 16 CTAs,
   and 4.'s 16-row CTAs re-read the tokens from L2 many times (the split is ~30 % faster at
   K = 8192, T = 64).
4. gk % 64 == 0, K and the row strides multiples of 16: `mma_splitk_kernel` (kernels/mma.mojo), with
   (MT, NB, U) = (1, 1, 4) for T <= 16, (2, 2, 2) for T <= WGMMA_MIN_TOKENS, else (2, 4, 1);
   from N = LARGE_N rows: (1, 2, 2) with late row resolution for T <= 16, (4, 4, 1) up to
   WGMMA_MIN_TOKENS (the MMA_* configs). The fused K+V op (one launch, 2 N rows of CTAs)
   counts both halves' rows for T <= 16 and 32 < T <= 64; at 17-32 tokens one 32-token tile
   of (2, 2, 2) holds every token and the per-half config stays (measurements:
   docs/design/k_matmul_ragged_paged_scale.md, "Fused K and V").
5. Anything else (any granularity): `simt_kernel` (kernels/simt.mojo), fp32 FMAs from
   shared-memory tiles.
"""


from std.math import ceildiv
from max.gpu.host import DeviceContext

from ..common.pdl import pdl_attributes
from ..common.target import PATH_HOPPER, PATH_PORTABLE
from .kernels.mma import MmaConfig, mma_splitk_kernel
from .kernels.simt import S_BN, S_BT, simt_kernel
from .kernels.tiles import THREADS
from .kernels.wgmma import (
    LARGE, SMALL, TALL_PERSISTENT, launch_wgmma, wgmma_large_tiles, wgmma_path_supported, wgmma_tall_tiles
)
from .kernels.wgmma_decode import MAX_TOKENS, ROWS, SPLIT_MAX, decode_config, decode_split_config, launch_wgmma_decode
from .layout import F32Ptr, Fp8Ptr, KCacheShape, U32Ptr
from .sink import RowSink
from .tuning_sm90 import MMA_DECODE, MMA_DECODE_LARGE_N, MMA_MID, MMA_MID_LARGE_N, MMA_PREFILL

comptime WGMMA_MIN_TOKENS = 128
"""More tokens than this (and gk % 128 == 0) take the TMA + wgmma kernel (kernels/wgmma.mojo); up
to it the mma.sync split-K kernel, whose CTAs cover only 8 or 16 weight rows each, keeps more
SMs busy (at N = 1024, T = 64-128 the 64-row wgmma tiles leave most SMs idle)."""
comptime LARGE_N = 4096
"""From this many weight rows (e.g. a fused QKV projection) the mma.sync kernel takes CTAs of
more rows: with N / 8 CTAs of 8 rows the grid runs ~4 waves of short CTAs at N = 8192, and
fewer, fatter CTAs stream better ((MT, NB, U) = (1, 2, 2) with the rows resolved late for
T <= 16, (4, 4, 1) above; 20-40 % faster there). At N = 1024 both would leave SMs idle."""


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
"""The swap-AB decode kernel (kernels/wgmma_decode.mojo)."""
comptime PLAN_WGMMA_DECODE_SPLIT = 10
"""The swap-AB decode kernel with K split over clusters of SPLIT_MAX CTAs (rule 3b)."""
comptime PLAN_WGMMA_TALL = 11
"""The wgmma prefill kernel with TALL_PERSISTENT tiles (rule 2)."""
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
    shape: KCacheShape, halves: Int = 1
) -> Int:
    """The launch `k_cache_matmul_gpu` makes for this call, a PLAN_* code (the rules in the
    module docstring), on GPU path `path` with (fp8_mma) or without FP8 mma.sync. Host
    arithmetic on T, N, K, a_stride and w_stride only. halves: 2 for the fused K+V op, whose
    mma.sync launch covers both halves' rows (grid z = 2): at T <= 16 and 32 < T <= 64 the
    config is that of 2 N rows."""
    var T = Int(shape.T)
    if T == 0 or Int(shape.N) == 0:
        return PLAN_NONE
    comptime if path == PATH_PORTABLE or not fp8_mma:
        return PLAN_SIMT
    comptime if gk % 128 == 0 and path == PATH_HOPPER:
        if T > WGMMA_MIN_TOKENS and wgmma_path_supported[gk](shape):
            if wgmma_tall_tiles(shape):
                return PLAN_WGMMA_TALL
            return PLAN_WGMMA_LARGE if wgmma_large_tiles(shape) else PLAN_WGMMA_SMALL
        if T <= MAX_TOKENS and ceildiv(Int(shape.N), ROWS) >= DECODE_MIN_CTAS and wgmma_path_supported[gk](shape):
            return PLAN_WGMMA_DECODE
        if (16 < T and T <= 64 and ceildiv(Int(shape.N), ROWS) * SPLIT_MAX <= SPLIT_MAX_CTAS
                and wgmma_path_supported[gk](shape)):
            return PLAN_WGMMA_DECODE_SPLIT
    comptime if gk % 64 == 0:
        if mma_path_supported[gk](shape):
            # the fused K+V launch's CTAs cover both halves' rows; from 33 tokens MMA_MID's
            # 32-token tiles stream the weights twice, MMA_MID_LARGE_N's 64-token tiles once
            var fused_rows = T <= 16 or (32 < T and T <= 64)
            var large_n = Int(shape.N) * (halves if fused_rows else 1) >= LARGE_N
            if T <= 16:
                return PLAN_MMA_DECODE_LARGE_N if large_n else PLAN_MMA_DECODE
            if T <= WGMMA_MIN_TOKENS:
                return PLAN_MMA_MID_LARGE_N if large_n else PLAN_MMA_MID
            return PLAN_MMA_PREFILL
    return PLAN_SIMT


def k_cache_gpu_plan_text[gm: Int, gn: Int, gk: Int, path: Int = PATH_HOPPER, fp8_mma: Bool = True](
    shape: KCacheShape, halves: Int = 1
) -> String:
    """`k_cache_gpu_plan` as text: "none (T=0)" / "none (N=0)", "wgmma BMxBN" (CTA tile, tokens
    x weight rows), "wgmma swap-AB 64xTN s=S c=C" (weight rows x tokens, stages, consumers),
    "mma.sync MT=.. NB=.. U=.." (+ " late"), or "simt"."""
    var plan = k_cache_gpu_plan[gm, gn, gk, path, fp8_mma](shape, halves)
    if plan == PLAN_NONE:
        return String("none (T=0)") if Int(shape.T) == 0 else String("none (N=0)")
    if plan == PLAN_WGMMA_LARGE:
        return String(LARGE)
    if plan == PLAN_WGMMA_SMALL:
        return String(SMALL)
    if plan == PLAN_WGMMA_TALL:
        return String(TALL_PERSISTENT)
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


def _launch_mma[sink_t: RowSink, gm: Int, gn: Int, gk: Int, cfg: MmaConfig](
    hidden: Fp8Ptr, offsets: U32Ptr, in_scale: F32Ptr, cache_lengths: U32Ptr, lut: U32Ptr,
    shape: KCacheShape,
    k_weight: Fp8Ptr,
    k_w_scale: F32Ptr,
    k_kv_scale: F32Ptr,
    k_sink: sink_t,
    v_weight: Fp8Ptr,
    v_w_scale: F32Ptr,
    v_kv_scale: F32Ptr,
    v_sink: sink_t,
    both: Bool,
    ctx: DeviceContext,
) raises:
    comptime kernel = mma_splitk_kernel[sink_t, gm, gn, gk, cfg.mt, cfg.nb, cfg.u, cfg.late_rows, cfg.rotate]
    ctx.enqueue_function[kernel](
        hidden, offsets, k_weight, v_weight, in_scale, k_w_scale, v_w_scale, k_kv_scale,
        v_kv_scale, cache_lengths, lut, k_sink, v_sink, shape,
        grid_dim=(ceildiv(Int(shape.N), 8 * cfg.nb), ceildiv(Int(shape.T), 16 * cfg.mt), 2 if both else 1),
        block_dim=THREADS,
        attributes=pdl_attributes(),
    )


def k_cache_matmul_gpu[gm: Int, gn: Int, gk: Int, sink_t: RowSink, path: Int = PATH_HOPPER, fp8_mma: Bool = True](
    hidden: Fp8Ptr,
    offsets: U32Ptr,
    in_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    shape: KCacheShape,
    k_weight: Fp8Ptr,
    k_w_scale: F32Ptr,
    k_kv_scale: F32Ptr,
    k_sink: sink_t,
    v_weight: Fp8Ptr,
    v_w_scale: F32Ptr,
    v_kv_scale: F32Ptr,
    v_sink: sink_t,
    both: Bool,
    ctx: DeviceContext,
) raises:
    """Enqueues the kernel `k_cache_gpu_plan` picks for this call's sizes (nothing when T == 0)
    for the K operands (k_*), and with `both` for the V operands (v_*) too (the fused K+V op; `shape` holds for both):
    the mma.sync plans project both halves in one launch (grid z = 2), the other plans launch
    once per half. Only the kernels `path` and `fp8_mma` allow are instantiated."""
    var plan = k_cache_gpu_plan[gm, gn, gk, path, fp8_mma](shape, 2 if both else 1)
    if plan == PLAN_NONE:
        return
    comptime if gk % 64 == 0 and path != PATH_PORTABLE and fp8_mma:
        if plan == PLAN_MMA_DECODE_LARGE_N:
            _launch_mma[sink_t, gm, gn, gk, MMA_DECODE_LARGE_N](
                hidden, offsets, in_scale, cache_lengths, lut, shape,
                k_weight, k_w_scale, k_kv_scale, k_sink, v_weight, v_w_scale, v_kv_scale, v_sink, both, ctx)
            return
        if plan == PLAN_MMA_DECODE:
            _launch_mma[sink_t, gm, gn, gk, MMA_DECODE](
                hidden, offsets, in_scale, cache_lengths, lut, shape,
                k_weight, k_w_scale, k_kv_scale, k_sink, v_weight, v_w_scale, v_kv_scale, v_sink, both, ctx)
            return
        if plan == PLAN_MMA_MID_LARGE_N:
            _launch_mma[sink_t, gm, gn, gk, MMA_MID_LARGE_N](
                hidden, offsets, in_scale, cache_lengths, lut, shape,
                k_weight, k_w_scale, k_kv_scale, k_sink, v_weight, v_w_scale, v_kv_scale, v_sink, both, ctx)
            return
        if plan == PLAN_MMA_MID:
            _launch_mma[sink_t, gm, gn, gk, MMA_MID](
                hidden, offsets, in_scale, cache_lengths, lut, shape,
                k_weight, k_w_scale, k_kv_scale, k_sink, v_weight, v_w_scale, v_kv_scale, v_sink, both, ctx)
            return
        if plan == PLAN_MMA_PREFILL:
            _launch_mma[sink_t, gm, gn, gk, MMA_PREFILL](
                hidden, offsets, in_scale, cache_lengths, lut, shape,
                k_weight, k_w_scale, k_kv_scale, k_sink, v_weight, v_w_scale, v_kv_scale, v_sink, both, ctx)
            return
    _launch_half[gm, gn, gk, sink_t, path](
        plan, hidden, offsets, in_scale, cache_lengths, lut, shape, k_weight, k_w_scale, k_kv_scale, k_sink, ctx)
    if both:
        _launch_half[gm, gn, gk, sink_t, path](
            plan, hidden, offsets, in_scale, cache_lengths, lut, shape, v_weight, v_w_scale, v_kv_scale, v_sink, ctx)


def _launch_half[gm: Int, gn: Int, gk: Int, sink_t: RowSink, path: Int](
    plan: Int,
    hidden: Fp8Ptr,
    offsets: U32Ptr,
    in_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    shape: KCacheShape,
    weight: Fp8Ptr,
    w_scale: F32Ptr,
    kv_scale: F32Ptr,
    sink: sink_t,
    ctx: DeviceContext,
) raises:
    """Launches a non-mma.sync `plan` (wgmma prefill or decode, SIMT) for one half's operands."""
    comptime if gk % 128 == 0 and path == PATH_HOPPER:
        if plan == PLAN_WGMMA_LARGE:
            launch_wgmma[gm, gn, gk, sink_t, LARGE](
                hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, sink, shape, ctx)
            return
        if plan == PLAN_WGMMA_SMALL:
            launch_wgmma[gm, gn, gk, sink_t, SMALL](
                hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, sink, shape, ctx)
            return
        if plan == PLAN_WGMMA_TALL:
            launch_wgmma[gm, gn, gk, sink_t, TALL_PERSISTENT](
                hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, sink, shape, ctx)
            return
        if plan == PLAN_WGMMA_DECODE:
            var tn = decode_config(Int(shape.T)).tn
            comptime for i in range(5):
                comptime cfg = decode_config(8 << i)
                if tn == cfg.tn:
                    launch_wgmma_decode[gm, gn, gk, sink_t, cfg](
                        hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, sink,
                        shape, ctx)
                    return
        if plan == PLAN_WGMMA_DECODE_SPLIT:
            var tn = decode_config(Int(shape.T)).tn
            comptime for i in range(2):
                comptime cfg = decode_split_config(32 << i, SPLIT_MAX)
                if tn == cfg.tn:
                    launch_wgmma_decode[gm, gn, gk, sink_t, cfg](
                        hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, sink,
                        shape, ctx)
                    return
    if plan != PLAN_SIMT:
        raise Error("k_matmul_ragged_paged_scale: no launch for plan ", plan, " (gk = ", gk, ")")
    comptime kernel = simt_kernel[sink_t, gm, gn, gk]
    ctx.enqueue_function[kernel](
        hidden, offsets, weight, in_scale, w_scale, kv_scale, cache_lengths, lut, sink, shape,
        grid_dim=(ceildiv(Int(shape.N), S_BN), ceildiv(Int(shape.T), S_BT)),
        block_dim=THREADS,
    )

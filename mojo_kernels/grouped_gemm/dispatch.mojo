"""GPU dispatch of `grouped_matmul_sm100_persistent`: the kernel and token tile for the GPU path
(the rules in entry.mojo's docstring), and the launches that apply them. Kernels in kernels/,
the measured token tiles in tuning_sm90.mojo."""

from std.math import sqrt
from std.sys import size_of
from max.gpu.host import DeviceContext

from ..common.target import PATH_AMPERE, PATH_BLACKWELL, PATH_HOPPER
from .kernels.mma import grouped_matmul_gpu_mma
from .kernels.naive import grouped_matmul_gpu_naive
from .kernels.sm90 import grouped_matmul_sm90
from .kernels.sm100 import grouped_matmul_sm100
from .scheduler import ElemPtr, F32Ptr, GroupedShape, I32Ptr, U32Ptr
from .tuning_sm90 import (
    DECODE_BN, DECODE_KSUB, DECODE_WIDTHS, GROUP_SPREAD, MID_BN, MID_STAGED, PREFILL_BN, PREFILL_STAGED, TILE_WIDTHS
)


def use_decode_tiles(shape: GroupedShape) -> Bool:
    """sm_100a's host-side choice of the token tile from shapes only (no device read): the
    average group size T / G decides; the kernels stay correct for any mix of group sizes."""
    return shape.T <= 64 * max(shape.G, 1)


def typical_group_fits(shape: GroupedShape, bn: Int) -> Bool:
    """Whether a typical group (mean rows T / G plus GROUP_SPREAD standard deviations, sqrt of
    the mean under uniform routing) fits one token tile of `bn` rows, so its weights are read
    once."""
    var mean = Float64(shape.T) / Float64(max(shape.G, 1))
    return mean + GROUP_SPREAD * sqrt(mean) <= Float64(bn)


def sm90_token_regime(shape: GroupedShape) -> Int:
    """SM90's token tile from shapes only (no device read): the narrowest tile a typical group
    fits (0 = DECODE_BN, 1 = MID_BN), else 2 = PREFILL_BN (tuning_sm90.mojo). A group that
    spills over one tile re-reads its weights for the next (at 128 mean rows the BN = 256 tile
    beat BN = 128 by 6-12 % on the H200; at 96 BN = 128 won by 11 %); the kernels stay correct
    for any mix of group sizes."""
    if typical_group_fits(shape, DECODE_BN):
        return 0
    if typical_group_fits(shape, MID_BN):
        return 1
    return 2


def _launch_sm100[
    dtype: DType, cta_group: Int, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool
](
    c: ElemPtr[dtype],
    a: ElemPtr[dtype],
    b: ElemPtr[dtype],
    a_offsets: U32Ptr,
    expert_ids: I32Ptr,
    stats: U32Ptr,
    row_scale: F32Ptr,
    shape: GroupedShape,
    ctx: DeviceContext,
) raises:
    if use_decode_tiles(shape):
        grouped_matmul_sm100[dtype, DECODE_BN, cta_group, s0, s1, swiglu, has_row_scale](
            c, a, b, a_offsets, expert_ids, stats, row_scale, shape, ctx)
    else:
        grouped_matmul_sm100[dtype, PREFILL_BN, cta_group, s0, s1, swiglu, has_row_scale](
            c, a, b, a_offsets, expert_ids, stats, row_scale, shape, ctx)


def grouped_matmul_gpu[
    dtype: DType, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool, path: Int, routing_settled: Bool = False
](
    c: ElemPtr[dtype],
    a: ElemPtr[dtype],
    b: ElemPtr[dtype],
    a_offsets: U32Ptr,
    expert_ids: I32Ptr,
    stats: U32Ptr,
    row_scale: F32Ptr,
    shape: GroupedShape,
    ctx: DeviceContext,
) raises:
    """Launches the kernel of GPU path `path` (a supported PATH_*) for this call's shape: the
    TMA kernels on Hopper / Blackwell and the mma.sync kernel on Ampere when
    K * sizeof(dtype) % 16 == 0, else (and on the portable path) the naive one. routing_settled:
    `launch_grouped_matmul` (the SM90 kernel's EARLY_ROUTING)."""
    # One comptime chain, so a path instantiates only its own kernels (the sm_100a kernel
    # does not build for other targets).
    comptime if path != PATH_AMPERE and path != PATH_HOPPER and path != PATH_BLACKWELL:
        grouped_matmul_gpu_naive[dtype, s0, s1, swiglu, has_row_scale](
            c, a, b, a_offsets, expert_ids, stats, row_scale, shape, ctx)
    else:
        # every tensor-core kernel reads a / b rows by 16-byte loads (TMA or vectors)
        if (shape.K * size_of[dtype]()) % 16 != 0:
            grouped_matmul_gpu_naive[dtype, s0, s1, swiglu, has_row_scale](
                c, a, b, a_offsets, expert_ids, stats, row_scale, shape, ctx)
            return
        comptime if path == PATH_AMPERE:
            grouped_matmul_gpu_mma[dtype, s0, s1, swiglu, has_row_scale](
                c, a, b, a_offsets, expert_ids, stats, row_scale, shape, ctx)
        elif path == PATH_HOPPER:
            var regime = sm90_token_regime(shape)
            if regime == 0:
                grouped_matmul_sm90[
                    dtype, DECODE_BN, DECODE_WIDTHS, s0, s1, swiglu, has_row_scale, DECODE_KSUB, False, routing_settled
                ](
                    c, a, b, a_offsets, expert_ids, stats, row_scale, shape, ctx)
            elif regime == 1:
                grouped_matmul_sm90[
                    dtype, MID_BN, TILE_WIDTHS, s0, s1, swiglu, has_row_scale, 1, MID_STAGED, routing_settled
                ](
                    c, a, b, a_offsets, expert_ids, stats, row_scale, shape, ctx)
            else:
                grouped_matmul_sm90[
                    dtype, PREFILL_BN, TILE_WIDTHS, s0, s1, swiglu, has_row_scale, 1, PREFILL_STAGED, routing_settled
                ](
                    c, a, b, a_offsets, expert_ids, stats, row_scale, shape, ctx)
        else:
            # sm_100a: 2-SM MMA (256 weight rows per cluster, one token tile shared by the
            # pair) when N fills 256-row tiles and every pair tile reads a single Q/K/V plane
            comptime pair_ok = s0 == 0 or (s0 % 256 == 0 and s1 % 256 == 0)
            comptime if pair_ok:
                if shape.N % 256 == 0:
                    _launch_sm100[dtype, 2, s0, s1, swiglu, has_row_scale](
                        c, a, b, a_offsets, expert_ids, stats, row_scale, shape, ctx)
                    return
            _launch_sm100[dtype, 1, s0, s1, swiglu, has_row_scale](
                c, a, b, a_offsets, expert_ids, stats, row_scale, shape, ctx)

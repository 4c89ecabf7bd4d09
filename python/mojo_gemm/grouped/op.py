"""Graph function of the MoE grouped GEMM: `grouped_matmul` emits `grouped_matmul_sm100_persistent`.

Kernels (mojo_kernels/grouped_gemm/): CPU (parallel), SM90 (H100/H200: persistent TMA + wgmma,
warp-specialized, swap-AB) and SM100 (B200: tcgen05 + TMEM, cta_group 1/2); the choice is made
at compile time from the graph's device. The kernels read a_offsets, expert_ids and
expert_usage_stats on the device: no device-to-host copy, no synchronization, so the op can be
captured in a device graph.

Runtime data is trusted and clamped, never checked (checking would need a device read):
- G_active = min(expert_usage_stats[1], G); groups >= G_active touch nothing;
- group g's rows are [min(a_offsets[g], T), min(a_offsets[g + 1], T)); a range that does not
  increase is empty (non-monotone offsets skip the group; overlapping groups may write the same
  rows twice, always inside c);
- an expert id outside [0, E) (−1, or >= E) zero-fills the group's rows and reads no weight.
expert_usage_stats[0] (max tokens per group) is accepted for MAX compatibility and not needed.
"""

from __future__ import annotations

from collections.abc import Sequence

from max.dtype import DType
from max.graph import BufferValue, TensorType, TensorValue, ops

from ..core.extension import ensure_kernels_loaded
from ..core.targets import op_target_parameters
from .contract import GROUPED_MATMUL, grouped_out_cols, grouped_out_rows

OP_NAME = "grouped_matmul_sm100_persistent"
OP_NAME_INPLACE = "grouped_matmul_sm100_persistent_inplace"


def grouped_matmul(
    a: TensorValue,
    b: TensorValue,
    a_offsets: TensorValue,
    expert_ids: TensorValue,
    expert_usage_stats: TensorValue,
    *,
    a_plane_splits: Sequence[int] = (0, 0),
    swiglu: bool = False,
    row_scale: TensorValue | None = None,
    out: BufferValue | None = None,
    routing_settled: bool = False,
) -> TensorValue | None:
    """MoE grouped GEMM: c[r] = epilogue(a[r] · b[expert_ids[g]]ᵀ) for rows r of group g.

    a: bfloat16/float16 [T, K], tokens sorted by group ([3 T, K] with a_plane_splits);
    b: a's dtype [E, N, K] (static; expert e's weight is [N, K]); a_offsets: uint32 [G + 1]
    prefix sums (group g owns rows a_offsets[g]..a_offsets[g+1]); expert_ids: int32 [G]
    (−1: rows written as zeros); expert_usage_stats: uint32 [2] = [max tokens in a group,
    G_active], all on a's device.

    a_plane_splits (s0, s1): (0, 0) is off; otherwise a is a Q/K/V plane stack [3 T, K] and
    output column n reads plane 0 if n < s0, 1 if n < s1, else 2 (a row token + plane · T);
    s0, s1 multiples of 128 (fused LoRA-B QKV expand).
    Epilogue, in fp32 before the single rounding: swiglu (b's N rows hold gate and up
    interleaved in blocks of 8, see `interleave_gate_up`; output column i = silu(gate_i) · up_i,
    so c has N / 2 columns), then row_scale (float32 [T], e.g. router weights): row r times
    row_scale[r].

    routing_settled: True only when an earlier `grouped_matmul` of the same graph read the same
    a_offsets, expert_ids and expert_usage_stats (e.g. the down projection after gate_up) and b
    holds weights no op of the graph writes: the kernel then reads the routing, and starts
    streaming b, while the kernel ahead of it still runs (on Hopper; ignored elsewhere). The
    Hopper kernel lets its successor start only after its own inputs are complete, which is
    what makes that safe.

    Returns c (a's dtype, [T, N] or [T, N / 2]) whose rows outside the active groups are
    unspecified; or, when `out` (a buffer of that shape) is given, writes into it and returns
    None (rows of inactive groups keep their contents). Raises TypeError/ValueError
    (`contracts.GROUPED_MATMUL`) at graph-build time for bad ranks, dtypes, shapes or
    devices, TypeError naming the argument for a value of the wrong Python type (e.g. a
    TensorValue as `out`), and ValueError for a GPU target no kernel path supports
    (`mojo_gemm.core.targets`); runtime data is clamped as described in the module docstring.
    """
    splits = tuple(a_plane_splits) if isinstance(a_plane_splits, (tuple, list)) else a_plane_splits
    GROUPED_MATMUL.validate(
        {
            "a": a,
            "b": b,
            "a_offsets": a_offsets,
            "expert_ids": expert_ids,
            "expert_usage_stats": expert_usage_stats,
            "a_plane_splits": splits,
            "swiglu": swiglu,
            "row_scale": row_scale,
            "out": out,
            "routing_settled": routing_settled,
        }
    )
    ensure_kernels_loaded()
    device = a.device
    n = int(b.shape[1])
    scale = (
        row_scale
        if row_scale is not None
        else ops.constant(0, DType.float32, device=device).broadcast_to([1])
    )
    operands = [a, b, a_offsets, expert_ids, expert_usage_stats, scale]
    parameters: dict[str, bool | int | str | DType] = {
        "a_plane_split0": int(splits[0]),
        "a_plane_split1": int(splits[1]),
        "swiglu": bool(swiglu),
        "has_row_scale": row_scale is not None,
        "routing_settled": bool(routing_settled),
        **op_target_parameters(OP_NAME, device),
    }
    if out is not None:
        ops.inplace_custom(OP_NAME_INPLACE, device, [out, *operands], parameters=parameters)
        return None
    rows = grouped_out_rows({"a": a, "a_plane_splits": splits})
    out_type = TensorType(a.dtype, [rows, grouped_out_cols(n, swiglu)], device)
    return ops.custom(OP_NAME, device, operands, [out_type], parameters=parameters)[0].tensor

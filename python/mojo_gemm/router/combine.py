"""Graph function of `moe_combine_rows`: an MoE layer's expert rows summed back per token.

One op (one GPU kernel reading each row once) replaces the gather of the T·k rows into token
order, the cast to float32, the sum over k and the cast back that the combine takes as graph
ops (four kernels and a float32 copy of every row; kernels: mojo_kernels/moe_combine/).
"""

from __future__ import annotations

from max.graph import TensorType, TensorValue, ops

from ..core.extension import ensure_kernels_loaded
from ..core.targets import op_target_parameters
from .contract import MOE_COMBINE

OP_NAME = "moe_combine_rows"


def moe_combine(y: TensorValue, inverse: TensorValue, top_k: int) -> TensorValue:
    """Sums each token's k expert rows: y's dtype [T, H] from y [T·k, H] and inverse [T·k].

    y: bfloat16 or float16 [T·k, H] (rows may be symbolic; H static), the rows in
    `moe_route`'s sorted order (e.g. the down projection's `grouped_matmul` output, router
    weights applied through its row_scale); inverse: int64 [T·k], `MoERouting.inverse` (the
    sorted row of assignment t·k + j); top_k: int >= 1. out[t] = Σ_j y[inverse[t·k + j]]
    accumulated in float32 in j order, rounded once; an index outside [0, T·k) adds nothing.
    Raises TypeError / ValueError naming the argument (`router.contract.MOE_COMBINE`) at graph
    build time, ValueError for a GPU target no kernel path supports (`core.targets`).
    """
    MOE_COMBINE.validate({"y": y, "inverse": inverse, "top_k": top_k})
    ensure_kernels_loaded()
    device = y.device
    op_target_parameters(OP_NAME, device)
    tokens = inverse.shape[0] // top_k
    out = ops.custom(OP_NAME, device, [y, inverse],
                     [TensorType(y.dtype, [tokens, y.shape[1]], device)])
    return out[0].tensor

"""Graph function of the MoE routing op `moe_route_topk_group` (router, top-k, grouping by expert).

One custom op (two GPU kernels: router + top-k + softmax, then a one-CTA grouping) replaces the
~15-20 small graph ops a top-k router and its on-device grouping take otherwise (cast, float32
matmul, top_k, softmax, argsort twice, one-hot counts, cumsum, concat, gathers), each its own
kernel launch. Its outputs are the routing operands of `grouped_matmul` plus what a MoE block
needs to build its rows and put the results back (kernels: mojo_kernels/moe_route/).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from max.dtype import DType
from max.graph import TensorType, TensorValue, ops

from ..core.extension import ensure_kernels_loaded
from ..core.targets import op_target_parameters
from .contract import MOE_ROUTE

OP_NAME = "moe_route_topk_group"


@dataclass(frozen=True)
class MoERouting:
    """The routing of T tokens to their top-k of E experts (graph values on x's device).

    topk_ids: int32 [T, k]: per token the experts of the k largest logits, in decreasing
        logit order, ties towards the lower expert id.
    topk_weights: float32 [T, k]: softmax over those k logits.
    token_index: int64 [T·k]: the token of sorted row r; rows are the assignments
        a = t·k + j sorted by (expert, a), so `ops.gather(x, token_index, 0)` is the `a` of
        `grouped_matmul`.
    row_scale: float32 [T·k]: topk_weights of the assignment in sorted row r.
    inverse: int64 [T·k]: the sorted row of assignment a (puts results back in token order).
    a_offsets: uint32 [E + 1]: a_offsets[e] = rows of experts < e (a_offsets[E] = T·k).
    expert_ids: int32 [E] = arange(E) (a graph constant; empty groups included).
    expert_usage_stats: uint32 [2] = [max rows of one expert, E].
    """

    topk_ids: TensorValue
    topk_weights: TensorValue
    token_index: TensorValue
    row_scale: TensorValue
    inverse: TensorValue
    a_offsets: TensorValue
    expert_ids: TensorValue
    expert_usage_stats: TensorValue

    @property
    def grouped_operands(self) -> tuple[TensorValue, TensorValue, TensorValue]:
        """(a_offsets, expert_ids, expert_usage_stats): `grouped_matmul`'s routing arguments."""
        return self.a_offsets, self.expert_ids, self.expert_usage_stats


def moe_route(x: TensorValue, router_weight: TensorValue, top_k: int) -> MoERouting:
    """Routes tokens to experts and groups the assignments by expert, in one op.

    x: bfloat16 or float16 [T, H] (T may be symbolic, or 0; H static, a multiple of 8);
    router_weight: x's dtype [E, H] (1 <= E <= 1024), on x's device; top_k: int in [1, E].
    logits[t, e] = Σ_h f32(x[t, h]) · f32(router_weight[e, h]) accumulated in float32 (the
    order of the sum is the kernel's). Returns the `MoERouting` (every tensor on x's device).
    Raises TypeError / ValueError naming the argument (`router.contract.MOE_ROUTE`) at
    graph build time, ValueError for a GPU target no kernel path supports (`core.targets`).
    """
    MOE_ROUTE.validate({"x": x, "router_weight": router_weight, "top_k": top_k})
    ensure_kernels_loaded()
    device = x.device
    # one kernel pair for every GPU (no forced path): only the target check applies
    op_target_parameters(OP_NAME, device)
    t = x.shape[0]
    e = int(router_weight.shape[0])
    r = t * top_k
    outs = ops.custom(
        OP_NAME,
        device,
        [x, router_weight],
        [
            TensorType(DType.int32, [t, top_k], device),
            TensorType(DType.float32, [t, top_k], device),
            TensorType(DType.int64, [r], device),
            TensorType(DType.float32, [r], device),
            TensorType(DType.int64, [r], device),
            TensorType(DType.uint32, [e + 1], device),
            TensorType(DType.uint32, [2], device),
        ],
    )
    ids, weights, token_index, row_scale, inverse, offsets, stats = (o.tensor for o in outs)
    expert_ids = ops.constant(np.arange(e, dtype=np.int32), DType.int32, device=device)
    return MoERouting(ids, weights, token_index, row_scale, inverse, offsets, expert_ids, stats)

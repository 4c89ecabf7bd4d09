"""Host-side (numpy) MoE helpers for `grouped_matmul`: token grouping and the SwiGLU weight layout.

`group_tokens_by_expert` turns a router's top-k expert choices into the grouped layout the op
takes (rows sorted by expert, prefix offsets, expert ids, usage stats); `interleave_gate_up`
builds the gate/up weight layout of the SwiGLU epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.rules import ARRAY, INT, check_types

SWIGLU_BLOCK = 8
"""Gate and up rows alternate in blocks of this many (see `interleave_gate_up`)."""


@dataclass(frozen=True)
class ExpertGrouping:
    """The grouped layout of R = T · top_k token-expert assignments (all numpy arrays).

    row_order: int64 [R]; sorted position j holds flat assignment row_order[j] = t · top_k + s
        (token t, choice s); stable, so tokens stay in order inside an expert.
    token_index: int64 [R] = row_order // top_k: the token whose activation goes in row j
        (gather `x[token_index]` to build the op's `a`).
    inverse_order: int64 [R]: sorted row of each flat assignment (row_order's inverse), so
        `y_sorted[inverse_order].reshape(T, top_k, N)` puts results back in token order.
    a_offsets: uint32 [E + 1]; group g owns sorted rows a_offsets[g]..a_offsets[g+1].
    expert_ids: int32 [E]; the used experts in increasing id first, then the unused ones
        (empty groups), so every array has a fixed size for a given E.
    expert_usage_stats: uint32 [2] = [max rows of one expert, number of used experts]; the
        op visits only the first stats[1] groups.
    """

    row_order: np.ndarray
    token_index: np.ndarray
    inverse_order: np.ndarray
    a_offsets: np.ndarray
    expert_ids: np.ndarray
    expert_usage_stats: np.ndarray


def group_tokens_by_expert(topk_ids: np.ndarray, num_experts: int) -> ExpertGrouping:
    """Groups the token-expert assignments of a router by expert.

    topk_ids: integer [T, top_k] (or [T] for top-1) of expert ids in [0, num_experts).
    Returns the `ExpertGrouping` (G = num_experts groups). Raises ValueError for ids outside
    [0, num_experts) or num_experts < 1, TypeError for a non-integer array.
    """
    check_types("group_tokens_by_expert", {"topk_ids": topk_ids, "num_experts": num_experts},
                {"topk_ids": ARRAY, "num_experts": INT})
    ids = np.asarray(topk_ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"group_tokens_by_expert: topk_ids must be integers, got {ids.dtype}")
    if ids.ndim not in (1, 2):
        raise ValueError(f"group_tokens_by_expert: topk_ids must be [T] or [T, top_k], got "
                         f"shape {ids.shape}")
    if num_experts < 1:
        raise ValueError(f"group_tokens_by_expert: num_experts must be >= 1, got {num_experts}")
    top_k = 1 if ids.ndim == 1 else ids.shape[1]
    flat = ids.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= num_experts):
        raise ValueError(
            f"group_tokens_by_expert: expert ids must be in [0, {num_experts}), got "
            f"[{flat.min()}, {flat.max()}]"
        )
    counts = np.bincount(flat, minlength=num_experts)
    used = np.flatnonzero(counts)
    unused = np.flatnonzero(counts == 0)
    order_of_experts = np.concatenate([used, unused])
    # Sort assignments by their expert's group position (= by expert id, since used experts
    # come first in increasing order and unused ones own no rows).
    row_order = np.argsort(flat, kind="stable").astype(np.int64)
    inverse = np.empty_like(row_order)
    inverse[row_order] = np.arange(row_order.size, dtype=np.int64)
    group_counts = counts[order_of_experts]
    offsets = np.zeros(num_experts + 1, dtype=np.uint32)
    np.cumsum(group_counts, out=offsets[1:])
    stats = np.array([counts.max() if flat.size else 0, used.size], dtype=np.uint32)
    return ExpertGrouping(
        row_order=row_order,
        token_index=row_order // top_k,
        inverse_order=inverse,
        a_offsets=offsets,
        expert_ids=order_of_experts.astype(np.int32),
        expert_usage_stats=stats,
    )


def interleave_gate_up(w_gate: np.ndarray, w_up: np.ndarray) -> np.ndarray:
    """The [E, 2 I, K] expert bank of the SwiGLU epilogue from gate and up weights [E, I, K].

    Rows [16j, 16j + 8) are gate rows [8j, 8j + 8) and rows [16j + 8, 16j + 16) the matching up
    rows, so output column i of `grouped_matmul(..., swiglu=True)` is silu(x·gate_i)·(x·up_i).
    I must be a multiple of 8. Also accepts [I, K] (one expert).
    """
    check_types("interleave_gate_up", {"w_gate": w_gate, "w_up": w_up},
                {"w_gate": ARRAY, "w_up": ARRAY})
    g, u = np.asarray(w_gate), np.asarray(w_up)
    if g.shape != u.shape or g.ndim not in (2, 3):
        raise ValueError(f"interleave_gate_up: gate and up must have the same [E, I, K] or "
                         f"[I, K] shape, got {g.shape} and {u.shape}")
    i_dim = g.shape[-2]
    if i_dim % SWIGLU_BLOCK:
        raise ValueError(f"interleave_gate_up: I = {i_dim} must be a multiple of {SWIGLU_BLOCK}")
    lead, k = g.shape[:-2], g.shape[-1]
    blocks = np.stack(
        [g.reshape(*lead, i_dim // SWIGLU_BLOCK, SWIGLU_BLOCK, k),
         u.reshape(*lead, i_dim // SWIGLU_BLOCK, SWIGLU_BLOCK, k)],
        axis=-3,
    )  # [..., I/8, 2, 8, K]
    return blocks.reshape(*lead, 2 * i_dim, k)

"""The contract of `moe_route` and the `moe_route_topk_group` op it emits."""

from __future__ import annotations

from max.dtype import DType

from ..core.rules import (
    INT,
    TENSOR,
    Args,
    Contract,
    Rule,
    Violation,
    dtype_in,
    dtype_like,
    positive_int,
    rank_is,
    same_device,
    shape_of,
    static,
)

MOE_ROUTE_DTYPES = (DType.bfloat16, DType.float16)
"""dtypes of x and the router weight."""
MOE_ROUTE_VEC = 8
"""H must be a multiple of this: the GPU router reads rows in 16-byte vectors."""
MOE_ROUTE_MAX_EXPERTS = 1024
"""Largest E (mojo_kernels/moe_route/route.mojo MAX_EXPERTS: the grouping kernel's table)."""


def _hidden(a: Args) -> Violation:
    h = static(a["x"].shape[1])
    if h is not None and h > 0 and h % MOE_ROUTE_VEC == 0:
        return None
    return f"a static positive multiple of {MOE_ROUTE_VEC}", a["x"].shape[1]


def _weight_shape(a: Args) -> Violation:
    e, h = (static(d) for d in a["router_weight"].shape)
    want_h = static(a["x"].shape[1])
    if e is not None and 1 <= e <= MOE_ROUTE_MAX_EXPERTS and h == want_h:
        return None
    return f"static [E, {want_h}] with 1 <= E <= {MOE_ROUTE_MAX_EXPERTS}", shape_of(
        a["router_weight"])


def _top_k(a: Args) -> Violation:
    e = static(a["router_weight"].shape[0])
    k = a["top_k"]
    return None if 1 <= k <= e else (f"an int in [1, E = {e}]", k)


MOE_ROUTE = Contract(
    op="moe_route",
    summary=(
        "MoE routing for `grouped_matmul` in one op (two GPU kernels): logits[t, e] = "
        "Σ_h x[t, h] · router_weight[e, h] in float32; topk_ids int32 [T, k] = the k largest "
        "logits' experts, decreasing, ties towards the lower id; topk_weights float32 [T, k] = "
        "their softmax; the T·k assignments a = t·k + j sorted by (expert, a) give token_index "
        "int64 [T·k] (a // k), row_scale float32 [T·k] (the assignment's weight), inverse int64 "
        "[T·k] (the sorted row of each a), a_offsets uint32 [E + 1], expert_ids int32 [E] "
        "(arange: empty groups included) and expert_usage_stats uint32 [2] = [max rows of one "
        "expert, E]: exactly the routing operands of `grouped_matmul`."
    ),
    rules=(
        Rule("x", "dtype bfloat16 or float16", dtype_in("x", MOE_ROUTE_DTYPES), TypeError),
        Rule("router_weight", "same dtype as x", dtype_like("router_weight", "x"), TypeError),
        Rule("x", "rank 2 [T, H] (T may be symbolic)", rank_is("x", 2)),
        Rule("router_weight", "rank 2 [E, H]", rank_is("router_weight", 2)),
        Rule("x", f"H (dim 1) static, a positive multiple of {MOE_ROUTE_VEC}", _hidden),
        Rule("router_weight", f"static [E, H], 1 <= E <= {MOE_ROUTE_MAX_EXPERTS}, H as x's",
             _weight_shape),
        Rule("router_weight", "on x's device", same_device("router_weight", "x")),
        Rule("top_k", "an int in [1, E]", _top_k),
    ),
    types={"x": TENSOR, "router_weight": TENSOR, "top_k": INT},
)
"""Rules of `mojo_gemm.moe_route`."""


def _rows(a: Args) -> Violation:
    r, n = a["y"].shape[0], a["inverse"].shape[0]
    if static(r) is not None and static(n) is not None:
        ok = static(r) == static(n)
    else:
        ok = str(r) == str(n)
    return None if ok else (f"{n} rows (inverse's length)", shape_of(a["y"]))


def _multiple_of_k(a: Args) -> Violation:
    n = static(a["inverse"].shape[0])
    k = a["top_k"]
    return None if n is None or n % k == 0 else (f"a length that is a multiple of top_k = {k}", n)


def _hidden_static(a: Args) -> Violation:
    h = static(a["y"].shape[1])
    return None if h is not None else ("a static H", a["y"].shape[1])


MOE_COMBINE = Contract(
    op="moe_combine",
    summary=(
        "The inverse of `moe_route`'s grouping, in one op (op `moe_combine_rows`): out [T, H] "
        "with out[t] = Σ_{j < k} y[inverse[t·k + j]] summed in float32 in j order and rounded "
        "once to y's dtype, for y the [T·k, H] rows of an expert GEMM in `moe_route`'s sorted "
        "order (router weights already applied, e.g. `grouped_matmul(..., row_scale=...)`) and "
        "inverse = `MoERouting.inverse`; an index outside [0, T·k) adds nothing."
    ),
    rules=(
        Rule("y", "dtype bfloat16 or float16", dtype_in("y", MOE_ROUTE_DTYPES), TypeError),
        Rule("inverse", "dtype int64", dtype_in("inverse", (DType.int64,)), TypeError),
        Rule("y", "rank 2 [T·k, H] (rows may be symbolic)", rank_is("y", 2)),
        Rule("inverse", "rank 1 [T·k]", rank_is("inverse", 1)),
        Rule("y", "H (dim 1) static", _hidden_static),
        Rule("y", "as many rows as inverse has entries", _rows),
        Rule("top_k", "a positive int", positive_int("top_k")),
        Rule("inverse", "a length that is a multiple of top_k", _multiple_of_k),
        Rule("inverse", "on y's device", same_device("inverse", "y")),
    ),
    types={"y": TENSOR, "inverse": TENSOR, "top_k": INT},
)
"""Rules of `mojo_gemm.moe_combine`."""

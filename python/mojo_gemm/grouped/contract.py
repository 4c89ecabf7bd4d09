"""The contract of `grouped_matmul` and the `grouped_matmul_sm100_persistent` op it emits."""

from __future__ import annotations

from max.dtype import DType
from max.graph import Dim, StaticDim

from ..core.rules import (
    BOOL,
    BUFFER,
    INT_SEQ,
    TENSOR,
    Args,
    Contract,
    Rule,
    Violation,
    dtype_in,
    dtype_like,
    optional,
    rank_is,
    same_device,
    shape_of,
    static,
)

GROUPED_DTYPES = (DType.bfloat16, DType.float16)
"""dtypes of a, b and the output."""
PLANE_ALIGN = 128
"""a_plane_splits must be multiples of this (the widest column tile of the kernels)."""
SWIGLU_BLOCK = 8
"""SwiGLU weight interleave block: matmul columns [16j, 16j + 8) gate, [16j + 8, 16j + 16) up."""


def grouped_out_rows(a: Args) -> Dim:
    """T, the rows of the output: a's rows, or a third of them with plane splits."""
    rows = a["a"].shape[0]
    return rows // 3 if a["a_plane_splits"][0] > 0 else rows


def grouped_out_cols(n: int, swiglu: bool) -> int:
    """Output columns: N, or N / 2 with the SwiGLU epilogue."""
    return n // 2 if swiglu else n


def _rank(name: str, rank: int) -> Rule:
    return Rule(name, f"rank {rank}", rank_is(name, rank))


def _b_static(a: Args) -> Violation:
    shape = shape_of(a["b"])
    if all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return "static positive [E, N, K]", shape


def _k_matches(a: Args) -> Violation:
    k_a, k_b = static(a["a"].shape[1]), static(a["b"].shape[2])
    if k_a is not None and k_a == k_b:
        return None
    return f"K = {k_b} (static, b.shape[2])", a["a"].shape[1]


def _ids_len(a: Args) -> Violation:
    n_off, n_ids = a["a_offsets"].shape[0], a["expert_ids"].shape[0]
    if isinstance(n_off, StaticDim) and isinstance(n_ids, StaticDim):
        if int(n_off) == int(n_ids) + 1:
            return None
        return f"G = {int(n_off) - 1} (len(a_offsets) - 1)", int(n_ids)
    return None  # symbolic: checked by the op when the graph runs


def _plane_splits(a: Args) -> Violation:
    splits = a["a_plane_splits"]
    if not (isinstance(splits, tuple | list) and len(splits) == 2):
        return "a pair (s0, s1)", splits
    s0, s1 = splits
    n = static(a["b"].shape[1])
    if (s0, s1) == (0, 0):
        return None
    ok = (
        isinstance(s0, int) and isinstance(s1, int) and 0 < s0 <= s1
        and s0 % PLANE_ALIGN == 0 and s1 % PLANE_ALIGN == 0 and (n is None or s1 <= n)
    )
    return None if ok else (f"(0, 0) or 0 < s0 <= s1 <= N = {n}, multiples of 128", splits)


def _plane_rows(a: Args) -> Violation:
    if a["a_plane_splits"][0] <= 0:
        return None
    rows = static(a["a"].shape[0])
    if rows is None or rows % 3 == 0:
        return None
    return "a multiple of 3 rows (Q/K/V plane stack [3 T, K])", rows


def _swiglu_n(a: Args) -> Violation:
    if not a["swiglu"]:
        return None
    n = static(a["b"].shape[1])
    if n is not None and n % (2 * SWIGLU_BLOCK) == 0:
        return None
    return "N = b.shape[1] a multiple of 16 (gate/up interleaved in blocks of 8)", n


def _same_dim(x: Dim, y: Dim) -> bool:
    sx, sy = static(x), static(y)
    if sx is not None or sy is not None:
        return sx == sy
    return str(x) == str(y)


def _row_scale_shape(a: Args) -> Violation:
    v = a["row_scale"]
    if v is None:
        return None
    rows = grouped_out_rows(a)
    if v.rank == 1 and _same_dim(v.shape[0], rows):
        return None
    return f"[{rows}] (one weight per output row)", shape_of(v)


def _out_shape(a: Args) -> Violation:
    v = a["out"]
    if v is None:
        return None
    rows = grouped_out_rows(a)
    cols = grouped_out_cols(static(a["b"].shape[1]) or 0, a["swiglu"])
    if v.rank == 2 and _same_dim(v.shape[0], rows) and static(v.shape[1]) == cols:
        return None
    return f"[{rows}, {cols}]", shape_of(v)


GROUPED_MATMUL = Contract(
    op="grouped_matmul",
    summary=(
        "c[r, :] = epilogue(a[r, :] · b[expert_ids[g]]ᵀ) for the rows r in "
        "[a_offsets[g], a_offsets[g+1]) of each active group g < expert_usage_stats[1]; "
        "fp32 accumulation; c has a's dtype, shape [T, N] ([T, N/2] with swiglu). An expert id "
        "outside [0, E) zero-fills its rows; rows of inactive groups are not written. Runtime "
        "data is trusted but clamped: offsets to [0, T] (a non-increasing range is empty), "
        "G_active to G."
    ),
    rules=(
        Rule("a", "dtype bfloat16 or float16", dtype_in("a", GROUPED_DTYPES), TypeError),
        _rank("a", 2),
        Rule("b", "dtype equals a's dtype", dtype_like("b", "a"), TypeError),
        _rank("b", 3),
        Rule("b", "static shape [E, N, K] (the expert bank)", _b_static),
        Rule("a", "a.shape[1] equals K = b.shape[2]", _k_matches),
        Rule("a_offsets", "dtype uint32 (group prefix sums, G + 1 entries)",
             dtype_in("a_offsets", (DType.uint32,)), TypeError),
        _rank("a_offsets", 1),
        Rule("expert_ids", "dtype int32 (−1: the group's rows are zeros)",
             dtype_in("expert_ids", (DType.int32,)), TypeError),
        _rank("expert_ids", 1),
        Rule("expert_ids", "length G = len(a_offsets) − 1", _ids_len),
        Rule("expert_usage_stats", "dtype uint32 ([max tokens per group, G_active])",
             dtype_in("expert_usage_stats", (DType.uint32,)), TypeError),
        Rule(
            "expert_usage_stats",
            "shape [2]",
            lambda a: None
            if shape_of(a["expert_usage_stats"]) == [2]
            else ([2], shape_of(a["expert_usage_stats"])),
        ),
        Rule("a_plane_splits", "(0, 0) (off) or 0 < s0 <= s1 <= N, multiples of 128",
             _plane_splits),
        Rule("a", "with a_plane_splits: [3 T, K] (Q, K, V planes stacked)", _plane_rows),
        Rule("swiglu", "needs N = b.shape[1] a multiple of 16", _swiglu_n),
        Rule("row_scale", "None or dtype float32", dtype_in("row_scale", (DType.float32,)),
             TypeError),
        Rule("row_scale", "shape [T] (T = output rows)", _row_scale_shape),
        Rule("out", "None or a buffer of a's dtype", dtype_like("out", "a"), TypeError),
        Rule("out", "shape [T, N] ([T, N/2] with swiglu)", _out_shape),
        *(
            Rule(name, "on the same device as a", same_device(name, "a"))
            for name in ("b", "a_offsets", "expert_ids", "expert_usage_stats", "row_scale",
                         "out")
        ),
    ),
    types={
        **{n: TENSOR for n in ("a", "b", "a_offsets", "expert_ids", "expert_usage_stats")},
        "a_plane_splits": INT_SEQ,
        "swiglu": BOOL,
        "row_scale": optional(TENSOR),
        "out": optional(BUFFER),
        "routing_settled": BOOL,
    },
)
"""Rules of `mojo_gemm.grouped_matmul` (and of the `grouped_matmul_sm100_persistent` op)."""

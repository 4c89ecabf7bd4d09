"""The contract of `int4_matmul` and the `multistage_gemm_q` op it emits."""

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
    optional,
    same_device,
    shape_is,
    static,
)
from .layout import K_ALIGN, N_TILE, PACK_FACTOR, round_up

INT4_ACTIVATION_DTYPES = (DType.bfloat16, DType.float16)
INT4_GROUP_SIZES = (32, 64, 128, -1)
"""Supported group sizes; -1 means one scale per output channel."""
PERM_DTYPES = (DType.int32, DType.int64)


def int4_padded(n: int, k: int) -> tuple[int, int]:
    """(Np, Kp): the padded weight shape the packed layout stores."""
    return round_up(n, N_TILE), round_up(k, K_ALIGN)


def int4_num_groups(k: int, group_size: int) -> int:
    """Rows of the scales/zeros tensors: Kp / group_size, or 1 per channel."""
    _, kp = int4_padded(8, k)
    return 1 if group_size == -1 else kp // group_size


def _x_k_matches(a: Args) -> Violation:
    k_dim = static(a["x"].shape[-1])
    return None if k_dim == a["k"] else (f"K = {a['k']} (static)", a["x"].shape[-1])


def _group_fits(a: Args) -> Violation:
    g = a["group_size"]
    if g == -1 or a["k"] % g == 0:
        return None
    return f"K a multiple of group_size {g}", f"K = {a['k']}"


def _qweight_shape(a: Args) -> list[int]:
    n_p, k_p = int4_padded(a["n"], a["k"])
    return [n_p // N_TILE, k_p * PACK_FACTOR]


def _params_shape(a: Args) -> list[int]:
    n_p, _ = int4_padded(a["n"], a["k"])
    return [int4_num_groups(a["k"], a["group_size"]), n_p]


INT4_MATMUL = Contract(
    op="int4_matmul",
    summary=(
        "y[..., N] = x[..., K] · dequant(W)ᵀ (+ bias) with W[n, k] = (q − z) · s per group of "
        "`group_size` K elements; fp32 accumulation; y has x's dtype."
    ),
    rules=(
        Rule("x", "dtype bfloat16 or float16", dtype_in("x", INT4_ACTIVATION_DTYPES), TypeError),
        Rule(
            "x",
            "rank >= 2 (leading dims are flattened)",
            lambda a: None if a["x"].rank >= 2 else ("rank >= 2", f"rank {a['x'].rank}"),
        ),
        Rule("x", "last dim equals the weight's in_features K", _x_k_matches),
        Rule(
            "group_size",
            "one of 32, 64, 128 or -1 (per channel)",
            lambda a: None
            if a["group_size"] in INT4_GROUP_SIZES
            else (INT4_GROUP_SIZES, a["group_size"]),
        ),
        Rule("group_size", "divides in_features K", _group_fits),
        Rule(
            "n",
            "out_features N is a positive multiple of 8",
            lambda a: None if a["n"] > 0 and a["n"] % 8 == 0 else ("a multiple of 8", a["n"]),
        ),
        Rule(
            "qweight",
            "dtype uint32 (8 codes per word)",
            dtype_in("qweight", (DType.uint32,)),
            TypeError,
        ),
        Rule("qweight", "shape [Np/64, Kp*8] (Np = N rounded up to 64, Kp = K to 128)",
             shape_is("qweight", _qweight_shape)),
        Rule("scales", "dtype equals x's dtype", dtype_like("scales", "x"), TypeError),
        Rule("scales", "shape [groups, Np] (groups = Kp / group_size, 1 per channel)",
             shape_is("scales", _params_shape)),
        Rule("zeros", "None (symmetric, zero point 8) or x's dtype",
             dtype_like("zeros", "x"), TypeError),
        Rule("zeros", "shape equals the scales' shape", shape_is("zeros", _params_shape)),
        Rule("perm", "None or dtype int32/int64 (act-order input permutation)",
             dtype_in("perm", PERM_DTYPES), TypeError),
        Rule("perm", "shape [K]", shape_is("perm", lambda a: [a["k"]])),
        Rule("bias", "None or x's dtype", dtype_like("bias", "x"), TypeError),
        Rule("bias", "shape [N]", shape_is("bias", lambda a: [a["n"]])),
        *(
            Rule(name, "on the same device as x", same_device(name, "x"))
            for name in ("qweight", "scales", "zeros", "perm", "bias")
        ),
    ),
    types={
        "x": TENSOR,
        "qweight": TENSOR,
        "scales": TENSOR,
        "zeros": optional(TENSOR),
        "perm": optional(TENSOR),
        "bias": optional(TENSOR),
        "n": INT,
        "k": INT,
        "group_size": INT,
    },
)
"""Rules of `mojo_gemm.int4_matmul` (and of the `multistage_gemm_q` op it emits)."""

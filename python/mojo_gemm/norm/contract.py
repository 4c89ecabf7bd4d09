"""The contract of `add_rms_norm` and the `rms_norm_rows` / `add_rms_norm_rows` ops it emits."""

from __future__ import annotations

import math

from max.dtype import DType

from ..core.rules import (
    BOOL,
    DTYPE,
    TENSOR,
    Args,
    Contract,
    Expect,
    Rule,
    Violation,
    dtype_in,
    optional,
    rank_is,
    same_device,
    shape_of,
    static,
)

NORM_INPUT_DTYPES = (DType.float32, DType.bfloat16, DType.float16)
"""dtypes of h and y (mojo_kernels/rms_norm/norm.mojo is_norm_input)."""
NORM_OUTPUT_DTYPES = (DType.bfloat16, DType.float16)
"""dtypes of the normed output (norm.mojo is_norm_output)."""

FLOAT = Expect("a float", lambda v: isinstance(v, (float, int)) and not isinstance(v, bool))


def _hidden(a: Args) -> Violation:
    h = static(a["h"].shape[1])
    return None if h is not None and h > 0 else ("a static positive H", a["h"].shape[1])


def _same_shape(a: Args) -> Violation:
    y, h = a["y"], a["h"]
    if y is None:
        return None
    same = all((static(p) == static(q)) if static(p) is not None or static(q) is not None
               else str(p) == str(q) for p, q in zip(y.shape, h.shape, strict=True))
    return None if same else (shape_of(h), shape_of(y))


def _weight_shape(a: Args) -> Violation:
    w, h = a["weight"], static(a["h"].shape[1])
    return None if shape_of(w) == [h] else ([h], shape_of(w))


def _eps(a: Args) -> Violation:
    e = a["eps"]
    return None if math.isfinite(e) and e >= 0 else ("a finite float >= 0", e)


def _out_dtype(a: Args) -> Violation:
    d = a["out_dtype"]
    return None if d in NORM_OUTPUT_DTYPES else (" or ".join(map(str, NORM_OUTPUT_DTYPES)), d)


ADD_RMS_NORM = Contract(
    op="add_rms_norm",
    summary=(
        "A pre-norm decoder's residual add, RMSNorm and cast in one op (one GPU kernel, op "
        "`add_rms_norm_rows`, or `rms_norm_rows` without y): s = f32(h) + f32(y) per element "
        "(s = f32(h) when y is None), normed = round(s · rsqrt(mean(s²) + eps) · weight) in "
        "out_dtype, the mean of the float32 squares over H; returns (s float32 [T, H], or None "
        "when keep_sum is False; normed [T, H])."
    ),
    rules=(
        Rule("h", "dtype float32, bfloat16 or float16", dtype_in("h", NORM_INPUT_DTYPES),
             TypeError),
        Rule("y", "dtype float32, bfloat16 or float16 (or None)", dtype_in("y", NORM_INPUT_DTYPES),
             TypeError),
        Rule("weight", "dtype float32", dtype_in("weight", (DType.float32,)), TypeError),
        Rule("out_dtype", "bfloat16 or float16", _out_dtype, TypeError),
        Rule("h", "rank 2 [T, H] (T may be symbolic)", rank_is("h", 2)),
        Rule("h", "H (dim 1) static and positive", _hidden),
        Rule("y", "rank 2, the shape of h", rank_is("y", 2)),
        Rule("y", "the shape of h", _same_shape),
        Rule("weight", "static [H]", _weight_shape),
        Rule("eps", "a finite float >= 0", _eps),
        Rule("y", "on h's device", same_device("y", "h")),
        Rule("weight", "on h's device", same_device("weight", "h")),
    ),
    types={"h": TENSOR, "y": optional(TENSOR), "weight": TENSOR, "eps": FLOAT,
           "out_dtype": DTYPE, "keep_sum": BOOL},
)
"""Rules of `mojo_gemm.add_rms_norm`."""

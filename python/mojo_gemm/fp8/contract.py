"""The contract of `quantize_fp8_rows`, the activation quantizer that feeds the FP8 K/V-cache
ops (`mojo_gemm.k_cache.contract`), and the fp8 dtypes both use.
"""

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
    positive_int,
    rank_is,
    static,
)

FP8 = DType.float8_e4m3fn
FP8_BITS = DType.uint8
"""How fp8 travels on CPU: MAX 26.7 CPU graphs cannot hold float8 tensors."""

QUANTIZE_INPUT_DTYPES = (DType.bfloat16, DType.float16, DType.float32)
"""Activation dtypes `quantize_fp8_rows` reads."""


def _hidden_static(a: Args) -> Violation:
    h = static(a["x"].shape[1])
    return None if h is not None and h > 0 else ("a static hidden size > 0", a["x"].shape[1])


QUANTIZE_FP8_ROWS = Contract(
    op="quantize_fp8_rows",
    summary=(
        "data[t, c] = round_e4m3(x[t, c] / scales[c // block, t]) with scales[kb, t] = "
        "amax(|x[t, kb·block : (kb+1)·block]|) / 448 (1.0 for an all-zero block); the division "
        "runs in float64 and rounds once to float32, then to e4m3 (nearest even, clamped to "
        "±448), exactly like `mojo_gemm.quantize_fp8_input(x, 1, block)` on the host (whose "
        "scales are these, token-padded), subnormal inputs included (a block of subnormals gets "
        "a subnormal scale and non-zero codes, whatever the device's flush-to-zero mode); a "
        "block holding inf or NaN gets scale NaN and every code NaN (0x7F), in both. data is "
        "e4m3 [T, H] (float8_e4m3fn on GPU, uint8 bits on CPU), scales float32 "
        "[ceil(H/block), T]: the input_scale of the K/V ops with gm = 1."
    ),
    rules=(
        Rule("x", "dtype bfloat16, float16 or float32", dtype_in("x", QUANTIZE_INPUT_DTYPES),
             TypeError),
        Rule("x", "rank 2 [T, H] (T may be symbolic)", rank_is("x", 2)),
        Rule("x", "H (dim 1) static and positive", _hidden_static),
        Rule("block", "a positive int (columns per scale)", positive_int("block")),
    ),
    types={"x": TENSOR, "block": INT},
)
"""Rules of `mojo_gemm.quantize_fp8_rows`."""

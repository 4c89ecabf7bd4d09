"""The contracts of the FP8 ops outside the KV cache: `quantize_fp8_rows`, the activation
quantizer that feeds the FP8 K/V-cache ops (`mojo_gemm.k_cache.contract`), and
`fp8_blockwise_matmul`, the dense block-scaled GEMM; the fp8 dtypes and the block-scaled operand
rules (`block_scaled_rules`) they all share.
"""

from __future__ import annotations

from collections.abc import Callable

from max.dtype import DType

from ..core.rules import (
    DEVICE,
    DTYPE,
    INT,
    INT_SEQ,
    TENSOR,
    Args,
    Contract,
    Rule,
    Violation,
    dtype_in,
    dtype_like,
    layer_attr,
    positive_int,
    rank_is,
    same_device,
    shape_is,
    shape_of,
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


# ------------------------------------------------------------ block-scaled FP8 operands
def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def granularity(a: Args) -> tuple[int, int, int]:
    """(gm, gn, gk) of a checked `scales_granularity_mnk`."""
    return tuple(a["scales_granularity_mnk"])  # type: ignore[return-value]


def _granularity_ok(a: Args) -> Violation:
    g = a["scales_granularity_mnk"]
    ok = len(g) == 3 and all(v > 0 for v in g)
    return None if ok else ("a tuple of three positive ints (gm, gn, gk)", g)


def block_scaled_rules(
    x: str,
    weights: tuple[str, ...],
    x_scale: str,
    w_scales: tuple[str, ...],
    n_of: Callable[[Args], int],
    n_rule: str,
) -> tuple[Rule, ...]:
    """The rules of a block-scaled FP8 product x · wᵀ every FP8 GEMM op shares: x [T, K] and
    each weight [N, K] e4m3 (uint8 bits on CPU), x_scale float32 [ceil(K/gk), >= ceil(T/gm)],
    each weight scale float32 [ceil(N/gn), ceil(K/gk)], for (gm, gn, gk) =
    scales_granularity_mnk; `n_of` gives N, `n_rule` says where it comes from."""

    def k_of(a: Args) -> int:
        return static(a[x].shape[1])  # type: ignore[return-value]

    def x_dtype(a: Args) -> Violation:
        v = a[x]
        want = FP8_BITS if v.device.is_cpu() else FP8
        return None if v.dtype == want else (f"{want} on {v.device}", v.dtype)

    def k_static(a: Args) -> Violation:
        k = static(a[x].shape[1])
        return None if k is not None and k > 0 else ("a static K > 0", a[x].shape[1])

    def x_scale_shape(a: Args) -> Violation:
        s = a[x_scale]
        gm, _, gk = granularity(a)
        kb = _ceil(k_of(a), gk)
        got = shape_of(s)
        if got[0] != kb:
            return f"[ceil(K/gk) = {kb}, >= ceil(T/gm)]", got
        t, cols = static(a[x].shape[0]), static(s.shape[1])
        if t is not None and cols is not None and cols < _ceil(t, gm):
            return f"[{kb}, >= ceil(T/gm) = {_ceil(t, gm)}]", got
        return None

    def w_scale_shape(a: Args) -> list[int]:
        _, gn, gk = granularity(a)
        return [_ceil(n_of(a), gn), _ceil(k_of(a), gk)]

    return (
        Rule(
            "scales_granularity_mnk",
            "a tuple (gm, gn, gk) of positive ints; any values work (GPU tensor cores need "
            "gk % 64 == 0, wgmma for T > 128 gk % 128 == 0; other gk use a CUDA-core kernel)",
            _granularity_ok,
        ),
        Rule(
            x,
            "dtype float8_e4m3fn on GPU, uint8 holding e4m3fn bits on CPU "
            "(MAX 26.7 CPU graphs cannot hold float8 tensors)",
            x_dtype,
            TypeError,
        ),
        Rule(x, "rank 2 [T, K] (T = tokens, may be symbolic)", rank_is(x, 2)),
        Rule(x, "K (dim 1) static and positive", k_static),
        *(
            rule
            for w in weights
            for rule in (
                Rule(w, f"dtype equals {x}'s", dtype_like(w, x), TypeError),
                Rule(
                    w, f"shape [N, K] static, {n_rule}", shape_is(w, lambda a: [n_of(a), k_of(a)])
                ),
            )
        ),
        Rule(x_scale, "dtype float32", dtype_in(x_scale, (DType.float32,)), TypeError),
        Rule(x_scale, "rank 2", rank_is(x_scale, 2)),
        Rule(
            x_scale,
            "shape [ceil(K/gk), >= ceil(T/gm)], tokens contiguous (dim 1 may be "
            "padded and symbolic)",
            x_scale_shape,
        ),
        *(
            rule
            for s in w_scales
            for rule in (
                Rule(s, "dtype float32", dtype_in(s, (DType.float32,)), TypeError),
                Rule(s, "shape [ceil(N/gn), ceil(K/gk)]", shape_is(s, w_scale_shape)),
            )
        ),
        *(
            Rule(n, f"on {x}'s device", same_device(n, x))
            for n in (*weights, x_scale, *w_scales)
        ),
    )


def _w_rows(a: Args) -> int:
    return static(a["w"].shape[0])  # type: ignore[return-value]


def _w_rows_static(a: Args) -> Violation:
    w = a["w"]
    n = static(w.shape[0]) if w.rank == 2 else None
    return None if n is not None and n > 0 else ("a static N > 0", shape_of(w))


FP8_BLOCKWISE_MATMUL = Contract(
    op="fp8_blockwise_matmul",
    summary=(
        "out[m, n] = Σ_k a[m, k]·w[n, k]·a_scale[k//gk, m//gm]·w_scale[n//gn, k//gk], summed in "
        "fp32 one gk block at a time (each block's sum scaled, then added), rounded once to "
        "bfloat16; out is [M, N] bfloat16 on a's device. The same kernels and dispatch as "
        "`k_matmul_ragged_paged_scale` with a dense output (its plan for T = M is this op's)."
    ),
    rules=(
        Rule("w", "rank 2 with a static N > 0 (dim 0)", _w_rows_static),
        *block_scaled_rules("a", ("w",), "a_scale", ("w_scale",), _w_rows, "N = w's rows"),
    ),
    types={
        **{n: TENSOR for n in ("a", "a_scale", "w", "w_scale")},
        "scales_granularity_mnk": INT_SEQ,
    },
)
"""Rules of `mojo_gemm.fp8_blockwise_matmul`."""


# ------------------------------------------------------------------------ the Fp8Linear layer
def _dtype_ok(a: Args) -> Violation:
    d = a["dtype"]
    return None if d in QUANTIZE_INPUT_DTYPES else ("bfloat16, float16 or float32", d)


FP8_LINEAR = Contract(
    op="Fp8Linear",
    summary=(
        "y = x · Wᵀ for x [..., in_features] (`dtype`) and a block-scaled e4m3 weight W "
        "[out_features, in_features] (scales per block × block): x is quantized per token and "
        "per `block` columns (`quantize_fp8_rows`), multiplied by `fp8_blockwise_matmul` "
        "(scales_granularity_mnk = (1, block, block)) and returned in `dtype` [..., out_features]."
    ),
    rules=(
        Rule("in_features", "a positive int", positive_int("in_features")),
        Rule("out_features", "a positive int", positive_int("out_features")),
        Rule("dtype", "bfloat16, float16 or float32 (the activations' dtype)", _dtype_ok,
             TypeError),
        Rule("block", "a positive int (scale block of activations and weights)",
             positive_int("block")),
    ),
    types={"in_features": INT, "out_features": INT, "dtype": DTYPE, "device": DEVICE,
           "block": INT},
)
"""Construction rules of `mojo_gemm.Fp8Linear`."""


def _x_call_features(a: Args) -> Violation:
    got = shape_of(a["x"])
    ok = len(got) >= 1 and got[-1] == a["in_features"]
    return None if ok else (f"[..., {a['in_features']}]", got)


FP8_LINEAR_CALL = Contract(
    op="Fp8Linear.__call__",
    summary="x must have the layer's dtype and device and in_features as its last dimension.",
    types={"x": TENSOR},
    rules=(
        Rule("x", "the layer's dtype", layer_attr("x", "dtype"), TypeError),
        Rule("x", "last dimension equals the layer's in_features", _x_call_features),
        Rule("x", "on the layer's device", layer_attr("x", "device")),
    ),
)
"""Call rules of `Fp8Linear.__call__`."""

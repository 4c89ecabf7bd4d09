"""float64 numpy references of `MoEBlock` and of the example decoder (`models.decoder`).

The references compute in float64 but round to the graph's storage dtype (bf16/fp16) at the
points where the graph stores a tensor in that dtype, and quantize the K/V-projection input to
e4m3 exactly as the graph does (`quantize_fp8_input`). Those rounding points are discrete: if the
reference skipped them, its hidden states would drift ~1e-2 (relative) from the graph's and flip
near-tied router top-k choices and greedy tokens. With them, the two differ only by float32 vs
float64 accumulation (~1e-6), and every decision is taken from the same numbers.
"""

from __future__ import annotations

import numpy as np
from max.dtype import DType

from .._host import numpy_dtype


def round_to(x: np.ndarray, dtype: DType) -> np.ndarray:
    """x rounded to `dtype` (nearest even, via float32 as the graph's casts do), as float64."""
    return np.asarray(x, np.float32).astype(numpy_dtype(dtype)).astype(np.float64)


def silu(x: np.ndarray) -> np.ndarray:
    """x · sigmoid(x), float64."""
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along `axis`, float64."""
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def moe_route(x: np.ndarray, router: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k routing of x [T, H] by router [E, H]: (ids int64 [T, k] by decreasing logit,
    weights float64 [T, k] = softmax of the chosen logits)."""
    logits = x @ router.T
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    return ids, softmax(np.take_along_axis(logits, ids, axis=1))


def moe_reference(
    x: np.ndarray,
    router: np.ndarray,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    top_k: int,
    dtype: DType = DType.bfloat16,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`MoEBlock` in float64: (y [T, H], ids int64 [T, k], weights [T, k]).

    x [T, H] holds `dtype` values; router [E, H], gate/up [E, I, H], down [E, H, I] are float
    arrays rounded to `dtype` here as the block's loader does. Rounded to `dtype` like the graph:
    the SwiGLU activations, each expert's weighted output, and the sum over the k experts.
    """
    router, gate, up, down = (round_to(w, dtype) for w in (router, gate, up, down))
    ids, weights = moe_route(x, router, top_k)
    y = np.zeros(x.shape)
    for t in range(x.shape[0]):
        for j in range(top_k):
            e = ids[t, j]
            act = round_to(silu(gate[e] @ x[t]) * (up[e] @ x[t]), dtype)
            y[t] += round_to((down[e] @ act) * weights[t, j], dtype)
    return round_to(y, dtype), ids, weights

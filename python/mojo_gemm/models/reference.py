"""float64 numpy references of `MoEBlock` and of the example decoder (`models.decoder`).

The references compute in float64 but round to the graph's storage dtype (bf16/fp16) at the
points where the graph stores a tensor in that dtype, and quantize the K/V-projection input to
e4m3 exactly as the graph does (`quantize_fp8_input`). Those rounding points are discrete: if the
reference skipped them, its hidden states would drift ~1e-2 (relative) from the graph's and flip
near-tied router top-k choices and greedy tokens. With them, the two differ only by float32 vs
float64 accumulation (~1e-6), and every decision is taken from the same numbers.

The "flash" decoder (MAX's flash-attention kernel) computes the same causal softmax attention;
where it rounds (scores, unnormalized probabilities) is the kernel's own, so its outputs differ
from this reference by bf16 rounding (~1e-3 .. 1e-2 relative) and a router decision whose top-k
margin is smaller than that may flip: `ReferenceDecoder.route_margins` reports the margins.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np
from max.dtype import DType

from ..core.host import numpy_dtype
from ..fp8.quant import quantize_fp8_input
from .decoder import DTYPE, FP8_BLOCK, DecoderWeights


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


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x², last axis) + eps) · weight, float64."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def fp8_input_dequantized(x: np.ndarray, block: int) -> np.ndarray:
    """x [T, K] after the graph's activation quantization (e4m3 per token per `block` columns,
    `quantize_fp8_input`), dequantized to float64."""
    data, scales = quantize_fp8_input(x, 1, block)
    per_col = np.repeat(scales[:, : x.shape[0]].T.astype(np.float64), block, axis=1)
    return data.astype(np.float64) * per_col[:, : x.shape[1]]


def _bf16_as_f64(w: np.ndarray) -> np.ndarray:
    """w rounded to bf16, as float64; bf16 arrays are widened by a bit shift (fast)."""
    if w.dtype == ml_dtypes.bfloat16:
        bits = np.ascontiguousarray(w).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    return round_to(w, DTYPE)


class ReferenceDecoder:
    """`models.decoder.MoEDecoder` in float64 numpy, with its own per-sequence K/V cache.

    Uses the same quantized weights (int4 and fp8 dequantized, the rest rounded to bf16) and
    rounds where the graph does (see the module docstring and `models.decoder`). Expert weights
    are rounded (and kept, float64) when an expert is first routed to, so a real-size
    configuration costs only the experts a few tokens use (OLMoE: 50 MB each). After each
    `step`, `route_margins` holds the smallest top-k router margin of every layer: (k-th largest
    logit − (k+1)-th) / std of the token's logits, minimized over the step's tokens.
    """

    def __init__(self, weights: DecoderWeights, num_sequences: int) -> None:
        self.config = c = weights.config
        self.embed = round_to(weights.embed, DTYPE)
        self.final_norm = round_to(weights.final_norm, DTYPE)
        self.lm_head = round_to(weights.lm_head, DTYPE)
        self.layers = [
            {"attn_norm": round_to(w.attn_norm, DTYPE), "ffn_norm": round_to(w.ffn_norm, DTYPE),
             "q": w.q.dequantize().astype(np.float64), "o": w.o.dequantize().astype(np.float64),
             "k": w.k.dequantize(), "v": w.v.dequantize(), "router": round_to(w.router, DTYPE)}
            for w in weights.layers
        ]
        self._weights = weights
        self._experts: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        empty = np.zeros((0, c.num_kv_heads, c.head_dim))
        self.k_cache = [[empty] * num_sequences for _ in range(c.num_layers)]
        self.v_cache = [[empty] * num_sequences for _ in range(c.num_layers)]
        self.route_margins = [float("inf")] * c.num_layers

    def _expert(self, li: int, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Layer li's expert e: (gate [I, H], up [I, H], down [H, I]) bf16 values, float64."""
        if (li, e) not in self._experts:
            w = self._weights.layers[li]
            self._experts[li, e] = (_bf16_as_f64(w.gate[e]), _bf16_as_f64(w.up[e]),
                                    _bf16_as_f64(w.down[e]))
        return self._experts[li, e]

    def _moe(self, li: int, x: np.ndarray) -> np.ndarray:
        """`moe_reference` of layer li for x [n, H] (bf16 values), grouped by expert; records
        the step's smallest router margin of the layer in `route_margins`."""
        c, router = self.config, self.layers[li]["router"]
        logits = x @ router.T
        ordered = -np.sort(-logits, axis=1)
        if c.top_k < c.num_experts:
            gap = (ordered[:, c.top_k - 1] - ordered[:, c.top_k]) / logits.std(axis=1)
            self.route_margins[li] = min(self.route_margins[li], float(gap.min()))
        ids, weights = moe_route(x, router, c.top_k)
        contrib = np.zeros((x.shape[0], c.top_k, x.shape[1]))
        for e in np.unique(ids):
            rows, cols = np.nonzero(ids == e)
            gate, up, down = self._expert(li, int(e))
            xe = x[rows]
            act = round_to(silu(xe @ gate.T) * (xe @ up.T), DTYPE)
            contrib[rows, cols] = round_to((act @ down.T) * weights[rows, cols][:, None], DTYPE)
        y = contrib[:, 0].copy()
        for j in range(1, c.top_k):  # the choices in order, as moe_reference sums them
            y += contrib[:, j]
        return round_to(y, DTYPE)

    def _attention(self, li: int, seq: int, x: np.ndarray) -> np.ndarray:
        """Sequence `seq`'s new normed tokens x [n, H] -> bf16-rounded attention output."""
        c, w = self.config, self.layers[li]
        hk, grp, d = c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim
        n = x.shape[0]
        q = round_to(x @ w["q"].T, DTYPE).reshape(n, hk, grp, d)
        xq = fp8_input_dequantized(x, FP8_BLOCK)
        start = self.k_cache[li][seq].shape[0]
        for cache, weight in ((self.k_cache, w["k"]), (self.v_cache, w["v"])):
            new = round_to(xq @ weight.T, DTYPE).reshape(n, hk, d)
            cache[li][seq] = np.concatenate([cache[li][seq], new])
        keys, values = self.k_cache[li][seq], self.v_cache[li][seq]
        out = np.empty((n, hk, grp, d))
        for i in range(n):
            visible = start + i + 1  # causal: positions 0..start+i
            scores = np.einsum("hgd,shd->hgs", q[i], keys[:visible]) / np.sqrt(d)
            out[i] = self._attend(scores, values[:visible])
        return round_to(out.reshape(n, c.q_size), DTYPE)

    def _attend(self, scores: np.ndarray, values: np.ndarray) -> np.ndarray:
        """scores [h, g, s] · values [s, h, d] -> [h, g, d] with the rounding of the model's
        attention: "graph" rounds the normalized probabilities to bf16 before P·V; MAX's flash
        kernel rounds the unnormalized exp(s − max) to bf16 and divides P·V by the float32 sum
        of the unrounded ones (exact for the check's short sequences, one key block)."""
        if self.config.attention != "flash":
            return np.einsum("hgs,shd->hgd", round_to(softmax(scores), DTYPE), values)
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        pv = np.einsum("hgs,shd->hgd", round_to(p, DTYPE), values)
        return pv / p.sum(axis=-1)[..., None]

    def step(self, tokens: Sequence[Sequence[int]],
             sequences: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One step (tokens[b]: the new tokens of sequence `sequences[b]`, default every
        sequence in order) -> (logits float64 [T, vocab] in the order given, greedy next ids
        int64 [B])."""
        c = self.config
        self.route_margins = [float("inf")] * c.num_layers
        seqs = range(len(tokens)) if sequences is None else sequences
        hs = [self.embed[np.asarray(t, np.int64)] for t in tokens]
        for li, w in enumerate(self.layers):
            for seq, h in zip(seqs, hs, strict=True):
                x = round_to(rms_norm(h, w["attn_norm"], c.rms_eps), DTYPE)
                h += round_to(self._attention(li, seq, x) @ w["o"].T, DTYPE)
                x = round_to(rms_norm(h, w["ffn_norm"], c.rms_eps), DTYPE)
                h += self._moe(li, x)
        logits = [round_to(rms_norm(h, self.final_norm, c.rms_eps), DTYPE) @ self.lm_head.T
                  for h in hs]
        next_ids = np.array([int(np.argmax(lg[-1])) for lg in logits], np.int64)
        return np.concatenate(logits), next_ids

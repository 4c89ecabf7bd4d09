"""Independent 4-bit checkpoint encoders for tests (GPTQ v1/v2, AWQ, MAX's GPTQ buffer).

Written only from the formats' published descriptions (AutoGPTQ, AutoAWQ), without importing
mojo_gemm, so that tests do not trust our own packer. Each `make_*` quantizes a random float
W [N, K] (N = out features, K = in features), packs it in the checkpoint's format, and returns the
float64 reference weight `w_ref` [N, K] decoded from the checkpoint tensors with the format's
own dequant formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AutoAWQ packer: nibble i of word (row, c) holds logical column 8c + AWQ_PACK_ORDER[i]."""
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
"""AutoAWQ loader: logical column 8c + i is unpacked nibble AWQ_REVERSE_ORDER[i]."""
GPTQ_FORMATS = ("gptq", "gptq_v2")
"""v1 ("gptq") stores zero - 1 in qzeros; v2 stores the zero itself."""


@dataclass(frozen=True, eq=False)
class GptqCheckpoint:
    """AutoGPTQ tensors of one Linear (G = K / group_size, 1 for per channel).

    qweight: int32 [K/8, N]; qzeros: int32 [G, N/8]; scales: float16 [G, N];
    g_idx: int32 [K]; w_ref: float64 [N, K] = (q - z[g_idx]) * scales[g_idx].
    """

    qweight: np.ndarray
    qzeros: np.ndarray
    scales: np.ndarray
    g_idx: np.ndarray
    w_ref: np.ndarray


@dataclass(frozen=True, eq=False)
class AwqCheckpoint:
    """AutoAWQ GEMM tensors of one Linear (G = K / group_size, 1 for per channel).

    qweight: int32 [K, N/8]; qzeros: int32 [G, N/8]; scales: float16 [G, N];
    w_ref: float64 [N, K] = (q - z[k // g]) * scales[k // g].
    """

    qweight: np.ndarray
    qzeros: np.ndarray
    scales: np.ndarray
    w_ref: np.ndarray


@dataclass(frozen=True, eq=False)
class MaxGptqCheckpoint:
    """MAX GPTQLinear's input: buffer uint8 [K/2 + 2K/g, N]; w_ref float64 [N, K] (zero 8)."""

    buffer: np.ndarray
    w_ref: np.ndarray


# --------------------------------------------------------------------------------------------
# random weights and round-to-nearest quantization


def _random_weight(
    rng: np.random.Generator, n: int, group_of_k: np.ndarray, groups: int, spread: bool
) -> np.ndarray:
    """float64 [N, K] with per-row magnitudes; spread adds a per-(row, group) offset.

    The offset pushes groups off centre so asymmetric zero points cover 0..15.
    """
    k = group_of_k.shape[0]
    row_scale = rng.uniform(0.25, 2.0, size=(n, 1))
    w = rng.standard_normal((n, k)) * row_scale
    if spread:
        offset = rng.uniform(-3.5, 3.5, size=(n, groups)) * row_scale
        w += offset[:, group_of_k]
    return w


def _quantize(
    w: np.ndarray, group_of_k: np.ndarray, groups: int, sym: bool, min_zero: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RTN per group (group of input row k = group_of_k[k]).

    Returns codes int64 [N, K] in 0..15, zero points int64 [G, N], scales float16 [G, N].
    sym: GPTQ's symmetric rule, scale = 2 * amax / 15 and zero 8. Otherwise min/max over the
    group (widened to include 0) with the zero point clipped to min_zero..15.
    """
    n, k = w.shape
    codes = np.zeros((n, k), np.int64)
    zeros = np.zeros((groups, n), np.int64)
    scales = np.zeros((groups, n), np.float16)
    for gi in range(groups):
        cols = np.flatnonzero(group_of_k == gi)
        wg = w[:, cols]
        if sym:
            s = (2 * np.abs(wg).max(axis=1) / 15).astype(np.float16)
            z = np.full(n, 8, np.int64)
        else:
            lo = np.minimum(wg.min(axis=1), 0)
            hi = np.maximum(wg.max(axis=1), 0)
            s = ((hi - lo) / 15).astype(np.float16)
            z = np.clip(np.rint(-lo / s.astype(np.float64)), min_zero, 15).astype(np.int64)
        q = np.rint(wg / s.astype(np.float64)[:, None]) + z[:, None]
        codes[:, cols] = np.clip(q, 0, 15)
        zeros[gi] = z
        scales[gi] = s
    return codes, zeros, scales


# --------------------------------------------------------------------------------------------
# packers (checkpoint side) and the checkpoint's own decoders


def _pack_along_rows(v: np.ndarray) -> np.ndarray:
    """int [R, C] in 0..15 -> int32 [R/8, C]: word (r, c) nibble j = v[8r + j, c]."""
    words = np.zeros((v.shape[0] // 8, v.shape[1]), np.uint32)
    for j in range(8):
        words |= v[j::8].astype(np.uint32) << np.uint32(4 * j)
    return words.view(np.int32)


def _pack_along_cols(v: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    """int [R, C] in 0..15 -> int32 [R, C/8]: word (r, c) nibble i = v[r, 8c + order[i]]."""
    words = np.zeros((v.shape[0], v.shape[1] // 8), np.uint32)
    for i in range(8):
        words |= v[:, order[i] :: 8].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def _nibble(words: np.ndarray, j: int) -> np.ndarray:
    """Nibble j (bits 4j..4j+3) of int32 words, as int64."""
    return ((words.view(np.uint32) >> np.uint32(4 * j)) & np.uint32(15)).astype(np.int64)


def _decode_rows(qweight: np.ndarray) -> np.ndarray:
    """GPTQ qweight int32 [K/8, N] -> codes int64 [K, N] (row 8r + j = nibble j of row r)."""
    out = np.zeros((qweight.shape[0] * 8, qweight.shape[1]), np.int64)
    for j in range(8):
        out[j::8] = _nibble(qweight, j)
    return out


def _decode_cols(packed: np.ndarray, reverse: tuple[int, ...]) -> np.ndarray:
    """int32 [R, C/8] -> int64 [R, C]: column 8c + i = nibble reverse[i] of word (r, c)."""
    out = np.zeros((packed.shape[0], packed.shape[1] * 8), np.int64)
    for i in range(8):
        out[:, i::8] = _nibble(packed, reverse[i])
    return out


def _gptq_ref(
    qweight: np.ndarray, zeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray
) -> np.ndarray:
    """W[n, k] = (q[k, n] - z[g_idx[k], n]) * scales[g_idx[k], n], float64 [N, K]."""
    q = _decode_rows(qweight)
    s = scales.astype(np.float64)
    return ((q - zeros[g_idx]) * s[g_idx]).T


def _checked_group(n: int, k: int, group_size: int) -> int:
    """Group length (K for -1) after checking the fixture's shape requirements."""
    if n % 8 or k % 8:
        raise ValueError(f"fixtures need N and K multiples of 8, got N = {n}, K = {k}")
    g = k if group_size == -1 else group_size
    if g <= 0 or k % g:
        raise ValueError(f"fixtures need K a multiple of group_size, got K = {k}, g = {group_size}")
    return g


# --------------------------------------------------------------------------------------------


def make_gptq(
    n: int,
    k: int,
    group_size: int,
    *,
    sym: bool,
    act_order: bool,
    checkpoint_format: str = "gptq",
    seed: int,
) -> GptqCheckpoint:
    """Quantize a random W [n, k] into AutoGPTQ tensors.

    group_size: a divisor of k, or -1 (per channel). act_order: rows are visited in a random
    order and g_idx[k] = (position of k in that order) // group_size, as desc_act produces.
    checkpoint_format: "gptq" (v1, qzeros store zero - 1, so asymmetric zero points are kept in
    1..15) or "gptq_v2" (qzeros store the zero, 0..15). sym: zero point 8 (v1 stores 7).
    """
    if checkpoint_format not in GPTQ_FORMATS:
        raise ValueError(f"checkpoint_format must be one of {GPTQ_FORMATS}")
    g = _checked_group(n, k, group_size)
    groups = k // g
    rng = np.random.default_rng(seed)
    order = rng.permutation(k) if act_order else np.arange(k)
    g_idx = np.empty(k, np.int32)
    g_idx[order] = np.arange(k) // g
    w = _random_weight(rng, n, g_idx, groups, spread=not sym)
    min_zero = 1 if checkpoint_format == "gptq" else 0
    codes, zeros, scales = _quantize(w, g_idx, groups, sym, min_zero)
    stored = zeros - 1 if checkpoint_format == "gptq" else zeros
    qweight = _pack_along_rows(codes.T)
    qzeros = _pack_along_cols(stored, tuple(range(8)))
    decoded = _decode_cols(qzeros, tuple(range(8))) + (1 if checkpoint_format == "gptq" else 0)
    w_ref = _gptq_ref(qweight, decoded, scales, g_idx)
    return GptqCheckpoint(qweight, qzeros, scales, g_idx, w_ref)


def make_awq(n: int, k: int, group_size: int, *, seed: int) -> AwqCheckpoint:
    """Quantize a random W [n, k] (asymmetric, zero points 0..15) into AutoAWQ GEMM tensors.

    group_size: a divisor of k, or -1 (per channel).
    """
    g = _checked_group(n, k, group_size)
    groups = k // g
    rng = np.random.default_rng(seed)
    group_of_k = np.arange(k) // g
    w = _random_weight(rng, n, group_of_k, groups, spread=True)
    codes, zeros, scales = _quantize(w, group_of_k, groups, sym=False, min_zero=0)
    qweight = _pack_along_cols(codes.T, AWQ_PACK_ORDER)
    qzeros = _pack_along_cols(zeros, AWQ_PACK_ORDER)
    q = _decode_cols(qweight, AWQ_REVERSE_ORDER)  # [K, N]
    z = _decode_cols(qzeros, AWQ_REVERSE_ORDER)  # [G, N]
    s = scales.astype(np.float64)
    w_ref = ((q - z[group_of_k]) * s[group_of_k]).T
    return AwqCheckpoint(qweight, qzeros, scales, w_ref)


def make_max_gptq(n: int, k: int, group_size: int = 128, *, seed: int) -> MaxGptqCheckpoint:
    """Quantize a random W [n, k] (symmetric GPTQ, no act-order) into MAX's GPTQ buffer.

    buffer: uint8 [k/2 + 2k/g, n], the raw qweight bytes followed by the raw fp16 scales
    bytes (as MAX's GPTQLinear builds it). group_size: a divisor of k, or -1 (per channel).
    """
    g = _checked_group(n, k, group_size)
    groups = k // g
    rng = np.random.default_rng(seed)
    g_idx = np.arange(k) // g
    w = _random_weight(rng, n, g_idx, groups, spread=False)
    codes, _, scales = _quantize(w, g_idx, groups, sym=True, min_zero=0)
    qweight = _pack_along_rows(codes.T)
    raw = np.concatenate([qweight.view(np.uint8).ravel(), scales.view(np.uint8).ravel()])
    buffer = raw.reshape(k // 2 + 2 * groups, n)
    eights = np.full((groups, n), 8, np.int64)
    return MaxGptqCheckpoint(buffer, _gptq_ref(qweight, eights, scales, g_idx))

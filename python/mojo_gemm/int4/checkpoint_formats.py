"""Bit-level unpacking of 4-bit checkpoint tensors (GPTQ, AWQ, MAX's GPTQ buffer), numpy.

These helpers only decode bits; argument validation with user-facing messages lives in
`mojo_gemm.int4.quant`, which calls them with arrays of already checked shapes and dtypes.
The formats are described in `mojo_gemm.checkpoints`.
"""

from __future__ import annotations

import numpy as np

NIBBLES_PER_WORD = 8
"""4-bit codes per 32-bit checkpoint word."""

AWQ_REVERSE_ORDER = np.array([0, 4, 1, 5, 2, 6, 3, 7])
"""AutoAWQ: logical column 8c + i of a packed word comes from its nibble AWQ_REVERSE_ORDER[i]."""


def _nibbles(words: np.ndarray) -> np.ndarray:
    """int32/uint32 words [..., W] -> uint8 nibbles [..., W, 8]; nibble j = bits 4j..4j+3."""
    u = words.view(np.uint32)[..., None]
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    return ((u >> shifts) & np.uint32(0xF)).astype(np.uint8)


def unpack_rows(qweight: np.ndarray) -> np.ndarray:
    """GPTQ qweight int32 [K/8, N] (packed along K) -> codes uint8 [K, N].

    Word (r, n) holds the code of row k = 8r + j in nibble j.
    """
    r, n = qweight.shape
    return _nibbles(qweight).transpose(0, 2, 1).reshape(r * NIBBLES_PER_WORD, n)


def unpack_columns(packed: np.ndarray) -> np.ndarray:
    """GPTQ qzeros int32 [R, N/8] (packed along N) -> uint8 [R, N].

    Word (r, c) holds the value of column 8c + j in nibble j.
    """
    r, c = packed.shape
    return _nibbles(packed).reshape(r, c * NIBBLES_PER_WORD)


def unpack_awq_columns(packed: np.ndarray) -> np.ndarray:
    """AutoAWQ qweight int32 [K, N/8] or qzeros int32 [G, N/8] -> uint8 [K or G, N].

    Column 8c + i is nibble AWQ_REVERSE_ORDER[i] of word (row, c).
    """
    r, c = packed.shape
    return _nibbles(packed)[:, :, AWQ_REVERSE_ORDER].reshape(r, c * NIBBLES_PER_WORD)


def split_max_gptq_buffer(
    buffer: np.ndarray, n: int, k: int, groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """MAX GPTQLinear uint8 buffer [K/2 + 2*groups, N] -> (qweight, scales).

    Returns qweight int32 [K/8, N] and scales float16 [groups, N]: the buffer's flat bytes
    are the raw little-endian qweight bytes followed by the raw fp16 scales bytes.
    """
    flat = np.ascontiguousarray(buffer).reshape(-1)
    split = n * k // 2
    qweight = flat[:split].view("<i4").reshape(k // NIBBLES_PER_WORD, n)
    scales = flat[split:].view("<f2").reshape(groups, n)
    return qweight, scales


def act_order_perm(g_idx: np.ndarray, group_size: int) -> np.ndarray | None:
    """Packed-K permutation int64 [K] for a GPTQ g_idx int [K], or None if it is the identity.

    perm is the stable argsort of g_idx: packed position j holds input row perm[j]. Returns
    None when g_idx is already arange(K) // group_size. Raises ValueError (naming g_idx) unless
    the sorted g_idx is arange(K) // group_size, i.e. every group holds exactly group_size rows,
    which is what act-order (desc_act) checkpoints contain. Callers check that g_idx is int64
    [K] with values in 0..K/group_size - 1.
    """
    k = g_idx.shape[0]
    expected = np.arange(k) // group_size
    perm = np.argsort(g_idx, kind="stable")
    if not np.array_equal(g_idx[perm], expected):
        want = np.bincount(expected)
        got = np.bincount(g_idx, minlength=want.shape[0])[: want.shape[0]]
        bad = int(np.flatnonzero(got != want)[0])
        raise ValueError(
            f"g_idx: expected every group to hold {group_size} consecutive packed rows "
            f"(sorted g_idx == arange({k}) // {group_size}), got group {bad} with "
            f"{int(got[bad])} rows instead of {int(want[bad])}"
        )
    if np.array_equal(perm, np.arange(k)):
        return None
    return perm.astype(np.int64)

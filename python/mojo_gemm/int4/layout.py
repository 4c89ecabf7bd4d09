"""The packed int4 weight layout that `multistage_gemm_q` reads (host side, numpy).

This module is the single definition of the layout; the Mojo kernels
(`mojo_kernels/int4_gemm/layout.mojo`) implement the same index maps.

Logical weight: W [N, K] (Linear convention, y = x · Wᵀ), quantized per group of
`group_size` consecutive K elements (after the optional act-order permutation):

    W[n, k] = (q[n, k] - z[k // g, n]) * s[k // g, n]        q, z in 0..15

N is padded to Np (a multiple of `N_TILE` = 64) and K to Kp (a multiple of `K_ALIGN` = 128);
padded codes equal the zero point, so they dequantize to exactly 0.

qweight: uint32 [Np / 64, Kp * 8]. Row T holds the 64-column band n ∈ [64T, 64T + 64); along
the row, the K tiles of 16 follow each other, each 128 words. Inside one 16(K) x 64(N) tile,
word `4 * lane + w` (lane 0..31, w 0..3) carries in nibble j (bits 4j..4j+3) the code of

    n_local = lane // 4 + 16 * w + 8 * ((j >> 1) & 1)
    k_local = 2 * (lane % 4) + 8 * (j & 1) + (j >> 2)

Why: one 16-byte load gives GPU lane `lane` exactly the mma.m16n8k16 fragments of a
16 x 64 tile (as the B operand: 8 n8-subtiles; as the A operand of a swapped product:
4 m16 tiles), and nibbles j and j + 4 sit 16 bits apart with consecutive k, so a
`(word >> s) & 0x000F000F | magic` turns them into one half2/bfloat162 pair.

scales / zeros: [Kp / g, Np], the dtype of the activations, with an 8 x 8 transpose inside
every 64 columns: stored[grp, 64T + 8r + i] = logical[grp, 64T + r + 8i]. A GPU lane then
reads the 8 scales of its columns (n_local = lane // 4 + 8i) as one 16-byte vector.
Per-channel quantization (group_size = -1) uses g = Kp (one group).
"""

from __future__ import annotations

import numpy as np

N_TILE = 64
"""Output columns per packed band (the GPU kernel's narrowest N tile)."""
K_TILE = 16
"""K extent of one packed tile (one mma k-step)."""
K_ALIGN = 128
"""Kp is a multiple of this (the GPU kernel's widest K tile)."""
PACK_FACTOR = 8
"""4-bit codes per uint32 word."""
WORDS_PER_TILE = K_TILE * N_TILE // PACK_FACTOR  # 128


def round_up(x: int, m: int) -> int:
    """Smallest multiple of m that is >= x."""
    return (x + m - 1) // m * m


def padded_shape(n: int, k: int) -> tuple[int, int]:
    """(Np, Kp) for a logical [n, k] weight."""
    return round_up(n, N_TILE), round_up(k, K_ALIGN)


def _tile_index_maps() -> tuple[np.ndarray, np.ndarray]:
    """For each (word, nibble) of a tile: its (n_local, k_local). Shapes [128, 8]."""
    word = np.arange(WORDS_PER_TILE)[:, None]
    j = np.arange(PACK_FACTOR)[None, :]
    lane, w = word // 4, word % 4
    n_local = lane // 4 + 16 * w + 8 * ((j >> 1) & 1)
    k_local = 2 * (lane % 4) + 8 * (j & 1) + (j >> 2)
    return n_local, k_local


_N_LOCAL, _K_LOCAL = _tile_index_maps()


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """Pack 4-bit codes [Np, Kp] (uint8, values 0..15) into qweight uint32 [Np/64, Kp*8]."""
    np_, kp = codes.shape
    if np_ % N_TILE or kp % K_TILE:
        raise ValueError(f"codes shape {codes.shape} must be multiples of ({N_TILE}, {K_TILE})")
    c = codes.astype(np.uint32).reshape(np_ // N_TILE, N_TILE, kp // K_TILE, K_TILE)
    c = c.transpose(0, 2, 1, 3)  # [bands, ktiles, 64, 16]
    nib = c[:, :, _N_LOCAL, _K_LOCAL]  # [bands, ktiles, 128, 8]
    words = np.zeros(nib.shape[:3], np.uint32)
    for j in range(PACK_FACTOR):
        words |= nib[..., j] << np.uint32(4 * j)
    return words.reshape(np_ // N_TILE, kp * PACK_FACTOR)


def unpack_codes(qweight: np.ndarray) -> np.ndarray:
    """Inverse of `pack_codes`: qweight uint32 [Np/64, Kp*8] -> codes uint8 [Np, Kp]."""
    bands, row = qweight.shape
    kp = row // PACK_FACTOR
    words = qweight.reshape(bands, kp // K_TILE, WORDS_PER_TILE)
    out = np.zeros((bands, kp // K_TILE, N_TILE, K_TILE), np.uint8)
    for j in range(PACK_FACTOR):
        out[:, :, _N_LOCAL[:, j], _K_LOCAL[:, j]] = (words >> np.uint32(4 * j)) & np.uint32(0xF)
    return out.transpose(0, 2, 1, 3).reshape(bands * N_TILE, kp)


def permute_group_params(p: np.ndarray) -> np.ndarray:
    """Logical [G, Np] scales/zeros -> stored layout (8 x 8 transpose inside 64 columns)."""
    g, np_ = p.shape
    return p.reshape(g, np_ // 64, 8, 8).transpose(0, 1, 3, 2).reshape(g, np_)


def unpermute_group_params(p: np.ndarray) -> np.ndarray:
    """Inverse of `permute_group_params` (the transpose is its own inverse)."""
    return permute_group_params(p)

"""`Int4Weight`: the host container of a 4-bit weight in our packed layout (numpy).

The packed layout itself (qweight words, the 8 x 8 transpose of scales/zeros, padding of N to
64 and K to 128) is defined in `mojo_gemm.int4.layout`. This module turns logical codes,
float weights, and GPTQ / AWQ / MAX-GPTQ checkpoint tensors into that layout, validating every
argument, and dequantizes back for reference computations.

Logical weight W [N, K] (y = x · Wᵀ); with an act-order permutation `perm`, packed K position j
holds input feature perm[j], and groups are formed over packed positions:

    W[n, perm[j]] = (q[n, j] - z[j // g, n]) * s[j // g, n]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.rules import BOOL, INT, NDARRAY, check_types
from .checkpoint_formats import (
    NIBBLES_PER_WORD,
    act_order_perm,
    split_max_gptq_buffer,
    unpack_awq_columns,
    unpack_columns,
    unpack_rows,
)
from .layout import (
    N_TILE,
    PACK_FACTOR,
    pack_codes,
    padded_shape,
    permute_group_params,
    unpack_codes,
    unpermute_group_params,
)

GROUP_SIZES = (32, 64, 128, -1)
"""Supported group sizes; -1 means one group per output channel (all of K)."""
SYMMETRIC_ZERO = 8
"""Implicit zero point of symmetric weights."""
MAX_CODE = 15
"""Largest 4-bit code."""
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")
"""GPTQ zero-point conventions: v1 stores zero - 1, v2 stores the zero itself."""


# --------------------------------------------------------------------------------------------
# argument checks (messages name the argument, the expectation and the actual value)
FN = "Int4Weight"
"""The name Python-type errors (`check_types`) give for every constructor's arguments."""


def _check_int(name: str, value: object, minimum: int = 1) -> int:
    """Return `value` if it is an int >= minimum; TypeError / ValueError naming `name` otherwise."""
    check_types(FN, {name: value}, {name: INT})
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


def _check_group_size(group_size: object) -> int:
    """Return group_size if it is one of GROUP_SIZES; TypeError / ValueError otherwise."""
    check_types(FN, {"group_size": group_size}, {"group_size": INT})
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size: expected one of {GROUP_SIZES}, got {group_size}")
    return int(group_size)


def _check_array(name: str, value: object, ndim: int) -> np.ndarray:
    """Return `value` if it is a numpy array of rank `ndim`; TypeError / ValueError otherwise."""
    check_types(FN, {name: value}, {name: NDARRAY})
    if value.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {value.shape}")
    return value


def _check_shape(name: str, a: np.ndarray, expected: tuple[int, ...]) -> None:
    """ValueError naming `name` unless a.shape == expected."""
    if a.shape != expected:
        raise ValueError(f"{name}: expected shape {expected}, got {a.shape}")


def _is_float(dtype: np.dtype) -> bool:
    """True for numpy floating dtypes and ml_dtypes' bfloat16 (whose kind is 'V')."""
    return bool(np.issubdtype(dtype, np.floating)) or dtype.name == "bfloat16"


def _check_float(name: str, a: np.ndarray, dtype: type[np.floating] = np.float32) -> np.ndarray:
    """a converted to `dtype` if it has a float dtype and finite values; TypeError / ValueError."""
    if not _is_float(a.dtype):
        raise TypeError(f"{name}: expected a float dtype, got {a.dtype}")
    out = a.astype(dtype)
    if a.size and not np.isfinite(out).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(out))[0])
        raise ValueError(f"{name}: expected finite values, got {out[bad]} at index {bad}")
    return out


def _check_dtype(name: str, a: np.ndarray, allowed: tuple[type[np.generic], ...]) -> None:
    """TypeError naming `name` unless a.dtype is one of `allowed`."""
    if a.dtype not in [np.dtype(t) for t in allowed]:
        names = " or ".join(np.dtype(t).name for t in allowed)
        raise TypeError(f"{name}: expected dtype {names}, got {a.dtype}")


def _check_integer_dtype(name: str, a: np.ndarray) -> None:
    """TypeError naming `name` unless a has a (signed or unsigned) integer dtype."""
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name}: expected an integer dtype, got {a.dtype}")


def _check_perm(name: str, perm: object, k: int) -> np.ndarray | None:
    """perm as int64 [k], or None if it is None or the identity; errors name `name`."""
    if perm is None:
        return None
    p = _check_array(name, perm, 1)
    _check_integer_dtype(name, p)
    _check_shape(name, p, (k,))
    if not np.array_equal(np.sort(p), np.arange(k)):
        missing = np.setdiff1d(np.arange(k), p)
        raise ValueError(
            f"{name}: expected a permutation of 0..{k - 1}, got values {p.min()}..{p.max()} "
            f"with {missing.size} of 0..{k - 1} missing"
        )
    if np.array_equal(p, np.arange(k)):
        return None
    return p.astype(np.int64)


def _check_zero_points(name: str, z: np.ndarray) -> None:
    """ValueError naming `name` unless every value of z is an integer in 0..15."""
    bad = (z != np.rint(z)) | (z < 0) | (z > MAX_CODE)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name}: expected integer zero points in 0..{MAX_CODE}, got {z[at]} at {at}"
        )


def _check_divisibility(names: tuple[str, str], n: int, k: int, group_size: int) -> None:
    """ValueError unless N % 8 == 0 and group_size divides K (or is -1).

    names: the arguments (N's, K's) are read from, named in the message, e.g. ("codes", "codes").
    """
    if n % 8:
        raise ValueError(f"{names[0]}: expected N a multiple of 8, got N = {n}")
    if group_size != -1 and k % group_size:
        raise ValueError(
            f"{names[1]}: expected K a multiple of group_size {group_size}, got K = {k}"
        )


def _logical_groups(k: int, group_size: int) -> int:
    """Groups of a logical K: k / group_size, or 1 for per-channel (-1)."""
    return 1 if group_size == -1 else k // group_size


def _packed_codes_int32(name: str, a: object) -> np.ndarray:
    """A 2-D int32/uint32 checkpoint word array, checked; errors name `name`."""
    arr = _check_array(name, a, 2)
    _check_dtype(name, arr, (np.int32, np.uint32))
    return arr


# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Int4Weight:
    """A 4-bit weight W [n, k] in the packed layout of `mojo_gemm.int4.layout`.

    Fields (Np = round_up(n, 64), Kp = round_up(k, 128), G = `num_groups`):
      n, k: logical out / in features.
      group_size: 32, 64, 128, or -1 (per channel: one group of Kp).
      qweight: uint32 [Np / 64, Kp * 8], `layout.pack_codes` of the padded codes.
      scales: float32 [G, Np], stored (8 x 8 permuted) layout.
      zeros: float32 [G, Np] stored layout with integer values 0..15, or None (symmetric: 8).
      perm: int64 [k] act-order permutation (packed K position j holds input feature perm[j]),
        or None for the identity.

    Padding: padded codes equal the zero point of their (column, group), padded columns and
    groups made only of padding have scale 0 and zero point 8, so padding dequantizes to 0.
    Build instances with the `from_*` constructors; direct construction checks shapes/dtypes.
    """

    n: int
    k: int
    group_size: int
    qweight: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None = None
    perm: np.ndarray | None = None

    def __post_init__(self) -> None:
        """Check field types, dtypes and shapes (ValueError / TypeError naming the field)."""
        _check_int("n", self.n)
        _check_int("k", self.k)
        _check_group_size(self.group_size)
        _check_divisibility(("n", "k"), self.n, self.k, self.group_size)
        np_, kp = self.padded_n, self.padded_k
        _check_array("qweight", self.qweight, 2)
        _check_dtype("qweight", self.qweight, (np.uint32,))
        _check_shape("qweight", self.qweight, (np_ // N_TILE, kp * PACK_FACTOR))
        _check_array("scales", self.scales, 2)
        _check_dtype("scales", self.scales, (np.float32,))
        _check_shape("scales", self.scales, (self.num_groups, np_))
        if self.zeros is not None:
            _check_array("zeros", self.zeros, 2)
            _check_dtype("zeros", self.zeros, (np.float32,))
            _check_shape("zeros", self.zeros, (self.num_groups, np_))
            _check_zero_points("zeros", self.zeros)
        if self.perm is not None:
            _check_dtype("perm", _check_array("perm", self.perm, 1), (np.int64,))
            _check_perm("perm", self.perm, self.k)

    @property
    def symmetric(self) -> bool:
        """True when there are no explicit zero points (zero point 8 everywhere)."""
        return self.zeros is None

    @property
    def padded_n(self) -> int:
        """Np = round_up(n, 64)."""
        return padded_shape(self.n, self.k)[0]

    @property
    def padded_k(self) -> int:
        """Kp = round_up(k, 128)."""
        return padded_shape(self.n, self.k)[1]

    @property
    def effective_group_size(self) -> int:
        """Packed K rows per group: group_size, or Kp for per-channel (-1)."""
        return self.padded_k if self.group_size == -1 else self.group_size

    @property
    def num_groups(self) -> int:
        """G = Kp // effective_group_size (1 for per-channel)."""
        return self.padded_k // self.effective_group_size

    # ----------------------------------------------------------------------------------------

    @classmethod
    def from_codes(
        cls,
        codes: np.ndarray,
        scales: np.ndarray,
        zeros: np.ndarray | None,
        group_size: int,
        perm: np.ndarray | None = None,
    ) -> Int4Weight:
        """Pack logical codes.

        codes: uint8 [N, K], values 0..15, in packed K order (column j is input feature perm[j]);
          N a multiple of 8, K a multiple of group_size.
        scales: float (float16/32/64, bfloat16) [K/g, N] (1 row for per-channel), finite.
        zeros: float or integer dtype [K/g, N] with integer values 0..15, or None (symmetric).
        group_size: 32, 64, 128, or -1 (per channel).
        perm: integer [K] permutation, or None; an identity permutation is stored as None.
        Raises TypeError / ValueError naming the offending argument.
        """
        group_size = _check_group_size(group_size)
        c = _check_array("codes", codes, 2)
        _check_dtype("codes", c, (np.uint8,))
        n, k = c.shape
        if n == 0 or k == 0:
            raise ValueError(f"codes: expected a non-empty [N, K] array, got shape {c.shape}")
        _check_divisibility(("codes", "codes"), n, k, group_size)
        if c.max() > MAX_CODE:
            raise ValueError(f"codes: expected values in 0..{MAX_CODE}, got max {int(c.max())}")
        groups = _logical_groups(k, group_size)
        s = _check_float("scales", _check_array("scales", scales, 2))
        _check_shape("scales", s, (groups, n))
        z = None
        if zeros is not None:
            z_arr = _check_array("zeros", zeros, 2)
            if not (_is_float(z_arr.dtype) or np.issubdtype(z_arr.dtype, np.integer)):
                raise TypeError(f"zeros: expected a float or integer dtype, got {z_arr.dtype}")
            _check_shape("zeros", z_arr, (groups, n))
            z = z_arr.astype(np.float32)
            _check_zero_points("zeros", z)
        p = _check_perm("perm", perm, k)

        np_, kp = padded_shape(n, k)
        g_eff = kp if group_size == -1 else group_size
        s_full = np.zeros((kp // g_eff, np_), np.float32)
        s_full[:groups, :n] = s
        z_full = np.full((kp // g_eff, np_), SYMMETRIC_ZERO, np.uint8)
        if z is not None:
            z_full[:groups, :n] = z
        codes_full = np.repeat(z_full.T, g_eff, axis=1)  # padding = zero point of its group
        codes_full[:n, :k] = c
        return cls(
            n=n,
            k=k,
            group_size=group_size,
            qweight=pack_codes(codes_full),
            scales=permute_group_params(s_full),
            zeros=None if z is None else permute_group_params(z_full.astype(np.float32)),
            perm=p,
        )

    @classmethod
    def from_float(cls, w: np.ndarray, group_size: int = 128, symmetric: bool = True) -> Int4Weight:
        """Round-to-nearest quantization of w: float [N, K] (float16/32/64, bfloat16), finite.

        Per group of `group_size` consecutive K elements (all of K for -1), with the scale s
        rounded to float32 before the codes are computed:
          symmetric: s = amax / 7, q = round(w / s) + 8, so codes stay in 1..15;
          asymmetric: lo = min(min w, 0), hi = max(max w, 0), s = (hi - lo) / 15,
            z = round(-lo / s) in 0..15, q = clip(round(w / s) + z, 0, 15).
        Every element dequantizes to within s / 2 of w. All-zero groups get s = 0.
        """
        group_size = _check_group_size(group_size)
        check_types(FN, {"symmetric": symmetric}, {"symmetric": BOOL})
        arr = _check_array("w", w, 2)
        n, k = arr.shape
        if n == 0 or k == 0:
            raise ValueError(f"w: expected a non-empty [N, K] array, got shape {arr.shape}")
        _check_divisibility(("w", "w"), n, k, group_size)
        x = _check_float("w", arr, np.float64)
        groups = _logical_groups(k, group_size)
        g = k if group_size == -1 else group_size
        xg = np.zeros((n, groups * g))
        xg[:, :k] = x  # zero padding changes neither amax nor min(., 0) / max(., 0)
        xg = xg.reshape(n, groups, g)
        if symmetric:
            s = (np.abs(xg).max(axis=2) / 7).astype(np.float32)
            zp = np.full(s.shape, SYMMETRIC_ZERO, np.float64)
        else:
            lo = np.minimum(xg.min(axis=2), 0)
            hi = np.maximum(xg.max(axis=2), 0)
            s = ((hi - lo) / MAX_CODE).astype(np.float32)
            neg_lo = np.divide(-lo, s, out=np.zeros_like(lo), where=s > 0)
            zp = np.clip(np.rint(neg_lo), 0, MAX_CODE)
        s64 = s.astype(np.float64)[:, :, None]
        ratio = np.divide(xg, s64, out=np.zeros_like(xg), where=s64 > 0)
        q = np.clip(np.rint(ratio) + zp[:, :, None], 0, MAX_CODE).astype(np.uint8)
        codes = q.reshape(n, groups * g)[:, :k]
        zeros = None if symmetric else zp.T.astype(np.float32)
        return cls.from_codes(np.ascontiguousarray(codes), s.T, zeros, group_size)

    @classmethod
    def from_gptq(
        cls,
        qweight: np.ndarray,
        qzeros: np.ndarray,
        scales: np.ndarray,
        g_idx: np.ndarray | None = None,
        *,
        group_size: int,
        checkpoint_format: str = "gptq",
    ) -> Int4Weight:
        """Repack AutoGPTQ 4-bit tensors (G = K / group_size, 1 for -1).

        qweight: int32 (or uint32) [K/8, N], codes of rows 8r..8r+7 in nibbles 0..7.
        qzeros: int32 (or uint32) [G, N/8], zero of column 8c + j in nibble j; "gptq" (v1)
          stores zero - 1, "gptq_v2" the zero itself (a v1 nibble 15 = zero 16 is refused).
        scales: float (usually float16) [G, N].
        g_idx: integer [K] group of each input row, or None (= arange(K) // group_size). With
          act-order, perm = stable argsort(g_idx); every group must then hold exactly
          group_size consecutive packed rows, otherwise ValueError.
        N must be a multiple of 8 and K of group_size. If every zero point is 8 the result is
        symmetric (zeros None).
        """
        group_size = _check_group_size(group_size)
        if checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(
                f"checkpoint_format: expected one of {CHECKPOINT_FORMATS}, "
                f"got {checkpoint_format!r}"
            )
        qw = _packed_codes_int32("qweight", qweight)
        k, n = qw.shape[0] * NIBBLES_PER_WORD, qw.shape[1]
        if k == 0 or n == 0:
            raise ValueError(f"qweight: expected a non-empty [K/8, N] array, got shape {qw.shape}")
        _check_divisibility(("qweight", "qweight"), n, k, group_size)
        groups = _logical_groups(k, group_size)
        qz = _packed_codes_int32("qzeros", qzeros)
        _check_shape("qzeros", qz, (groups, n // NIBBLES_PER_WORD))
        _check_shape("scales", _check_array("scales", scales, 2), (groups, n))
        perm = None
        if g_idx is not None:
            gi = _check_array("g_idx", g_idx, 1)
            _check_integer_dtype("g_idx", gi)
            _check_shape("g_idx", gi, (k,))
            if gi.min() < 0 or gi.max() >= groups:
                raise ValueError(
                    f"g_idx: expected values in 0..{groups - 1}, got range {gi.min()}..{gi.max()}"
                )
            perm = act_order_perm(gi.astype(np.int64), k if group_size == -1 else group_size)

        z = unpack_columns(qz).astype(np.int64) + (1 if checkpoint_format == "gptq" else 0)
        if z.max() > MAX_CODE:
            raise ValueError(
                f"qzeros: expected zero points in 0..{MAX_CODE}, got {int(z.max())} (a v1 "
                f"checkpoint stores zero - 1, so nibble 15 would mean 16; wrong checkpoint_format?)"
            )
        codes = unpack_rows(qw).T
        if perm is not None:
            codes = codes[:, perm]
        zeros = None if (z == SYMMETRIC_ZERO).all() else z.astype(np.float32)
        return cls.from_codes(np.ascontiguousarray(codes), scales, zeros, group_size, perm)

    @classmethod
    def from_awq(
        cls, qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, *, group_size: int
    ) -> Int4Weight:
        """Repack AutoAWQ GEMM 4-bit tensors (G = K / group_size, 1 for -1).

        qweight: int32 (or uint32) [K, N/8], packed along N in AWQ nibble order (column 8c + i
          in nibble [0, 4, 1, 5, 2, 6, 3, 7][i]).
        qzeros: int32 (or uint32) [G, N/8], same packing, zero points stored as is.
        scales: float (usually float16) [G, N].
        K must be a multiple of group_size. If every zero point is 8 the result is symmetric
        (zeros None).
        """
        group_size = _check_group_size(group_size)
        qw = _packed_codes_int32("qweight", qweight)
        k, n = qw.shape[0], qw.shape[1] * NIBBLES_PER_WORD
        if k == 0 or n == 0:
            raise ValueError(f"qweight: expected a non-empty [K, N/8] array, got shape {qw.shape}")
        _check_divisibility(("qweight", "qweight"), n, k, group_size)
        groups = _logical_groups(k, group_size)
        qz = _packed_codes_int32("qzeros", qzeros)
        _check_shape("qzeros", qz, (groups, n // NIBBLES_PER_WORD))
        _check_shape("scales", _check_array("scales", scales, 2), (groups, n))
        z = unpack_awq_columns(qz)
        zeros = None if (z == SYMMETRIC_ZERO).all() else z.astype(np.float32)
        codes = np.ascontiguousarray(unpack_awq_columns(qw).T)
        return cls.from_codes(codes, scales, zeros, group_size)

    @classmethod
    def from_max_gptq(
        cls,
        buffer: np.ndarray,
        *,
        n: int,
        k: int,
        group_size: int = 128,
        perm_idx: np.ndarray | None = None,
    ) -> Int4Weight:
        """Repack MAX GPTQLinear's symmetric buffer (G = K / group_size, 1 for -1).

        buffer: uint8 [K/2 + 2*G, N]; its flat bytes are the raw GPTQ qweight int32 [K/8, N]
          followed by the raw float16 scales [G, N].
        n: out features N, a multiple of 8. k: in features K, a multiple of 8 and of group_size.
        perm_idx: integer [K] act-order permutation as MAX takes it (packed K position j holds
          qweight row perm_idx[j]; scales are indexed by packed group j // g), or None.
        """
        n = _check_int("n", n)
        k = _check_int("k", k)
        group_size = _check_group_size(group_size)
        if k % NIBBLES_PER_WORD:
            raise ValueError(f"k: expected a multiple of 8 (8 qweight rows per word), got {k}")
        _check_divisibility(("n", "k"), n, k, group_size)
        groups = _logical_groups(k, group_size)
        buf = _check_array("buffer", buffer, 2)
        _check_dtype("buffer", buf, (np.uint8,))
        _check_shape("buffer", buf, (k // 2 + 2 * groups, n))
        perm = _check_perm("perm_idx", perm_idx, k)
        qw, scales = split_max_gptq_buffer(buf, n, k, groups)
        codes = unpack_rows(qw).T
        if perm is not None:
            codes = codes[:, perm]
        return cls.from_codes(np.ascontiguousarray(codes), scales, None, group_size, perm)

    # ----------------------------------------------------------------------------------------

    def dequantize(self) -> np.ndarray:
        """float32 [n, k]: the logical weight in the original input-feature order.

        Computed from the packed fields: unpack_codes(qweight), unpermuted scales/zeros, and
        the inverse of perm (W[:, perm[j]] = packed column j).
        """
        g = self.effective_group_size
        codes = unpack_codes(self.qweight).astype(np.float32)
        s = np.repeat(unpermute_group_params(self.scales).T, g, axis=1)
        if self.zeros is None:
            z: np.ndarray | float = float(SYMMETRIC_ZERO)
        else:
            z = np.repeat(unpermute_group_params(self.zeros).T, g, axis=1)
        w = ((codes - z) * s)[: self.n, : self.k]
        if self.perm is None:
            return np.ascontiguousarray(w)
        out = np.empty_like(w)
        out[:, self.perm] = w
        return out

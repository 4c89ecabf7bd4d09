"""Pure-numpy tests of the packed int4 layout and the `Int4Weight` host container (no graph)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from checkpoint_fixtures import make_awq, make_gptq, make_max_gptq
from mojo_gemm.int4.layout import (
    pack_codes,
    permute_group_params,
    unpack_codes,
    unpermute_group_params,
)
from mojo_gemm.int4.quant import Int4Weight

GROUP_SIZES = (32, 64, 128, -1)


def _full_params(w: Int4Weight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Padded codes, scales and zero points of w, each float64 [Np, Kp] (logical column order)."""
    g = w.effective_group_size
    codes = unpack_codes(w.qweight).astype(np.float64)
    s = np.repeat(unpermute_group_params(w.scales).T, g, axis=1).astype(np.float64)
    if w.zeros is None:
        z = np.full(codes.shape, 8.0)
    else:
        z = np.repeat(unpermute_group_params(w.zeros).T, g, axis=1).astype(np.float64)
    return codes, s, z


def _scale_per_element(w: Int4Weight) -> np.ndarray:
    """float64 [N, K]: the scale applied to each logical element (packed K order)."""
    return _full_params(w)[1][: w.n, : w.k]


# --------------------------------------------------------------------------------------------
# the packed layout


def test_pack_unpack_round_trip() -> None:
    """unpack_codes inverts pack_codes on random codes; qweight is uint32 [Np/64, Kp*8]."""
    codes = np.random.default_rng(0).integers(0, 16, size=(192, 384), dtype=np.uint8)
    qweight = pack_codes(codes)
    assert qweight.dtype == np.uint32
    assert qweight.shape == (3, 384 * 8)
    np.testing.assert_array_equal(unpack_codes(qweight), codes)


@pytest.mark.parametrize(
    ("n", "k", "band", "word", "nibble"),
    [
        (0, 0, 0, 0, 0),
        (8, 0, 0, 0, 2),  # n_local 8: nibble bit 1 -> +8 columns
        (0, 8, 0, 0, 1),  # k_local 8: nibble bit 0 -> +8 rows
        (0, 1, 0, 0, 4),  # k_local 1: nibble bit 2 -> +1 row
        (17, 3, 0, 21, 4),  # lane 5, word 1
        (63, 15, 0, 127, 7),  # last word and nibble of the first tile
        (0, 16, 0, 128, 0),  # second K tile
        (64, 0, 1, 0, 0),  # second 64-column band
        (70, 37, 1, 360, 4),  # band 1, K tile 2, lane 26, word 0
    ],
)
def test_layout_single_code(n: int, k: int, band: int, word: int, nibble: int) -> None:
    """A lone code lands in the word and nibble worked out by hand from the layout formula."""
    codes = np.zeros((128, 128), np.uint8)
    codes[n, k] = 0xB
    qweight = pack_codes(codes)
    expected = np.zeros_like(qweight)
    expected[band, word] = 0xB << (4 * nibble)
    np.testing.assert_array_equal(qweight, expected)


def test_layout_words_by_hand() -> None:
    """Whole words of one 64 x 16 tile, for codes equal to n % 16 and to k."""
    by_n = np.tile((np.arange(64) % 16).astype(np.uint8)[:, None], (1, 128))
    words = pack_codes(by_n)[0]
    assert words[0] == 0x88008800  # lane 0: n_local 0 or 8 (nibbles 2, 3, 6, 7)
    assert words[21] == 0x99119911  # lane 5, w 1: n_local 17 or 25
    by_k = np.tile(np.arange(16, dtype=np.uint8)[None, :], (64, 8))
    words = pack_codes(by_k)[0]
    assert words[0] == 0x91918080  # lane 0: k_local 0, 8, 0, 8, 1, 9, 1, 9
    assert words[127] == 0xF7F7E6E6  # lane 31: k_local 6, 14, 6, 14, 7, 15, 7, 15
    assert words[128] == 0x91918080  # the next K tile repeats the pattern


def test_group_params_transpose_by_hand() -> None:
    """stored[grp, 64T + 8r + i] = logical[grp, 64T + r + 8i], and the map is an involution."""
    logical = np.arange(2 * 128, dtype=np.float32).reshape(2, 128)
    stored = permute_group_params(logical)
    assert stored[0, 1] == logical[0, 8]
    assert stored[0, 8] == logical[0, 1]
    assert stored[1, 64 + 8 * 2 + 3] == logical[1, 64 + 2 + 8 * 3]
    np.testing.assert_array_equal(unpermute_group_params(stored), logical)


def test_from_codes_fields() -> None:
    """from_codes packs padded codes and stores scales/zeros in the permuted layout."""
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 16, size=(72, 96), dtype=np.uint8)
    scales = rng.uniform(0.5, 1.0, size=(3, 72)).astype(np.float16)
    zeros = rng.integers(0, 16, size=(3, 72)).astype(np.float32)
    w = Int4Weight.from_codes(codes, scales, zeros, 32)
    assert (w.padded_n, w.padded_k, w.effective_group_size, w.num_groups) == (128, 128, 32, 4)
    assert w.qweight.shape == (2, 1024)
    assert w.scales.dtype == np.float32 and w.scales.shape == (4, 128)
    assert w.zeros is not None and w.zeros.shape == (4, 128)
    assert w.perm is None and not w.symmetric
    np.testing.assert_array_equal(unpack_codes(w.qweight)[:72, :96], codes)
    logical_s = unpermute_group_params(w.scales)
    np.testing.assert_array_equal(logical_s[:3, :72], scales.astype(np.float32))
    np.testing.assert_array_equal(unpermute_group_params(w.zeros)[:3, :72], zeros)
    ref = (codes.astype(np.float64) - np.repeat(zeros.T, 32, axis=1)) * np.repeat(
        scales.astype(np.float64).T, 32, axis=1
    )
    np.testing.assert_array_equal(w.dequantize(), ref.astype(np.float32))


def test_per_channel_properties() -> None:
    """Per-channel: one group spanning Kp."""
    w = Int4Weight.from_float(np.ones((64, 200), np.float32), group_size=-1)
    assert (w.padded_n, w.padded_k, w.effective_group_size, w.num_groups) == (64, 256, 256, 1)
    assert w.scales.shape == (1, 64)


def test_identity_perm_is_none() -> None:
    """An identity permutation (or a monotone g_idx) is stored as perm None."""
    codes = np.full((64, 128), 8, np.uint8)
    w = Int4Weight.from_codes(codes, np.ones((1, 64), np.float32), None, 128, np.arange(128))
    assert w.perm is None
    ck = make_gptq(64, 256, 64, sym=True, act_order=False, seed=2)
    np.testing.assert_array_equal(ck.g_idx, np.arange(256) // 64)
    w = Int4Weight.from_gptq(ck.qweight, ck.qzeros, ck.scales, ck.g_idx, group_size=64)
    assert w.perm is None


def test_dequantize_undoes_perm() -> None:
    """Packed column j is input feature perm[j]."""
    rng = np.random.default_rng(3)
    perm = rng.permutation(128)
    codes = rng.integers(0, 16, size=(64, 128), dtype=np.uint8)
    w = Int4Weight.from_codes(codes, np.ones((1, 64), np.float32), None, -1, perm)
    assert w.perm is not None and w.perm.dtype == np.int64
    deq = w.dequantize()
    np.testing.assert_array_equal(deq[:, perm], codes.astype(np.float32) - 8)


# --------------------------------------------------------------------------------------------
# checkpoints against the independent fixtures


@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("checkpoint_format", ["gptq", "gptq_v2"])
def test_from_gptq_matches_checkpoint(
    checkpoint_format: str, sym: bool, act_order: bool, group_size: int
) -> None:
    """from_gptq dequantizes to the checkpoint's own dequant (v1/v2, sym/asym, act-order)."""
    ck = make_gptq(
        136,
        256,
        group_size,
        sym=sym,
        act_order=act_order,
        checkpoint_format=checkpoint_format,
        seed=10,
    )
    w = Int4Weight.from_gptq(
        ck.qweight,
        ck.qzeros,
        ck.scales,
        ck.g_idx,
        group_size=group_size,
        checkpoint_format=checkpoint_format,
    )
    assert (w.n, w.k, w.group_size) == (136, 256, group_size)
    assert w.symmetric == sym
    if act_order and group_size != -1:
        assert w.perm is not None
        np.testing.assert_array_equal(w.perm, np.argsort(ck.g_idx, kind="stable"))
    else:
        assert w.perm is None
    deq = w.dequantize()
    assert deq.dtype == np.float32 and deq.shape == (136, 256)
    np.testing.assert_allclose(deq, ck.w_ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("n", "k", "group_size"), [(72, 96, 32), (200, 200, -1), (64, 384, 128), (8, 64, 64)]
)
def test_from_gptq_padded_shapes(n: int, k: int, group_size: int) -> None:
    """Shapes that need N and K padding, asymmetric act-order v1."""
    ck = make_gptq(n, k, group_size, sym=False, act_order=True, seed=11)
    w = Int4Weight.from_gptq(ck.qweight, ck.qzeros, ck.scales, ck.g_idx, group_size=group_size)
    np.testing.assert_allclose(w.dequantize(), ck.w_ref, rtol=1e-6, atol=0)


def test_from_gptq_without_g_idx() -> None:
    """g_idx None means arange(K) // group_size."""
    ck = make_gptq(64, 256, 32, sym=False, act_order=False, checkpoint_format="gptq_v2", seed=12)
    w = Int4Weight.from_gptq(
        ck.qweight, ck.qzeros, ck.scales, group_size=32, checkpoint_format="gptq_v2"
    )
    assert w.perm is None
    np.testing.assert_allclose(w.dequantize(), ck.w_ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize(("n", "k"), [(136, 256), (72, 128)])
def test_from_awq_matches_checkpoint(n: int, k: int, group_size: int) -> None:
    """dequantize() of from_awq equals the AWQ checkpoint's own dequant."""
    ck = make_awq(n, k, group_size, seed=20)
    w = Int4Weight.from_awq(ck.qweight, ck.qzeros, ck.scales, group_size=group_size)
    assert not w.symmetric and w.perm is None
    np.testing.assert_allclose(w.dequantize(), ck.w_ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize(("n", "k"), [(128, 256), (72, 128)])
def test_from_max_gptq_matches_checkpoint(n: int, k: int, group_size: int) -> None:
    """dequantize() of from_max_gptq equals the GPTQ dequant of the tensors in the buffer."""
    ck = make_max_gptq(n, k, group_size, seed=30)
    w = Int4Weight.from_max_gptq(ck.buffer, n=n, k=k, group_size=group_size)
    assert w.symmetric and w.perm is None
    np.testing.assert_allclose(w.dequantize(), ck.w_ref, rtol=1e-6, atol=0)


def test_from_max_gptq_act_order() -> None:
    """MAX's buffer + perm_idx = argsort(g_idx) gives the same weight as from_gptq."""
    n, k, g = 64, 512, 128
    ck = make_gptq(n, k, g, sym=True, act_order=True, seed=31)
    raw = np.concatenate([ck.qweight.view(np.uint8).ravel(), ck.scales.view(np.uint8).ravel()])
    buffer = raw.reshape(k // 2 + 2 * k // g, n)
    perm_idx = np.argsort(ck.g_idx, kind="stable").astype(np.int32)
    w = Int4Weight.from_max_gptq(buffer, n=n, k=k, group_size=g, perm_idx=perm_idx)
    np.testing.assert_allclose(w.dequantize(), ck.w_ref, rtol=1e-6, atol=0)
    ref = Int4Weight.from_gptq(ck.qweight, ck.qzeros, ck.scales, ck.g_idx, group_size=g)
    np.testing.assert_array_equal(w.qweight, ref.qweight)
    np.testing.assert_array_equal(w.scales, ref.scales)
    assert w.perm is not None and ref.perm is not None
    np.testing.assert_array_equal(w.perm, ref.perm)


# --------------------------------------------------------------------------------------------
# round-to-nearest from float


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize(
    ("n", "k", "group_size"),
    [(136, 256, 32), (136, 256, 64), (136, 256, 128), (136, 256, -1), (72, 96, 32), (64, 200, -1)],
)
def test_from_float_rtn_error_bound(n: int, k: int, group_size: int, symmetric: bool) -> None:
    """Every element dequantizes to within s/2 of the input (s = its group's scale)."""
    rng = np.random.default_rng(40)
    x = (rng.standard_normal((n, k)) * rng.uniform(0.1, 3.0, size=(n, 1))).astype(np.float32)
    x[:, :8] += 1.5  # some off-centre groups for the asymmetric zero points
    w = Int4Weight.from_float(x, group_size=group_size, symmetric=symmetric)
    assert w.symmetric == symmetric
    s = _scale_per_element(w)
    assert (s > 0).all()
    err = np.abs(w.dequantize().astype(np.float64) - x)
    assert (err <= s * (0.5 + 1e-6)).all()
    if not symmetric:
        assert w.zeros is not None
        z = unpermute_group_params(w.zeros)
        assert len(np.unique(z[: w.num_groups, :n])) > 1


@pytest.mark.parametrize("dtype_name", ["float16", "float64", "bfloat16"])
def test_from_float_input_dtypes(dtype_name: str) -> None:
    """float16, float64 and bfloat16 (ml_dtypes) inputs quantize like their float32 values."""
    if dtype_name == "bfloat16":
        dtype = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    else:
        dtype = np.dtype(dtype_name)
    base = np.random.default_rng(41).standard_normal((64, 128)).astype(np.float32)
    x = base.astype(dtype)  # values exactly representable in float32 for all three dtypes
    w = Int4Weight.from_float(x, group_size=64)
    ref = Int4Weight.from_float(x.astype(np.float32), group_size=64)
    np.testing.assert_array_equal(w.qweight, ref.qweight)
    np.testing.assert_array_equal(w.scales, ref.scales)


def test_from_float_zero_groups() -> None:
    """All-zero groups get scale 0 and dequantize to 0."""
    x = np.zeros((64, 128), np.float32)
    x[:, 64:] = 1.0
    for symmetric in (True, False):
        w = Int4Weight.from_float(x, group_size=64, symmetric=symmetric)
        np.testing.assert_array_equal(unpermute_group_params(w.scales)[0, :64], 0)
        np.testing.assert_allclose(w.dequantize(), x, rtol=1e-6, atol=0)


# --------------------------------------------------------------------------------------------
# padding


def _padded_weights() -> list[Int4Weight]:
    """Weights whose N or K needs padding, from every constructor."""
    rng = np.random.default_rng(50)
    gptq = make_gptq(72, 96, 32, sym=False, act_order=True, checkpoint_format="gptq_v2", seed=51)
    awq = make_awq(72, 96, 32, seed=52)
    max_gptq = make_max_gptq(72, 96, 32, seed=53)
    return [
        Int4Weight.from_gptq(
            gptq.qweight,
            gptq.qzeros,
            gptq.scales,
            gptq.g_idx,
            group_size=32,
            checkpoint_format="gptq_v2",
        ),
        Int4Weight.from_awq(awq.qweight, awq.qzeros, awq.scales, group_size=32),
        Int4Weight.from_max_gptq(max_gptq.buffer, n=72, k=96, group_size=32),
        Int4Weight.from_float(rng.standard_normal((64, 200)) + 2.0, -1, symmetric=False),
        Int4Weight.from_float(rng.standard_normal((72, 200)), -1, symmetric=True),
        Int4Weight.from_float(rng.standard_normal((72, 96)) - 1.0, 32, symmetric=False),
    ]


@pytest.mark.parametrize("index", range(6))
def test_padding_dequantizes_to_zero(index: int) -> None:
    """Padded codes equal their zero point; padding-only groups/columns have s = 0, z = 8."""
    w = _padded_weights()[index]
    codes, s, z = _full_params(w)
    full = (codes - z) * s
    assert (full[w.n :, :] == 0).all() and (full[:, w.k :] == 0).all()
    np.testing.assert_array_equal(codes[: w.n, w.k :], z[: w.n, w.k :])
    assert (s[w.n :, :] == 0).all() and (z[w.n :, :] == 8).all()
    real_groups = -(-w.k // w.effective_group_size)
    logical_s = unpermute_group_params(w.scales)
    assert (logical_s[real_groups:] == 0).all()
    if w.zeros is not None:
        assert (unpermute_group_params(w.zeros)[real_groups:] == 8).all()
    inner = np.empty((w.n, w.k))
    inner[:, np.arange(w.k) if w.perm is None else w.perm] = full[: w.n, : w.k]
    np.testing.assert_array_equal(w.dequantize(), inner.astype(np.float32))


# --------------------------------------------------------------------------------------------
# errors: each message names the argument


def _codes(n: int = 64, k: int = 128) -> np.ndarray:
    """Valid codes uint8 [n, k] (all 8)."""
    return np.full((n, k), 8, np.uint8)


def _ones(g: int = 1, n: int = 64) -> np.ndarray:
    """float32 ones [g, n]."""
    return np.ones((g, n), np.float32)


def _gptq() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A valid small GPTQ checkpoint (64 x 256, g = 64, act-order, v1 asym)."""
    ck = make_gptq(64, 256, 64, sym=False, act_order=True, seed=60)
    return ck.qweight, ck.qzeros, ck.scales, ck.g_idx


def _awq() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A valid small AWQ checkpoint (64 x 256, g = 64)."""
    ck = make_awq(64, 256, 64, seed=61)
    return ck.qweight, ck.qzeros, ck.scales


def _unbalanced_g_idx() -> np.ndarray:
    """g_idx [256] with 65 rows in group 0 and 63 in group 1."""
    g_idx = (np.arange(256) // 64).astype(np.int32)
    g_idx[64] = 0
    return g_idx


def _v1_nibble_15() -> np.ndarray:
    """v1 qzeros [4, 8] whose first zero nibble is 15 (zero point 16)."""
    qzeros = _gptq()[1].copy()
    qzeros.view(np.uint32)[0, 0] |= np.uint32(0xF)
    return qzeros


def _valid() -> Int4Weight:
    """A valid 64 x 128 symmetric weight for `dataclasses.replace`."""
    return Int4Weight.from_codes(_codes(), _ones(), None, -1)


ERROR_CASES: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    # from_codes
    ("codes-list", lambda: Int4Weight.from_codes([[8]], _ones(), None, -1),
     TypeError, r"^Int4Weight: codes must be a numpy.ndarray, got list"),
    ("codes-dtype", lambda: Int4Weight.from_codes(_codes().astype(np.int32), _ones(), None, -1),
     TypeError, r"^codes: expected dtype uint8, got int32"),
    ("codes-rank", lambda: Int4Weight.from_codes(np.zeros(8, np.uint8), _ones(), None, -1),
     ValueError, r"^codes: expected a 2-D array, got shape \(8,\)"),
    ("codes-value", lambda: Int4Weight.from_codes(_codes() + 8, _ones(), None, -1),
     ValueError, r"^codes: expected values in 0..15, got max 16"),
    ("codes-n", lambda: Int4Weight.from_codes(_codes(60), _ones(1, 60), None, -1),
     ValueError, r"^codes: expected N a multiple of 8, got N = 60"),
    ("codes-k", lambda: Int4Weight.from_codes(_codes(64, 100), _ones(4), None, 32),
     ValueError, r"^codes: expected K a multiple of group_size 32, got K = 100"),
    ("group-48", lambda: Int4Weight.from_codes(_codes(), _ones(), None, 48),
     ValueError, r"^group_size: expected one of \(32, 64, 128, -1\), got 48"),
    ("group-256", lambda: Int4Weight.from_codes(_codes(), _ones(), None, 256),
     ValueError, r"^group_size: expected one of .*, got 256"),
    ("group-float", lambda: Int4Weight.from_codes(_codes(), _ones(), None, 128.0),
     TypeError, r"^Int4Weight: group_size must be an int, got float"),
    ("group-bool", lambda: Int4Weight.from_codes(_codes(), _ones(), None, True),
     TypeError, r"^Int4Weight: group_size must be an int, got bool"),
    ("scales-shape", lambda: Int4Weight.from_codes(_codes(), _ones(2), None, -1),
     ValueError, r"^scales: expected shape \(1, 64\), got \(2, 64\)"),
    ("scales-dtype", lambda: Int4Weight.from_codes(_codes(), np.ones((1, 64), int), None, -1),
     TypeError, r"^scales: expected a float dtype, got int64"),
    ("scales-nan", lambda: Int4Weight.from_codes(_codes(), _ones() * np.nan, None, -1),
     ValueError, r"^scales: expected finite values, got nan at index \(0, 0\)"),
    ("zeros-shape", lambda: Int4Weight.from_codes(_codes(), _ones(), _ones(1, 8), -1),
     ValueError, r"^zeros: expected shape \(1, 64\), got \(1, 8\)"),
    ("zeros-range", lambda: Int4Weight.from_codes(_codes(), _ones(), _ones() * 16, -1),
     ValueError, r"^zeros: expected integer zero points in 0..15, got 16.0 at \(0, 0\)"),
    ("zeros-fraction", lambda: Int4Weight.from_codes(_codes(), _ones(), _ones() * 7.5, -1),
     ValueError, r"^zeros: expected integer zero points in 0..15, got 7.5"),
    ("zeros-dtype", lambda: Int4Weight.from_codes(_codes(), _ones(), _ones() > 0, -1),
     TypeError, r"^zeros: expected a float or integer dtype, got bool"),
    ("perm-shape", lambda: Int4Weight.from_codes(_codes(), _ones(), None, -1, np.arange(64)),
     ValueError, r"^perm: expected shape \(128,\), got \(64,\)"),
    ("perm-dtype",
     lambda: Int4Weight.from_codes(_codes(), _ones(), None, -1, np.arange(128.0)),
     TypeError, r"^perm: expected an integer dtype, got float64"),
    ("perm-duplicate",
     lambda: Int4Weight.from_codes(_codes(), _ones(), None, -1, np.zeros(128, int)),
     ValueError, r"^perm: expected a permutation of 0..127, got values 0..0 with 127 of"),
    # from_float
    ("w-dtype", lambda: Int4Weight.from_float(np.ones((64, 128), np.int32)),
     TypeError, r"^w: expected a float dtype, got int32"),
    ("w-inf", lambda: Int4Weight.from_float(np.full((64, 128), np.inf)),
     ValueError, r"^w: expected finite values, got inf"),
    ("w-rank", lambda: Int4Weight.from_float(np.ones((2, 64, 128))),
     ValueError, r"^w: expected a 2-D array, got shape \(2, 64, 128\)"),
    ("w-k", lambda: Int4Weight.from_float(np.ones((64, 96)), group_size=64),
     ValueError, r"^w: expected K a multiple of group_size 64, got K = 96"),
    ("w-n", lambda: Int4Weight.from_float(np.ones((12, 128))),
     ValueError, r"^w: expected N a multiple of 8, got N = 12"),
    ("symmetric-type", lambda: Int4Weight.from_float(np.ones((64, 128)), 128, "yes"),
     TypeError, r"^Int4Weight: symmetric must be a bool, got str"),
    # from_gptq
    ("gptq-qweight-dtype",
     lambda: Int4Weight.from_gptq(_gptq()[0].astype(np.float32), *_gptq()[1:], group_size=64),
     TypeError, r"^qweight: expected dtype int32 or uint32, got float32"),
    ("gptq-n",
     lambda: Int4Weight.from_gptq(_gptq()[0][:, :60], *_gptq()[1:], group_size=64),
     ValueError, r"^qweight: expected N a multiple of 8, got N = 60"),
    ("gptq-k",
     lambda: Int4Weight.from_gptq(_gptq()[0][:12], *_gptq()[1:], group_size=64),
     ValueError, r"^qweight: expected K a multiple of group_size 64, got K = 96"),
    ("gptq-qzeros-shape",
     lambda: Int4Weight.from_gptq(_gptq()[0], _gptq()[1][:3], *_gptq()[2:], group_size=64),
     ValueError, r"^qzeros: expected shape \(4, 8\), got \(3, 8\)"),
    ("gptq-qzeros-dtype",
     lambda: Int4Weight.from_gptq(
         _gptq()[0], _gptq()[1].astype(np.int64), *_gptq()[2:], group_size=64),
     TypeError, r"^qzeros: expected dtype int32 or uint32, got int64"),
    ("gptq-scales-shape",
     lambda: Int4Weight.from_gptq(*_gptq()[:2], _gptq()[2].T, _gptq()[3], group_size=64),
     ValueError, r"^scales: expected shape \(4, 64\), got \(64, 4\)"),
    ("gptq-scales-dtype",
     lambda: Int4Weight.from_gptq(
         *_gptq()[:2], _gptq()[2].astype(np.int32), _gptq()[3], group_size=64),
     TypeError, r"^scales: expected a float dtype, got int32"),
    ("gptq-g-idx-shape",
     lambda: Int4Weight.from_gptq(*_gptq()[:3], _gptq()[3][:128], group_size=64),
     ValueError, r"^g_idx: expected shape \(256,\), got \(128,\)"),
    ("gptq-g-idx-dtype",
     lambda: Int4Weight.from_gptq(*_gptq()[:3], _gptq()[3].astype(float), group_size=64),
     TypeError, r"^g_idx: expected an integer dtype, got float64"),
    ("gptq-g-idx-range",
     lambda: Int4Weight.from_gptq(*_gptq()[:3], _gptq()[3] + 1, group_size=64),
     ValueError, r"^g_idx: expected values in 0..3, got range 1..4"),
    ("gptq-g-idx-unbalanced",
     lambda: Int4Weight.from_gptq(*_gptq()[:3], _unbalanced_g_idx(), group_size=64),
     ValueError, r"^g_idx: expected every group to hold 64 .* got group 0 with 65 rows"),
    ("gptq-format",
     lambda: Int4Weight.from_gptq(*_gptq(), group_size=64, checkpoint_format="gptq_v3"),
     ValueError, r"^checkpoint_format: expected one of \('gptq', 'gptq_v2'\), got 'gptq_v3'"),
    ("gptq-v1-zero-16",
     lambda: Int4Weight.from_gptq(_gptq()[0], _v1_nibble_15(), *_gptq()[2:], group_size=64),
     ValueError, r"^qzeros: expected zero points in 0..15, got 16"),
    ("gptq-group-48", lambda: Int4Weight.from_gptq(*_gptq(), group_size=48),
     ValueError, r"^group_size: expected one of"),
    # from_awq
    ("awq-k", lambda: Int4Weight.from_awq(_awq()[0][:96], *_awq()[1:], group_size=64),
     ValueError, r"^qweight: expected K a multiple of group_size 64, got K = 96"),
    ("awq-qweight-dtype",
     lambda: Int4Weight.from_awq(_awq()[0].astype(np.int16), *_awq()[1:], group_size=64),
     TypeError, r"^qweight: expected dtype int32 or uint32, got int16"),
    ("awq-qzeros-shape",
     lambda: Int4Weight.from_awq(_awq()[0], _awq()[1][:, :4], _awq()[2], group_size=64),
     ValueError, r"^qzeros: expected shape \(4, 8\), got \(4, 4\)"),
    ("awq-scales-shape", lambda: Int4Weight.from_awq(*_awq()[:2], _awq()[2][:2], group_size=64),
     ValueError, r"^scales: expected shape \(4, 64\), got \(2, 64\)"),
    # from_max_gptq
    ("max-buffer-dtype",
     lambda: Int4Weight.from_max_gptq(np.zeros((66, 64), np.int8), n=64, k=128),
     TypeError, r"^buffer: expected dtype uint8, got int8"),
    ("max-buffer-shape",
     lambda: Int4Weight.from_max_gptq(np.zeros((64, 64), np.uint8), n=64, k=128),
     ValueError, r"^buffer: expected shape \(66, 64\), got \(64, 64\)"),
    ("max-n", lambda: Int4Weight.from_max_gptq(np.zeros((66, 60), np.uint8), n=60, k=128),
     ValueError, r"^n: expected N a multiple of 8, got N = 60"),
    ("max-n-type", lambda: Int4Weight.from_max_gptq(np.zeros((66, 64), np.uint8), n="64", k=128),
     TypeError, r"^Int4Weight: n must be an int, got str"),
    ("max-k-8", lambda: Int4Weight.from_max_gptq(np.zeros((66, 64), np.uint8), n=64, k=100),
     ValueError, r"^k: expected a multiple of 8 .*, got 100"),
    ("max-k-group", lambda: Int4Weight.from_max_gptq(np.zeros((99, 64), np.uint8), n=64, k=192),
     ValueError, r"^k: expected K a multiple of group_size 128, got K = 192"),
    ("max-perm-idx",
     lambda: Int4Weight.from_max_gptq(
         np.zeros((66, 64), np.uint8), n=64, k=128, perm_idx=np.arange(1, 129)),
     ValueError, r"^perm_idx: expected a permutation of 0..127, got values 1..128"),
    # direct construction
    ("direct-n", lambda: dataclasses.replace(_valid(), n=0),
     ValueError, r"^n: expected an int >= 1, got 0"),
    ("direct-n-8", lambda: dataclasses.replace(_valid(), n=60),
     ValueError, r"^n: expected N a multiple of 8, got N = 60"),
    ("direct-k-group", lambda: dataclasses.replace(_valid(), group_size=32, k=100),
     ValueError, r"^k: expected K a multiple of group_size 32, got K = 100"),
    ("direct-qweight-shape", lambda: dataclasses.replace(_valid(), k=256),
     ValueError, r"^qweight: expected shape \(1, 2048\), got \(1, 1024\)"),
    ("direct-scales-dtype",
     lambda: dataclasses.replace(_valid(), scales=_valid().scales.astype(np.float16)),
     TypeError, r"^scales: expected dtype float32, got float16"),
    ("direct-zeros-shape", lambda: dataclasses.replace(_valid(), zeros=_ones(2)),
     ValueError, r"^zeros: expected shape \(1, 64\), got \(2, 64\)"),
    ("direct-perm-dtype",
     lambda: dataclasses.replace(_valid(), perm=np.arange(128, dtype=np.int32)),
     TypeError, r"^perm: expected dtype int64, got int32"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [pytest.param(make, error, match, id=name) for name, make, error, match in ERROR_CASES],
)
def test_constructor_errors(make: Callable[[], object], error: type[Exception], match: str) -> None:
    """Each invalid argument raises the documented error type with a message naming it."""
    with pytest.raises(error, match=match):
        make()

"""`mojo_gemm.fp8.quant`: block quantization, the op's activation-scale layout, and DeepSeek
checkpoints (weight + weight_scale_inv), checked against an independent float64 encoder."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mojo_gemm.fp8.quant import (
    E4M3,
    Fp8Blockwise,
    quantize_fp8_blockwise,
    quantize_fp8_input,
)

# every finite e4m3fn value, for a brute-force nearest-value encoder
_ALL = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float64)
_FINITE = np.sort(np.unique(_ALL[np.isfinite(_ALL)]))


def _nearest_e4m3(x: np.ndarray) -> np.ndarray:
    """Nearest finite e4m3fn value (ties to the even code), saturating; independent of ml_dtypes."""
    x = np.clip(x, _FINITE[0], _FINITE[-1])
    idx = np.clip(np.searchsorted(_FINITE, x), 1, len(_FINITE) - 1)
    lo, hi = _FINITE[idx - 1], _FINITE[idx]
    pick_hi = (hi - x) < (x - lo)
    tie = (hi - x) == (x - lo)
    hi_even = (np.array(hi, dtype=np.float32).astype(E4M3).view(np.uint8) % 2) == 0
    return np.where(pick_hi | (tie & hi_even), hi, lo)


@pytest.mark.parametrize(
    ("shape", "block"),
    [((256, 384), (128, 128)), ((200, 130), (128, 128)), ((7, 300), (1, 128)), ((33, 64), (3, 16))],
)
def test_blockwise_matches_independent_encoder(
    shape: tuple[int, int], block: tuple[int, int]
) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape) * rng.uniform(0.01, 10, (shape[0], 1))
    q = quantize_fp8_blockwise(x, block)
    br, bc = block
    want_s = np.zeros((-(-shape[0] // br), -(-shape[1] // bc)))
    for i in range(want_s.shape[0]):
        for j in range(want_s.shape[1]):
            want_s[i, j] = np.abs(x[i * br : (i + 1) * br, j * bc : (j + 1) * bc]).max() / 448.0
    np.testing.assert_allclose(q.scales, want_s, rtol=1e-6)
    assert q.scales.dtype == np.float32 and q.data.dtype == E4M3
    full = np.repeat(np.repeat(q.scales.astype(np.float64), br, 0)[: shape[0]], bc, 1)[
        :, : shape[1]
    ]
    np.testing.assert_array_equal(q.data.astype(np.float64), _nearest_e4m3(x / full))
    err = np.linalg.norm(q.dequantize() - x) / np.linalg.norm(x)
    assert err < 0.04, err  # e4m3: 3 mantissa bits
    assert np.abs(q.data.astype(np.float64)).max() <= 448.0


def test_zero_block_gets_unit_scale() -> None:
    x = np.zeros((4, 8))
    x[:, 4:] = 1.0
    q = quantize_fp8_blockwise(x, (4, 4))
    assert q.scales[0, 0] == 1.0 and q.scales[0, 1] == np.float32(1.0 / 448.0)
    np.testing.assert_allclose(q.dequantize(), x, rtol=1e-6)


def test_input_scale_layout_is_transposed_and_padded() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 300))
    data, scale = quantize_fp8_input(x, gm=1, gk=128)
    assert data.shape == (5, 300) and data.dtype == E4M3
    assert scale.shape == (3, 8)  # [ceil(300/128), 5 padded to a multiple of 4]
    q = quantize_fp8_blockwise(x, (1, 128))
    np.testing.assert_array_equal(scale[:, :5], q.scales.T)
    assert (scale[:, 5:] == 1.0).all()
    _, s2 = quantize_fp8_input(x, gm=2, gk=64, row_align=1)
    assert s2.shape == (5, 3)


def test_deepseek_checkpoint_is_wrapped_not_requantized() -> None:
    rng = np.random.default_rng(2)
    w = rng.integers(0, 256, (256, 384), dtype=np.uint8)
    w[(w & 0x7F) == 0x7F] = 0  # no NaN codes
    inv = rng.uniform(1e-4, 1e-2, (2, 3)).astype(np.float32)
    q = quantize_fp8_blockwise(w.view(E4M3), (128, 128), weight_scale_inv=inv)
    assert (q.bits == w).all() and (q.scales == inv).all()
    want = w.view(E4M3).astype(np.float64) * np.repeat(np.repeat(inv, 128, 0), 128, 1)
    np.testing.assert_array_equal(q.dequantize(), want)
    q_bits = quantize_fp8_blockwise(w, (128, 128), weight_scale_inv=inv)  # uint8 bits too
    assert (q_bits.bits == w).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"x": np.zeros(8), "block": (1, 8)}, ValueError, "x: expected a 2-D"),
        ({"x": np.zeros((2, 2), np.int32), "block": (1, 2)}, TypeError, "x: expected a float"),
        ({"x": np.zeros((2, 2)), "block": (0, 2)}, ValueError, "block: expected positive"),
        ({"x": np.zeros((2, 2)), "block": 128}, TypeError, "block must be a tuple of ints"),
        ({"x": np.full((2, 2), np.inf), "block": (1, 2)}, ValueError, "finite"),
        (
            {
                "x": np.zeros((256, 256), np.float32),
                "block": (128, 128),
                "weight_scale_inv": np.ones((2, 2)),
            },
            TypeError,
            "x: expected float8_e4m3fn",
        ),
        (
            {
                "x": np.zeros((256, 256), np.uint8),
                "block": (128, 128),
                "weight_scale_inv": np.ones((2, 3)),
            },
            ValueError,
            r"scales: expected shape \(2, 2\)",
        ),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        quantize_fp8_blockwise(**kwargs)  # type: ignore[arg-type]


def test_container_checks_shapes() -> None:
    with pytest.raises(ValueError, match="scales: expected shape"):
        Fp8Blockwise(np.zeros((4, 4), ml_dtypes.float8_e4m3fn), np.ones((2, 2)), (4, 4))

"""`quantize_fp8_rows` through a MAX graph vs the host quantizer and float64.

One graph per device (tests/shared_op_graph.py, shared with test_moe_route) holds three op
instances (bf16 H = 200 with a partial last block, fp16 H = 256 with block 64, fp32 H = 96
smaller than one block) with a symbolic T, so the Mojo op compiles once per device. Each batch
checks that data and scales are bit-identical to `quantize_fp8_input(x, 1, block)` (zero rows
and zero blocks included: scale 1.0; float32 rows whose quotients sit next to e4m3 rounding
ties, which only a correctly rounded division gets right) and that the dequantized values are
within e4m3's rounding bound of x in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest
from max.driver import CPU, Device
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType

from mojo_gemm.core.host import numpy_dtype, to_buffer
from mojo_gemm.fp8.op import quantize_fp8_rows
from mojo_gemm.fp8.quant import E4M3, quantize_fp8_input
from shared_op_graph import Part, quantize_part


@dataclass(frozen=True)
class Case:
    dtype: DType
    hidden: int
    block: int


CASES = (
    Case(DType.bfloat16, 200, 128),
    Case(DType.float16, 256, 64),
    Case(DType.float32, 96, 128),
)
TOKENS = (1, 7, 130)
E4M3_SUBNORMAL_STEP = 2.0**-9


def compiled(device_kind: str) -> tuple[Part, Device]:
    """Every case's op instance on `device_kind` (in tests/shared_op_graph.py's graph)."""
    return quantize_part(device_kind)


def tie_row(hidden: int, rng: np.random.Generator) -> np.ndarray:
    """float32 values whose quotient by their block's scale lies within an ulp or two of an
    e4m3 rounding tie (midpoints of normal and subnormal steps), on either side: only a
    correctly rounded division reproduces the host's rounding of all of them (multiplying by
    a float32 reciprocal instead misses about 4 % of them)."""
    amax = np.float32(rng.uniform(100.0, 1000.0))  # a random scale: 1/scale is inexact
    scale = np.float32(np.float64(amax) / 448.0)
    mids = np.array([1.0625, 3.25, 13.0, 208.0, 1.5 * 2.0**-9, 2.5 * 2.0**-9, 0.6875 * 2.0**-5])
    vals = (mids[rng.integers(0, len(mids), hidden)] * np.float64(scale)).astype(np.float32)
    nudged = np.nextafter(vals, np.where(rng.random(hidden) < 0.5, -np.inf, np.inf))
    row = np.where(rng.random(hidden) < 0.5, vals, nudged) * rng.choice([-1, 1], hidden)
    row[:: 128] = amax  # every block's amax (hence its scale) is the same
    return row.astype(np.float64)


def make_x(case: Case, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """Random rows of widely varying magnitude in the case's dtype (as float64), with one
    all-zero row and one all-zero block (the zero-amax case) and, for float32, rows of
    near-tie quotients, when there is room."""
    x = rng.standard_normal((tokens, case.hidden)) * 10.0 ** rng.uniform(-3, 2, (tokens, 1))
    if tokens > 2:
        x[1] = 0.0
        x[2, : min(case.block, case.hidden)] = 0.0
    if case.dtype == DType.float32:
        for t in range(3, min(tokens, max(4, tokens // 2))):
            x[t] = tie_row(case.hidden, rng)
    return x.astype(numpy_dtype(case.dtype)).astype(np.float64)


def run(device_kind: str, tokens: int, seed: int) -> None:
    model, dev = compiled(device_kind)
    rng = np.random.default_rng(seed)
    xs = [make_x(c, tokens, rng) for c in CASES]
    outs = model.execute(*(to_buffer(x, c.dtype).to(dev) for c, x in zip(CASES, xs, strict=True)))
    for i, (c, x) in enumerate(zip(CASES, xs, strict=True)):
        data = outs[2 * i].to(CPU())
        if data.dtype != DType.uint8:
            data = data.view(DType.uint8)
        bits = data.to_numpy()
        scales = outs[2 * i + 1].to(CPU()).to_numpy()
        want_q, want_s = quantize_fp8_input(x, 1, c.block)
        assert scales.shape == (-(-c.hidden // c.block), tokens)
        np.testing.assert_array_equal(scales, want_s[:, :tokens], err_msg=f"{c}: scales")
        mismatch = int((bits != want_q.view(np.uint8)).sum())
        assert mismatch == 0, f"{c}: {mismatch} e4m3 values differ from the host quantizer"
        # float64: |q·s − x| <= half an e4m3 step (2^-4 relative, or the subnormal step)
        s_full = np.repeat(scales.T.astype(np.float64), c.block, axis=1)[:, : c.hidden]
        deq = bits.view(E4M3).astype(np.float64) * s_full
        # (slack: the float32 rounding of the quotient may sit an ulp past a tie)
        bound = np.maximum(2.0**-4 * np.abs(x), 0.5 * E4M3_SUBNORMAL_STEP * s_full) * (1 + 1e-6)
        assert (np.abs(deq - x) <= bound).all(), f"{c}: dequantized values off by > half a step"
        if tokens > 2:
            assert (scales[:, 1] == 1.0).all() and (bits[1] == 0).all(), f"{c}: zero row"


@pytest.mark.parametrize("tokens", TOKENS)
def test_quantize_fp8_rows_cpu(tokens: int) -> None:
    run("cpu", tokens, seed=tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", TOKENS)
def test_quantize_fp8_rows_gpu(tokens: int) -> None:
    run("gpu", tokens, seed=tokens)


def edge_rows(case: Case) -> np.ndarray:
    """Rows of the case's dtype (as float64) at the edges of float32: subnormal blocks (the
    dtype's own subnormals; bf16 shares float32's), amax right around the smallest amax with a
    normal scale (448 · 2^-126) and around the float64-path bound 2^-100, normal values mixed
    with subnormals, and blocks holding +inf, -inf or NaN (scale NaN, codes NaN)."""
    h, dt = case.hidden, numpy_dtype(case.dtype)
    lin = np.linspace(-1.0, 1.0, h)
    tiny = float(np.finfo(np.float16).smallest_subnormal) if case.dtype == DType.float16 else 1e-42
    rows = [lin * tiny * 37, np.full(h, tiny), lin * tiny]
    if case.dtype != DType.float16:
        for amax in (448 * 2.0**-126, 2.0**-100, 1e-38):
            for nudge in (-1, 0, 1):
                a = np.nextafter(np.float32(amax), np.float32(np.inf * nudge)) if nudge else amax
                row = lin * 0.7 * a
                row[0] = a
                rows.append(row)
        mixed = lin * 3.0
        mixed[1::2] = lin[1::2] * 1e-40
        rows.append(mixed)
    for bad in (np.inf, -np.inf, np.nan):
        row = lin * 5.0
        row[min(3, h - 1)] = bad
        rows.append(row)
    return np.array(rows).astype(dt).astype(np.float64)


def run_edges(device_kind: str) -> None:
    model, dev = compiled(device_kind)
    rows = [edge_rows(c) for c in CASES]
    width = max(x.shape[0] for x in rows)  # one T for all inputs: zero rows pad the shorter
    xs = [np.concatenate([x, np.zeros((width - x.shape[0], x.shape[1]))]) for x in rows]
    outs = model.execute(*(to_buffer(x, c.dtype).to(dev) for c, x in zip(CASES, xs, strict=True)))
    for i, (c, x, r) in enumerate(zip(CASES, xs, rows, strict=True)):
        nan_row = r.shape[0] - 1
        data = outs[2 * i].to(CPU())
        bits = (data if data.dtype == DType.uint8 else data.view(DType.uint8)).to_numpy()
        scales = outs[2 * i + 1].to(CPU()).to_numpy()
        want_q, want_s = quantize_fp8_input(x, 1, c.block)
        np.testing.assert_array_equal(scales, want_s[:, :width], err_msg=f"{c}: scales")
        bad = np.argwhere(bits != want_q.view(np.uint8))
        assert bad.size == 0, f"{c}: e4m3 bits differ at {bad[:5].tolist()}"
        if c.dtype == DType.float32:
            assert 0 < scales[0, 1] < 1e-44 and (bits[1] != 0).all(), f"{c}: subnormal row"
        assert np.isnan(scales[0, nan_row]) and (bits[nan_row, : c.block] == 0x7F).all(), (
            f"{c}: NaN block")


def test_subnormal_inf_nan_cpu() -> None:
    """Subnormal, inf and NaN rows: bit-identical to the host quantizer (same graph)."""
    run_edges("cpu")


@pytest.mark.gpu
def test_subnormal_inf_nan_gpu() -> None:
    run_edges("gpu")


def run_empty(device_kind: str) -> None:
    """T = 0 runs and returns empty outputs."""
    model, dev = compiled(device_kind)
    outs = model.execute(*(to_buffer(np.zeros((0, c.hidden)), c.dtype).to(dev) for c in CASES))
    for i, c in enumerate(CASES):
        assert tuple(outs[2 * i].shape) == (0, c.hidden)
        assert tuple(outs[2 * i + 1].shape) == (-(-c.hidden // c.block), 0)


def test_empty_batch_cpu() -> None:
    run_empty("cpu")


@pytest.mark.gpu
def test_empty_batch_gpu() -> None:
    run_empty("gpu")


BAD = [
    ("dtype", TensorType(DType.int32, ["T", 128], DeviceRef.CPU()), 128, TypeError,
     "'x'.*bfloat16, float16 or float32"),
    ("rank", TensorType(DType.bfloat16, [128], DeviceRef.CPU()), 128, ValueError, "'x'.*rank 2"),
    ("symbolic hidden", TensorType(DType.bfloat16, ["T", "h"], DeviceRef.CPU()), 128, ValueError,
     "'x'.*static"),
    ("block", TensorType(DType.bfloat16, ["T", 128], DeviceRef.CPU()), 0, ValueError,
     "'block'.*positive"),
]


@pytest.mark.parametrize(("case", "t", "block", "error", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises(case: str, t: TensorType, block: int, error: type, match: str) -> None:
    with Graph("quantize_contract", input_types=[t]) as g, pytest.raises(error, match=match):
        quantize_fp8_rows(g.inputs[0].tensor, block)


def test_not_a_tensor_raises() -> None:
    with pytest.raises(TypeError, match=r"quantize_fp8_rows: x must be a TensorValue"):
        quantize_fp8_rows(np.zeros((2, 128), ml_dtypes.bfloat16), 128)  # type: ignore[arg-type]

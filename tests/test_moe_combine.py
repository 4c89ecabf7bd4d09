"""`moe_combine` (the `moe_combine_rows` op) through a MAX graph vs a numpy float64 reference.

The op instances live in tests/shared_op_graph.py's graph (one compile per device, shared with
test_moe_route and test_fp8_quantize_op), with symbolic rows: bf16 H = 200 top-2, fp16 H = 96
top-5, bf16 H = 7 top-3 (H not a multiple of 8: the kernel's scalar columns), bf16 H = 1100
top-8 (more than one 1024-column block, a partial one). Every T in (0, 1, 7, 33) reuses it.
The inverse is a random permutation of the T·k rows with one entry out of range (it adds
nothing); the output buffers are fresh per run, so a row the op left unwritten would hold
whatever the allocator had and fail the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType

from mojo_gemm.core.host import to_buffer, to_numpy
from mojo_gemm.models.reference import round_to
from mojo_gemm.router.combine import moe_combine
from shared_op_graph import combine_part


@dataclass(frozen=True)
class Case:
    dtype: DType
    hidden: int
    top_k: int


CASES = (
    Case(DType.bfloat16, 200, 2),
    Case(DType.float16, 96, 5),
    Case(DType.bfloat16, 7, 3),
    Case(DType.bfloat16, 1100, 8),
)
TOKENS = (0, 1, 7, 33)
TOL = {DType.bfloat16: 8e-3, DType.float16: 1e-3}
"""Elementwise relative tolerance: one rounding of the float32 sum to the dtype."""


def reference(y: np.ndarray, inverse: np.ndarray, k: int) -> np.ndarray:
    """float64 [T, H]: the sum of each token's k rows (indices outside [0, R) add nothing)."""
    r = y.shape[0]
    rows = np.where((inverse >= 0) & (inverse < r), inverse, r)
    padded = np.concatenate([y, np.zeros((1, y.shape[1]))])
    return padded[rows].reshape(-1, k, y.shape[1]).sum(axis=1)


def run(device_kind: str) -> None:
    model, dev = combine_part(device_kind)
    rng = np.random.default_rng(11)
    for tokens in TOKENS:
        ys, invs, inputs = [], [], []
        for c in CASES:
            r = tokens * c.top_k
            y = round_to(rng.standard_normal((r, c.hidden)), c.dtype)
            inverse = rng.permutation(r).astype(np.int64)
            if r:
                inverse[rng.integers(r)] = r + 3
            ys.append(y)
            invs.append(inverse)
            inputs += [to_buffer(y, c.dtype).to(dev), to_buffer(inverse, DType.int64).to(dev)]
        outs = model.execute(*inputs)
        for c, y, inverse, out in zip(CASES, ys, invs, outs, strict=True):
            got = to_numpy(out)
            want = reference(y, inverse, c.top_k)
            where = f"{device_kind} {c} T={tokens}"
            assert got.shape == (tokens, c.hidden), f"{where}: shape {got.shape}"
            np.testing.assert_allclose(got, want, rtol=TOL[c.dtype], atol=1e-6, err_msg=where)


def test_moe_combine_cpu() -> None:
    """Every case on the CPU, T in {0, 1, 7, 33}."""
    run("cpu")


@pytest.mark.gpu
def test_moe_combine_gpu() -> None:
    """Every case on the GPU, T in {0, 1, 7, 33}."""
    run("gpu")


_CPU = DeviceRef.CPU()
BAD = [
    ("y dtype", TensorType(DType.float32, ["R", 64], _CPU), TensorType(DType.int64, ["R"], _CPU),
     2, TypeError, "'y'.*bfloat16 or float16"),
    ("inverse dtype", TensorType(DType.bfloat16, ["R", 64], _CPU),
     TensorType(DType.int32, ["R"], _CPU), 2, TypeError, "'inverse'.*int64"),
    ("y rank", TensorType(DType.bfloat16, [64], _CPU), TensorType(DType.int64, ["R"], _CPU), 2,
     ValueError, "'y'.*rank 2"),
    ("rows", TensorType(DType.bfloat16, [6, 64], _CPU), TensorType(DType.int64, [8], _CPU), 2,
     ValueError, "'y'.*as many rows"),
    ("multiple", TensorType(DType.bfloat16, [9, 64], _CPU), TensorType(DType.int64, [9], _CPU), 2,
     ValueError, "'inverse'.*multiple of top_k"),
    ("top_k", TensorType(DType.bfloat16, ["R", 64], _CPU), TensorType(DType.int64, ["R"], _CPU),
     0, ValueError, "'top_k'.*positive"),
    ("device", TensorType(DType.bfloat16, ["R", 64], _CPU),
     TensorType(DType.int64, ["R"], DeviceRef.GPU()), 2, ValueError, "'inverse'.*device"),
]


@pytest.mark.parametrize(("case", "yt", "it", "k", "error", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises(case: str, yt: TensorType, it: TensorType, k: int, error: type,
                          match: str) -> None:
    with Graph("moe_combine_contract", input_types=[yt, it]) as g, pytest.raises(error,
                                                                                 match=match):
        moe_combine(g.inputs[0].tensor, g.inputs[1].tensor, k)


def test_not_an_int_raises() -> None:
    with Graph("moe_combine_types", input_types=[TensorType(DType.bfloat16, ["R", 64], _CPU),
                                                 TensorType(DType.int64, ["R"], _CPU)]) as g, \
            pytest.raises(TypeError, match="moe_combine: top_k must be an int"):
        moe_combine(g.inputs[0].tensor, g.inputs[1].tensor, 2.0)  # type: ignore[arg-type]

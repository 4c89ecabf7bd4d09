"""`moe_route` (the `moe_route_topk_group` op) through a MAX graph vs a numpy float64 reference.

One graph per device (tests/shared_op_graph.py, shared with test_fp8_quantize_op) holds four op
instances with a symbolic T (bf16 E = 16 top-2; fp16 k = E = 5; bf16 E = 37 top-1; fp16 E = 100
top-7: E not a power of two, more experts than a warp has lanes), so the op compiles once per
device, and every T (0, 1, 7, 33, 300) reuses it. Random data is
redrawn per token until its top k + 1 float64 logits are at least GAP apart (no near-ties, so
float32 summation order cannot reorder them); the integer-valued case makes every logit exact in
any order and has many exact ties, which must go to the lower expert id. Successive runs write
different values into the same output sizes, so an entry the op left unwritten would hold stale
data and fail the exact comparisons (the standalone GPU harness
tests/mojo/moe_route_gpu_harness.mojo poisons its buffers explicitly).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from max.driver import Device
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType

from mojo_gemm.core.host import to_buffer, to_numpy
from mojo_gemm.models.reference import round_to
from mojo_gemm.router.op import moe_route
from shared_op_graph import Part, route_part


@dataclass(frozen=True)
class Case:
    dtype: DType
    hidden: int
    experts: int
    top_k: int
    integer: bool = False


CASES = (
    Case(DType.bfloat16, 200, 16, 2),
    Case(DType.float16, 96, 5, 5),
    Case(DType.bfloat16, 64, 37, 1, integer=True),
    Case(DType.float16, 128, 100, 7),
)
TOKENS = (0, 1, 7, 33, 300)
GAP = 1e-3
"""Smallest relative gap between consecutive top k + 1 logits of a random token."""
OUTPUTS = 8
"""Values per case: topk_ids, topk_weights, token_index, row_scale, inverse, a_offsets,
expert_ids, expert_usage_stats."""


def make_router(case: Case, rng: np.random.Generator) -> np.ndarray:
    if case.integer:
        return rng.integers(-2, 3, (case.experts, case.hidden)).astype(np.float64)
    return round_to(rng.standard_normal((case.experts, case.hidden)) / np.sqrt(case.hidden),
                    case.dtype)


def make_x(case: Case, w: np.ndarray, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """Tokens [T, H] of the case's dtype (as float64) without near-ties in their top k + 1."""
    if case.integer:
        return rng.integers(-3, 4, (tokens, case.hidden)).astype(np.float64)
    x = np.zeros((tokens, case.hidden))
    n = min(case.top_k + 1, case.experts)
    for t in range(tokens):
        while True:
            row = round_to(rng.standard_normal(case.hidden) * rng.uniform(0.5, 2.0), case.dtype)
            top = np.sort(w @ row)[::-1][:n]
            if n < 2 or (np.diff(-top) > GAP * np.abs(top).max()).all():
                break
        x[t] = row
    return x


def reference(x: np.ndarray, w: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """Every output of the op in numpy (float64 logits; ties to the lower expert id)."""
    t, e = x.shape[0], w.shape[0]
    logits = x @ w.T
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, ids, axis=1)
    z = np.exp(top - top[:, :1])
    weights = z / z.sum(axis=1, keepdims=True)
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable")  # (expert, assignment)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    counts = np.bincount(flat, minlength=e)
    return {
        "topk_ids": ids.astype(np.int32),
        "topk_weights": weights,
        "token_index": order // k,
        "row_scale": weights.reshape(-1)[order],
        "inverse": inverse,
        "a_offsets": np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32),
        "expert_ids": np.arange(e, dtype=np.int32),
        "expert_usage_stats": np.array([counts.max() if t else 0, e], np.uint32),
    }


def compiled(device_kind: str) -> tuple[Part, Device]:
    """Every case's op instance on `device_kind` (in tests/shared_op_graph.py's graph)."""
    return route_part(device_kind)


def run(device_kind: str) -> None:
    model, dev = compiled(device_kind)
    rng = np.random.default_rng(3)
    routers = [make_router(c, rng) for c in CASES]
    for tokens in TOKENS:
        xs = [make_x(c, w, tokens, rng) for c, w in zip(CASES, routers, strict=True)]
        inputs = []
        for c, x, w in zip(CASES, xs, routers, strict=True):
            inputs += [to_buffer(x, c.dtype).to(dev), to_buffer(w, c.dtype).to(dev)]
        outs = model.execute(*inputs)
        for n, (c, x, w) in enumerate(zip(CASES, xs, routers, strict=True)):
            got = [to_numpy(o) for o in outs[OUTPUTS * n: OUTPUTS * (n + 1)]]
            want = reference(x, w, c.top_k)
            for (name, ref), value in zip(want.items(), got, strict=True):
                where = f"{device_kind} {c} T={tokens}: {name}"
                assert value.dtype == ref.dtype or name in ("topk_weights", "row_scale"), where
                assert value.shape == ref.shape, f"{where}: shape {value.shape} != {ref.shape}"
                if name in ("topk_weights", "row_scale"):
                    assert value.dtype == np.float32, where
                    np.testing.assert_allclose(value, ref, rtol=1e-5, atol=1e-6, err_msg=where)
                else:
                    np.testing.assert_array_equal(value, ref, err_msg=where)


def test_moe_route_cpu() -> None:
    """Every case on the CPU, T in {0, 1, 7, 33, 300}."""
    run("cpu")


@pytest.mark.gpu
def test_moe_route_gpu() -> None:
    """Every case on the GPU, T in {0, 1, 7, 33, 300}."""
    run("gpu")


_CPU = DeviceRef.CPU()
BAD = [
    ("x dtype", TensorType(DType.float32, ["T", 64], _CPU),
     TensorType(DType.float32, [8, 64], _CPU), 2, TypeError, "'x'.*bfloat16 or float16"),
    ("weight dtype", TensorType(DType.bfloat16, ["T", 64], _CPU),
     TensorType(DType.float16, [8, 64], _CPU), 2, TypeError, "'router_weight'.*same dtype"),
    ("x rank", TensorType(DType.bfloat16, [64], _CPU),
     TensorType(DType.bfloat16, [8, 64], _CPU), 2, ValueError, "'x'.*rank 2"),
    ("hidden", TensorType(DType.bfloat16, ["T", 60], _CPU),
     TensorType(DType.bfloat16, [8, 60], _CPU), 2, ValueError, "'x'.*multiple of 8"),
    ("weight shape", TensorType(DType.bfloat16, ["T", 64], _CPU),
     TensorType(DType.bfloat16, [8, 72], _CPU), 2, ValueError, r"'router_weight'.*\[E, 64\]"),
    ("experts", TensorType(DType.bfloat16, ["T", 64], _CPU),
     TensorType(DType.bfloat16, [1025, 64], _CPU), 2, ValueError, "'router_weight'.*1024"),
    ("device", TensorType(DType.bfloat16, ["T", 64], _CPU),
     TensorType(DType.bfloat16, [8, 64], DeviceRef.GPU()), 2, ValueError,
     "'router_weight'.*device"),
    ("top_k", TensorType(DType.bfloat16, ["T", 64], _CPU),
     TensorType(DType.bfloat16, [8, 64], _CPU), 9, ValueError, r"'top_k'.*\[1, E = 8\]"),
    ("top_k zero", TensorType(DType.bfloat16, ["T", 64], _CPU),
     TensorType(DType.bfloat16, [8, 64], _CPU), 0, ValueError, "'top_k'"),
]


@pytest.mark.parametrize(("case", "xt", "wt", "k", "error", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises(case: str, xt: TensorType, wt: TensorType, k: int, error: type,
                          match: str) -> None:
    with Graph("moe_route_contract", input_types=[xt, wt]) as g, pytest.raises(error, match=match):
        moe_route(g.inputs[0].tensor, g.inputs[1].tensor, k)


def test_not_an_int_raises() -> None:
    with Graph("moe_route_types", input_types=[TensorType(DType.bfloat16, ["T", 64], _CPU),
                                               TensorType(DType.bfloat16, [8, 64], _CPU)]) as g, \
            pytest.raises(TypeError, match="moe_route: top_k must be an int"):
        moe_route(g.inputs[0].tensor, g.inputs[1].tensor, 2.0)  # type: ignore[arg-type]

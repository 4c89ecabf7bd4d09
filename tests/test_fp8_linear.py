"""`Fp8Linear` through a MAX graph vs float64: activations quantized on the graph
(`quantize_fp8_rows`), the block-scaled product (`fp8_blockwise_matmul`), float16 out, rank-3
input with a symbolic token dim and an N tail past the last scale block (the layer lives in
tests/shared_op_graph.py's graph); then the layer's construction and call rules and its state
helpers."""

from __future__ import annotations

import numpy as np
import pytest
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType

import mojo_gemm as mg
from mojo_gemm.core.host import to_buffer, to_numpy
from mojo_gemm.fp8.quant import quantize_fp8_blockwise, quantize_fp8_input
from shared_op_graph import fp8_linear_part

IN, OUT, BLOCK = 320, 200, 128


def layer_weight() -> np.ndarray:
    """The layer's float weight [OUT, IN] (fixed: the layer lives in a shared compiled graph)."""
    return np.random.default_rng(7).standard_normal((OUT, IN)) * 0.05


def linear_layer(device: DeviceRef) -> mg.Fp8Linear:
    """The layer under test (float16, block 128) with `layer_weight()` loaded, for
    tests/shared_op_graph.py's graph."""
    layer = mg.Fp8Linear(IN, OUT, dtype=DType.float16, device=device, block=BLOCK)
    layer.load_state_dict(layer.state_from_float(layer_weight()))
    return layer


def run(device_kind: str, tokens: int, seed: int) -> None:
    part, dev = fp8_linear_part(device_kind)
    w = layer_weight()
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((2, tokens, IN)) * 2.0).astype(np.float16).astype(np.float64)
    (y,) = part.execute(to_buffer(x, DType.float16).to(dev))
    got = to_numpy(y).astype(np.float64)
    assert got.shape == (2, tokens, OUT)
    # float64 of what the layer computes: the host quantizer's e4m3 activations and scales (the
    # graph op is bit-identical to it) times the block-quantized weight
    data, scales = quantize_fp8_input(x.reshape(-1, IN), 1, BLOCK)
    a = data.astype(np.float64) * np.repeat(scales[:, : 2 * tokens].T, BLOCK, axis=1)[:, :IN]
    wq = quantize_fp8_blockwise(w, (BLOCK, BLOCK)).dequantize()
    ref = (a @ wq.T).reshape(2, tokens, OUT)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err <= 1e-2, err
    # and against the unquantized product: FP8's own error, well inside the bar for this data
    full = x @ w.T
    assert np.linalg.norm(got - full) / np.linalg.norm(full) <= 0.1


@pytest.mark.parametrize("tokens", [1, 33])
def test_fp8_linear_cpu(tokens: int) -> None:
    run("cpu", tokens, tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 33, 300])
def test_fp8_linear_gpu(tokens: int) -> None:
    run("gpu", tokens, 100 + tokens)


@pytest.mark.parametrize("shape", [[IN], ["T", IN], [3, "T", 2, IN]])
def test_any_leading_dims_build(shape: list[object]) -> None:
    """x of rank 1, 2 or 4 gives [..., out_features] (graph build only)."""
    layer = mg.Fp8Linear(IN, OUT)
    with Graph("fp8_linear_ranks", input_types=[TensorType(DType.bfloat16, shape,
                                                           DeviceRef.CPU())]) as g:
        y = layer(g.inputs[0].tensor)
        assert [str(d) for d in y.shape] == [str(d) for d in [*shape[:-1], OUT]]


def test_call_rules() -> None:
    layer = mg.Fp8Linear(IN, OUT)
    with Graph("fp8_linear_rules", input_types=[TensorType(DType.bfloat16, ["T", IN + 1],
                                                           DeviceRef.CPU()),
                                                TensorType(DType.float16, ["T", IN],
                                                           DeviceRef.CPU())]) as g:
        with pytest.raises(ValueError, match="in_features"):
            layer(g.inputs[0].tensor)
        with pytest.raises(TypeError, match="the layer's dtype"):
            layer(g.inputs[1].tensor)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [({"in_features": 0}, ValueError, "in_features"),
     ({"block": 0}, ValueError, "block"),
     ({"dtype": DType.int32}, TypeError, "dtype")],
)
def test_construction_rules(kwargs: dict[str, object], error: type, match: str) -> None:
    args: dict[str, object] = {"in_features": IN, "out_features": OUT, **kwargs}
    with pytest.raises(error, match=match):
        mg.Fp8Linear(**args)  # type: ignore[arg-type]


def test_state_helpers_check_shapes() -> None:
    layer = mg.Fp8Linear(IN, OUT)
    with pytest.raises(ValueError, match="shape"):
        layer.state_from_float(np.zeros((OUT, IN + 1)))
    with pytest.raises(ValueError, match="block"):
        layer.fp8_state(quantize_fp8_blockwise(np.zeros((OUT, IN)), (64, 64)))
    state = layer.state_from_float(np.zeros((OUT, IN)))
    assert state["weight"].shape == (OUT, IN) and state["weight_scale"].shape == (2, 3)

"""ONE graph per device holding the op instances of tests/test_moe_route.py,
tests/test_moe_combine.py, tests/test_fp8_quantize_op.py, tests/test_fp8_matmul.py and
tests/test_fp8_linear.py (ops on symbolic token counts; the one layer's weights are fixed), so
the five files share one compile. Each file's
`compiled(device)` returns a `Part` whose `execute` feeds the other files' inputs empty (T = 0,
which every op accepts) and returns only its own outputs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import graph_pool
import numpy as np
from max.driver import CPU, Accelerator, Buffer, Device
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import DeviceRef, Graph, Module, TensorType

from mojo_gemm import Fp8Linear
from mojo_gemm.core.host import to_buffer
from mojo_gemm.fp8.matmul import fp8_blockwise_matmul
from mojo_gemm.fp8.op import quantize_fp8_rows
from mojo_gemm.fp8.quant import fp8_buffer
from mojo_gemm.k_cache.op import fp8_dtype_for
from mojo_gemm.router.combine import moe_combine
from mojo_gemm.router.op import moe_route


@dataclass
class Part:
    """One file's slice of the shared model: its inputs and outputs by position."""

    model: Model
    first_input: int
    first_output: int
    n_outputs: int
    idle: list[Buffer]
    """Every input of the graph when idle (zero rows for token-indexed inputs)."""

    def execute(self, *inputs: Buffer) -> list[Buffer]:
        """Runs the shared model with `inputs` as this part's inputs; this part's outputs."""
        feeds = list(self.idle)
        feeds[self.first_input:self.first_input + len(inputs)] = inputs
        outs = self.model.execute(*feeds)
        return list(outs[self.first_output:self.first_output + self.n_outputs])


KEY = "shared_ops"


def _input_types(dref: DeviceRef) -> tuple[list[TensorType], Fp8Linear]:
    """The shared graph's input types on `dref`, and its one layer (weights loaded)."""
    from test_fp8_linear import linear_layer
    from test_fp8_matmul import CASES as MATMUL_CASES
    from test_fp8_quantize_op import CASES as QUANT_CASES
    from test_moe_combine import CASES as COMBINE_CASES
    from test_moe_route import CASES as ROUTE_CASES

    types = []
    for c in ROUTE_CASES:
        types += [TensorType(c.dtype, ["T", c.hidden], dref),
                  TensorType(c.dtype, [c.experts, c.hidden], dref)]
    types += [TensorType(c.dtype, ["Tq", c.hidden], dref) for c in QUANT_CASES]
    for n, c in enumerate(COMBINE_CASES):
        types += [TensorType(c.dtype, [f"Rc{n}", c.hidden], dref),
                  TensorType(DType.int64, [f"Rc{n}"], dref)]
    fp8 = fp8_dtype_for(dref)
    for n, c in enumerate(MATMUL_CASES):
        types += [TensorType(fp8, ["Tm", c.k], dref),
                  TensorType(DType.float32, [c.k_blocks, f"Tms{n}"], dref),
                  TensorType(fp8, [c.n, c.k], dref),
                  TensorType(DType.float32, [c.n_blocks, c.k_blocks], dref)]
    layer = linear_layer(dref)
    types.append(TensorType(layer.dtype, [2, "Tl", layer.in_features], dref))
    return types, layer


def _build(device_kind: str, module: Module | None = None) -> tuple[Graph, dict[str, Any]]:
    """The shared graph on `device_kind` (built into `module` if given) and its weights."""
    from test_fp8_matmul import CASES as MATMUL_CASES
    from test_fp8_quantize_op import CASES as QUANT_CASES
    from test_moe_combine import CASES as COMBINE_CASES
    from test_moe_route import CASES as ROUTE_CASES

    types, layer = _input_types(DeviceRef.CPU() if device_kind == "cpu" else DeviceRef.GPU())
    weights = graph_pool.prefixed_weights(KEY, layer)
    with Graph(f"moe_route_quantize_{device_kind}", input_types=types, module=module) as g:
        outs = []
        for n, c in enumerate(ROUTE_CASES):
            r = moe_route(g.inputs[2 * n].tensor, g.inputs[2 * n + 1].tensor, c.top_k)
            outs += [r.topk_ids, r.topk_weights, r.token_index, r.row_scale, r.inverse,
                     r.a_offsets, r.expert_ids, r.expert_usage_stats]
        first = 2 * len(ROUTE_CASES)
        for c, x in zip(QUANT_CASES, g.inputs[first:first + len(QUANT_CASES)], strict=True):
            outs += quantize_fp8_rows(x.tensor, c.block)
        first += len(QUANT_CASES)
        for n, c in enumerate(COMBINE_CASES):
            y, inverse = g.inputs[first + 2 * n].tensor, g.inputs[first + 2 * n + 1].tensor
            outs.append(moe_combine(y, inverse, c.top_k))
        first += 2 * len(COMBINE_CASES)
        for n, c in enumerate(MATMUL_CASES):
            a, a_scale, w, w_scale = (x.tensor for x in g.inputs[first + 4 * n:first + 4 * n + 4])
            outs.append(fp8_blockwise_matmul(a, a_scale, w, w_scale, c.gran))
        outs.append(layer(g.inputs[-1].tensor))
        g.output(*outs)
    return g, weights


@cache
def _model(device_kind: str) -> tuple[Model, Device, list[TensorType]]:
    """The shared graph compiled for `device_kind` (on the CPU: from the suite's pool)."""
    if device_kind == "cpu":
        return graph_pool.model(KEY), CPU(), _input_types(DeviceRef.CPU())[0]
    g, weights = _build(device_kind)
    dev = Accelerator()
    types = _input_types(DeviceRef.GPU())[0]
    return InferenceSession(devices=[CPU(), dev]).load(g, weights_registry=weights), dev, types


graph_pool.register(KEY, lambda module: _build("cpu", module))


def _part(device_kind: str, which: str) -> tuple[Part, Device]:
    from test_fp8_matmul import CASES as MATMUL_CASES
    from test_fp8_quantize_op import CASES as QUANT_CASES
    from test_moe_combine import CASES as COMBINE_CASES
    from test_moe_route import CASES as ROUTE_CASES
    from test_moe_route import OUTPUTS as ROUTE_OUTPUTS

    model, dev, types = _model(device_kind)
    idle = []
    for t in types:  # symbolic dims (token counts) 0, static ones as they are
        shape = tuple(d.dim if hasattr(d, "dim") else 0 for d in t.shape)
        if t.dtype == DType.float8_e4m3fn:
            idle.append(fp8_buffer(np.zeros(shape, np.uint8), dev))
        else:
            idle.append(to_buffer(np.zeros(shape), t.dtype).to(dev))
    n_route_in, n_route_out = 2 * len(ROUTE_CASES), ROUTE_OUTPUTS * len(ROUTE_CASES)
    if which == "quantize":
        return Part(model, n_route_in, n_route_out, 2 * len(QUANT_CASES), idle), dev
    if which == "combine":
        return Part(model, n_route_in + len(QUANT_CASES), n_route_out + 2 * len(QUANT_CASES),
                    len(COMBINE_CASES), idle), dev
    first_in = n_route_in + len(QUANT_CASES) + 2 * len(COMBINE_CASES)
    first_out = n_route_out + 2 * len(QUANT_CASES) + len(COMBINE_CASES)
    if which == "fp8_matmul":
        return Part(model, first_in, first_out, len(MATMUL_CASES), idle), dev
    if which == "fp8_linear":
        return Part(model, first_in + 4 * len(MATMUL_CASES), first_out + len(MATMUL_CASES), 1,
                    idle), dev
    return Part(model, 0, 0, n_route_out, idle), dev


def route_part(device_kind: str) -> tuple[Part, Device]:
    """test_moe_route's slice: inputs x_i, router_i per case; its OUTPUTS outputs each."""
    return _part(device_kind, "route")


def quantize_part(device_kind: str) -> tuple[Part, Device]:
    """test_fp8_quantize_op's slice: one x per case; data, scales per case."""
    return _part(device_kind, "quantize")


def fp8_linear_part(device_kind: str) -> tuple[Part, Device]:
    """test_fp8_linear's slice: the layer's input x; its output."""
    return _part(device_kind, "fp8_linear")


def fp8_matmul_part(device_kind: str) -> tuple[Part, Device]:
    """test_fp8_matmul's slice: a, a_scale, w, w_scale per case; out per case."""
    return _part(device_kind, "fp8_matmul")


def combine_part(device_kind: str) -> tuple[Part, Device]:
    """test_moe_combine's slice: y, inverse per case; the combined rows per case."""
    return _part(device_kind, "combine")

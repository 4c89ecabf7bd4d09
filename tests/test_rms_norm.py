"""`add_rms_norm` (ops `rms_norm_rows`, `add_rms_norm_rows`) through a MAX graph vs numpy float64.

One graph per device (the CPU one in the suite's pool) holds every case on symbolic token counts:
float32 h + bf16 y -> bf16 at H = 2048 (the decoder's residual add); bf16 h alone -> bf16 at
H = 200 with the sum not kept; float32 h + float32 y -> fp16 at H = 1100 (columns past the last
full step of the kernel); float32 h + bf16 y -> bf16 at H = 7 (not a multiple of 4: the kernel's
scalar columns). The first three also quantize the normed rows to e4m3 (`add_rms_norm_fp8`,
blocks of 128; at H = 200 and 1100 the last block is partial), checked bit for bit against the
host quantizer run on the op's own normed output. Every T in (0, 1, 7, 33) reuses
the graph; outputs are fresh buffers per run, so an unwritten element would hold whatever the
allocator had and fail the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import graph_pool
import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer, Device
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import DeviceRef, Graph, Module, TensorType

from mojo_gemm.core.host import to_buffer, to_numpy
from mojo_gemm.fp8.quant import quantize_fp8_input
from mojo_gemm.models.reference import rms_norm, round_to
from mojo_gemm.norm.op import add_rms_norm, add_rms_norm_fp8

POOL_KEY = "rms_norm"
EPS = 1e-5


@dataclass(frozen=True)
class Case:
    h: DType
    y: DType | None
    out: DType
    hidden: int
    keep_sum: bool = True
    fp8_block: int = 0


CASES = (
    Case(DType.float32, DType.bfloat16, DType.bfloat16, 2048, fp8_block=128),
    Case(DType.bfloat16, None, DType.bfloat16, 200, keep_sum=False, fp8_block=128),
    Case(DType.float32, DType.float32, DType.float16, 1100, fp8_block=128),
    Case(DType.float32, DType.bfloat16, DType.bfloat16, 7),
)
"""The first, second and fourth are the example decoder's own forms (so the CPU suite compiles
them once for both): its attention norms, its first norm (the bf16 embeddings, no residual
yet) and its FFN / final norms."""
TOKENS = (0, 1, 7, 33)
TOL = {DType.bfloat16: 8e-3, DType.float16: 1e-3}
"""Elementwise relative tolerance of normed: one rounding to the output dtype."""


def _types(dref: DeviceRef) -> list[TensorType]:
    types = []
    for n, c in enumerate(CASES):
        types += [TensorType(c.h, [f"T{n}", c.hidden], dref),
                  TensorType(DType.float32, [c.hidden], dref)]
        if c.y is not None:
            types.append(TensorType(c.y, [f"T{n}", c.hidden], dref))
    return types


def build_graph(device_kind: str, module: Module | None = None) -> Graph:
    """Every case's op on `device_kind`: inputs h, weight (, y) per case; outputs (sum,) normed
    (, data, scales)."""
    dref = DeviceRef.CPU() if device_kind == "cpu" else DeviceRef.GPU()
    with Graph(f"rms_norm_{device_kind}", input_types=_types(dref), module=module) as g:
        outs, i = [], 0
        for c in CASES:
            h, w = g.inputs[i].tensor, g.inputs[i + 1].tensor
            y = g.inputs[i + 2].tensor if c.y is not None else None
            i += 2 if c.y is None else 3
            if c.fp8_block:
                s, normed, data, scales = add_rms_norm_fp8(h, y, w, EPS, c.fp8_block, c.out,
                                                           keep_sum=c.keep_sum)
                quantized = [data, scales]
            else:
                s, normed = add_rms_norm(h, y, w, EPS, c.out, keep_sum=c.keep_sum)
                quantized = []
            outs += ([s] if s is not None else []) + [normed] + quantized
        g.output(*outs)
    return g


graph_pool.register(POOL_KEY, lambda module: (build_graph("cpu", module), {}))


@cache
def _model(device_kind: str) -> tuple[Model, Device]:
    if device_kind == "cpu":
        return graph_pool.model(POOL_KEY), CPU()
    dev = Accelerator()
    return InferenceSession(devices=[CPU(), dev]).load(build_graph(device_kind)), dev


def run(device_kind: str) -> None:
    model, dev = _model(device_kind)
    rng = np.random.default_rng(5)
    for tokens in TOKENS:
        inputs: list[Buffer] = []
        refs = []
        for c in CASES:
            h = round_to(rng.standard_normal((tokens, c.hidden)) * 3, c.h)
            w = round_to(rng.standard_normal(c.hidden), DType.bfloat16)
            inputs += [to_buffer(h, c.h).to(dev), to_buffer(w, DType.float32).to(dev)]
            s = h.astype(np.float64)
            if c.y is not None:
                y = round_to(rng.standard_normal((tokens, c.hidden)), c.y)
                inputs.append(to_buffer(y, c.y).to(dev))
                s = s + y
            refs.append((s, rms_norm(s, w.astype(np.float64), EPS)))
        outs = iter(model.execute(*inputs))
        for c, (s, want) in zip(CASES, refs, strict=True):
            where = f"{device_kind} {c} T={tokens}"
            if c.keep_sum:
                got_s = to_numpy(next(outs))
                assert got_s.shape == (tokens, c.hidden), f"{where}: sum shape {got_s.shape}"
                # float32 h + y: exact in float64, one rounding to float32
                np.testing.assert_allclose(got_s, s, rtol=1e-7, atol=1e-30, err_msg=where)
            got = to_numpy(next(outs))
            assert got.shape == (tokens, c.hidden), f"{where}: normed shape {got.shape}"
            np.testing.assert_allclose(got, want, rtol=TOL[c.out], atol=1e-4, err_msg=where)
            if c.fp8_block:
                data = next(outs).to(CPU())
                bits = (data if data.dtype == DType.uint8 else data.view(DType.uint8)).to_numpy()
                scales = next(outs).to(CPU()).to_numpy()
                want_q, want_s = quantize_fp8_input(got, 1, c.fp8_block)
                assert scales.shape == (-(-c.hidden // c.fp8_block), tokens), where
                np.testing.assert_array_equal(scales, want_s[:, :tokens], err_msg=where)
                np.testing.assert_array_equal(bits, want_q.view(np.uint8), err_msg=where)


def test_rms_norm_cpu() -> None:
    """Every case on the CPU, T in {0, 1, 7, 33}."""
    run("cpu")


@pytest.mark.gpu
def test_rms_norm_gpu() -> None:
    """Every case on the GPU, T in {0, 1, 7, 33}."""
    run("gpu")


_CPU = DeviceRef.CPU()
_H = TensorType(DType.float32, ["T", 64], _CPU)
_W = TensorType(DType.float32, [64], _CPU)
BAD = [
    ("h dtype", TensorType(DType.int32, ["T", 64], _CPU), None, _W, {}, TypeError,
     "'h'.*float32, bfloat16 or float16"),
    ("y dtype", _H, TensorType(DType.int64, ["T", 64], _CPU), _W, {}, TypeError, "'y'.*dtype"),
    ("weight dtype", _H, None, TensorType(DType.bfloat16, [64], _CPU), {}, TypeError,
     "'weight'.*float32"),
    ("out dtype", _H, None, _W, {"out_dtype": DType.float32}, TypeError,
     "'out_dtype'.*bfloat16 or float16"),
    ("h rank", TensorType(DType.float32, [64], _CPU), None, _W, {}, ValueError, "'h'.*rank 2"),
    ("symbolic H", TensorType(DType.float32, ["T", "H"], _CPU), None, _W, {}, ValueError,
     "'h'.*static"),
    ("y shape", _H, TensorType(DType.bfloat16, ["T", 32], _CPU), _W, {}, ValueError,
     "'y'.*shape of h"),
    ("y rows", _H, TensorType(DType.bfloat16, ["U", 64], _CPU), _W, {}, ValueError,
     "'y'.*shape of h"),
    ("weight shape", _H, None, TensorType(DType.float32, [32], _CPU), {}, ValueError,
     "'weight'.*static \\[H\\]"),
    ("eps", _H, None, _W, {"eps": -1.0}, ValueError, "'eps'.*>= 0"),
    ("device", _H, None, TensorType(DType.float32, [64], DeviceRef.GPU()), {}, ValueError,
     "'weight'.*device"),
]


@pytest.mark.parametrize(("case", "ht", "yt", "wt", "kwargs", "error", "match"), BAD,
                         ids=[b[0] for b in BAD])
def test_bad_input_raises(case: str, ht: TensorType, yt: TensorType | None, wt: TensorType,
                          kwargs: dict, error: type, match: str) -> None:
    types = [ht, wt] + ([yt] if yt is not None else [])
    with Graph("rms_norm_contract", input_types=types) as g, pytest.raises(error, match=match):
        y = g.inputs[2].tensor if yt is not None else None
        add_rms_norm(g.inputs[0].tensor, y, g.inputs[1].tensor, kwargs.get("eps", EPS),
                     kwargs.get("out_dtype", DType.bfloat16))


def test_not_a_float_raises() -> None:
    with Graph("rms_norm_types", input_types=[_H, _W]) as g, \
            pytest.raises(TypeError, match="add_rms_norm: eps must be a float"):
        add_rms_norm(g.inputs[0].tensor, None, g.inputs[1].tensor, "1e-5")  # type: ignore[arg-type]

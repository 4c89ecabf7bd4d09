"""Empty inputs return empty results or write nothing, for every op and layer but int4 (its
M = 0 case lives in test_int4_graph.py).

One graph per device holds every op with symbolic sizes, so each case below runs through the
same compiled model:
- `grouped_matmul` (functional and in place into a poisoned buffer), `GroupedLinear` (SwiGLU)
  and `MoEBlock`, over T tokens and G groups (G = 0: a_offsets holds one entry);
- `quantize_fp8_rows` over T rows;
- `k_matmul_ragged_paged_scale`, `v_matmul_ragged_paged_scale` and `PagedKVProjection` over
  Tk tokens in B sequences (B = 0: input_row_offsets = [0]) of a poisoned paged cache.
Outputs must have T (or Tk) rows and the poisoned buffers must keep every bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer, Device
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import BufferType, DeviceRef, Graph, TensorType, TensorValue
from max.nn import Module
from max.nn.kv_cache import MHAKVCacheParams, PagedCacheValues
from max.nn.kv_cache.cache_params import contiguous_page_view_and_stride

from mojo_gemm.core.host import to_buffer, to_numpy
from mojo_gemm.fp8.op import quantize_fp8_rows
from mojo_gemm.fp8.quant import fp8_buffer
from mojo_gemm.grouped.layer import GroupedLinear
from mojo_gemm.grouped.moe import MoEBlock
from mojo_gemm.grouped.op import grouped_matmul
from mojo_gemm.k_cache.layer import PagedKVProjection
from mojo_gemm.k_cache.op import (
    fp8_dtype_for,
    k_matmul_ragged_paged_scale,
    v_matmul_ragged_paged_scale,
)

E, K, N = 4, 64, 32  # grouped: bank [E, N, K]
INTER = 16  # GroupedLinear / MoEBlock intermediate size
HEADS, HEAD_DIM, LAYERS, PAGE, PAGES = 2, 32, 2, 16, 9  # bf16 paged cache
KC = 128  # K-cache ops: hidden columns (one 128 block)
POISON = -1234.0


@dataclass(frozen=True)
class Case:
    """T tokens routed into groups by offsets / ids / stats; tk tokens of which
    len(kv_offsets) - 1 sequences with cache lengths cache_lengths own [0, kv_offsets[-1])."""

    name: str
    T: int
    offsets: tuple[int, ...]
    ids: tuple[int, ...]
    stats: tuple[int, int]
    kv_offsets: tuple[int, ...]
    cache_lengths: tuple[int, ...]
    tk: int = 0


CASES = (
    Case("T0_G0_B0", 0, (0,), (), (0, 0), (0,), ()),
    Case("T0_G2_B2", 0, (0, 0, 0), (1, -1), (0, 2), (0, 0, 0), (3, 0)),
    # no group: the in-place buffer keeps every row; no sequence: tokens outside
    # [offsets[0], offsets[B]) have no destination, so the cache keeps every slot
    Case("T5_G0_B0", 5, (0,), (), (0, 0), (0,), (), tk=3),
)


def _params(device: DeviceRef) -> MHAKVCacheParams:
    return MHAKVCacheParams(dtype=DType.bfloat16, n_kv_heads=HEADS, head_dim=HEAD_DIM,
                            num_layers=LAYERS, page_size=PAGE, devices=[device])


class Layers(Module):
    """The three layers of the graph: SwiGLU GroupedLinear, MoEBlock, PagedKVProjection."""

    def __init__(self, dref: DeviceRef, rng: np.random.Generator) -> None:
        super().__init__()
        self.swiglu = GroupedLinear(E, K, INTER, swiglu=True, dtype=DType.bfloat16, device=dref)
        self.moe = MoEBlock(K, INTER, E, 2, dtype=DType.bfloat16, device=dref)
        self.kv = PagedKVProjection(_params(dref), KC, 1, device=dref)
        gate, up = (rng.standard_normal((E, INTER, K)) for _ in range(2))
        n = HEADS * HEAD_DIM
        # loaded through the parent so the graph's weight names carry the attribute prefix
        local = {
            "swiglu": self.swiglu.expert_state(gate=gate, up=up),
            "moe": self.moe.moe_state(rng.standard_normal((E, K)), gate, up,
                                      rng.standard_normal((E, K, INTER))),
            "kv": self.kv.state_from_float(rng.standard_normal((n, KC)) * 0.05,
                                           rng.standard_normal((n, KC)) * 0.05),
        }
        self.load_state_dict({f"{layer}.{name}": buf for layer, state in local.items()
                              for name, buf in state.items()})

    def __call__(
        self, a: TensorValue, route: tuple[TensorValue, TensorValue, TensorValue],
        x_kv: TensorValue, kv_offsets: TensorValue, coll: PagedCacheValues,
    ) -> tuple[TensorValue, TensorValue]:
        """(SwiGLU GroupedLinear of a, MoEBlock of a); writes K and V of x_kv into coll."""
        self.kv(x_kv, kv_offsets, coll)
        return self.swiglu(a, *route), self.moe(a)


@cache
def compiled(device_kind: str) -> tuple[Model, Device]:
    """The graph of every op on `device_kind`, compiled once; inputs in `run`'s order."""
    dref = DeviceRef.CPU() if device_kind == "cpu" else DeviceRef.GPU()
    dev: Device = CPU() if device_kind == "cpu" else Accelerator()
    fp8 = fp8_dtype_for(dref)
    p = _params(dref)
    n = HEADS * HEAD_DIM
    layers = Layers(dref, np.random.default_rng(0))
    types: list[TensorType | BufferType] = [
        TensorType(DType.bfloat16, ["T", K], dref),  # a
        TensorType(DType.bfloat16, [E, N, K], dref),  # b
        BufferType(DType.bfloat16, ["T", N], dref),  # c (in place, poisoned)
        TensorType(DType.uint32, ["G1"], dref),
        TensorType(DType.int32, ["G"], dref),
        TensorType(DType.uint32, [2], dref),
        TensorType(DType.uint32, ["B1"], dref),  # input_row_offsets
        TensorType(fp8, ["Tk", KC], dref),  # hidden
        TensorType(fp8, [n, KC], dref),  # weight
        TensorType(DType.float32, [1, "Tk"], dref),  # input scale
        TensorType(DType.float32, [1, 1], dref),  # weight scale
        TensorType(DType.bfloat16, ["Tk", KC], dref),  # PagedKVProjection x
        BufferType(DType.bfloat16, ["pages", *p.shape_per_block], dref),
        TensorType(DType.int64, [1], DeviceRef.CPU()),
        TensorType(DType.uint32, ["B"], dref),
        TensorType(DType.uint32, ["B", "cols"], dref),
        TensorType(DType.uint32, [1], DeviceRef.CPU()),
        TensorType(DType.uint32, [1], DeviceRef.CPU()),
    ]
    with Graph(f"empty_inputs_{device_kind}", input_types=types) as g:
        (a, b, c, offs, ids, stats, kv_offs, hidden, weight, in_s, w_s, x_kv,
         blocks, stride, lens, lut, mp, mc) = g.inputs
        route = (offs.tensor, ids.tensor, stats.tensor)
        y = grouped_matmul(a.tensor, b.tensor, *route)
        grouped_matmul(a.tensor, b.tensor, *route, out=c.buffer)
        data, scales = quantize_fp8_rows(a.tensor, 32)
        coll = PagedCacheValues(kv_blocks=blocks.buffer, cache_lengths=lens.tensor,
                                lookup_table=lut.tensor, max_prompt_length=mp.tensor,
                                max_cache_length=mc.tensor, page_stride=stride.tensor)
        for project in (k_matmul_ragged_paged_scale, v_matmul_ragged_paged_scale):
            project(p, hidden.tensor, kv_offs.tensor, weight.tensor, in_s.tensor, w_s.tensor,
                    coll, (1, 128, 128), 0)
        y_swiglu, y_moe = layers(a.tensor, route, x_kv.tensor, kv_offs.tensor, coll)
        outs: list[TensorValue] = [y, y_swiglu, y_moe, data, scales]
        g.output(*outs)
    session = InferenceSession(devices=[CPU()] if device_kind == "cpu" else [CPU(), dev])
    return session.load(g, weights_registry=layers.state_dict()), dev


def run(device_kind: str, case: Case) -> None:
    """Runs `case`; checks the output shapes and that the poisoned buffers kept every bit."""
    model, dev = compiled(device_kind)
    dref = DeviceRef.CPU() if device_kind == "cpu" else DeviceRef.GPU()
    rng = np.random.default_rng(1)
    T, n = case.T, HEADS * HEAD_DIM
    tk = case.tk
    b_seq = len(case.kv_offsets) - 1

    def to_dev(x: np.ndarray) -> Buffer:
        return Buffer.from_numpy(np.ascontiguousarray(x)).to(dev)

    c = to_buffer(np.full((T, N), POISON), DType.bfloat16).to(dev)
    c_poison = to_numpy(c)
    p = _params(dref)
    arena = rng.integers(0, 2**16, size=PAGES * 2 * LAYERS * PAGE * n, dtype=np.uint16)
    slab = Buffer.from_numpy(arena.view(np.uint8).copy()).to(dev)
    blocks, stride = contiguous_page_view_and_stride(slab, p.shape_per_block, DType.bfloat16,
                                                     padded_page_bytes=None)
    zeros8 = np.zeros((tk, KC), np.uint8)
    inputs = [
        to_buffer(rng.standard_normal((T, K)), DType.bfloat16).to(dev),
        to_buffer(rng.standard_normal((E, N, K)), DType.bfloat16).to(dev),
        c,
        to_dev(np.array(case.offsets, np.uint32)),
        to_dev(np.array(case.ids, np.int32)),
        to_dev(np.array(case.stats, np.uint32)),
        to_dev(np.array(case.kv_offsets, np.uint32)),
        fp8_buffer(zeros8, dev),
        fp8_buffer(np.zeros((n, KC), np.uint8), dev),
        to_dev(np.ones((1, tk), np.float32)),
        to_dev(np.ones((1, 1), np.float32)),
        to_buffer(np.zeros((tk, KC)), DType.bfloat16).to(dev),
        blocks,
        Buffer.from_numpy(np.array([stride], np.int64)),
        to_dev(np.array(case.cache_lengths, np.uint32)),
        to_dev(np.full((b_seq, 2), PAGES - 1, np.uint32)),
        Buffer.from_numpy(np.array([0], np.uint32)),
        Buffer.from_numpy(np.array([max(case.cache_lengths, default=0)], np.uint32)),
    ]
    y, y_swiglu, y_moe, data, scales = model.execute(*inputs)
    assert tuple(y.shape) == (T, N), f"{case.name}: grouped_matmul shape {tuple(y.shape)}"
    assert tuple(y_swiglu.shape) == (T, INTER), f"{case.name}: GroupedLinear {y_swiglu.shape}"
    assert tuple(y_moe.shape) == (T, K), f"{case.name}: MoEBlock shape {tuple(y_moe.shape)}"
    assert tuple(data.shape) == (T, K), f"{case.name}: quantize_fp8_rows data {data.shape}"
    assert tuple(scales.shape) == (2, T), f"{case.name}: quantize_fp8_rows scales {scales.shape}"
    if T:
        assert np.isfinite(to_numpy(y_moe).astype(np.float64)).all(), f"{case.name}: MoE"
    got_c = to_numpy(c)
    assert np.array_equal(got_c.view(np.uint32), c_poison.view(np.uint32)), (
        f"{case.name}: the in-place buffer was written")
    got = slab.to(CPU()).to_numpy().view(np.uint16)
    assert np.array_equal(got, arena), f"{case.name}: the paged cache was written"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_empty_inputs_cpu(case: Case) -> None:
    run("cpu", case)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_empty_inputs_gpu(case: Case) -> None:
    run("gpu", case)

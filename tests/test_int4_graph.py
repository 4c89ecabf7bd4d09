"""`int4_matmul` / `Int4Linear` through a MAX graph vs a float64 reference of the checkpoint.

One graph holds one layer per configuration (pairwise coverage of group size, symmetric /
asymmetric, act-order, bias, dtype, padded N and K, rank-3 input), so the Mojo op compiles once
per device; every M runs through the same compiled model (symbolic M). On the CPU the graph
also holds a rowwise- and a columnwise-sharded layer (tests/test_int4_shard.py checks them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache

import graph_pool
import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer, Device
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import DeviceRef, ShardingStrategy, TensorType, TensorValue, ops
from max.nn import LayerList, Module

from checkpoint_fixtures import make_awq, make_gptq, make_max_gptq
from mojo_gemm import Int4Linear, Int4Weight
from mojo_gemm.core.host import numpy_dtype, to_buffer, to_numpy

M_VALUES = (0, 1, 7, 16, 24, 33, 300)
"""M = 0: an empty batch (serving loops hand them to layers) returns an empty [0, N]."""


@dataclass(frozen=True)
class Case:
    """One layer of the test graph: its source format and configuration."""

    name: str
    source: str  # gptq | gptq_v2 | awq | max_gptq | float
    n: int
    k: int
    group_size: int
    symmetric: bool
    act_order: bool
    bias: bool
    dtype: DType
    rank3: bool = False


CASES = (
    Case("gptq_g128_sym", "gptq", 200, 256, 128, True, False, False, DType.bfloat16),
    Case("gptq_g64_asym_act_bias", "gptq", 72, 192, 64, False, True, True, DType.float16),
    Case("gptq_v2_g128_asym_act", "gptq_v2", 136, 384, 128, False, True, False, DType.bfloat16,
         rank3=True),
    Case("gptq_g32_sym_act", "gptq", 64, 160, 32, True, True, True, DType.bfloat16),
    Case("awq_g32_bias", "awq", 136, 96, 32, False, False, True, DType.bfloat16),
    Case("awq_g128_fp16", "awq", 8, 256, 128, False, False, False, DType.float16, rank3=True),
    Case("max_gptq_g128", "max_gptq", 128, 256, 128, True, False, True, DType.float16),
    Case("rtn_per_channel_sym", "float", 64, 200, -1, True, False, False, DType.float16),
    Case("rtn_per_channel_asym_bias", "float", 80, 136, -1, False, False, True, DType.bfloat16),
    Case("rtn_g64_asym", "float", 264, 128, 64, False, False, False, DType.bfloat16),
)


def build_weight(case: Case, seed: int) -> tuple[Int4Weight, np.ndarray]:
    """The packed weight and the float64 reference W [N, K] from the checkpoint's own formula."""
    if case.source in ("gptq", "gptq_v2"):
        ck = make_gptq(case.n, case.k, case.group_size, sym=case.symmetric,
                       act_order=case.act_order, checkpoint_format=case.source, seed=seed)
        w = Int4Weight.from_gptq(ck.qweight, ck.qzeros, ck.scales, ck.g_idx,
                                 group_size=case.group_size, checkpoint_format=case.source)
        return w, ck.w_ref
    if case.source == "awq":
        ck = make_awq(case.n, case.k, case.group_size, seed=seed)
        return Int4Weight.from_awq(ck.qweight, ck.qzeros, ck.scales,
                                   group_size=case.group_size), ck.w_ref
    if case.source == "max_gptq":
        ck = make_max_gptq(case.n, case.k, case.group_size, seed=seed)
        return Int4Weight.from_max_gptq(ck.buffer, n=case.n, k=case.k,
                                        group_size=case.group_size), ck.w_ref
    rng = np.random.default_rng(seed)
    w_float = rng.standard_normal((case.n, case.k)).astype(np.float32)
    w = Int4Weight.from_float(w_float, group_size=case.group_size, symmetric=case.symmetric)
    return w, w.dequantize().astype(np.float64)


Ref = tuple[np.ndarray, np.ndarray]
N_SHARDS = 2


class ShardedPair(Module):
    """A rowwise-sharded layer (act-order, asymmetric, bias) and a columnwise-sharded one, in
    MAX's sharding protocol with N_SHARDS shards on the CPU device; outputs (unsharded col,
    concat of its shards, unsharded row, sum of its shards)."""

    def __init__(self) -> None:
        super().__init__()
        self.col = Int4Linear(256, 256, group_size=128, symmetric=False, act_order=True,
                              has_bias=True)
        self.row = Int4Linear(512, 192, group_size=64, has_bias=True)
        self.col.sharding_strategy = ShardingStrategy.rowwise(N_SHARDS)
        self.row.sharding_strategy = ShardingStrategy.columnwise(N_SHARDS)

    def __call__(self, x1: TensorValue, x2: TensorValue) -> tuple[TensorValue, ...]:
        devices = [DeviceRef.CPU()] * N_SHARDS
        col_out = ops.concat([s(x1) for s in self.col.shard(devices)], axis=-1)
        k_part = self.row.in_features // N_SHARDS
        row_parts = [s(x2[:, i * k_part:(i + 1) * k_part])
                     for i, s in enumerate(self.row.shard(devices))]
        row_out = row_parts[0]
        for part in row_parts[1:]:
            row_out = row_out + part
        return self.col(x1), col_out, self.row(x2), row_out

    def state(self, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, Ref]]:
        """Random weights of both layers (col: a valid act-order weight) as a state dict
        (names relative to this module) and their float64 references (W [N, K], bias)."""
        state, refs = {}, {}
        for name, layer in (("col", self.col), ("row", self.row)):
            w_float = rng.standard_normal((layer.out_features, layer.in_features))
            weight = Int4Weight.from_float(w_float.astype(np.float32),
                                           group_size=layer.group_size, symmetric=layer.symmetric)
            if layer.act_order:  # the same codes read in a permuted K order
                perm = rng.permutation(layer.in_features).astype(np.int64)
                weight = dataclasses.replace(weight, perm=perm)
            bias = rng.standard_normal(layer.out_features).astype(np.float32)
            state.update({f"{name}.{k}": v for k, v in layer.int4_state(weight, bias).items()})
            refs[name] = (weight.dequantize().astype(np.float64), bias.astype(np.float64))
        return state, refs


class Layers(Module):
    """Every case as one Int4Linear, each on its own input; on the CPU also a ShardedPair
    (two more inputs [m, 256], [m, 512] bf16 and its four outputs last)."""

    def __init__(self, device: DeviceRef) -> None:
        super().__init__()
        self.layers = LayerList([
            Int4Linear(c.k, c.n, group_size=c.group_size, symmetric=c.symmetric,
                       act_order=c.act_order, has_bias=c.bias, dtype=c.dtype, device=device)
            for c in CASES
        ])
        self.pair = ShardedPair() if device.is_cpu() else None

    def __call__(self, *xs: TensorValue) -> tuple[TensorValue, ...]:
        outs = tuple(layer(x) for layer, x in zip(self.layers, xs, strict=False))
        if self.pair is not None:
            outs += self.pair(*xs[len(CASES):])
        return outs


def input_types(device: DeviceRef) -> list[TensorType]:
    """One input per case: [m_i, K], or [1, m_i, K] for the rank-3 cases (symbolic m_i); on
    the CPU then the ShardedPair's two inputs."""
    types = [
        TensorType(c.dtype, [1, f"m{i}", c.k] if c.rank3 else [f"m{i}", c.k], device)
        for i, c in enumerate(CASES)
    ]
    if device.is_cpu():
        types += [TensorType(DType.bfloat16, ["mp", k], device) for k in PAIR_K]
    return types


PAIR_K = (256, 512)
"""in_features of the ShardedPair's col and row layers."""


@dataclass
class Compiled:
    """The all-cases model on one device, with the float64 references of its weights."""

    model: Model
    device: Device
    refs: list[tuple[np.ndarray, np.ndarray | None]]
    pair_refs: dict[str, Ref]


@cache
def loaded_layers(device_kind: str) -> tuple[Layers, list[tuple[np.ndarray, np.ndarray | None]],
                                             dict[str, Ref]]:
    """The all-cases layers on `device_kind` with their (seeded) weights loaded, the float64
    references of those weights and the ShardedPair's."""
    rng = np.random.default_rng(2026)
    device = DeviceRef.GPU() if device_kind == "gpu" else DeviceRef.CPU()
    model_layers = Layers(device)
    refs, state = [], {}
    for i, (case, layer) in enumerate(zip(CASES, model_layers.layers, strict=True)):
        weight, w_ref = build_weight(case, seed=100 + i)
        bias = rng.standard_normal(case.n).astype(np.float32) if case.bias else None
        state.update({f"layers.{i}.{k}": v for k, v in layer.int4_state(weight, bias).items()})
        refs.append((w_ref, bias))
    pair_refs: dict[str, Ref] = {}
    if model_layers.pair is not None:
        pair_state, pair_refs = model_layers.pair.state(rng)
        state.update({f"pair.{k}": v for k, v in pair_state.items()})
    model_layers.load_state_dict(state)
    return model_layers, refs, pair_refs


graph_pool.register_traced("int4_linear", lambda: loaded_layers("cpu")[0],
                           input_types(DeviceRef.CPU()))


@cache
def compiled(device_kind: str) -> Compiled:
    """The all-cases graph compiled once on `device_kind` ("cpu" or "gpu"; the CPU one comes
    from the suite's pool)."""
    model_layers, refs, pair_refs = loaded_layers(device_kind)
    if device_kind == "cpu":
        return Compiled(graph_pool.model("int4_linear"), CPU(), refs, pair_refs)
    driver_device = Accelerator()
    model = model_layers.compile(*input_types(DeviceRef.GPU()),
                                 session=InferenceSession(devices=[CPU(), driver_device]))
    return Compiled(model, driver_device, refs, pair_refs)


def case_inputs(rng: np.random.Generator, m: int, c: Compiled,
                pair_xs: tuple[np.ndarray, ...] | None = None) -> tuple[list[Buffer], list]:
    """Random inputs of every case for `m` rows (+ the pair's, zeros unless given) and the
    cases' float64 copies."""
    xs, x_refs = [], []
    for case in CASES:
        x = rng.standard_normal((m, case.k)).astype(numpy_dtype(case.dtype))
        x_refs.append(x.astype(np.float64))
        buf: Buffer = to_buffer(x.reshape((1, m, case.k)) if case.rank3 else x, case.dtype)
        xs.append(buf.to(c.device))
    if c.pair_refs:
        pair_xs = pair_xs or tuple(np.zeros((m, k), np.float32) for k in PAIR_K)
        xs += [to_buffer(x, DType.bfloat16).to(c.device) for x in pair_xs]
    return xs, x_refs


def run_cases(device_kind: str) -> None:
    """Runs every M through the all-cases model of `device_kind` and checks every case."""
    rng = np.random.default_rng(2027)
    c = compiled(device_kind)
    for m in M_VALUES:
        xs, x_refs = case_inputs(rng, m, c)
        outs = c.model.execute(*xs)
        for case, out, x64, (w_ref, bias) in zip(CASES, outs, x_refs, c.refs, strict=False):
            got = to_numpy(out).astype(np.float64).reshape(m, case.n)
            if m == 0:
                continue
            ref = x64 @ w_ref.T + (0.0 if bias is None else bias.astype(numpy_dtype(case.dtype)))
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            assert np.isfinite(got).all(), f"{case.name} M={m}: non-finite output"
            assert err <= 1e-2, f"{case.name} M={m}: rel. Frobenius error {err:.3e} > 1e-2"


def test_int4_linear_cpu() -> None:
    """All cases on the CPU path, M in {0, 1, 7, 16, 24, 33, 300}."""
    run_cases("cpu")


@pytest.mark.gpu
def test_int4_linear_gpu() -> None:
    """All cases on the GPU path, M in {0, 1, 7, 16, 24, 33, 300}."""
    run_cases("gpu")

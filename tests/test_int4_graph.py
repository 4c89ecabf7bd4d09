"""`int4_matmul` / `Int4Linear` through a MAX graph vs a float64 reference of the checkpoint.

One graph holds one layer per configuration (pairwise coverage of group size, symmetric /
asymmetric, act-order, bias, dtype, padded N and K, rank-3 input), so the Mojo op compiles once
per device; every M runs through the same compiled model (symbolic M).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, TensorType, TensorValue
from max.nn import LayerList, Module

from checkpoint_fixtures import make_awq, make_gptq, make_max_gptq
from mojo_gemm import Int4Linear, Int4Weight
from mojo_gemm.core.host import numpy_dtype, to_buffer, to_numpy

M_VALUES = (0, 1, 7, 16, 33, 300)
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


class Layers(Module):
    """Every case as one Int4Linear, each on its own input."""

    def __init__(self, device: DeviceRef) -> None:
        super().__init__()
        self.layers = LayerList([
            Int4Linear(c.k, c.n, group_size=c.group_size, symmetric=c.symmetric,
                       act_order=c.act_order, has_bias=c.bias, dtype=c.dtype, device=device)
            for c in CASES
        ])

    def __call__(self, *xs: TensorValue) -> tuple[TensorValue, ...]:
        return tuple(layer(x) for layer, x in zip(self.layers, xs, strict=True))


def input_types(device: DeviceRef) -> list[TensorType]:
    """One input per case: [m_i, K], or [1, m_i, K] for the rank-3 cases (symbolic m_i)."""
    return [
        TensorType(c.dtype, [1, f"m{i}", c.k] if c.rank3 else [f"m{i}", c.k], device)
        for i, c in enumerate(CASES)
    ]


def run_cases(device_kind: str) -> None:
    """Compiles the all-cases graph once on `device_kind` and checks every M."""
    rng = np.random.default_rng(2026)
    device = DeviceRef.GPU() if device_kind == "gpu" else DeviceRef.CPU()
    driver_device = Accelerator() if device_kind == "gpu" else CPU()
    model_layers = Layers(device)
    refs, state = [], {}
    for i, (case, layer) in enumerate(zip(CASES, model_layers.layers, strict=True)):
        weight, w_ref = build_weight(case, seed=100 + i)
        bias = rng.standard_normal(case.n).astype(np.float32) if case.bias else None
        state.update({f"layers.{i}.{k}": v for k, v in layer.int4_state(weight, bias).items()})
        refs.append((w_ref, bias))
    model_layers.load_state_dict(state)
    session = InferenceSession(devices=[CPU(), driver_device] if device_kind == "gpu" else [CPU()])
    model = model_layers.compile(*input_types(device), session=session)
    for m in M_VALUES:
        xs, x_refs = [], []
        for case in CASES:
            x = rng.standard_normal((m, case.k)).astype(numpy_dtype(case.dtype))
            x_refs.append(x.astype(np.float64))
            buf: Buffer = to_buffer(x.reshape((1, m, case.k)) if case.rank3 else x, case.dtype)
            xs.append(buf.to(driver_device))
        outs = model.execute(*xs)
        for case, out, x64, (w_ref, bias) in zip(CASES, outs, x_refs, refs, strict=True):
            got = to_numpy(out).astype(np.float64).reshape(m, case.n)
            if m == 0:
                continue
            ref = x64 @ w_ref.T + (0.0 if bias is None else bias.astype(numpy_dtype(case.dtype)))
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            assert np.isfinite(got).all(), f"{case.name} M={m}: non-finite output"
            assert err <= 1e-2, f"{case.name} M={m}: rel. Frobenius error {err:.3e} > 1e-2"


def test_int4_linear_cpu() -> None:
    """All cases on the CPU path, M in {0, 1, 7, 16, 33, 300}."""
    run_cases("cpu")


@pytest.mark.gpu
def test_int4_linear_gpu() -> None:
    """All cases on the GPU path, M in {1, 7, 16, 33, 300}."""
    run_cases("gpu")

"""`MoEBlock` (router top-k, on-device grouping, grouped SwiGLU experts, weighted combine) through
a MAX graph vs its float64 reference (`mojo_gemm.models.reference.moe_reference`).

One graph holds two blocks (bf16: H=200, I=72, 16 experts, top-2; fp16: H=96, I=40, 5 experts,
top-3) with a symbolic token count, so it compiles once per device and every T below (1: most
groups empty, ragged 7, 37) reuses it. Also checks the routing outputs and the configuration
errors. On the CPU the graph also holds the bf16 block's expert-parallel shards
(tests/test_moe_shard.py checks them).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import graph_pool
import numpy as np
import pytest
from max.driver import CPU, Accelerator, Device
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import DeviceRef, Graph, ShardingStrategy, TensorType, TensorValue, ops
from max.nn import LayerList, Module

from mojo_gemm.core.host import to_buffer, to_numpy
from mojo_gemm.grouped.moe import MoEBlock
from mojo_gemm.models.reference import moe_reference, round_to

T_VALUES = (0, 1, 7, 37)
"""T = 0: an empty batch returns empty outputs."""
TOL = 1e-2


@dataclass(frozen=True)
class Case:
    hidden: int
    inter: int
    experts: int
    top_k: int
    dtype: DType


CASES = (Case(200, 72, 16, 2, DType.bfloat16), Case(96, 40, 5, 3, DType.float16))
N_SHARDS = 2
"""Expert shards of the first block, and tensor-parallel shards of TP_CASE (CPU graph only)."""
TP_CASE = Case(200, 32, 16, 2, DType.bfloat16)
"""A block with intermediate_size a multiple of 8 N_SHARDS, for its tensor-parallel shards."""


def case_weights(case: Case, seed: int) -> tuple[np.ndarray, ...]:
    """Random float router [E, H], gate/up [E, I, H], down [E, H, I] (fresh, nonzero)."""
    rng = np.random.default_rng(seed)
    e, h, i = case.experts, case.hidden, case.inter
    return (rng.standard_normal((e, h)) / np.sqrt(h),
            rng.standard_normal((e, i, h)) / np.sqrt(h),
            rng.standard_normal((e, i, h)) / np.sqrt(h),
            rng.standard_normal((e, h, i)) / np.sqrt(i))


class Blocks(Module):
    """Every case as one MoEBlock on its own input; outputs y, ids, weights per block, and on
    the CPU then the float32 sum of the first block's N_SHARDS expert shards (MAX's
    `ShardingStrategy.expert_parallel`, every shard on the CPU device), the TP_CASE block's
    output on the first input and the float32 sum of its N_SHARDS tensor-parallel shards'."""

    def __init__(self, device: DeviceRef) -> None:
        super().__init__()
        self.device = device
        self.blocks = LayerList([
            MoEBlock(c.hidden, c.inter, c.experts, c.top_k, dtype=c.dtype, device=device)
            for c in CASES
        ])
        if device.is_cpu():
            self.blocks[0].sharding_strategy = ShardingStrategy.expert_parallel(N_SHARDS)
            c = TP_CASE
            self.tp = MoEBlock(c.hidden, c.inter, c.experts, c.top_k, dtype=c.dtype, device=device)
            self.tp.sharding_strategy = ShardingStrategy.tensor_parallel(N_SHARDS)

    def __call__(self, *xs: TensorValue) -> tuple[TensorValue, ...]:
        outs: list[TensorValue] = []
        for block, x in zip(self.blocks, xs, strict=True):
            outs += [block(x), *block.route(x)]
        if self.device.is_cpu():
            for sharded in (self.blocks[0], self.tp):
                parts = [ops.cast(s(xs[0]), DType.float32)
                         for s in sharded.shard([self.device] * N_SHARDS)]
                total = parts[0]
                for part in parts[1:]:
                    total = total + part
                if sharded is self.tp:
                    outs.append(self.tp(xs[0]))
                outs.append(total)
        return tuple(outs)


@cache
def loaded_blocks(device_kind: str) -> tuple[Blocks, tuple[tuple[np.ndarray, ...], ...]]:
    """The two-block model on `device_kind` with its (seeded) float weights loaded, and those
    weights."""
    dref = DeviceRef.GPU() if device_kind == "gpu" else DeviceRef.CPU()
    blocks = Blocks(dref)
    weights = tuple(case_weights(c, seed=10 + n) for n, c in enumerate(CASES))
    state = {}
    for n, (block, w) in enumerate(zip(blocks.blocks, weights, strict=True)):
        state.update({f"blocks.{n}.{k}": v for k, v in block.moe_state(*w).items()})
    if device_kind == "cpu":
        tp_weights = case_weights(TP_CASE, seed=30)
        state.update({f"tp.{k}": v for k, v in blocks.tp.moe_state(*tp_weights).items()})
    blocks.load_state_dict(state)
    return blocks, weights


def input_types(dref: DeviceRef) -> list[TensorType]:
    return [TensorType(c.dtype, [f"t{n}", c.hidden], dref) for n, c in enumerate(CASES)]


graph_pool.register_traced("moe_blocks", lambda: loaded_blocks("cpu")[0],
                           input_types(DeviceRef.CPU()))


@cache
def compiled(device_kind: str) -> tuple[Model, Device, tuple[tuple[np.ndarray, ...], ...]]:
    """The two-block model on `device_kind`, compiled once (the CPU one comes from the
    suite's pool), with its float weights."""
    blocks, weights = loaded_blocks(device_kind)
    if device_kind == "cpu":
        return graph_pool.model("moe_blocks"), CPU(), weights
    dev = Accelerator()
    session = InferenceSession(devices=[CPU(), dev])
    return blocks.compile(*input_types(DeviceRef.GPU()), session=session), dev, weights


def run(device_kind: str) -> None:
    model, dev, weights = compiled(device_kind)
    rng = np.random.default_rng(7)
    for t in T_VALUES:
        xs = [round_to(rng.standard_normal((t, c.hidden)) * rng.uniform(0.5, 2.0, (t, 1)),
                       c.dtype) for c in CASES]
        outs = model.execute(*(to_buffer(x, c.dtype).to(dev)
                               for x, c in zip(xs, CASES, strict=True)))
        for n, (case, x, w) in enumerate(zip(CASES, xs, weights, strict=True)):
            y, ids, wts = (to_numpy(o) for o in outs[3 * n: 3 * n + 3])
            where = f"case {n} ({case}) T={t}"
            assert y.shape == (t, case.hidden), where
            assert ids.shape == wts.shape == (t, case.top_k), where
            if t == 0:
                continue
            ref, ref_ids, ref_w = moe_reference(x, *w, case.top_k, case.dtype)
            np.testing.assert_array_equal(ids, ref_ids, err_msg=where)
            np.testing.assert_allclose(wts, ref_w, rtol=1e-5, atol=1e-6, err_msg=where)
            assert np.isfinite(y).all(), f"{where}: non-finite output"
            err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
            assert err <= TOL, f"{where}: rel. Frobenius error {err:.3e} > {TOL}"


def test_moe_block_cpu() -> None:
    """Both blocks on the CPU, T in {0, 1, 7, 37}."""
    run("cpu")


@pytest.mark.gpu
def test_moe_block_gpu() -> None:
    """Both blocks on the GPU, T in {0, 1, 7, 37}."""
    run("gpu")


# ------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dtype": DType.float32}, TypeError, "dtype must be bfloat16 or float16"),
        ({"hidden_size": 100}, ValueError, "hidden_size must be a positive multiple of 8"),
        ({"intermediate_size": 12}, ValueError, "intermediate_size.*multiple of 8"),
        ({"num_experts": 0, "top_k": 1}, ValueError, "num_experts must be >= 1"),
        ({"top_k": 9}, ValueError, r"top_k must be in \[1, num_experts = 8\], got 9"),
        ({"top_k": 0}, ValueError, "top_k must be in"),
    ],
    ids=["dtype", "hidden", "intermediate", "experts", "top_k_big", "top_k_zero"],
)
def test_bad_configuration(kwargs: dict[str, object], error: type, match: str) -> None:
    args: dict[str, object] = {"hidden_size": 64, "intermediate_size": 32, "num_experts": 8,
                               "top_k": 2}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        MoEBlock(**args)  # type: ignore[arg-type]


_CPU = DeviceRef.CPU()


@pytest.mark.parametrize(
    ("x_type", "error", "match"),
    [
        (TensorType(DType.float16, ["t", 64], _CPU), TypeError, "x must have dtype"),
        (TensorType(DType.bfloat16, ["t", 72], _CPU), ValueError, r"x must be \[T, 64\]"),
        (TensorType(DType.bfloat16, [64], _CPU), ValueError, r"x must be \[T, 64\]"),
        (TensorType(DType.bfloat16, ["t", 64], DeviceRef.GPU()), ValueError, "x must be on cpu"),
    ],
    ids=["dtype", "hidden", "rank", "device"],
)
def test_bad_input(x_type: TensorType, error: type, match: str) -> None:
    block = MoEBlock(64, 32, 8, 2)
    with Graph("moe_bad_input", input_types=[x_type]) as g, pytest.raises(error, match=match):
        block(g.inputs[0].tensor)


def test_moe_state_shapes() -> None:
    block = MoEBlock(64, 32, 8, 2)
    good = case_weights(Case(64, 32, 8, 2, DType.bfloat16), seed=0)
    assert set(block.moe_state(*good)) == {"router_weight", "gate_up.weight", "down.weight"}
    with pytest.raises(ValueError, match="router must have shape"):
        block.moe_state(good[0][:, :8], *good[1:])
    with pytest.raises(ValueError, match="weights must have shape"):
        block.moe_state(good[0], good[1], good[2], good[3][:, :, :8])

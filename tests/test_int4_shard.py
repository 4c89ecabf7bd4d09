"""`Int4Linear` in MAX's sharding protocol: rowwise (split N) and columnwise (split K) shards.

One CPU graph holds the unsharded layers and their 2 shards each (both on the CPU device);
the shards' outputs recombined (concatenated for rowwise, summed for columnwise) must match
the float64 reference as the unsharded layer does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from max.driver import CPU
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, ShardingStrategy, TensorType, TensorValue, ops
from max.nn import Module

from mojo_gemm import Int4Linear, Int4Weight
from mojo_gemm.core.host import to_buffer, to_numpy

N_SHARDS = 2


class ShardedPair(Module):
    """A rowwise-sharded layer (act-order, asymmetric, bias) and a columnwise-sharded one."""

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


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def test_int4_shards_recombine_cpu() -> None:
    """Concat of rowwise shards and sum of columnwise shards equal the unsharded layers."""
    rng = np.random.default_rng(7)
    model = ShardedPair()
    state, refs = {}, {}
    for name, layer in (("col", model.col), ("row", model.row)):
        w_float = rng.standard_normal((layer.out_features, layer.in_features)).astype(np.float32)
        weight = Int4Weight.from_float(w_float, group_size=layer.group_size,
                                       symmetric=layer.symmetric)
        if layer.act_order:
            perm = rng.permutation(layer.in_features)
            # The same codes read in a permuted K order: a valid act-order weight.
            weight = dataclasses.replace(weight, perm=perm.astype(np.int64))
        bias = rng.standard_normal(layer.out_features).astype(np.float32)
        state.update({f"{name}.{k}": v for k, v in layer.int4_state(weight, bias).items()})
        refs[name] = (weight.dequantize().astype(np.float64), bias.astype(np.float64))
    model.load_state_dict(state)
    types = [TensorType(DType.bfloat16, ["m", layer.in_features], DeviceRef.CPU())
             for layer in (model.col, model.row)]
    compiled = model.compile(*types, session=InferenceSession(devices=[CPU()]))
    m = 5
    xs = [rng.standard_normal((m, layer.in_features)).astype(np.float32)
          for layer in (model.col, model.row)]
    outs = [to_numpy(o).astype(np.float64)
            for o in compiled.execute(*(to_buffer(x, DType.bfloat16) for x in xs))]
    for (name, x), (full, sharded) in zip((("col", xs[0]), ("row", xs[1])),
                                          ((outs[0], outs[1]), (outs[2], outs[3])), strict=True):
        w_ref, bias = refs[name]
        x64 = to_numpy(to_buffer(x, DType.bfloat16)).astype(np.float64)
        ref = x64 @ w_ref.T + bias
        assert _rel(full, ref) <= 1e-2, f"{name} unsharded: {_rel(full, ref):.3e}"
        assert _rel(sharded, ref) <= 1e-2, f"{name} shards: {_rel(sharded, ref):.3e}"


@pytest.mark.parametrize(
    ("kwargs", "strategy", "match"),
    [
        ({"in_features": 256, "out_features": 192}, ShardingStrategy.rowwise(2),
         "out_features / 2 to be a multiple of 64, got out_features = 192"),
        ({"in_features": 384, "out_features": 64}, ShardingStrategy.columnwise(2),
         "in_features / 2 to be a multiple of 128"),
        ({"in_features": 512, "out_features": 64, "act_order": True},
         ShardingStrategy.columnwise(2), "needs act_order=False"),
        ({"in_features": 256, "out_features": 128}, ShardingStrategy.replicate(2),
         "expected ShardingStrategy.rowwise or columnwise"),
    ],
)
def test_int4_shard_rejects(kwargs: dict[str, object], strategy: ShardingStrategy,
                            match: str) -> None:
    """Splits that break the packed layout, or act-order K splits, raise ValueError."""
    layer = Int4Linear(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=match):
        layer.sharding_strategy = strategy


def test_int4_shard_needs_strategy() -> None:
    """shard() without a strategy, or with the wrong device count, raises ValueError."""
    layer = Int4Linear(256, 128)
    with pytest.raises(ValueError, match="sharding_strategy must be set first"):
        layer.shard([DeviceRef.CPU()] * 2)
    layer.sharding_strategy = ShardingStrategy.rowwise(2)
    with pytest.raises(ValueError, match="devices must have 2 entries"):
        layer.shard([DeviceRef.CPU()])

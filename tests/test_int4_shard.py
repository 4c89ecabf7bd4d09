"""`Int4Linear` in MAX's sharding protocol: rowwise (split N) and columnwise (split K) shards.

test_int4_graph's CPU graph holds two layers and their 2 shards each (both on the CPU device,
its ShardedPair); the shards' outputs recombined (concatenated for rowwise, summed for
columnwise) must match the float64 reference as the unsharded layer does.
"""

from __future__ import annotations

import numpy as np
import pytest
from max.dtype import DType
from max.graph import DeviceRef, ShardingStrategy
from test_int4_graph import PAIR_K, case_inputs, compiled

from mojo_gemm import Int4Linear
from mojo_gemm.core.host import to_buffer, to_numpy


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def test_int4_shards_recombine_cpu() -> None:
    """Concat of rowwise shards and sum of columnwise shards equal the unsharded layers."""
    rng = np.random.default_rng(7)
    c = compiled("cpu")
    m = 5
    xs = tuple(rng.standard_normal((m, k)).astype(np.float32) for k in PAIR_K)
    inputs, _ = case_inputs(rng, m, c, pair_xs=xs)
    outs = [to_numpy(o).astype(np.float64) for o in c.model.execute(*inputs)[-4:]]
    for (name, x), (full, sharded) in zip((("col", xs[0]), ("row", xs[1])),
                                          ((outs[0], outs[1]), (outs[2], outs[3])), strict=True):
        w_ref, bias = c.pair_refs[name]
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

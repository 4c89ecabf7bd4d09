"""`MoEBlock` expert parallelism (MAX's `ShardingStrategy.expert_parallel`) on the CPU.

One graph holds the block and its 2 expert shards (both on the CPU device); the sum of the
shards' outputs must equal the unsharded block's output.
"""

from __future__ import annotations

import numpy as np
import pytest
from max.driver import CPU
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, ShardingStrategy, TensorType, TensorValue, ops
from max.nn import Module

from mojo_gemm import MoEBlock
from mojo_gemm.core.host import to_buffer, to_numpy

N_SHARDS = 2
HIDDEN, INTER, EXPERTS, TOP_K = 64, 32, 8, 3


class Sharded(Module):
    """The full block and the float32 sum of its expert shards' outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.moe = MoEBlock(HIDDEN, INTER, EXPERTS, TOP_K)
        self.moe.sharding_strategy = ShardingStrategy.expert_parallel(N_SHARDS)

    def __call__(self, x: TensorValue) -> tuple[TensorValue, TensorValue]:
        parts = [ops.cast(s(x), DType.float32)
                 for s in self.moe.shard([DeviceRef.CPU()] * N_SHARDS)]
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return self.moe(x), total


def test_moe_expert_shards_sum_cpu() -> None:
    """Σ over expert shards == the unsharded MoEBlock (bf16 tolerance)."""
    rng = np.random.default_rng(3)
    model = Sharded()
    model.load_state_dict({f"moe.{k}": v for k, v in model.moe.moe_state(
        rng.standard_normal((EXPERTS, HIDDEN)),
        rng.standard_normal((EXPERTS, INTER, HIDDEN)) * 0.2,
        rng.standard_normal((EXPERTS, INTER, HIDDEN)) * 0.2,
        rng.standard_normal((EXPERTS, HIDDEN, INTER)) * 0.2,
    ).items()})
    compiled = model.compile(TensorType(DType.bfloat16, ["t", HIDDEN], DeviceRef.CPU()),
                             session=InferenceSession(devices=[CPU()]))
    x = to_buffer(rng.standard_normal((9, HIDDEN)), DType.bfloat16)
    full, total = (to_numpy(o).astype(np.float64) for o in compiled.execute(x))
    err = np.linalg.norm(total - full) / np.linalg.norm(full)
    assert err <= 1e-2, f"rel. Frobenius error of the shard sum {err:.3e} > 1e-2"


def test_moe_shard_rejects() -> None:
    """Another strategy, or E not a multiple of n, raises ValueError."""
    block = MoEBlock(HIDDEN, INTER, EXPERTS, TOP_K)
    with pytest.raises(ValueError, match=r"expected ShardingStrategy\.expert_parallel"):
        block.sharding_strategy = ShardingStrategy.rowwise(2)
    with pytest.raises(ValueError, match="multiple of 3, got num_experts = 8"):
        block.sharding_strategy = ShardingStrategy.expert_parallel(3)
    with pytest.raises(ValueError, match="sharding_strategy must be set first"):
        block.shard([DeviceRef.CPU()] * 2)

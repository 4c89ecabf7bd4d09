"""`MoEBlock` expert and tensor parallelism (MAX's `ShardingStrategy.expert_parallel` and
`tensor_parallel`) on the CPU.

test_moe_block's CPU graph holds its bf16 block and that block's 2 expert shards, and a TP
block and its 2 tensor-parallel shards (all on the CPU device): each sum of shard outputs must
equal its unsharded block's output.
"""

from __future__ import annotations

import numpy as np
import pytest
from max.graph import DeviceRef, ShardingStrategy
from test_moe_block import CASES, compiled

from mojo_gemm import MoEBlock
from mojo_gemm.core.host import to_buffer, to_numpy
from mojo_gemm.models.reference import round_to

HIDDEN, INTER, EXPERTS, TOP_K = 64, 32, 8, 3


def test_moe_shards_sum_cpu() -> None:
    """Σ over expert shards and Σ over tensor-parallel shards == their unsharded MoEBlock
    (bf16 tolerance), T = 9."""
    model, dev, _ = compiled("cpu")
    rng = np.random.default_rng(3)
    xs = [round_to(rng.standard_normal((9, c.hidden)), c.dtype) for c in CASES]
    outs = model.execute(*(to_buffer(x, c.dtype).to(dev) for x, c in zip(xs, CASES, strict=True)))
    base = 3 * len(CASES)  # after every case's (y, ids, weights)
    for name, full_out, sum_out in (("expert", outs[0], outs[base]),
                                    ("tensor", outs[base + 1], outs[base + 2])):
        full, total = (to_numpy(o).astype(np.float64) for o in (full_out, sum_out))
        assert total.shape == full.shape, name
        assert np.abs(full).max() > 0, f"{name}: the unsharded block returned zeros"
        err = np.linalg.norm(total - full) / np.linalg.norm(full)
        assert err <= 1e-2, f"{name} shards: rel. Frobenius error of the sum {err:.3e} > 1e-2"


def test_moe_shard_rejects() -> None:
    """Another strategy, or E not a multiple of n, raises ValueError."""
    block = MoEBlock(HIDDEN, INTER, EXPERTS, TOP_K)
    with pytest.raises(ValueError, match=r"expected ShardingStrategy\.expert_parallel"):
        block.sharding_strategy = ShardingStrategy.rowwise(2)
    with pytest.raises(ValueError, match="multiple of 3, got num_experts = 8"):
        block.sharding_strategy = ShardingStrategy.expert_parallel(3)
    with pytest.raises(ValueError, match="sharding_strategy must be set first"):
        block.shard([DeviceRef.CPU()] * 2)
    with pytest.raises(ValueError, match="intermediate_size to be a multiple of 48, got 32"):
        block.sharding_strategy = ShardingStrategy.tensor_parallel(6)

"""`MoEBlock`: a mixture-of-experts SwiGLU FFN as a `max.nn` module on the grouped GEMM op.

Everything happens inside the graph, on the graph's device, with no host round trip:

1. router and grouping, one op (`moe_route`: two GPU kernels instead of ~15-20 graph ops):
   logits = x · Wrᵀ accumulated in float32 (float32 logits make exact ties, and so routing that
   depends on accumulation order, practically impossible), the top-k experts by decreasing
   logit (ties to the lower id), weights = softmax over the k selected logits (= softmax over
   all, renormalized on the top-k); the R = T·k assignments sorted by (expert, assignment),
   a_offsets, expert_ids = arange(E) (G = E groups, empty ones included: the op skips them),
   stats = [max count, E];
2. experts: rows x[token of each sorted assignment] go through `grouped_matmul` twice, gate/up
   with the SwiGLU epilogue, then down with row_scale = the assignment's router weight;
3. combine, one op (`moe_combine`: one kernel instead of a gather, two casts and a sum): each
   token's k rows, found through the inverse permutation (no atomics, a fixed summation order),
   summed in float32, then rounded to x's dtype.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, ShardingStrategy, TensorValue, Weight, ops
from max.nn import Module

from ..core.host import to_buffer
from ..core.rules import (
    ARRAY,
    DEVICE,
    DTYPE,
    INT,
    STRATEGY,
    TENSOR,
    check_types,
    optional,
)
from ..core.sharding import shard_devices
from ..router.combine import moe_combine
from ..router.op import MoERouting, moe_route
from .contract import GROUPED_DTYPES, SWIGLU_BLOCK
from .layer import GroupedLinear
from .op import grouped_matmul

HIDDEN_ALIGN = 8
"""hidden_size must be a multiple of this (the grouped op's column blocks)."""


class MoEBlock(Module):
    """Top-k routed SwiGLU experts: y[t] = Σ_j w[t, j] · down_e(silu(gate_e(x[t])) · up_e(x[t])).

    e = the j-th expert chosen for token t, w = softmax of the chosen router logits.
    Weights (names as in `state_dict()`): `router_weight` `dtype` [num_experts, hidden_size],
    `gate_up.weight` `dtype` [num_experts, 2 · intermediate_size, hidden_size] (gate and up
    interleaved, `interleave_gate_up`), `down.weight` `dtype` [num_experts, hidden_size,
    intermediate_size]. Fill them with `moe_state` / `load_moe`.
    Call: x `dtype` [T, hidden_size] (T may be symbolic) on `device` -> `dtype` [T, hidden_size].
    Raises TypeError (dtype) / ValueError (sizes) naming the argument for a bad configuration.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        *,
        dtype: DType = DType.bfloat16,
        device: DeviceRef | None = None,
    ) -> None:
        super().__init__()
        check_types(
            "MoEBlock",
            {"hidden_size": hidden_size, "intermediate_size": intermediate_size,
             "num_experts": num_experts, "top_k": top_k, "dtype": dtype, "device": device},
            {"hidden_size": INT, "intermediate_size": INT, "num_experts": INT, "top_k": INT,
             "dtype": DTYPE, "device": optional(DEVICE)},
        )
        if dtype not in GROUPED_DTYPES:
            raise TypeError(f"MoEBlock: dtype must be bfloat16 or float16, got {dtype}")
        if hidden_size < 1 or hidden_size % HIDDEN_ALIGN:
            raise ValueError(f"MoEBlock: hidden_size must be a positive multiple of "
                             f"{HIDDEN_ALIGN}, got {hidden_size}")
        if intermediate_size < 1 or intermediate_size % SWIGLU_BLOCK:
            raise ValueError(f"MoEBlock: intermediate_size must be a positive multiple of "
                             f"{SWIGLU_BLOCK}, got {intermediate_size}")
        if num_experts < 1:
            raise ValueError(f"MoEBlock: num_experts must be >= 1, got {num_experts}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"MoEBlock: top_k must be in [1, num_experts = {num_experts}], "
                             f"got {top_k}")
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_experts, self.top_k, self.dtype = num_experts, top_k, dtype
        self.device = device if device is not None else DeviceRef.CPU()
        self.router_weight = Weight("router_weight", dtype, [num_experts, hidden_size],
                                    self.device)
        self.gate_up = GroupedLinear(num_experts, hidden_size, intermediate_size, swiglu=True,
                                     dtype=dtype, device=self.device)
        self.down = GroupedLinear(num_experts, intermediate_size, hidden_size, dtype=dtype,
                                  device=self.device)
        self._sharding_strategy: ShardingStrategy | None = None
        # First global expert id this block's experts hold (0 unless it is an expert shard).
        self._expert_offset = 0

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """`ShardingStrategy.expert_parallel(n)` (as MAX's MoE): each shard holds E/n experts;
        or `ShardingStrategy.tensor_parallel(n)`: each shard holds every expert's slice of
        intermediate features (gate/up column parallel, down row parallel)."""
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        """Sets expert or tensor parallelism; ValueError for another strategy, or E (expert
        parallel) / intermediate_size over 8 (tensor parallel) not a multiple of n.

        The router weight is replicated (every shard computes the global top-k); gate/up and
        down weights are split along the expert axis (expert parallel) or along the
        intermediate features (tensor parallel, `GroupedLinear.sharding_strategy`).
        """
        check_types(
            "MoEBlock.sharding_strategy",
            {"strategy": strategy},
            {"strategy": STRATEGY},
        )
        n = strategy.num_devices
        if strategy.is_tensor_parallel:
            if self.intermediate_size % (SWIGLU_BLOCK * n):
                raise ValueError(
                    f"MoEBlock.sharding_strategy: tensor_parallel({n}) needs intermediate_size "
                    f"to be a multiple of {SWIGLU_BLOCK * n}, got {self.intermediate_size}")
            self.router_weight.sharding_strategy = ShardingStrategy.replicate(n)
            self.gate_up.sharding_strategy = ShardingStrategy.axiswise(1, n)
            self.down.sharding_strategy = ShardingStrategy.axiswise(2, n)
            self._sharding_strategy = strategy
            return
        if not strategy.is_expert_parallel:
            raise ValueError(
                "MoEBlock.sharding_strategy: expected ShardingStrategy.expert_parallel or "
                f"tensor_parallel, got {strategy}"
            )
        if self.num_experts % n:
            raise ValueError(
                f"MoEBlock.sharding_strategy: expert_parallel({n}) needs num_experts to be a "
                f"multiple of {n}, got num_experts = {self.num_experts}"
            )
        self.router_weight.sharding_strategy = ShardingStrategy.replicate(n)
        self.gate_up.weight.sharding_strategy = ShardingStrategy.rowwise(n)
        self.down.weight.sharding_strategy = ShardingStrategy.rowwise(n)
        self._sharding_strategy = strategy

    def shard(self, devices: Iterable[DeviceRef]) -> list[MoEBlock]:
        """One `MoEBlock` per device. Expert parallel: shard i holds experts [i E/n, (i+1) E/n)
        (tensor parallel: see `_tensor_shards`; its partial outputs sum the same way).

        Each shard maps x `dtype` [T, hidden] -> a partial `dtype` [T, hidden]: the global
        top-k routing, with the assignments to experts held elsewhere as zero rows (the
        grouped op's expert id -1), so the sum of the shards' outputs (e.g. `max.nn`
        allreduce) is the block's output. The weights are views of this block's weights
        (load the full block's state). ValueError when no strategy is set or
        len(devices) differs from its count.
        """
        devices = shard_devices("MoEBlock", self._sharding_strategy, devices)
        if self._sharding_strategy is not None and self._sharding_strategy.is_tensor_parallel:
            return self._tensor_shards(devices)
        local = self.num_experts // len(devices)
        routers = self.router_weight.shard(devices)
        gate_ups = self.gate_up.weight.shard(devices)
        downs = self.down.weight.shard(devices)
        shards = []
        for i, device in enumerate(devices):
            block = MoEBlock(self.hidden_size, self.intermediate_size, self.num_experts,
                             self.top_k, dtype=self.dtype, device=device)
            block.router_weight = routers[i]
            block.gate_up = GroupedLinear(local, self.hidden_size, self.intermediate_size,
                                          swiglu=True, dtype=self.dtype, device=device)
            block.gate_up.weight = gate_ups[i]
            block.down = GroupedLinear(local, self.intermediate_size, self.hidden_size,
                                       dtype=self.dtype, device=device)
            block.down.weight = downs[i]
            block._expert_offset = i * local
            shards.append(block)
        return shards

    def _tensor_shards(self, devices: list[DeviceRef]) -> list[MoEBlock]:
        """Tensor-parallel shards: shard i is an MoEBlock of intermediate_size / n over every
        expert (the global routing, intermediate features [i I/n, (i+1) I/n)), whose output is
        a partial sum of the block's."""
        routers = self.router_weight.shard(devices)
        gate_ups = self.gate_up.shard(devices)
        downs = self.down.shard(devices)
        shards = []
        for i, device in enumerate(devices):
            block = MoEBlock(self.hidden_size, self.intermediate_size // len(devices),
                             self.num_experts, self.top_k, dtype=self.dtype, device=device)
            block.router_weight = routers[i]
            block.gate_up = gate_ups[i]
            block.down = downs[i]
            shards.append(block)
        return shards

    def _check_input(self, x: TensorValue) -> None:
        check_types("MoEBlock", {"x": x}, {"x": TENSOR})
        if x.dtype != self.dtype:
            raise TypeError(f"MoEBlock: x must have dtype {self.dtype}, got {x.dtype}")
        if x.rank != 2 or x.shape[1] != self.hidden_size:
            raise ValueError(f"MoEBlock: x must be [T, {self.hidden_size}], got "
                             f"{list(x.shape)}")
        if x.device != self.device:
            raise ValueError(f"MoEBlock: x must be on {self.device}, got {x.device}")

    def _routing(self, x: TensorValue) -> MoERouting:
        """The full routing of x `dtype` [T, hidden] (`MoERouting`: top-k ids and weights, the
        rows sorted by expert and `grouped_matmul`'s routing operands)."""
        self._check_input(x)
        return moe_route(x, TensorValue(self.router_weight), self.top_k)

    def route(self, x: TensorValue) -> tuple[TensorValue, TensorValue]:
        """Router of x `dtype` [T, hidden]: (expert ids int32 [T, k], weights float32 [T, k]).

        The ids are in decreasing logit order (ties to the lower id); the weights are a
        softmax over the k logits.
        """
        r = self._routing(x)
        return r.topk_ids, r.topk_weights

    def __call__(self, x: TensorValue) -> TensorValue:
        """x `dtype` [T, hidden_size] -> `dtype` [T, hidden_size] (see the class docstring)."""
        r = self._routing(x)
        k = self.top_k
        rows = ops.gather(x, r.token_index, axis=0)  # [R, hidden], sorted by expert
        a_offsets, expert_ids, stats = r.grouped_operands
        local = int(self.gate_up.weight.shape[0])
        if local != self.num_experts:
            # An expert shard: global ids it does not hold become -1 (zero rows).
            local_ids = expert_ids - self._expert_offset
            owned = (local_ids >= 0) & (local_ids < local)
            expert_ids = ops.where(owned, local_ids, ops.constant(-1, DType.int32, x.device))
        route = (a_offsets, expert_ids, stats)
        act = grouped_matmul(rows, TensorValue(self.gate_up.weight), *route, swiglu=True)
        # gate_up read the same routing: down may read it, and stream its first weights, early
        y = grouped_matmul(act, TensorValue(self.down.weight), *route, row_scale=r.row_scale,
                           routing_settled=True)
        return moe_combine(y, r.inverse, k)

    def moe_state(
        self, router: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray
    ) -> dict[str, Buffer]:
        """The host buffers of the block's weights (local names) from float arrays.

        router [E, hidden]; gate, up [E, intermediate, hidden]; down [E, hidden, intermediate].
        Values are rounded to the block's dtype. Raises ValueError on a shape mismatch,
        TypeError naming the argument for a value that is not an array.
        """
        check_types("MoEBlock.moe_state",
                    {"router": router, "gate": gate, "up": up, "down": down},
                    {"router": ARRAY, "gate": ARRAY, "up": ARRAY, "down": ARRAY})
        e, h = self.num_experts, self.hidden_size
        if np.shape(router) != (e, h):
            raise ValueError(f"MoEBlock: router must have shape {(e, h)}, got "
                             f"{np.shape(router)}")
        state = {"router_weight": to_buffer(router, self.dtype)}
        state.update({f"gate_up.{n}": b for n, b in
                      self.gate_up.expert_state(gate=gate, up=up).items()})
        state.update({f"down.{n}": b for n, b in self.down.expert_state(down).items()})
        return state

    def load_moe(
        self, router: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray
    ) -> None:
        """Loads the block's weights (see `moe_state`); for a nested block load the model."""
        self.load_state_dict(self.moe_state(router, gate, up, down))

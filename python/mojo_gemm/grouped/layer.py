"""`GroupedLinear`: a `max.nn` layer holding an MoE expert bank, run by `grouped_matmul`."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from max.driver import Buffer
from max.dtype import DType
from max.graph import BufferValue, DeviceRef, ShardingStrategy, TensorValue, Weight
from max.nn import Module

from ..core.host import to_buffer
from ..core.rules import (
    ARRAY,
    BOOL,
    BUFFER,
    DEVICE,
    DTYPE,
    INT,
    STRATEGY,
    TENSOR,
    check_types,
    optional,
)
from ..core.sharding import shard_devices
from .contract import GROUPED_DTYPES, SWIGLU_BLOCK
from .op import grouped_matmul
from .routing import interleave_gate_up


class GroupedLinear(Module):
    """The experts of an MoE layer: y[r] = x[r] · W[expert of r's group]ᵀ, one GEMM for all.

    Weight (name as in `state_dict()`): `weight` `dtype` [num_experts, N, in_features] with
    N = out_features, or 2 · out_features with swiglu (gate and up interleaved in blocks of 8,
    `interleave_gate_up`; the layer then returns silu(gate) · up, [.., out_features]).
    Call it with the grouped layout (`group_tokens_by_expert`): x `dtype` [T, in_features]
    sorted by group, a_offsets uint32 [G + 1], expert_ids int32 [G], expert_usage_stats
    uint32 [2], and optionally row_scale float32 [T] (router weights, applied in fp32 before
    rounding). All on `device` (CPU by default).
    """

    def __init__(
        self,
        num_experts: int,
        in_features: int,
        out_features: int,
        *,
        swiglu: bool = False,
        dtype: DType = DType.bfloat16,
        device: DeviceRef | None = None,
    ) -> None:
        super().__init__()
        check_types(
            "GroupedLinear",
            {"num_experts": num_experts, "in_features": in_features,
             "out_features": out_features, "swiglu": swiglu, "dtype": dtype, "device": device},
            {"num_experts": INT, "in_features": INT, "out_features": INT, "swiglu": BOOL,
             "dtype": DTYPE, "device": optional(DEVICE)},
        )
        if dtype not in GROUPED_DTYPES:
            raise TypeError(f"GroupedLinear: dtype must be bfloat16 or float16, got {dtype}")
        for name, value in (("num_experts", num_experts), ("in_features", in_features),
                            ("out_features", out_features)):
            if value < 1:
                raise ValueError(f"GroupedLinear: {name} must be >= 1, got {value}")
        if swiglu and out_features % SWIGLU_BLOCK:
            raise ValueError(
                f"GroupedLinear: with swiglu, out_features must be a multiple of "
                f"{SWIGLU_BLOCK}, got {out_features}"
            )
        self.num_experts, self.in_features, self.out_features = (
            num_experts, in_features, out_features)
        self.swiglu, self.dtype = swiglu, dtype
        device = device if device is not None else DeviceRef.CPU()
        n = 2 * out_features if swiglu else out_features
        self.weight = Weight("weight", dtype, [num_experts, n, in_features], device)
        self._sharding_strategy: ShardingStrategy | None = None

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """Tensor parallelism inside every expert: `ShardingStrategy.axiswise(1, n)` splits
        the output features (column parallel: shard i computes features [i F/n, (i+1) F/n) of
        every expert; with swiglu the gate/up pairs stay together), `axiswise(2, n)` the input
        features (row parallel: shard i takes x[:, i K/n : (i+1) K/n] and returns a partial
        sum; not with swiglu)."""
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        """Sets tensor parallelism; ValueError for another strategy or sizes n does not split
        (column parallel: out_features a multiple of n, and of 8 n with swiglu; row parallel:
        in_features a multiple of n)."""
        check_types(
            "GroupedLinear.sharding_strategy",
            {"strategy": strategy},
            {"strategy": STRATEGY},
        )
        n = strategy.num_devices
        axis = self._tp_axis(strategy)
        if axis == 1:
            unit = n * (SWIGLU_BLOCK if self.swiglu else 1)
            if self.out_features % unit:
                raise ValueError(
                    f"GroupedLinear.sharding_strategy: axiswise(1, {n}) needs out_features to "
                    f"be a multiple of {unit}, got {self.out_features}")
        else:
            if self.swiglu:
                raise ValueError(
                    "GroupedLinear.sharding_strategy: axiswise(2, n) (row parallel) sums partial "
                    "products, which silu(gate) * up does not allow: expected a layer without "
                    "swiglu, got swiglu=True")
            if self.in_features % n:
                raise ValueError(
                    f"GroupedLinear.sharding_strategy: axiswise(2, {n}) needs in_features to "
                    f"be a multiple of {n}, got {self.in_features}")
        self.weight.sharding_strategy = ShardingStrategy.axiswise(axis, n)
        self._sharding_strategy = strategy
        self._tp = axis

    @staticmethod
    def _tp_axis(strategy: ShardingStrategy) -> int:
        if strategy.is_axiswise and strategy.sharded_axis in (1, 2):
            return int(strategy.sharded_axis)
        raise ValueError(
            "GroupedLinear.sharding_strategy: expected ShardingStrategy.axiswise(1, n) "
            f"(column parallel) or axiswise(2, n) (row parallel), got {strategy}")

    def shard(self, devices: Iterable[DeviceRef]) -> list[GroupedLinear]:
        """One `GroupedLinear` per device holding its slice of every expert (weights are
        views of this layer's: load the full layer's state). Column parallel: shard i maps x
        [T, in_features] -> features [i F/n, (i+1) F/n) of the output (concatenated, the
        full output). Row parallel: shard i maps x[:, i K/n : (i+1) K/n] -> a partial
        [T, out_features] (summed, e.g. by `max.nn` allreduce, the full output). ValueError
        when no strategy is set or len(devices) differs from its count."""
        devices = shard_devices("GroupedLinear", self._sharding_strategy, devices)
        n = len(devices)
        weights = self.weight.shard(devices)
        out_f, in_f = self.out_features, self.in_features
        if self._tp == 1:
            out_f //= n
        else:
            in_f //= n
        shards = []
        for i, device in enumerate(devices):
            layer = GroupedLinear(self.num_experts, in_f, out_f, swiglu=self.swiglu,
                                  dtype=self.dtype, device=device)
            layer.weight = weights[i]
            shards.append(layer)
        return shards

    def __call__(
        self,
        x: TensorValue,
        a_offsets: TensorValue,
        expert_ids: TensorValue,
        expert_usage_stats: TensorValue,
        row_scale: TensorValue | None = None,
        out: BufferValue | None = None,
    ) -> TensorValue | None:
        """x [T, in_features] (grouped) -> [T, out_features]; see `grouped_matmul`."""
        check_types(
            "GroupedLinear.__call__",
            {"x": x, "a_offsets": a_offsets, "expert_ids": expert_ids,
             "expert_usage_stats": expert_usage_stats, "row_scale": row_scale, "out": out},
            {"x": TENSOR, "a_offsets": TENSOR, "expert_ids": TENSOR,
             "expert_usage_stats": TENSOR, "row_scale": optional(TENSOR),
             "out": optional(BUFFER)},
        )
        return grouped_matmul(
            x, TensorValue(self.weight), a_offsets, expert_ids, expert_usage_stats,
            swiglu=self.swiglu, row_scale=row_scale, out=out,
        )

    def expert_state(
        self, weights: np.ndarray | None = None, *, gate: np.ndarray | None = None,
        up: np.ndarray | None = None,
    ) -> dict[str, Buffer]:
        """The host buffers of the layer's weight (local names), from float arrays.

        Either `weights` [num_experts, N, in_features] (the bank as stored, N as above) or,
        for a swiglu layer, `gate` and `up` [num_experts, out_features, in_features].
        Values are rounded to the layer's dtype. Raises ValueError on a shape mismatch,
        TypeError naming the argument for a value that is not an array.
        """
        check_types(
            "GroupedLinear.expert_state",
            {"weights": weights, "gate": gate, "up": up},
            {"weights": optional(ARRAY), "gate": optional(ARRAY), "up": optional(ARRAY)},
        )
        if (weights is None) == (gate is None and up is None):
            raise ValueError("GroupedLinear: give either weights or gate and up")
        if weights is None:
            if not self.swiglu or gate is None or up is None:
                raise ValueError("GroupedLinear: gate/up need a swiglu layer and both arrays")
            weights = interleave_gate_up(gate, up)
        expected = tuple(int(d) for d in self.weight.shape)
        if np.shape(weights) != expected:
            raise ValueError(f"GroupedLinear: weights must have shape {expected}, got "
                             f"{np.shape(weights)}")
        return {"weight": to_buffer(weights, self.dtype)}

    def load_experts(
        self, weights: np.ndarray | None = None, *, gate: np.ndarray | None = None,
        up: np.ndarray | None = None,
    ) -> None:
        """Loads the expert bank (see `expert_state`) into the layer."""
        self.load_state_dict(self.expert_state(weights, gate=gate, up=up))

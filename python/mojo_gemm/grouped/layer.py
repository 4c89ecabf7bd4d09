"""`GroupedLinear`: a `max.nn` layer holding an MoE expert bank, run by `grouped_matmul`."""

from __future__ import annotations

import numpy as np
from max.driver import Buffer
from max.dtype import DType
from max.graph import BufferValue, DeviceRef, TensorValue, Weight
from max.nn import Module

from ..core.host import to_buffer
from ..core.rules import (
    ARRAY,
    BOOL,
    BUFFER,
    DEVICE,
    DTYPE,
    INT,
    TENSOR,
    check_types,
    optional,
)
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

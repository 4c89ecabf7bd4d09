"""`Fp8Linear`: a `max.nn` layer with a block-scaled FP8 weight (DeepSeek-V3-style checkpoints).

x [..., in_features] → `quantize_fp8_rows` (e4m3 per token per `block` columns, on the graph)
→ `fp8_blockwise_matmul` (e4m3 weight with block × block scales, fp32 accumulation promoted per
block, bf16 out) → x's dtype [..., out_features]. On CPU the e4m3 weight is uint8 bit patterns
(MAX 26.7 CPU graphs cannot hold float8), on GPU float8_e4m3fn; `fp8_state` / `state_from_float`
build the matching state dict.
"""

from __future__ import annotations

import operator
from functools import reduce

import numpy as np
from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn import Module

from ..core.rules import ARRAY, check_types, instance_of
from .contract import FP8, FP8_BITS, FP8_LINEAR, FP8_LINEAR_CALL
from .matmul import fp8_blockwise_matmul
from .op import quantize_fp8_rows
from .quant import Fp8Blockwise, quantize_fp8_blockwise


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class Fp8Linear(Module):
    """y = x · Wᵀ with W block-scaled e4m3 [out_features, in_features]."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        dtype: DType = DType.bfloat16,
        device: DeviceRef | None = None,
        block: int = 128,
    ) -> None:
        """in_features / out_features: the weight's columns / rows; dtype: x's and y's dtype
        (bfloat16, float16, float32); device: where x and the weights live (CPU by default);
        block: the scale block (activations per token x block columns, weights block x block).

        Weights (load_state_dict names): weight e4m3 [out_features, in_features] (uint8 bits on
        CPU), weight_scale float32 [ceil(out/block), ceil(in/block)] (a checkpoint's
        weight_scale_inv). Raises TypeError / ValueError naming the argument
        (`contracts.FP8_LINEAR`).
        """
        super().__init__()
        device = DeviceRef.CPU() if device is None else device
        FP8_LINEAR.validate({"in_features": in_features, "out_features": out_features,
                             "dtype": dtype, "device": device, "block": block})
        self.in_features, self.out_features = in_features, out_features
        self.dtype, self.device, self.block = dtype, device, block
        fp8 = FP8_BITS if device.is_cpu() else FP8
        self.weight = Weight("weight", fp8, [out_features, in_features], device)
        self.weight_scale = Weight(
            "weight_scale", DType.float32,
            [_ceil(out_features, block), _ceil(in_features, block)], device)

    def __call__(self, x: TensorValue) -> TensorValue:
        """x `dtype` [..., in_features] (leading dims may be symbolic) -> `dtype`
        [..., out_features]: x quantized per token per `block` columns, the block-scaled
        product summed in fp32, rounded to bf16 (then to `dtype`). Raises TypeError /
        ValueError naming x (`contracts.FP8_LINEAR_CALL`)."""
        FP8_LINEAR_CALL.validate({"x": x, "dtype": self.dtype, "device": self.device,
                                  "in_features": self.in_features})
        lead = list(x.shape[:-1])
        # the row count as the product of the leading dims, not -1: a zero-size batch (a
        # symbolic dim of 0) leaves -1 undetermined
        flat = x.rank != 2
        rows = ops.reshape(x, [reduce(operator.mul, lead, 1), self.in_features]) if flat else x
        data, scales = quantize_fp8_rows(rows, self.block)
        y = fp8_blockwise_matmul(data, scales, TensorValue(self.weight),
                                 TensorValue(self.weight_scale), (1, self.block, self.block))
        if self.dtype != DType.bfloat16:
            y = ops.cast(y, self.dtype)
        return ops.reshape(y, [*lead, self.out_features]) if flat else y

    def fp8_state(self, weight: Fp8Blockwise) -> dict[str, Buffer]:
        """The host buffers of this layer's weights (local names) from a block-quantized weight
        [out_features, in_features] with block (block, block) (e.g. a DeepSeek-style checkpoint
        via `quantize_fp8_blockwise(w, weight_scale_inv=...)`). Raises ValueError on a shape or
        block mismatch, TypeError when it is not an `Fp8Blockwise`."""
        check_types("Fp8Linear.fp8_state", {"weight": weight},
                    {"weight": instance_of("an Fp8Blockwise", Fp8Blockwise)})
        want = ((self.out_features, self.in_features), (self.block, self.block))
        got = (tuple(weight.data.shape), tuple(weight.block))
        if got != want:
            raise ValueError(f"Fp8Linear: weight (shape, block) must be {want}, got {got}")
        bits = Buffer.from_numpy(np.ascontiguousarray(weight.bits))
        return {"weight": bits if self.device.is_cpu() else bits.view(FP8),
                "weight_scale": Buffer.from_numpy(np.ascontiguousarray(weight.scales))}

    def state_from_float(self, weight: np.ndarray) -> dict[str, Buffer]:
        """`fp8_state` of a float weight [out_features, in_features] quantized blockwise
        (`quantize_fp8_blockwise`, block x block). Raises ValueError when its shape differs,
        TypeError when it is not an array."""
        check_types("Fp8Linear.state_from_float", {"weight": weight}, {"weight": ARRAY})
        if np.shape(weight) != (self.out_features, self.in_features):
            raise ValueError(
                f"Fp8Linear: weight must have shape [out_features, in_features] = "
                f"{[self.out_features, self.in_features]}, got {list(np.shape(weight))}")
        return self.fp8_state(quantize_fp8_blockwise(weight, (self.block, self.block)))

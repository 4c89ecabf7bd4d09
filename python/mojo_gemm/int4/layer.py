"""`Int4Linear`: a `max.nn` layer holding a packed int4 weight (W4A16), run by `int4_matmul`."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, ShardingStrategy, TensorValue, Weight
from max.nn import Module

from ..core.host import to_buffer
from ..core.rules import (
    ARRAY,
    BOOL,
    DEVICE,
    DTYPE,
    INT,
    STRATEGY,
    TENSOR,
    check_types,
    instance_of,
    optional,
)
from ..core.sharding import shard_devices
from .contract import INT4_ACTIVATION_DTYPES, INT4_GROUP_SIZES, int4_num_groups, int4_padded
from .layout import K_ALIGN, N_TILE, PACK_FACTOR
from .op import Int4WeightValues, int4_matmul
from .quant import Int4Weight


class Int4Linear(Module):
    """A linear layer with int4 GPTQ/AWQ-style weights: y = x · dequant(W)ᵀ (+ bias).

    x: `dtype` [..., in_features] -> `dtype` [..., out_features]. Weights (names as in
    `state_dict()`): qweight uint32 [Np/64, Kp*8], scales `dtype` [groups, Np], zeros (when
    not symmetric), perm int64 [in_features] (when act_order), bias `dtype` [out_features]
    (when has_bias). Fill them with `load_int4`. device: where the weights live (CPU
    by default).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        group_size: int = 128,
        symmetric: bool = True,
        act_order: bool = False,
        has_bias: bool = False,
        dtype: DType = DType.bfloat16,
        device: DeviceRef | None = None,
    ) -> None:
        super().__init__()
        check_types(
            "Int4Linear",
            {"in_features": in_features, "out_features": out_features, "group_size": group_size,
             "symmetric": symmetric, "act_order": act_order, "has_bias": has_bias,
             "dtype": dtype, "device": device},
            {"in_features": INT, "out_features": INT, "group_size": INT, "symmetric": BOOL,
             "act_order": BOOL, "has_bias": BOOL, "dtype": DTYPE, "device": optional(DEVICE)},
        )
        if dtype not in INT4_ACTIVATION_DTYPES:
            raise TypeError(f"Int4Linear: dtype must be bfloat16 or float16, got {dtype}")
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(
                f"Int4Linear: group_size must be one of {INT4_GROUP_SIZES}, got {group_size}"
            )
        if group_size != -1 and in_features % group_size:
            raise ValueError(
                f"Int4Linear: in_features must be a multiple of group_size {group_size}, "
                f"got {in_features}"
            )
        if out_features <= 0 or out_features % 8:
            raise ValueError(
                f"Int4Linear: out_features must be a positive multiple of 8, got {out_features}"
            )
        self.in_features, self.out_features = in_features, out_features
        self.group_size, self.symmetric, self.act_order = group_size, symmetric, act_order
        self.dtype = dtype
        device = device if device is not None else DeviceRef.CPU()
        n_p, k_p = int4_padded(out_features, in_features)
        params_shape = [int4_num_groups(in_features, group_size), n_p]
        self.qweight = Weight("qweight", DType.uint32, [n_p // N_TILE, k_p * PACK_FACTOR], device)
        self.scales = Weight("scales", dtype, params_shape, device)
        self.zeros = None if symmetric else Weight("zeros", dtype, params_shape, device)
        self.perm = Weight("perm", DType.int64, [in_features], device) if act_order else None
        self.bias = Weight("bias", dtype, [out_features], device) if has_bias else None
        self._sharding_strategy: ShardingStrategy | None = None

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """How `shard` splits this layer, with MAX `Linear`'s meaning of the strategies.

        `ShardingStrategy.rowwise(n)` splits the rows of the logical weight W [N, K], i.e. the
        output features (column parallel: each shard computes N/n output columns from the
        full x; concatenate the outputs). `ShardingStrategy.columnwise(n)` splits K (row
        parallel: each shard takes x[..., K/n slice] and yields a partial sum; sum the
        outputs, e.g. with `max.nn` allreduce; only shard 0 keeps the bias).
        """
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        """Sets the strategy on every weight; ValueError when the sizes do not split cleanly.

        rowwise(n): out_features / n must be a multiple of 64 (a packed band of qweight and
        of the scales' 8 x 8 transposed blocks). columnwise(n): in_features / n must be a
        multiple of 128 (the packed K alignment) and of group_size, and the layer must not
        use act-order: packed position j reads input feature perm[j], anywhere in K, so a
        shard fed the contiguous slice x[..., K/n] cannot serve a perm slice in general.
        """
        check_types(
            "Int4Linear.sharding_strategy",
            {"strategy": strategy},
            {"strategy": STRATEGY},
        )
        n = strategy.num_devices
        replicate = ShardingStrategy.replicate(n)
        if strategy.is_rowwise:
            if self.out_features % (N_TILE * n):
                raise ValueError(
                    f"Int4Linear.sharding_strategy: rowwise({n}) needs out_features / {n} to "
                    f"be a multiple of {N_TILE}, got out_features = {self.out_features}"
                )
            params = ShardingStrategy.columnwise(n)
            self.qweight.sharding_strategy = ShardingStrategy.rowwise(n)
            if self.bias is not None:
                self.bias.sharding_strategy = ShardingStrategy.rowwise(n)
            if self.perm is not None:
                self.perm.sharding_strategy = replicate
        elif strategy.is_colwise:
            if self.act_order:
                raise ValueError(
                    f"Int4Linear.sharding_strategy: columnwise({n}) needs act_order=False "
                    "(packed K positions read input features perm[j] from all of K, so no "
                    "contiguous split of x feeds a shard), got act_order=True"
                )
            quantum = K_ALIGN if self.group_size == -1 else max(K_ALIGN, self.group_size)
            if self.in_features % (quantum * n):
                raise ValueError(
                    f"Int4Linear.sharding_strategy: columnwise({n}) needs in_features / {n} "
                    f"to be a multiple of {quantum} (K alignment {K_ALIGN}, group_size "
                    f"{self.group_size}), got in_features = {self.in_features}"
                )
            # Per-channel scales (one group over all of K) are the same for every K slice.
            params = replicate if self.group_size == -1 else ShardingStrategy.rowwise(n)
            self.qweight.sharding_strategy = ShardingStrategy.columnwise(n)
            if self.bias is not None:
                self.bias.sharding_strategy = replicate
        else:
            raise ValueError(
                "Int4Linear.sharding_strategy: expected ShardingStrategy.rowwise or "
                f"columnwise, got {strategy}"
            )
        self.scales.sharding_strategy = params
        if self.zeros is not None:
            self.zeros.sharding_strategy = params
        self._sharding_strategy = strategy

    def shard(self, devices: Iterable[DeviceRef]) -> list[Int4Linear]:
        """One `Int4Linear` per device holding its part of this layer's weights.

        The shards' weights are views of this layer's weights (MAX weight sharding: the full
        weights stay the graph's weights, under this layer's names; each shard slices and
        moves its part), so load the full layer's state as usual. rowwise: shard i maps
        x [..., K] -> [..., N/n] (output columns [i N/n, (i+1) N/n)); columnwise: shard i
        maps x[..., i K/n : (i+1) K/n] -> a partial [..., N], the bias on shard 0 only.
        Raises ValueError when no strategy is set or len(devices) differs from its count.
        """
        strategy = self._sharding_strategy
        devices = shard_devices("Int4Linear", strategy, devices)
        n = strategy.num_devices
        split_n = strategy.is_rowwise
        shard_weights = {
            name: w.shard(devices)
            for name, w in (("qweight", self.qweight), ("scales", self.scales),
                            ("zeros", self.zeros), ("perm", self.perm), ("bias", self.bias))
            if w is not None
        }
        shards = []
        for i, device in enumerate(devices):
            layer = Int4Linear(
                self.in_features if split_n else self.in_features // n,
                self.out_features // n if split_n else self.out_features,
                group_size=self.group_size,
                symmetric=self.symmetric,
                act_order=self.act_order,
                has_bias=self.bias is not None and (split_n or i == 0),
                dtype=self.dtype,
                device=device,
            )
            for name, parts in shard_weights.items():
                if name != "bias" or layer.bias is not None:
                    setattr(layer, name, parts[i])
            shards.append(layer)
        return shards

    def __call__(self, x: TensorValue) -> TensorValue:
        """x: `dtype` [..., in_features] -> `dtype` [..., out_features]."""
        check_types("Int4Linear.__call__", {"x": x}, {"x": TENSOR})
        values = Int4WeightValues(
            qweight=TensorValue(self.qweight),
            scales=TensorValue(self.scales),
            zeros=None if self.zeros is None else TensorValue(self.zeros),
            perm=None if self.perm is None else TensorValue(self.perm),
            n=self.out_features,
            k=self.in_features,
            group_size=self.group_size,
        )
        return int4_matmul(x, values, None if self.bias is None else TensorValue(self.bias))

    def int4_state(self, weight: Int4Weight, bias: np.ndarray | None = None) -> dict[str, Buffer]:
        """The host buffers of this layer's weights (local names) from a packed `Int4Weight`.

        bias: float array [out_features], required exactly when the layer has a bias.
        Raises ValueError when `weight` does not match the layer's configuration, TypeError
        naming the argument for a value of the wrong Python type.
        """
        check_types(
            "Int4Linear.int4_state",
            {"weight": weight, "bias": bias},
            {"weight": instance_of("an Int4Weight", Int4Weight), "bias": optional(ARRAY)},
        )
        expected = (self.out_features, self.in_features, self.group_size, self.symmetric,
                    self.act_order)
        got = (weight.n, weight.k, weight.group_size, weight.symmetric, weight.perm is not None)
        if got != expected:
            raise ValueError(
                "Int4Linear: weight (out_features, in_features, group_size, symmetric, "
                f"act_order) must be {expected}, got {got}"
            )
        if (bias is None) != (self.bias is None):
            raise ValueError(
                f"Int4Linear: bias must be {'given' if self.bias is not None else 'None'} "
                f"for this layer (has_bias={self.bias is not None})"
            )
        state = {
            "qweight": Buffer.from_numpy(np.ascontiguousarray(weight.qweight)),
            "scales": to_buffer(weight.scales, self.dtype),
        }
        if weight.zeros is not None:
            state["zeros"] = to_buffer(weight.zeros, self.dtype)
        if weight.perm is not None:
            state["perm"] = Buffer.from_numpy(np.ascontiguousarray(weight.perm, np.int64))
        if bias is not None:
            if np.shape(bias) != (self.out_features,):
                raise ValueError(
                    f"Int4Linear: bias shape must be ({self.out_features},), "
                    f"got {np.shape(bias)}"
                )
            state["bias"] = to_buffer(bias, self.dtype)
        return state

    def load_int4(self, weight: Int4Weight, bias: np.ndarray | None = None) -> None:
        """Loads a packed `Int4Weight` (and bias) into this layer's weights.

        For a layer inside a larger model, load the model instead, with this layer's
        `int4_state` under its attribute path (e.g. "layers.0.qweight"): MAX names graph
        weights after the module on which `load_state_dict` was called.
        """
        self.load_state_dict(self.int4_state(weight, bias))

"""`PagedKVProjection`: a `max.nn` layer writing FP8 K and V projections into MAX's paged cache.

x bf16 [T, hidden] → `quantize_fp8_rows` (e4m3 per token per `block` columns, on the graph) →
`kv_matmul_ragged_paged_scale` (the K and V halves in one op: what `k_matmul_ragged_paged_scale`
and its V twin `v_matmul_ragged_paged_scale` write), block-scaled e4m3 weights and fp32
accumulation. Nothing is returned: the cache is written in place. On CPU the e4m3 weights are
uint8 bit patterns (MAX 26.7 CPU graphs cannot hold float8), on GPU float8_e4m3fn;
`state_from_float` / `fp8_state` build the matching state dict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, ShardingStrategy, TensorValue, Weight
from max.nn import Module
from max.nn.kv_cache import KVCacheParams, PagedCacheValues

from ..core.rules import ARRAY, KV_COLLECTION, STRATEGY, TENSOR, check_types, instance_of
from ..core.sharding import shard_devices
from ..fp8.contract import FP8
from ..fp8.op import quantize_fp8_rows
from ..fp8.quant import Fp8Blockwise, quantize_fp8_blockwise
from .contract import PAGED_KV_PROJECTION, PAGED_KV_PROJECTION_CALL
from .op import fp8_dtype_for, kv_matmul_ragged_paged_scale

_CPU = DeviceRef.CPU()


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class PagedKVProjection(Module):
    """FP8 K and V projections written into MAX's paged KV cache for one layer."""

    def __init__(
        self,
        kv_params: KVCacheParams,
        hidden_size: int,
        layer_idx: int,
        *,
        dtype: DType = DType.bfloat16,
        device: DeviceRef = _CPU,
        block: int = 128,
    ) -> None:
        """kv_params: the cache (bfloat16 or float8_e4m3fn, plain K/V); hidden_size: columns
        of x; layer_idx: the cache layer written; dtype: x's dtype (bfloat16, float16,
        float32); device: where x and the weights live; block: the scale block (activations
        per token x block columns, weights block x block).

        Weights (load_state_dict names): k_weight, v_weight e4m3 [N, hidden_size] (uint8 bits
        on CPU), N = n_kv_heads · head_dim; k_weight_scale, v_weight_scale float32
        [ceil(N/block), ceil(hidden_size/block)]. Raises TypeError / ValueError naming the
        argument (`contracts.PAGED_KV_PROJECTION`).
        """
        super().__init__()
        PAGED_KV_PROJECTION.validate(
            {
                "kv_params": kv_params,
                "hidden_size": hidden_size,
                "layer_idx": layer_idx,
                "dtype": dtype,
                "device": device,
                "block": block,
            }
        )
        self.kv_params, self.hidden_size, self.layer_idx = kv_params, hidden_size, layer_idx
        self.dtype, self.device, self.block = dtype, device, block
        # every KV head of the model: a kv_params over several devices splits them (MAX's
        # multi-device cache), and the layer's head shards (`shard`) write those splits
        self.n = kv_params.n_kv_heads * kv_params.head_dim
        fp8 = fp8_dtype_for(device)
        scale_shape = [_ceil(self.n, block), _ceil(hidden_size, block)]
        self.k_weight = Weight("k_weight", fp8, [self.n, hidden_size], device)
        self.k_weight_scale = Weight("k_weight_scale", DType.float32, scale_shape, device)
        self.v_weight = Weight("v_weight", fp8, [self.n, hidden_size], device)
        self.v_weight_scale = Weight("v_weight_scale", DType.float32, scale_shape, device)
        self._sharding_strategy: ShardingStrategy | None = None

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """`ShardingStrategy.rowwise(n)`: the KV heads split over n devices, as MAX's
        tensor-parallel attention splits its paged cache (each device's cache holds
        n_kv_heads / n heads); shard i projects heads [i H/n, (i+1) H/n) into its device's
        cache. None until set."""
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        """Sets the head split; raises TypeError for a non-strategy and ValueError for another
        strategy or when the heads or the weight-scale blocks do not divide by n."""
        check_types(
            "PagedKVProjection.sharding_strategy",
            {"strategy": strategy},
            {"strategy": STRATEGY},
        )
        if not strategy.is_rowwise:
            raise ValueError(
                "PagedKVProjection.sharding_strategy: expected ShardingStrategy.rowwise (KV "
                f"heads split across devices), got {strategy}"
            )
        n = strategy.num_devices
        heads, head_dim = self.kv_params.n_kv_heads, self.kv_params.head_dim
        if heads % n or (heads // n * head_dim) % self.block:
            raise ValueError(
                f"PagedKVProjection.sharding_strategy: rowwise({n}) needs n_kv_heads / {n} "
                f"heads per device whose rows (heads / {n} · head_dim) are a multiple of the "
                f"scale block {self.block}, got n_kv_heads = {heads}, head_dim = {head_dim}"
            )
        for w in (self.k_weight, self.k_weight_scale, self.v_weight, self.v_weight_scale):
            w.sharding_strategy = ShardingStrategy.rowwise(n)
        self._sharding_strategy = strategy

    def shard(self, devices: Iterable[DeviceRef]) -> list[PagedKVProjection]:
        """One `PagedKVProjection` per device for its n_kv_heads / n heads, writing layer
        `layer_idx` of that device's cache (kv_params: this layer's with n_kv_heads / n heads on
        that device). Its weights are views of this layer's (MAX weight sharding: load the full
        layer's state as usual). Raises ValueError when no strategy is set or len(devices)
        differs from its count."""
        devices = shard_devices("PagedKVProjection", self._sharding_strategy, devices)
        n = len(devices)
        parts = {name: getattr(self, name).shard(devices)
                 for name in ("k_weight", "k_weight_scale", "v_weight", "v_weight_scale")}
        shards = []
        for i, device in enumerate(devices):
            params = dataclasses.replace(
                self.kv_params, n_kv_heads=self.kv_params.n_kv_heads // n,
                devices=[device])
            layer = PagedKVProjection(params, self.hidden_size, self.layer_idx,
                                      dtype=self.dtype, device=device, block=self.block)
            for name, weights in parts.items():
                setattr(layer, name, weights[i])
            shards.append(layer)
        return shards

    def __call__(
        self, x: TensorValue, input_row_offsets: TensorValue, kv_collection: PagedCacheValues
    ) -> None:
        """x: bf16 [T, hidden] -> quantized per token per 128 columns to e4m3, then K and V
        (fp32 accumulate, block scales) written into the cache (bf16 cache: plain cast).

        x has the layer's dtype and device ([T, hidden_size], T may be symbolic);
        input_row_offsets uint32 [B + 1] and kv_collection (MAX's PagedCacheValues for
        kv_params) as for `k_matmul_ragged_paged_scale`, whose rules they must satisfy. Token t
        of sequence b lands at position cache_lengths[b] + t − offsets[b]; an fp8 cache stores
        the e4m3 rounding of K and V (kv_scale 1).
        """
        PAGED_KV_PROJECTION_CALL.validate(
            {"x": x, "input_row_offsets": input_row_offsets, "kv_collection": kv_collection,
             "dtype": self.dtype, "hidden_size": self.hidden_size, "device": self.device}
        )
        data, scales = quantize_fp8_rows(x, self.block)
        self.write_quantized(data, scales, input_row_offsets, kv_collection)

    def write_quantized(self, data: TensorValue, scales: TensorValue,
                        input_row_offsets: TensorValue, kv_collection: PagedCacheValues) -> None:
        """`__call__` on activations already quantized the way it quantizes them: data, scales
        = `quantize_fp8_rows(x, block)` of this layer's block, or the e4m3 outputs of
        `add_rms_norm_fp8` (data e4m3 [T, hidden_size], float8_e4m3fn on GPU / uint8 bits on
        CPU; scales float32 [ceil(hidden_size / block), T]), so a norm that feeds this layer
        can quantize in its own kernel. The K/V op's contract checks data and scales (its
        hidden_state and input_scale)."""
        check_types("PagedKVProjection.write_quantized",
                    {"data": data, "scales": scales, "input_row_offsets": input_row_offsets,
                     "kv_collection": kv_collection},
                    {"data": TENSOR, "scales": TENSOR, "input_row_offsets": TENSOR,
                     "kv_collection": KV_COLLECTION})
        # a shard's weights are slices of the full layer's host weights: moved to this
        # layer's device, as max.nn.Linear does (a no-op for weights already there)
        k_weight, k_scale, v_weight, v_scale = (
            TensorValue(w).to(self.device)
            for w in (self.k_weight, self.k_weight_scale, self.v_weight, self.v_weight_scale)
        )
        kv_matmul_ragged_paged_scale(
            self.kv_params, data, input_row_offsets, k_weight, v_weight, scales, k_scale, v_scale,
            kv_collection, (1, self.block, self.block), self.layer_idx,
        )

    def fp8_state(self, k: Fp8Blockwise, v: Fp8Blockwise) -> dict[str, Buffer]:
        """The host buffers of this layer's weights (local names) from block-quantized K and V
        weights (e.g. a DeepSeek-style checkpoint via `quantize_fp8_blockwise(w,
        weight_scale_inv=...)`). Each must be [N, hidden_size] with block (block, block).
        Raises ValueError naming the weight on a mismatch, TypeError when one is not an
        `Fp8Blockwise`.
        """
        blockwise = instance_of("an Fp8Blockwise", Fp8Blockwise)
        check_types("PagedKVProjection.fp8_state", {"k": k, "v": v},
                    {"k": blockwise, "v": blockwise})
        fp8_bits = fp8_dtype_for(self.device) != FP8
        state: dict[str, Buffer] = {}
        for name, w in (("k_weight", k), ("v_weight", v)):
            want = ((self.n, self.hidden_size), (self.block, self.block))
            got = (tuple(w.data.shape), tuple(w.block))
            if got != want:
                raise ValueError(
                    f"PagedKVProjection: {name} (shape, block) must be {want} "
                    f"(N = n_kv_heads · head_dim = {self.n}), got {got}"
                )
            bits = Buffer.from_numpy(np.ascontiguousarray(w.bits))
            state[name] = bits if fp8_bits else bits.view(FP8)
            state[f"{name}_scale"] = Buffer.from_numpy(np.ascontiguousarray(w.scales))
        return state

    def state_from_float(self, k_weight: np.ndarray, v_weight: np.ndarray) -> dict[str, Buffer]:
        """`fp8_state` of float K and V weights [N, hidden_size] quantized blockwise
        (`quantize_fp8_blockwise`, block x block), e.g. deterministic random weights:
        `layer.load_state_dict(layer.state_from_float(wk, wv))`. Raises ValueError naming the
        weight when its shape is not [N, hidden_size], TypeError when it is not an array."""
        check_types("PagedKVProjection.state_from_float",
                    {"k_weight": k_weight, "v_weight": v_weight},
                    {"k_weight": ARRAY, "v_weight": ARRAY})
        for name, w in (("k_weight", k_weight), ("v_weight", v_weight)):
            if np.shape(w) != (self.n, self.hidden_size):
                raise ValueError(
                    f"PagedKVProjection: {name} must have shape [N, hidden_size] = "
                    f"{[self.n, self.hidden_size]} (N = n_kv_heads · head_dim), "
                    f"got {list(np.shape(w))}"
                )
        blk = (self.block, self.block)
        return self.fp8_state(quantize_fp8_blockwise(k_weight, blk),
                              quantize_fp8_blockwise(v_weight, blk))

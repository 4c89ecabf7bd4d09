"""The example decoder built only from MAX 26.7 built-ins, for `bench_decoder.py`'s side-by-side.

Same weights, same math as `mojo_gemm.models.decoder.MoEDecoder` with attention "flash"; every
op of a layer is MAX's own:

- q, o: MAX's GPTQ kernel `qmatmul_b4_g128` on a weight repacked once, outside the timed graph,
  by `GPTQ_gpu_repack_b4_g128` (`repack_gptq`). MAX's `max.nn.GPTQLinear` runs the same two ops
  but repacks inside its graph on every call; repacking once is what a fast MAX model would do.
- K: `max.nn.kernels.matmul_k_cache_ragged_scaled_float8` (FP8 block-scaled matmul writing the
  paged cache) on activations quantized by MAX's `quantize_dynamic_scaled_float8` (1 x 128
  blocks, float32 scales); V: the same activations through MAX's FP8 block-scaled
  `dynamic_scaled_matmul`, then `store_v_cache_ragged`. (MAX's fused QKV matmul that writes the
  cache needs Q in FP8 too; Q is int4 here.)
- attention: `flash_attention_ragged`, causal, as in the package's "flash" decoder;
- experts: `moe_create_indices`, `grouped_matmul_ragged` for gate|up and down, SwiGLU as graph
  ops, `moe_finalize` (the path of `max.nn.moe.MoE`); router (float32 logits, top-k, softmax),
  residual adds, norms and casts as MAX's graph ops; the LM head as in the package's decoder.

GPU only: MAX's FP8 and grouped kernels have no CPU versions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, Weight, ops
from max.nn import LayerList, Module
from max.nn.attention import MHAMaskVariant
from max.nn.kernels import (
    dynamic_scaled_matmul,
    flash_attention_ragged,
    grouped_matmul_ragged,
    matmul_k_cache_ragged_scaled_float8,
    moe_create_indices,
    moe_finalize,
    quantize_dynamic_scaled_float8,
    store_v_cache_ragged,
)
from max.nn.kv_cache import PagedCacheValues
from max.nn.quant_config import InputScaleSpec, ScaleGranularity, ScaleOrigin, WeightScaleSpec

from mojo_gemm.core.host import to_buffer, to_numpy
from mojo_gemm.int4.layout import unpack_codes, unpermute_group_params
from mojo_gemm.int4.quant import Int4Weight
from mojo_gemm.models.decoder import (
    DTYPE,
    FP8_BLOCK,
    DecoderConfig,
    DecoderWeights,
    MoEDecoder,
    RMSNorm,
    widened_buffer,
)

GPTQ_GROUP = 128
"""The only group size of MAX's GPTQ kernel (`qmatmul_b4_g128`)."""
FP8 = DType.float8_e4m3fn
INPUT_SPEC = InputScaleSpec(granularity=ScaleGranularity.BLOCK, origin=ScaleOrigin.DYNAMIC,
                            dtype=DType.float32, block_size=(1, FP8_BLOCK))
"""K/V activations: dynamic scales per token per 128 columns (as the package's quantizer)."""
WEIGHT_SPEC = WeightScaleSpec(granularity=ScaleGranularity.BLOCK, dtype=DType.float32,
                              block_size=(FP8_BLOCK, FP8_BLOCK))
"""K/V weights: 128 x 128 blocks."""


def gptq_buffer(weight: Int4Weight) -> np.ndarray:
    """MAX GPTQLinear's uint8 buffer [K/2 + 2·K/128, N] of a symmetric g128 `Int4Weight`.

    The buffer's flat bytes are the GPTQ qweight int32 [K/8, N] (word (r, n) holds the code of
    input row 8r + j in nibble j) followed by the float16 scales [K/128, N]; the inverse of
    `Int4Weight.from_max_gptq`. Raises ValueError for another group size, zeros or act order.
    """
    if weight.group_size != GPTQ_GROUP or weight.zeros is not None or weight.perm is not None:
        raise ValueError(f"gptq_buffer: weight must be symmetric, group 128, no act order; got "
                         f"group_size={weight.group_size}, zeros={weight.zeros is not None}, "
                         f"perm={weight.perm is not None}")
    n, k = weight.n, weight.k
    codes = unpack_codes(weight.qweight)[:n, :k].astype(np.uint32)  # [N, K]
    nibbles = codes.T.reshape(k // 8, 8, n)
    words = np.zeros((k // 8, n), np.uint32)
    for j in range(8):
        words |= nibbles[:, j] << np.uint32(4 * j)
    scales = unpermute_group_params(weight.scales)[:, :n].astype(np.float16)
    flat = np.concatenate([words.astype("<u4").view(np.uint8).reshape(-1),
                           np.ascontiguousarray(scales).view(np.uint8).reshape(-1)])
    return flat.reshape(k // 2 + 2 * (k // GPTQ_GROUP), n)


def repack_gptq(buffers: list[np.ndarray], session: Any, device: Any) -> list[Buffer]:
    """MAX's GPU repack (`GPTQ_gpu_repack_b4_g128`) of GPTQ buffers [K/2 + 2·K/128, N]:
    host uint8 buffers [N, K/2 + 2·K/128], the weight `qmatmul_b4_g128` takes. One compiled
    graph per distinct shape; `session` an InferenceSession on `device` (an Accelerator)."""
    models: dict[tuple[int, int], Any] = {}
    out = []
    gpu = DeviceRef.GPU()
    for raw in buffers:
        kp, n = raw.shape
        if (kp, n) not in models:
            with Graph(f"max_gptq_repack_{kp}_{n}",
                       input_types=[TensorType(DType.uint8, [kp, n], gpu)]) as g:
                g.output(ops.custom("GPTQ_gpu_repack_b4_g128", gpu, [g.inputs[0].tensor],
                                    out_types=[TensorType(DType.uint8, [n, kp], gpu)])[0].tensor)
            models[kp, n] = session.load(g)
        packed = models[kp, n].execute(Buffer.from_numpy(np.ascontiguousarray(raw)).to(device))[0]
        out.append(Buffer.from_numpy(np.ascontiguousarray(to_numpy(packed))))
    return out


class MaxGptqLinear(Module):
    """y = x · Wᵀ by MAX's `qmatmul_b4_g128`: x bf16 [T, in] -> bf16 [T, out]; weight `weight`
    uint8 [out, in/2 + 2·in/128] (repacked, `repack_gptq`)."""

    def __init__(self, in_features: int, out_features: int, device: DeviceRef) -> None:
        super().__init__()
        self.out_features, self.device = out_features, device
        kp = in_features // 2 + 2 * (in_features // GPTQ_GROUP)
        self.weight = Weight("weight", DType.uint8, [out_features, kp], device)

    def __call__(self, x: TensorValue) -> TensorValue:
        """x bf16 [T, in] -> bf16 [T, out]."""
        return ops.custom("qmatmul_b4_g128", self.device, [x, TensorValue(self.weight)],
                          out_types=[TensorType(DTYPE, [x.shape[0], self.out_features],
                                                self.device)])[0].tensor


class MaxMoE(Module):
    """`max.nn.moe.MoE`'s expert path on the package's routing: top-k of float32 router logits,
    softmax over the chosen; `moe_create_indices`, `grouped_matmul_ragged` (gate|up, then down),
    silu(gate)·up in float32 rounded to bf16, `moe_finalize`. Weights: router_weight bf16 [E, H],
    gate_up_weight bf16 [E, 2I, H] (expert e's rows: its gate rows, then its up rows),
    down_weight bf16 [E, H, I]. x bf16 [T, H] -> bf16 [T, H]."""

    def __init__(self, config: DecoderConfig, device: DeviceRef) -> None:
        super().__init__()
        self.config = c = config
        h, e, i = c.hidden_size, c.num_experts, c.moe_intermediate_size
        self.router_weight = Weight("router_weight", DTYPE, [e, h], device)
        self.gate_up_weight = Weight("gate_up_weight", DTYPE, [e, 2 * i, h], device)
        self.down_weight = Weight("down_weight", DTYPE, [e, h, i], device)

    def __call__(self, x: TensorValue) -> TensorValue:
        """x bf16 [T, H] -> bf16 [T, H]."""
        c = self.config
        logits = ops.matmul(ops.cast(x, DType.float32),
                            ops.cast(TensorValue(self.router_weight), DType.float32).T)
        values, ids = ops.top_k(logits, c.top_k, axis=-1)
        weights = ops.softmax(values)
        order, starts, restore, expert_ids, stats = moe_create_indices(
            ops.cast(ops.reshape(ids, [-1]), DType.int32), c.num_experts)
        rows = ops.gather(x, ops.cast(order // c.top_k, DType.int32), axis=0)
        gate_up = grouped_matmul_ragged(rows, TensorValue(self.gate_up_weight), starts,
                                        expert_ids, stats)
        i = c.moe_intermediate_size
        gate, up = ops.cast(gate_up[:, :i], DType.float32), ops.cast(gate_up[:, i:], DType.float32)
        act = ops.cast(ops.silu(gate) * up, DTYPE)
        down = grouped_matmul_ragged(act, TensorValue(self.down_weight), starts, expert_ids,
                                     stats)
        return moe_finalize(down, restore, weights, DTYPE)


class MaxDecoderLayer(Module):
    """One layer of `MaxDecoder` (the package's `DecoderLayer` with MAX's ops; see the module
    docstring). Weights: attn_norm.weight, q_proj.weight, o_proj.weight (repacked GPTQ),
    k_weight / v_weight e4m3 [kv_size, H] with k_weight_scale / v_weight_scale float32
    [kv_size/128, H/128], ffn_norm.weight, moe.* (`MaxMoE`)."""

    def __init__(self, config: DecoderConfig, layer_idx: int, device: DeviceRef) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        h, n = config.hidden_size, config.kv_size
        scale_shape = [-(-n // FP8_BLOCK), -(-h // FP8_BLOCK)]
        self.attn_norm = RMSNorm(h, config.rms_eps, device)
        self.q_proj = MaxGptqLinear(h, config.q_size, device)
        self.o_proj = MaxGptqLinear(config.q_size, h, device)
        self.k_weight = Weight("k_weight", FP8, [n, h], device)
        self.k_weight_scale = Weight("k_weight_scale", DType.float32, scale_shape, device)
        self.v_weight = Weight("v_weight", FP8, [n, h], device)
        self.v_weight_scale = Weight("v_weight_scale", DType.float32, scale_shape, device)
        self.ffn_norm = RMSNorm(h, config.rms_eps, device)
        self.moe = MaxMoE(config, device)

    def attention(self, x: TensorValue, offsets: TensorValue,
                  kv: PagedCacheValues) -> TensorValue:
        """x bf16 [T, H] (normed) -> bf16 [T, q_size]; writes this step's K and V first."""
        c = self.config
        t = x.shape[0]
        params = c.kv_params(x.device)
        layer = ops.constant(self.layer_idx, DType.uint32, device=DeviceRef.CPU())
        xq, xs = quantize_dynamic_scaled_float8(x, INPUT_SPEC, WEIGHT_SPEC,
                                                scales_type=DType.float32, out_type=FP8)
        matmul_k_cache_ragged_scaled_float8(
            params, xq, offsets, TensorValue(self.k_weight), xs,
            TensorValue(self.k_weight_scale), kv, (1, FP8_BLOCK, FP8_BLOCK), layer)
        v = dynamic_scaled_matmul(xq, TensorValue(self.v_weight), xs,
                                  TensorValue(self.v_weight_scale), INPUT_SPEC, WEIGHT_SPEC,
                                  out_type=DTYPE)
        store_v_cache_ragged(kv, ops.reshape(v, [t, c.num_kv_heads, c.head_dim]), offsets,
                             layer)
        q = ops.reshape(self.q_proj(x), [t, c.num_heads, c.head_dim])
        out = flash_attention_ragged(params, q, offsets, kv, layer, MHAMaskVariant.CAUSAL_MASK,
                                     scale=1.0 / float(np.sqrt(c.head_dim)))
        return ops.reshape(out, [t, c.q_size])

    def __call__(self, h: TensorValue, pending: TensorValue | None, offsets: TensorValue,
                 kv: PagedCacheValues, layout: None) -> tuple[TensorValue, TensorValue]:
        """`DecoderLayer`'s (h, pending) -> (h', pending') with MAX's graph ops for the adds
        and norms (`layout` unused: flash only)."""
        h = _residual(h, pending)
        attn = self.attention(ops.cast(self.attn_norm(h), DTYPE), offsets, kv)
        h = h + ops.cast(self.o_proj(attn), DType.float32)
        return h, self.moe(ops.cast(self.ffn_norm(h), DTYPE))


def _residual(h: TensorValue, pending: TensorValue | None) -> TensorValue:
    """h + pending in float32 (h: float32, or the bf16 embeddings before the first layer)."""
    h = ops.cast(h, DType.float32)
    return h if pending is None else h + ops.cast(pending, DType.float32)


class MaxDecoder(MoEDecoder):
    """`MoEDecoder` (embedding, final norm, LM head, call signature, `config`) with
    `MaxDecoderLayer`s. Needs config.attention == "flash" and int4_group_size 128; fill it
    with `load_state_dict(model.max_state(weights, repacked))`."""

    def __init__(self, config: DecoderConfig, device: DeviceRef) -> None:
        if config.attention != "flash" or config.int4_group_size != GPTQ_GROUP:
            raise ValueError(f"MaxDecoder: config needs attention='flash' and int4_group_size "
                             f"128, got {config.attention!r} and {config.int4_group_size}")
        super().__init__(config, device)
        self.layers = LayerList([MaxDecoderLayer(config, i, device)
                                 for i in range(config.num_layers)])

    def head_input(self, h: TensorValue, pending: TensorValue | None) -> TensorValue:
        """The final norm as MAX's graph ops, bf16 [T, H]."""
        return ops.cast(self.final_norm(_residual(h, pending)), DTYPE)

    def max_state(self, weights: DecoderWeights,
                  repacked: list[tuple[Buffer, Buffer]]) -> dict[str, Buffer]:
        """The state dict of `weights`; repacked[i] = layer i's (q, o) from `repack_gptq`."""
        if weights.config != self.config:
            raise ValueError("MaxDecoder: weights were made for another DecoderConfig")
        state = {"embed_weight": to_buffer(weights.embed, DTYPE),
                 "final_norm.weight": widened_buffer(weights.final_norm),
                 "lm_head_weight": widened_buffer(weights.lm_head)}
        for i, (w, (q, o)) in enumerate(zip(weights.layers, repacked, strict=True)):
            parts = {"attn_norm.weight": widened_buffer(w.attn_norm),
                     "ffn_norm.weight": widened_buffer(w.ffn_norm),
                     "q_proj.weight": q, "o_proj.weight": o,
                     "moe.router_weight": to_buffer(w.router, DTYPE),
                     "moe.gate_up_weight": to_buffer(np.concatenate([w.gate, w.up], axis=1),
                                                     DTYPE),
                     "moe.down_weight": to_buffer(w.down, DTYPE)}
            for name, fp8 in (("k_weight", w.k), ("v_weight", w.v)):
                parts[name] = Buffer.from_numpy(np.ascontiguousarray(fp8.bits)).view(FP8)
                parts[f"{name}_scale"] = Buffer.from_numpy(np.ascontiguousarray(fp8.scales))
            state.update({f"layers.{i}.{k}": b for k, b in parts.items()})
        return state

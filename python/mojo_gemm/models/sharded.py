"""The example decoder over n GPUs: MAX's multi-device graph, the package's sharded layers and
MAX's allreduce (no communication code of our own).

Per layer and device i of n: the replicated RMSNorm, the Q projection's rows (heads
[i·heads/n, (i+1)·heads/n), column-parallel `Int4Linear`), the K/V projection's KV heads
written into device i's paged cache (`PagedKVProjection` head shards, MAX's multi-device
cache), MAX's flash attention over those heads, the O projection's matching input columns
(row-parallel `Int4Linear`, a partial sum); the partial sums are allreduced in float32 and
added to the residual stream, which every device keeps whole (the add inside the next norm's
kernel, `add_rms_norm`, as in the one-device decoder). The MoE block is expert-parallel
(`MoEBlock` expert shards: E/n experts per device, routing replicated, tokens routed elsewhere
are the grouped op's zero rows); its partial outputs are allreduced the same way. Embedding,
final norm and LM head are replicated; device 0 returns the logits and the next tokens.
Flash attention only (the graph attention of `DecoderConfig` is for the one-device CPU path).
"""

from __future__ import annotations

from collections.abc import Sequence

from max.graph import BufferValue, DeviceRef, Graph, ShardingStrategy, TensorValue, ops
from max.graph import Module as GraphModule
from max.nn import Allreduce, Signals
from max.nn.kv_cache import PagedCacheValues

from ..norm.op import add_rms_norm
from .decoder import (
    DTYPE,
    DecoderConfig,
    MoEDecoder,
    _f32,
    flash_attention,
    graph_input_types,
    logits_and_next,
)


class ShardedMoEDecoder(MoEDecoder):
    """`MoEDecoder` with its weights split over `devices` (the module docstring says how).

    The weights and their names are `MoEDecoder`'s (the shards are views of them, MAX weight
    sharding), so `load_state_dict(model.state(weights))` loads it as it does the one-device
    model. Call it with per-device lists (`sharded_graph_input_types`): tokens int64 [T] and
    input_row_offsets uint32 [B + 1] on every device, every device's `PagedCacheValues`, and
    MAX's allreduce signal buffers; returns (logits float32 [T, vocab], next token int64 [B])
    on devices[0] (`hidden`: the same step up to the LM head's input). Raises ValueError for
    attention other than "flash", or heads, KV heads or experts that `len(devices)` does not
    divide.
    """

    def __init__(self, config: DecoderConfig, devices: Sequence[DeviceRef]) -> None:
        devices = list(devices)
        n = len(devices)
        if n < 1:
            raise ValueError("ShardedMoEDecoder: devices must not be empty")
        if config.attention != "flash":
            raise ValueError(f"ShardedMoEDecoder: attention must be 'flash', got "
                             f"{config.attention!r}")
        for name in ("num_heads", "num_kv_heads", "num_experts"):
            if getattr(config, name) % n:
                raise ValueError(f"ShardedMoEDecoder: {name} ({getattr(config, name)}) must be "
                                 f"a multiple of the {n} devices")
        super().__init__(config, devices[0], kv_devices=devices)
        self.devices = devices
        replicate = ShardingStrategy.replicate(n)
        for w in (self.embed_weight, self.lm_head_weight, self.final_norm.weight):
            w.sharding_strategy = replicate
        for layer in self.layers:
            layer.attn_norm.weight.sharding_strategy = replicate
            layer.ffn_norm.weight.sharding_strategy = replicate
            layer.q_proj.sharding_strategy = ShardingStrategy.rowwise(n)
            layer.kv_proj.sharding_strategy = ShardingStrategy.rowwise(n)
            layer.o_proj.sharding_strategy = ShardingStrategy.columnwise(n)
            layer.moe.sharding_strategy = ShardingStrategy.expert_parallel(n)
        self.allreduce = Allreduce(n)

    def _sum(self, parts: list[TensorValue], signals: list[BufferValue]) -> list[TensorValue]:
        """The float32 sum of the devices' partial results, on every device (one device: its
        own result)."""
        parts = [_f32(p) for p in parts]
        return self.allreduce(parts, signals) if len(parts) > 1 else parts

    def __call__(self, tokens: Sequence[TensorValue], offsets: Sequence[TensorValue],  # type: ignore[override]
                 kvs: Sequence[PagedCacheValues],
                 signals: Sequence[BufferValue]) -> tuple[TensorValue, TensorValue]:
        """Per-device tokens, offsets, caches and signal buffers -> (logits, next tokens) on
        devices[0]; writes this step's K/V into every device's cache."""
        normed = self.hidden(tokens, offsets, kvs, signals)
        return logits_and_next(normed, TensorValue(self.lm_head_weight.shard(self.devices)[0]),
                               offsets[0])

    def hidden(self, tokens: Sequence[TensorValue], offsets: Sequence[TensorValue],
               kvs: Sequence[PagedCacheValues],
               signals: Sequence[BufferValue]) -> TensorValue:
        """The decoder without its LM head: the final norm's output, float32 [T, H] (bf16
        values) on devices[0], what the head (or a caller's own head or sampler) reads; writes
        this step's K/V into every device's cache."""
        c, devs, sig = self.config, self.devices, list(signals)
        embeds = self.embed_weight.shard(devs)
        # the residual stream h + pending per device, as in `DecoderLayer`: each add runs in
        # the next norm's kernel (`add_rms_norm`); h starts as the bf16 embedding rows
        h = [ops.gather(TensorValue(e), tok, axis=0) for e, tok in zip(embeds, tokens, strict=True)]
        pending: list[TensorValue | None] = [None] * len(devs)

        def norm(i: int, w: TensorValue) -> TensorValue:
            s, x = add_rms_norm(h[i], pending[i], w, c.rms_eps, DTYPE)
            assert s is not None
            h[i] = s
            return x

        for layer in self.layers:
            attn_w = layer.attn_norm.weight.shard(devs)
            ffn_w = layer.ffn_norm.weight.shard(devs)
            parts = []
            for i, (q, kv, o) in enumerate(zip(layer.q_proj.shard(devs),
                                               layer.kv_proj.shard(devs),
                                               layer.o_proj.shard(devs), strict=True)):
                x = norm(i, TensorValue(attn_w[i]))
                kv(x, offsets[i], kvs[i])
                parts.append(o(flash_attention(kv.kv_params, q(x), offsets[i], kvs[i],
                                               layer.layer_idx, c.head_dim)))
            pending = list(self._sum(parts, sig))
            experts = [moe(norm(i, TensorValue(w)))
                       for i, (moe, w) in enumerate(zip(layer.moe.shard(devs), ffn_w,
                                                        strict=True))]
            pending = list(self._sum(experts, sig))
        norm_w = TensorValue(self.final_norm.weight.shard(devs)[0])
        return _f32(add_rms_norm(h[0], pending[0], norm_w, c.rms_eps, DTYPE, keep_sum=False)[1])


def sharded_graph_input_types(config: DecoderConfig, devices: Sequence[DeviceRef]) -> list:
    """The inputs of `build_sharded_graph`'s graph, in order: per device tokens int64
    ["total_tokens"] and input_row_offsets uint32 ["batch_plus_one"], then per device the paged
    cache's inputs (as `graph_input_types`: kv_blocks, cache_lengths, lookup_table,
    max_prompt_length, max_cache_length, page_stride, attention dispatch metadata; every
    device's cache holds its num_kv_heads / n heads), then MAX's allreduce signal buffers."""
    devices = list(devices)
    types: list = []
    for dev in devices:
        types += graph_input_types(config, dev)[:2]
    for cache in config.kv_params(devices).get_symbolic_inputs():
        types += [cache.kv_blocks, cache.cache_lengths, cache.lookup_table,
                  cache.max_prompt_length, cache.max_cache_length, cache.page_stride,
                  cache.attention_dispatch_metadata]
    return types + list(Signals(devices).input_types())


CACHE_INPUTS = 7
"""Graph inputs per device's cache in `sharded_graph_input_types`."""


def build_sharded_graph(model: ShardedMoEDecoder, module: GraphModule | None = None, *,
                        head: bool = True) -> Graph:
    """The sharded decoder's one graph (symbolic tokens, batch and pages, as `build_graph`),
    built into `module` (a `max.graph.Module`) if given. Outputs (logits, next tokens), or with
    `head=False` the hidden state that the LM head reads (`ShardedMoEDecoder.hidden`: float32
    [T, H] on devices[0]), for a caller with its own head or sampler."""
    devs = model.devices
    n = len(devs)
    with Graph("moe_decoder_sharded", input_types=sharded_graph_input_types(model.config, devs),
               module=module) as graph:
        ins = list(graph.inputs)
        tokens = [ins[2 * i].tensor for i in range(n)]
        offsets = [ins[2 * i + 1].tensor for i in range(n)]
        kvs = []
        for i in range(n):
            blocks, lengths, lut, max_prompt, max_cache, stride, meta = (
                ins[2 * n + CACHE_INPUTS * i: 2 * n + CACHE_INPUTS * (i + 1)])
            kvs.append(PagedCacheValues(
                kv_blocks=blocks.buffer, cache_lengths=lengths.tensor, lookup_table=lut.tensor,
                max_prompt_length=max_prompt.tensor, max_cache_length=max_cache.tensor,
                page_stride=stride.tensor, attention_dispatch_metadata=meta.tensor))
        signals = [v.buffer for v in ins[(2 + CACHE_INPUTS) * n:]]
        if head:
            graph.output(*model(tokens, offsets, kvs, signals))
        else:
            graph.output(model.hidden(tokens, offsets, kvs, signals))
    return graph

"""A small MoE decoder on mojo-gemm's three ops: its configuration, weights and `max.nn` modules.

Per layer: RMSNorm → attention (Q and O projections int4 through `Int4Linear`; K and V
projections FP8 through `PagedKVProjection`, written into MAX's paged KV cache; attention itself
either a plain graph implementation over the paged cache, used on CPU and GPU alike
(`DecoderConfig.attention == "graph"`), or MAX's own paged flash-attention kernel with a causal
mask, what a MAX model runs, GPU only (`"flash"`)) → residual →
RMSNorm → `MoEBlock` (router top-k, grouped SwiGLU experts) → residual; then a final RMSNorm and
an LM head (bf16 values, stored in float32). No positional encoding (NoPE): the K op stores raw
projections, and causality comes from the mask alone.

Every residual add, norm and cast to bf16 is one `add_rms_norm` kernel (each layer hands its MoE
output on unadded, so the add runs in the next norm), and the attention norm also writes the
e4m3 rows the K/V projection reads (`add_rms_norm_fp8`, its `quantize_fp8_rows` in the same
kernel).

Numerics (what `models.reference` reproduces): the residual stream, norms, attention scores,
softmax and the LM head run in float32; the inputs of every projection (and the attention
probabilities) are rounded to bf16, and every projection stores bf16 (the cache too). The
router and LM head produce float32 logits, so top-k and argmax never see bf16 ties.

Graph inputs (see `graph_input_types`): tokens int64 [T] (all sequences' new tokens, ragged,
concatenated), input_row_offsets uint32 [B + 1], then MAX's paged-cache inputs for the cache
(`KVCacheParams.get_symbolic_inputs`), with MAX's attention dispatch metadata (int64 [4], on
the host) last when attention is "flash". Outputs: logits float32 [T, vocab] for every new token and
the greedy next token int64 [B] of each sequence (argmax at its last new token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from max.driver import Buffer
from max.dtype import DType
from max.graph import BufferType, DeviceRef, Dim, Graph, TensorType, TensorValue, Weight, ops
from max.graph import Module as GraphModule
from max.nn import LayerList, Module
from max.nn.attention import MHAMaskVariant
from max.nn.kernels import flash_attention_ragged
from max.nn.kv_cache import MHAKVCacheParams, PagedCacheValues

from ..core.host import to_buffer, to_numpy
from ..fp8.quant import Fp8Blockwise, quantize_fp8_blockwise
from ..grouped.moe import MoEBlock
from ..int4.layer import Int4Linear
from ..int4.quant import Int4Weight
from ..k_cache.layer import PagedKVProjection
from ..norm.op import add_rms_norm, add_rms_norm_fp8

DTYPE = DType.bfloat16
"""Activation and weight storage dtype of the model."""
FP8_BLOCK = 128
"""K/V projection scale block (activations 1 x 128, weights 128 x 128)."""
_MASKED = -1.0e30
"""Score of a masked (future or unused) cache slot; exp underflows to exactly 0."""
ATTENTION_KINDS = ("graph", "flash")
"""`DecoderConfig.attention`: plain graph attention (CPU and GPU) or MAX's flash kernel (GPU)."""


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes of the example decoder (defaults: ~7 M parameters, compiles in about a minute).

    attention: "graph" (attention as plain graph ops over the gathered pages; CPU and GPU) or
    "flash" (MAX's paged flash-attention kernel `flash_attention_ragged`, causal mask; GPU
    only, and the graph takes MAX's attention dispatch metadata as its last input).
    """

    vocab_size: int = 1024
    hidden_size: int = 512
    num_layers: int = 2
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 64
    num_experts: int = 8
    top_k: int = 2
    moe_intermediate_size: int = 256
    int4_group_size: int = 128
    page_size: int = 16
    rms_eps: float = 1e-5
    attention: str = "graph"

    @classmethod
    def olmoe(cls, num_layers: int = 4, **overrides: int | float | str) -> DecoderConfig:
        """OLMoE-1B-7B's dimensions (hidden 2048, 16 query and 16 KV heads of 128, 64 experts,
        top-8, expert intermediate 1024, page 128, flash attention) with `num_layers` layers.

        The vocabulary is kept small (256; OLMoE's is 50304): the LM head is not part of what
        the real-size benchmark times. `overrides` replace any other field.
        """
        fields: dict[str, int | float | str] = {
            "vocab_size": 256, "hidden_size": 2048, "num_layers": num_layers, "num_heads": 16,
            "num_kv_heads": 16, "head_dim": 128, "num_experts": 64, "top_k": 8,
            "moe_intermediate_size": 1024, "int4_group_size": 128, "page_size": 128,
            "attention": "flash",
        }
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"DecoderConfig: attention must be one of {ATTENTION_KINDS}, "
                             f"got {self.attention!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"DecoderConfig: num_heads ({self.num_heads}) must be a multiple "
                             f"of num_kv_heads ({self.num_kv_heads})")
        if self.hidden_size % self.int4_group_size or self.q_size % self.int4_group_size:
            raise ValueError(f"DecoderConfig: hidden_size ({self.hidden_size}) and num_heads · "
                             f"head_dim ({self.q_size}) must be multiples of int4_group_size "
                             f"({self.int4_group_size})")
        for name in ("vocab_size", "num_layers", "head_dim", "page_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"DecoderConfig: {name} must be >= 1, got "
                                 f"{getattr(self, name)}")

    @property
    def q_size(self) -> int:
        """num_heads · head_dim: columns of Q and of the attention output."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """num_kv_heads · head_dim: columns of K and V."""
        return self.num_kv_heads * self.head_dim

    def kv_params(self, device: DeviceRef | Sequence[DeviceRef]) -> MHAKVCacheParams:
        """MAX's cache parameters for this model: bf16 K/V, every layer, on `device` (or split
        by KV heads over a list of devices, MAX's multi-device cache)."""
        devices = [device] if isinstance(device, DeviceRef) else list(device)
        return MHAKVCacheParams(dtype=DTYPE, n_kv_heads=self.num_kv_heads,
                                head_dim=self.head_dim, num_layers=self.num_layers,
                                page_size=self.page_size, devices=devices)


@dataclass(frozen=True)
class LayerWeights:
    """One layer's weights as the graph holds them (float arrays are rounded to bf16 on load)."""

    attn_norm: np.ndarray  # [H]
    q: Int4Weight  # [q_size, H]
    k: Fp8Blockwise  # [kv_size, H], 128 x 128 blocks
    v: Fp8Blockwise  # [kv_size, H]
    o: Int4Weight  # [H, q_size]
    ffn_norm: np.ndarray  # [H]
    router: np.ndarray  # [E, H]
    gate: np.ndarray  # [E, I, H]
    up: np.ndarray  # [E, I, H]
    down: np.ndarray  # [E, H, I]


@dataclass(frozen=True)
class DecoderWeights:
    """All weights of the model (already int4/fp8-quantized where the graph quantizes)."""

    embed: np.ndarray  # [V, H]
    layers: tuple[LayerWeights, ...]
    final_norm: np.ndarray  # [H]
    lm_head: np.ndarray  # [V, H]
    config: DecoderConfig = field(default_factory=DecoderConfig)


def random_weights(config: DecoderConfig, seed: int = 0) -> DecoderWeights:
    """Deterministic random weights (fan-in scaled normals) for `config`, from `seed`."""
    rng = np.random.default_rng(seed)
    h, e, i = config.hidden_size, config.num_experts, config.moe_intermediate_size

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape) / np.sqrt(shape[-1])

    def int4(n: int, k: int) -> Int4Weight:
        return int4_pow2(normal(n, k), config.int4_group_size)

    def fp8(n: int, k: int) -> Fp8Blockwise:
        return quantize_fp8_blockwise(normal(n, k), (FP8_BLOCK, FP8_BLOCK))

    def norm() -> np.ndarray:
        return 1.0 + 0.1 * rng.standard_normal(h)

    layers = tuple(
        LayerWeights(attn_norm=norm(), q=int4(config.q_size, h), k=fp8(config.kv_size, h),
                     v=fp8(config.kv_size, h), o=int4(h, config.q_size), ffn_norm=norm(),
                     router=normal(e, h), gate=normal(e, i, h), up=normal(e, i, h),
                     down=normal(e, h, i))
        for _ in range(config.num_layers)
    )
    return DecoderWeights(embed=rng.standard_normal((config.vocab_size, h)), layers=layers,
                          final_norm=norm(), lm_head=normal(config.vocab_size, h),
                          config=config)


def int4_pow2(w: np.ndarray, group_size: int) -> Int4Weight:
    """Symmetric round-to-nearest int4 of w float [N, K] with power-of-two group scales.

    s = 2^ceil(log2(amax / 7)) per group, codes = clip(round(w / s) + 8, 1, 15). With such
    scales every dequantized value (code − 8) · s is exact in bf16 and float32, so the weight
    the kernel uses is `Int4Weight.dequantize()` exactly, whichever precision it dequantizes in.
    """
    n, k = w.shape
    groups = w.reshape(n, k // group_size, group_size)
    amax = np.maximum(np.abs(groups).max(axis=2), np.finfo(np.float32).tiny)
    scales = 2.0 ** np.ceil(np.log2(amax / 7.0))
    codes = np.clip(np.rint(groups / scales[:, :, None]) + 8, 1, 15).astype(np.uint8)
    return Int4Weight.from_codes(codes.reshape(n, k), scales.T.astype(np.float32), None,
                                 group_size)


@dataclass(frozen=True)
class TokenLayout:
    """Per-token positions of a ragged step, shared by every layer (all int64, on the device).

    batch: [T] sequence of each token; position: [T] its position in its sequence;
    mask: bool [T, S] (S = lookup-table columns · page size) true where cache slot s <= position;
    pages: [T, P] the token's sequence's lookup-table row, clamped to valid page ids.
    """

    batch: TensorValue
    position: TensorValue
    mask: TensorValue
    pages: TensorValue


def token_layout(num_tokens: Dim, offsets: TensorValue, kv: PagedCacheValues,
                 page_size: int) -> TokenLayout:
    """The `TokenLayout` of a step: T = num_tokens, input_row_offsets uint32 [B + 1], and the
    cache values (cache_lengths uint32 [B], lookup_table uint32 [B, P]); all on one device."""
    dev = offsets.device
    starts = ops.cast(offsets, DType.int64)
    tok = ops.range(0, num_tokens, 1, out_dim=num_tokens, dtype=DType.int64, device=dev)
    # sequence of token t = number of sequences ending at or before t
    ended = ops.greater_equal(ops.unsqueeze(tok, 1), ops.unsqueeze(starts[1:], 0))  # [T, B]
    batch = ops.reshape(ops.sum(ops.cast(ended, DType.int64), axis=1), [num_tokens])
    cache_len = ops.gather(ops.cast(kv.cache_lengths, DType.int64), batch, axis=0)
    position = cache_len + tok - ops.gather(starts, batch, axis=0)
    lut = ops.cast(kv.lookup_table, DType.int64)
    slots = lut.shape[1] * page_size
    slot = ops.range(0, slots, 1, out_dim=slots, dtype=DType.int64, device=dev)
    mask = ops.greater_equal(ops.unsqueeze(position, 1), ops.unsqueeze(slot, 0))  # [T, S]
    # Unused lookup-table entries hold MAX's sentinel (= the page count): point them at page 0;
    # the mask hides every slot they cover. The page count reaches the device through a
    # one-element range (its bounds are launch arguments), not a host-to-device copy, which a
    # captured device graph cannot hold.
    pages = kv.kv_blocks.shape[0]
    num_pages = ops.range(pages, pages + 1, 1, out_dim=1, dtype=DType.int64, device=dev)
    valid = ops.where(ops.greater(num_pages, lut), lut, 0)
    return TokenLayout(batch=batch, position=position, mask=mask,
                       pages=ops.gather(valid, batch, axis=0))


class RMSNorm(Module):
    """y = x / sqrt(mean(x²) + eps) · w in float32; weight `weight` float32 [size] holding
    bf16-rounded values (`widened_buffer`): the checkpoint's bf16 weight, stored widened so that
    no step spends a kernel launch casting it."""

    def __init__(self, size: int, eps: float, device: DeviceRef) -> None:
        super().__init__()
        self.eps = eps
        self.weight = Weight("weight", DType.float32, [size], device)

    def __call__(self, x: TensorValue) -> TensorValue:
        """x float32 [T, size] -> float32 [T, size] (MAX's graph op)."""
        return ops.rms_norm(x, TensorValue(self.weight), self.eps)

    def add(self, h: TensorValue, y: TensorValue | None) -> tuple[TensorValue, TensorValue]:
        """The residual add and this norm in one kernel (`add_rms_norm`): h float32 [T, size]
        (or the bf16 embeddings), y bf16 [T, size] or None -> (s = h + y float32 [T, size],
        the norm of s in bf16 [T, size])."""
        s, normed = add_rms_norm(h, y, TensorValue(self.weight), self.eps, DTYPE)
        assert s is not None  # keep_sum: the residual stream goes on
        return s, normed

    def add_fp8(self, h: TensorValue, y: TensorValue | None,
                block: int) -> tuple[TensorValue, TensorValue, tuple[TensorValue, TensorValue]]:
        """`add` that also quantizes the bf16 norm to e4m3 in the same kernel
        (`add_rms_norm_fp8`): (s, normed, (data, scales)), the pair
        `PagedKVProjection.write_quantized` takes."""
        s, normed, data, scales = add_rms_norm_fp8(h, y, TensorValue(self.weight), self.eps,
                                                   block, DTYPE)
        assert s is not None  # keep_sum: the residual stream goes on
        return s, normed, (data, scales)

    def last(self, h: TensorValue, y: TensorValue | None) -> TensorValue:
        """`add` where the residual stream ends (the final norm): the norm of h + y in bf16
        [T, size]; the sum is not written."""
        return add_rms_norm(h, y, TensorValue(self.weight), self.eps, DTYPE, keep_sum=False)[1]


def widened_buffer(w: np.ndarray) -> Buffer:
    """The host buffer of a weight the graph reads in float32 (an `RMSNorm` weight, the LM
    head): w rounded to bf16 (the checkpoint's values), stored as float32, so that no step
    spends a kernel casting it."""
    return to_buffer(to_numpy(to_buffer(w, DTYPE)), DType.float32)


def _bf16(x: TensorValue) -> TensorValue:
    return ops.cast(x, DTYPE)


def _f32(x: TensorValue) -> TensorValue:
    return ops.cast(x, DType.float32)


def flash_attention(kv_params: MHAKVCacheParams, q: TensorValue, offsets: TensorValue,
                    kv: PagedCacheValues, layer_idx: int, head_dim: int) -> TensorValue:
    """q bf16 [T, n · head_dim] (n query heads) -> bf16 [T, n · head_dim]: MAX's paged flash
    attention, causal, over layer `layer_idx` of `kv` (whose heads `kv_params` describes)."""
    t, width = q.shape[0], int(q.shape[1])
    out = flash_attention_ragged(
        kv_params, ops.reshape(q, [t, width // head_dim, head_dim]), offsets, kv,
        ops.constant(layer_idx, DType.uint32, device=DeviceRef.CPU()),
        MHAMaskVariant.CAUSAL_MASK, scale=1.0 / float(np.sqrt(head_dim)))
    return ops.reshape(out, [t, width])


def logits_and_next(normed: TensorValue, lm_head: TensorValue,
                    offsets: TensorValue) -> tuple[TensorValue, TensorValue]:
    """normed float32 [T, H] (the final norm's bf16 values), lm_head float32 [V, H] (bf16 values),
    input_row_offsets uint32 [B + 1] -> (logits float32 [T, V], the greedy next token int64 [B]
    of each sequence: argmax at its last new token)."""
    # computed as normed · lm_headᵀ. The other form, (lm_head · normedᵀ)ᵀ with the tokens on
    # the product's column side (4x faster at 8 tokens), makes MAX's float32 GPU result
    # wrong at one token and H = 2048 (rel. error 1.0 against float64 on an H100; right at
    # H = 256 and at 8 tokens): a silent wrong answer at batch-1 decode. This form is right at
    # every T tested, takes 1.7 µs at one token and a split-K kernel of ~32 µs at 8 x 2048 x 256.
    logits = ops.matmul(normed, lm_head.T)
    last = ops.max(ops.cast(offsets, DType.int64)[1:] - 1, 0)
    next_ids = ops.argmax(ops.gather(logits, last, axis=0), axis=-1)
    return logits, ops.reshape(next_ids, [next_ids.shape[0]])


class DecoderLayer(Module):
    """One pre-norm decoder layer (attention over the paged cache, then the MoE FFN)."""

    def __init__(self, config: DecoderConfig, layer_idx: int, device: DeviceRef,
                 kv_devices: Sequence[DeviceRef] | None = None) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        h, g = config.hidden_size, config.int4_group_size
        self.attn_norm = RMSNorm(h, config.rms_eps, device)
        self.q_proj = Int4Linear(h, config.q_size, group_size=g, dtype=DTYPE, device=device)
        self.kv_proj = PagedKVProjection(config.kv_params(kv_devices or device), h, layer_idx,
                                         dtype=DTYPE, device=device, block=FP8_BLOCK)
        self.o_proj = Int4Linear(config.q_size, h, group_size=g, dtype=DTYPE, device=device)
        self.ffn_norm = RMSNorm(h, config.rms_eps, device)
        self.moe = MoEBlock(h, config.moe_intermediate_size, config.num_experts, config.top_k,
                            dtype=DTYPE, device=device)

    def attention(self, x: TensorValue, x_fp8: tuple[TensorValue, TensorValue],
                  offsets: TensorValue, kv: PagedCacheValues,
                  layout: TokenLayout | None) -> TensorValue:
        """x bf16 [T, H] (normed) and its e4m3 quantization x_fp8 (data, scales) -> bf16
        [T, q_size]: causal attention over the paged cache.

        Writes this step's K and V first (`PagedKVProjection.write_quantized` of x_fp8), then
        either reads the layer's pages back through each token's lookup-table row (`layout`,
        "graph" attention) or runs MAX's flash kernel over the cache (`layout` None, "flash"
        attention).
        """
        c = self.config
        t = x.shape[0]
        hk, grp, d = c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim
        self.kv_proj.write_quantized(*x_fp8, offsets, kv)
        if layout is None:
            return flash_attention(c.kv_params(x.device), self.q_proj(x), offsets, kv,
                                   self.layer_idx, d)
        q = ops.reshape(_f32(self.q_proj(x)), [t, hk, grp, d])
        blocks = ops.buffer_load(kv.kv_blocks)  # after the in-place K/V writes (buffer chain)
        p = layout.pages.shape[1]

        def gathered(half: int) -> TensorValue:  # [T, S, Hk, D] float32
            pages = blocks[:, half, self.layer_idx]  # [pages, page, Hk, D]
            per_token = ops.gather(pages, layout.pages, axis=0)  # [T, P, page, Hk, D]
            return _f32(ops.reshape(per_token, [t, p * c.page_size, hk, d]))

        # Both products as broadcast multiply + sum rather than batched matmuls: these are
        # test-sized graphs (the benchmark sizes run "flash"), and a batched matmul costs each
        # graph compile ~30 CPU-s where the elementwise product and reduction cost next to nothing.
        k = ops.unsqueeze(ops.permute(gathered(0), [0, 2, 1, 3]), 2)  # [T, Hk, 1, S, D]
        v = ops.unsqueeze(ops.permute(gathered(1), [0, 2, 1, 3]), 2)  # [T, Hk, 1, S, D]
        scores = ops.squeeze(ops.sum(ops.unsqueeze(q, 3) * k, axis=-1), -1)  # [T, Hk, G, S]
        scores = scores * (1.0 / float(np.sqrt(d)))
        mask = ops.unsqueeze(ops.unsqueeze(layout.mask, 1), 1)  # [T, 1, 1, S]
        # probabilities rounded to bf16 before P·V, as flash-attention kernels do
        probs = _f32(_bf16(ops.softmax(ops.where(mask, scores, _MASKED))))
        out = ops.squeeze(ops.sum(ops.unsqueeze(probs, -1) * v, axis=3), 3)  # [T, Hk, G, D]
        return _bf16(ops.reshape(out, [t, c.q_size]))

    def __call__(self, h: TensorValue, pending: TensorValue | None, offsets: TensorValue,
                 kv: PagedCacheValues,
                 layout: TokenLayout | None) -> tuple[TensorValue, TensorValue]:
        """(h, pending) -> (h', pending'): the residual stream is h + pending, its last branch
        output not yet added, so that each add runs inside the next norm's kernel
        (`RMSNorm.add`). h float32 [T, H] (the bf16 embeddings before the first layer), pending
        bf16 [T, H] or None; returns h' float32 [T, H] (after attention's add) and this
        layer's MoE output bf16 [T, H]. `layout` None: flash attention."""
        h, x, x_fp8 = self.attn_norm.add_fp8(h, pending, self.kv_proj.block)
        attn = self.attention(x, x_fp8, offsets, kv, layout)
        h, x = self.ffn_norm.add(h, self.o_proj(attn))
        return h, self.moe(x)


class MoEDecoder(Module):
    """The example decoder: embedding, `num_layers` `DecoderLayer`s, final norm, LM head.

    Weights: `embed_weight` bf16 [V, H], `layers.{i}.…` (see `DecoderLayer`),
    `final_norm.weight` float32 [H] and `lm_head_weight` float32 [V, H] (bf16 values, as
    `widened_buffer` stores them); fill them with
    `load_state_dict(model.state(weights))`. Call it with the graph inputs of
    `graph_input_types` (tokens, input_row_offsets, PagedCacheValues) to get
    (logits float32 [T, V], next token int64 [B]). `kv_devices`: the devices the layers' K/V
    projections split their heads over (default: `device` alone; `ShardedMoEDecoder` passes
    all of its devices).
    """

    def __init__(self, config: DecoderConfig, device: DeviceRef,
                 kv_devices: Sequence[DeviceRef] | None = None) -> None:
        super().__init__()
        self.config, self.device = config, device
        v, h = config.vocab_size, config.hidden_size
        self.embed_weight = Weight("embed_weight", DTYPE, [v, h], device)
        self.layers = LayerList([DecoderLayer(config, i, device, kv_devices)
                                 for i in range(config.num_layers)])
        self.final_norm = RMSNorm(h, config.rms_eps, device)
        self.lm_head_weight = Weight("lm_head_weight", DType.float32, [v, h], device)

    def __call__(self, tokens: TensorValue, offsets: TensorValue,
                 kv: PagedCacheValues) -> tuple[TensorValue, TensorValue]:
        """tokens int64 [T], input_row_offsets uint32 [B + 1], the cache values ->
        (logits float32 [T, vocab], next token int64 [B]); writes this step's K/V."""
        t = tokens.shape[0]
        layout = (token_layout(t, offsets, kv, self.config.page_size)
                  if self.config.attention == "graph" else None)
        h: TensorValue = ops.gather(TensorValue(self.embed_weight), tokens, axis=0)
        pending: TensorValue | None = None
        for layer in self.layers:
            h, pending = layer(h, pending, offsets, kv, layout)
        return logits_and_next(_f32(self.head_input(h, pending)),
                               TensorValue(self.lm_head_weight), offsets)

    def head_input(self, h: TensorValue, pending: TensorValue | None) -> TensorValue:
        """The final norm of the residual stream h + pending (`DecoderLayer`), bf16 [T, H]."""
        return self.final_norm.last(h, pending)

    def state(self, weights: DecoderWeights) -> dict[str, Buffer]:
        """The state dict (graph weight names -> host buffers) of `weights`."""
        if weights.config != self.config:
            raise ValueError("MoEDecoder: weights were made for another DecoderConfig")
        state = {"embed_weight": to_buffer(weights.embed, DTYPE),
                 "final_norm.weight": widened_buffer(weights.final_norm),
                 "lm_head_weight": widened_buffer(weights.lm_head)}
        for i, (layer, w) in enumerate(zip(self.layers, weights.layers, strict=True)):
            parts = {
                "attn_norm.weight": widened_buffer(w.attn_norm),
                "ffn_norm.weight": widened_buffer(w.ffn_norm),
                **{f"q_proj.{k}": b for k, b in layer.q_proj.int4_state(w.q).items()},
                **{f"o_proj.{k}": b for k, b in layer.o_proj.int4_state(w.o).items()},
                **{f"kv_proj.{k}": b for k, b in layer.kv_proj.fp8_state(w.k, w.v).items()},
                **{f"moe.{k}": b for k, b in
                   layer.moe.moe_state(w.router, w.gate, w.up, w.down).items()},
            }
            state.update({f"layers.{i}.{k}": b for k, b in parts.items()})
        return state


def graph_input_types(config: DecoderConfig,
                      device: DeviceRef) -> list[TensorType | BufferType]:
    """tokens int64 ["total_tokens"], input_row_offsets uint32 ["batch_plus_one"], then the
    paged cache's inputs as MAX declares them (`get_symbolic_inputs`): kv_blocks, cache_lengths,
    lookup_table, max_prompt_length, max_cache_length, page_stride, and for "flash" attention
    the attention dispatch metadata (int64 [4] on the CPU: batch size, max prompt length,
    decode partitions, max cache length; `MHAAttnKey`)."""
    cache = config.kv_params(device).get_symbolic_inputs()[0]
    types = [TensorType(DType.int64, ["total_tokens"], device),
             TensorType(DType.uint32, ["batch_plus_one"], device),
             cache.kv_blocks, cache.cache_lengths, cache.lookup_table, cache.max_prompt_length,
             cache.max_cache_length, cache.page_stride]
    if config.attention == "flash":
        assert cache.attention_dispatch_metadata is not None  # MHA params always declare it
        types.append(cache.attention_dispatch_metadata)
    return types


def build_graph(model: Module, module: GraphModule | None = None) -> Graph:
    """The decoder's one graph (symbolic tokens, batch, pages): serves prefill and decode.

    `model`: a `MoEDecoder`, or any module with its call signature and `config` / `device`
    attributes (e.g. a variant built from other ops). `module`: the `max.graph.Module` to build
    it in (to compile it with other graphs at once), default a new one."""
    config: DecoderConfig = model.config
    types = graph_input_types(config, model.device)
    with Graph("moe_decoder", input_types=types, module=module) as graph:
        tokens, offsets, blocks, lengths, lut, max_prompt, max_cache, stride, *meta = graph.inputs
        kv = PagedCacheValues(kv_blocks=blocks.buffer, cache_lengths=lengths.tensor,
                              lookup_table=lut.tensor, max_prompt_length=max_prompt.tensor,
                              max_cache_length=max_cache.tensor, page_stride=stride.tensor,
                              attention_dispatch_metadata=meta[0].tensor if meta else None)
        graph.output(*model(tokens.tensor, offsets.tensor, kv))
    return graph

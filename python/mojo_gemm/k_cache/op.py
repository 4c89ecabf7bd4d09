"""Graph functions of the FP8 KV-cache projections: `k_matmul_ragged_paged_scale`, its V twin
`v_matmul_ragged_paged_scale` and both in one op, `kv_matmul_ragged_paged_scale`.

The K function is a drop-in for MAX's `max.nn.kernels.matmul_k_cache_ragged_scaled_float8`
(same arguments, same cache, same math) emitting our `k_matmul_ragged_paged_scale` Mojo op, plus
`kv_scale` for an fp8 cache. The V function takes the same arguments and runs the same kernels
(op `v_matmul_ragged_paged_scale`), writing the cache's V half instead. Both write into the
cache in place (ops.inplace_custom) and return nothing. The fused function takes a K and a V
weight and writes both halves in one op: one kernel launch for both at decode, where the two
launches' latency is most of the cost.

On CPU, MAX 26.7 graphs cannot hold float8 tensors: pass uint8 tensors holding the e4m3fn bits
(hidden_state, weight, and the blocks of an fp8 cache); `fp8_dtype_for(device)` says which dtype
a graph input needs and `mojo_gemm.fp8_buffer` makes the matching Buffer. The call
itself is the same on both devices.
"""

from __future__ import annotations

from collections.abc import Sequence

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, ops
from max.nn.kv_cache import KVCacheParams, PagedCacheValues

from ..core.extension import ensure_kernels_loaded
from ..core.rules import DEVICE, Contract, check_types
from ..core.targets import op_target_parameters
from ..fp8.contract import FP8, FP8_BITS
from .contract import (
    K_MATMUL_RAGGED_PAGED_SCALE,
    KV_MATMUL_RAGGED_PAGED_SCALE,
    V_MATMUL_RAGGED_PAGED_SCALE,
)


def fp8_dtype_for(device: DeviceRef) -> DType:
    """The graph dtype of fp8 data on `device`: float8_e4m3fn on GPU, uint8 (bits) on CPU."""
    check_types("fp8_dtype_for", {"device": device}, {"device": DEVICE})
    return FP8_BITS if device.is_cpu() else FP8


def k_matmul_ragged_paged_scale(
    kv_params: KVCacheParams,
    hidden_state: TensorValue,
    input_row_offsets: TensorValue,
    weight: TensorValue,
    input_scale: TensorValue,
    weight_scale: TensorValue,
    kv_collection: PagedCacheValues,
    scales_granularity_mnk: Sequence[int],
    layer_idx: int | TensorValue,
    kv_scale: TensorValue | None = None,
) -> None:
    """Projects FP8 tokens with a block-scaled FP8 weight and writes K into the paged cache.

    k[t, n] = Σ_k a[t, k]·w[n, k]·input_scale[k//gk, t//gm]·weight_scale[n//gn, k//gk] in
    fp32, for (gm, gn, gk) = scales_granularity_mnk (any positive values). Token t of
    sequence b (input_row_offsets[b] <= t < input_row_offsets[b+1]) is stored at position
    cache_lengths[b] + t − offsets[b]: page lookup_table[b, pos // page_size], slot
    pos % page_size, K half, layer `layer_idx`, head n // head_dim, dim n % head_dim. Nothing
    else in the cache changes. A bf16 cache gets round-to-nearest of k; an fp8 cache gets
    round(k / kv_scale) (kv_scale per tensor [1] or per head [n_kv_heads]; None means 1).

    hidden_state [T, K] and weight [N, K]: float8_e4m3fn on GPU, uint8 e4m3fn bits on CPU;
    N = n_kv_heads·head_dim; input_row_offsets uint32 [B + 1]; input_scale float32
    [ceil(K/gk), >= ceil(T/gm)] (tokens contiguous, padded rows allowed); weight_scale float32
    [ceil(N/gn), ceil(K/gk)]; kv_collection: MAX's PagedCacheValues for `kv_params`;
    layer_idx: int or a uint32 scalar on CPU.

    Runtime data (offsets, cache lengths, lookup table) is trusted, but never used to write
    outside kv_blocks: a token outside [offsets[0], offsets[B]), or whose page column is past
    the lookup table's width, or whose page id is >= kv_blocks.shape[0], is skipped. With a
    padded page_stride the blocks' allocation must span pages · page_stride elements (MAX's
    allocator guarantees it). Raises TypeError / ValueError
    (`contracts.K_MATMUL_RAGGED_PAGED_SCALE`) at graph build time for bad shapes, dtypes or
    devices, and ValueError for a GPU target no kernel path supports (`mojo_gemm.core.targets`).
    """
    _kv_matmul(
        K_MATMUL_RAGGED_PAGED_SCALE,
        kv_params,
        hidden_state,
        input_row_offsets,
        weight,
        input_scale,
        weight_scale,
        kv_collection,
        scales_granularity_mnk,
        layer_idx,
        kv_scale,
    )


def v_matmul_ragged_paged_scale(
    kv_params: KVCacheParams,
    hidden_state: TensorValue,
    input_row_offsets: TensorValue,
    weight: TensorValue,
    input_scale: TensorValue,
    weight_scale: TensorValue,
    kv_collection: PagedCacheValues,
    scales_granularity_mnk: Sequence[int],
    layer_idx: int | TensorValue,
    kv_scale: TensorValue | None = None,
) -> None:
    """The V twin of `k_matmul_ragged_paged_scale`: same arguments, math and kernels, writing
    v[t, n] = Σ_k a[t, k]·w[n, k]·input_scale[k//gk, t//gm]·weight_scale[n//gn, k//gk] into
    the V half of layer `layer_idx` (kv_blocks[page, 1, layer, slot, head, dim]); the K half and
    everything else in the cache are left unchanged. Shapes, dtypes, skipping rules and errors
    are those of the K function (`contracts.V_MATMUL_RAGGED_PAGED_SCALE`).
    """
    _kv_matmul(
        V_MATMUL_RAGGED_PAGED_SCALE,
        kv_params,
        hidden_state,
        input_row_offsets,
        weight,
        input_scale,
        weight_scale,
        kv_collection,
        scales_granularity_mnk,
        layer_idx,
        kv_scale,
    )


def kv_matmul_ragged_paged_scale(
    kv_params: KVCacheParams,
    hidden_state: TensorValue,
    input_row_offsets: TensorValue,
    k_weight: TensorValue,
    v_weight: TensorValue,
    input_scale: TensorValue,
    k_weight_scale: TensorValue,
    v_weight_scale: TensorValue,
    kv_collection: PagedCacheValues,
    scales_granularity_mnk: Sequence[int],
    layer_idx: int | TensorValue,
    kv_scale: TensorValue | None = None,
) -> None:
    """`k_matmul_ragged_paged_scale` with (k_weight, k_weight_scale) and
    `v_matmul_ragged_paged_scale` with (v_weight, v_weight_scale) on the same tokens, in one op.

    The K and V halves of layer `layer_idx` get exactly what the two ops write (same kernels,
    same sums; at decode one launch does both). k_weight, v_weight [N, K] and their scales
    [ceil(N/gn), ceil(K/gk)] as the K op's weight and weight_scale; kv_scale (fp8 cache only):
    None (1), float32 [2] (K's, V's) or [2·n_kv_heads] (K's per head, then V's). Everything
    else, the skipping rules and the errors are the K op's
    (`contracts.KV_MATMUL_RAGGED_PAGED_SCALE`).
    """
    args = {
        "kv_params": kv_params,
        "hidden_state": hidden_state,
        "input_row_offsets": input_row_offsets,
        "k_weight": k_weight,
        "v_weight": v_weight,
        "input_scale": input_scale,
        "k_weight_scale": k_weight_scale,
        "v_weight_scale": v_weight_scale,
        "kv_collection": kv_collection,
        "scales_granularity_mnk": _granularity_arg(scales_granularity_mnk),
        "layer_idx": layer_idx,
        "kv_scale": kv_scale,
    }
    KV_MATMUL_RAGGED_PAGED_SCALE.validate(args)
    _emit(
        KV_MATMUL_RAGGED_PAGED_SCALE.op,
        [hidden_state, input_row_offsets, k_weight, v_weight, input_scale, k_weight_scale,
         v_weight_scale],
        kv_collection,
        scales_granularity_mnk,
        layer_idx,
        kv_scale,
        halves=2,
    )


def _granularity_arg(g: Sequence[int]) -> object:
    """scales_granularity_mnk as the contract sees it (a tuple when it is a sequence)."""
    return tuple(g) if isinstance(g, (tuple, list)) else g


def _kv_matmul(
    contract: Contract,
    kv_params: KVCacheParams,
    hidden_state: TensorValue,
    input_row_offsets: TensorValue,
    weight: TensorValue,
    input_scale: TensorValue,
    weight_scale: TensorValue,
    kv_collection: PagedCacheValues,
    scales_granularity_mnk: Sequence[int],
    layer_idx: int | TensorValue,
    kv_scale: TensorValue | None,
) -> None:
    """Checks `contract` and emits its op (contract.op is the registered Mojo op's name)."""
    args = {
        "kv_params": kv_params,
        "hidden_state": hidden_state,
        "input_row_offsets": input_row_offsets,
        "weight": weight,
        "input_scale": input_scale,
        "weight_scale": weight_scale,
        "kv_collection": kv_collection,
        "scales_granularity_mnk": _granularity_arg(scales_granularity_mnk),
        "layer_idx": layer_idx,
        "kv_scale": kv_scale,
    }
    contract.validate(args)
    _emit(
        contract.op,
        [hidden_state, input_row_offsets, weight, input_scale, weight_scale],
        kv_collection,
        scales_granularity_mnk,
        layer_idx,
        kv_scale,
        halves=1,
    )


def _emit(
    op: str,
    operands: list[TensorValue],
    kv_collection: PagedCacheValues,
    scales_granularity_mnk: Sequence[int],
    layer_idx: int | TensorValue,
    kv_scale: TensorValue | None,
    halves: int,
) -> None:
    """Emits the in-place op `op` on checked operands (hidden_state first); kv_scale None
    becomes `halves` ones."""
    ensure_kernels_loaded()
    gm, gn, gk = scales_granularity_mnk
    device = operands[0].device
    if isinstance(layer_idx, int):
        layer_idx = ops.constant(layer_idx, DType.uint32, device=DeviceRef.CPU())
    if kv_scale is None:
        kv_scale = ops.constant([1.0] * halves, DType.float32, device=device)
    ops.inplace_custom(
        op,
        device,
        [
            *operands,
            kv_scale,
            *kv_collection.flatten_without_attention_dispatch_metadata(),
            layer_idx,
        ],
        parameters={
            "m_scale_granularity": int(gm),
            "n_scale_granularity": int(gn),
            "k_scale_granularity": int(gk),
            **op_target_parameters(op, device),
        },
    )

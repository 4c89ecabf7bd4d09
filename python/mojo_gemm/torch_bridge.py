"""PyTorch bridge: the package's three ops called on `torch.Tensor`s through MAX.

Built on `max.experimental.torch`: one `CustomOpLibrary` over this package's Mojo kernels (one
kernel load, one inference session) and, per op configuration, a MAX graph registered as a
`torch.library` custom op by the machinery behind `max.experimental.torch.graph_op` (its
`MaxOp`), bound to that library. The graph calls this package's graph functions
(`int4_matmul`, `grouped_matmul`, `k_matmul_ragged_paged_scale`), so the contracts, the
act-order permutation and the K padding are the same as in a MAX model. The raw ops of
`CustomOpLibrary` (`library().multistage_gemm_q[...]`) are not used directly: they take the
padded, permuted operands, and the K-cache op writes in place into a buffer, which a
`CustomOpLibrary` op (an `ops.custom` with fresh outputs) cannot express.

Token dimensions (M, T, batch, pages) are symbolic: one compiled graph serves every size; a
new configuration (dtype, N, K, group size, device, ...) compiles once (15-60 s on CPU).

torch is imported lazily (it is not a dependency of the package); `max.experimental.torch`
itself needs torch >= 2.7. Tensors reach MAX through DLPack, including uint32 and
float8_e4m3fn ones. All tensors of one call must be on one device ("cpu" or "cuda:i"), except
the CPU scalars noted below; CPU graphs cannot hold float8, so on the CPU fp8 data is passed
as uint8 e4m3 bits (this module converts float8_e4m3fn tensors with a free `.view`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, ops
from max.nn.kv_cache import MHAKVCacheParams, PagedCacheValues

from .core.extension import kernels_package
from .grouped.op import grouped_matmul as _grouped_matmul
from .int4.op import Int4WeightValues
from .int4.op import int4_matmul as _int4_matmul
from .int4.quant import Int4Weight
from .k_cache.op import k_matmul_ragged_paged_scale as _k_matmul

if TYPE_CHECKING:
    import torch
    from max.experimental.torch import CustomOpLibrary


def _torch() -> Any:
    """The torch module; ImportError with the install hint when it is missing."""
    try:
        import torch
    except ImportError as err:
        raise ImportError(
            "mojo_gemm.torch_bridge needs PyTorch (>= 2.7): pip install torch"
        ) from err
    return torch


@cache
def library() -> CustomOpLibrary:
    """The `CustomOpLibrary` of this package's kernels (loaded once, ~20 s).

    Built on the precompiled `kernels_package()`, the library the graph functions add to every
    graph: a process that also loaded the source directory would hold two definitions of each
    op, which crashes MAX 26.7's compile on a GPU).
    """
    _torch()
    from max.experimental.torch import CustomOpLibrary

    return CustomOpLibrary(kernels_package())


_OPS: dict[tuple, Callable[..., None]] = {}
"""Registered torch custom ops, one per configuration key."""


def _custom_op(
    key: tuple,
    fn: Callable[..., Any],
    input_types: Sequence[TensorType],
    output_types: Sequence[TensorType],
) -> Callable[..., None]:
    """The torch op (destination-passing: outputs first, mutated) running `fn` in a graph."""
    if key not in _OPS:
        from max.experimental.torch.torch import MaxOp

        name = f"mojo_gemm_{key[0]}_{len(_OPS)}"
        _OPS[key] = MaxOp(
            fn, name, library(), input_types=input_types, output_types=output_types,
            num_outputs=len(output_types),
        ).custom_op_def()
    return _OPS[key]


def _device_ref(device: torch.device) -> DeviceRef:
    if device.type == "cpu":
        return DeviceRef.CPU()
    if device.type == "cuda":
        return DeviceRef.GPU(device.index or 0)
    raise ValueError(f"device: expected a cpu or cuda tensor, got {device}")


def _max_dtype(dtype: torch.dtype) -> DType:
    from max.experimental.torch import torch_dtype_to_max

    return torch_dtype_to_max(dtype)


def _u32(t: torch.Tensor) -> torch.Tensor:
    """An integer tensor as uint32 (non-negative values): int32 is reinterpreted (a free view,
    which every torch 2.x supports for uint32, unlike casts), other dtypes go through int32."""
    torch = _torch()
    if t.dtype == torch.uint32:
        return t.contiguous()
    return t.to(torch.int32).contiguous().view(torch.uint32)


def _same_device(device: torch.device, **tensors: torch.Tensor | None) -> None:
    """ValueError naming the first tensor not on `device`."""
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{name}: expected a tensor on {device}, got {t.device}")


# --------------------------------------------------------------------------------------------
# int4


@dataclass(frozen=True)
class TorchInt4Weight:
    """A packed int4 weight (`mojo_gemm.int4.layout`) as torch tensors on one device.

    qweight: uint32 [Np/64, Kp*8]; scales: the activation dtype [groups, Np]; zeros: same, or
    None (symmetric); perm: int64 [k] or None (act-order); n, k, group_size as `Int4Weight`.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    perm: torch.Tensor | None
    n: int
    k: int
    group_size: int

    @classmethod
    def from_int4(
        cls, weight: Int4Weight, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> TorchInt4Weight:
        """Copies an `Int4Weight` to `device`; scales/zeros rounded to `dtype` (bf16/fp16)."""
        torch = _torch()

        def params(a: np.ndarray | None) -> torch.Tensor | None:
            return None if a is None else torch.from_numpy(a).to(device=device, dtype=dtype)

        scales = params(weight.scales)
        assert scales is not None
        return cls(
            qweight=torch.from_numpy(np.ascontiguousarray(weight.qweight)).to(device),
            scales=scales,
            zeros=params(weight.zeros),
            perm=None if weight.perm is None else torch.from_numpy(weight.perm).to(device),
            n=weight.n,
            k=weight.k,
            group_size=weight.group_size,
        )


def int4_matmul(
    x: torch.Tensor, weight: TorchInt4Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """y = x · dequant(weight)ᵀ (+ bias) with the `multistage_gemm_q` op.

    x: bfloat16/float16 [..., K] on the weight's device; bias: x's dtype [N] or None.
    Returns x's dtype [..., N]. Shape, dtype and device rules are `contracts.INT4_MATMUL`
    (raised when the op's graph is first built) plus a ValueError here for x's last dim.
    """
    torch = _torch()
    if x.shape[-1] != weight.k:
        raise ValueError(f"x: expected last dim K = {weight.k}, got shape {tuple(x.shape)}")
    _same_device(x.device, qweight=weight.qweight, bias=bias)
    dev, dtype = _device_ref(x.device), _max_dtype(x.dtype)
    has_zeros, has_perm, has_bias = (weight.zeros is not None, weight.perm is not None,
                                     bias is not None)
    key = ("int4", str(x.device), dtype, weight.n, weight.k, weight.group_size, has_zeros,
           has_perm, has_bias)

    def fn(x: TensorValue, qweight: TensorValue, scales: TensorValue, zeros: TensorValue,
           perm: TensorValue, bias: TensorValue) -> TensorValue:
        values = Int4WeightValues(
            qweight=qweight, scales=scales, zeros=zeros if has_zeros else None,
            perm=perm if has_perm else None, n=weight.n, k=weight.k,
            group_size=weight.group_size,
        )
        return _int4_matmul(x, values, bias if has_bias else None)

    scales_t = TensorType(dtype, list(weight.scales.shape), dev)
    op = _custom_op(
        key, fn,
        [TensorType(dtype, ["m", weight.k], dev),
         TensorType(DType.uint32, list(weight.qweight.shape), dev), scales_t, scales_t,
         TensorType(DType.int64, [weight.k if has_perm else 1], dev),
         TensorType(dtype, [weight.n if has_bias else 1], dev)],
        [TensorType(dtype, ["m", weight.n], dev)],
    )
    rows = x.reshape(-1, weight.k).contiguous()
    out = x.new_empty((rows.shape[0], weight.n))
    # Absent operands are never read by the graph; any tensor of the declared type stands in.
    op(out, rows, weight.qweight, weight.scales,
       weight.zeros if has_zeros else weight.scales,
       weight.perm if has_perm else torch.zeros(1, dtype=torch.int64, device=x.device),
       bias.contiguous() if has_bias else x.new_zeros(1))
    return out.reshape(*x.shape[:-1], weight.n)


# --------------------------------------------------------------------------------------------
# grouped


def grouped_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    a_offsets: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_usage_stats: torch.Tensor,
    *,
    swiglu: bool = False,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """c[r] = a[r] · b[expert of r's group]ᵀ (`grouped_matmul_sm100_persistent`), torch in/out.

    a: bfloat16/float16 [T, K] sorted by group; b: a's dtype [E, N, K]; a_offsets [G + 1],
    expert_ids [G], expert_usage_stats [2]: any integer dtype (converted to uint32 / int32 /
    uint32); row_scale: float32 [T] or None. Returns a's dtype [T, N] ([T, N/2] with swiglu);
    rows of inactive groups are 0. Rules: `contracts.GROUPED_MATMUL`.
    """
    torch = _torch()
    _same_device(a.device, b=b, a_offsets=a_offsets, expert_ids=expert_ids,
                 expert_usage_stats=expert_usage_stats, row_scale=row_scale)
    dev, dtype = _device_ref(a.device), _max_dtype(a.dtype)
    e, n, k = (int(d) for d in b.shape)
    groups = int(expert_ids.shape[0])
    has_scale = row_scale is not None
    n_out = n // 2 if swiglu else n
    key = ("grouped", str(a.device), dtype, e, n, k, groups, swiglu, has_scale)

    def fn(a: TensorValue, b: TensorValue, a_offsets: TensorValue, expert_ids: TensorValue,
           stats: TensorValue, row_scale: TensorValue) -> TensorValue:
        out = _grouped_matmul(a, b, a_offsets, expert_ids, stats, swiglu=swiglu,
                              row_scale=row_scale if has_scale else None)
        assert out is not None
        return out

    op = _custom_op(
        key, fn,
        [TensorType(dtype, ["t", k], dev), TensorType(dtype, [e, n, k], dev),
         TensorType(DType.uint32, [groups + 1], dev), TensorType(DType.int32, [groups], dev),
         TensorType(DType.uint32, [2], dev),
         TensorType(DType.float32, ["t" if has_scale else 1], dev)],
        [TensorType(dtype, ["t", n_out], dev)],
    )
    out = a.new_zeros((a.shape[0], n_out))
    op(out, a.contiguous(), b.contiguous(), _u32(a_offsets),
       expert_ids.to(torch.int32).contiguous(), _u32(expert_usage_stats),
       row_scale.contiguous() if has_scale
       else torch.ones(1, dtype=torch.float32, device=a.device))
    return out


# --------------------------------------------------------------------------------------------
# K cache


def _fp8_for(t: torch.Tensor) -> torch.Tensor:
    """fp8 data as the graph needs it: uint8 bits on CPU, float8_e4m3fn on GPU (free views)."""
    torch = _torch()
    if t.device.type == "cpu":
        return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
    return t.view(torch.float8_e4m3fn) if t.dtype == torch.uint8 else t


def k_matmul_ragged_paged_scale(
    kv_blocks: torch.Tensor,
    cache_lengths: torch.Tensor,
    lookup_table: torch.Tensor,
    hidden_state: torch.Tensor,
    input_row_offsets: torch.Tensor,
    weight: torch.Tensor,
    input_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    *,
    layer_idx: int,
    scales_granularity_mnk: tuple[int, int, int] = (1, 128, 128),
    kv_scale: torch.Tensor | None = None,
    max_prompt_length: int | None = None,
    max_cache_length: int | None = None,
) -> None:
    """Projects FP8 tokens and writes K into a paged cache held by torch, in place.

    The paged cache is given as its parts (MAX's `PagedCacheValues` without the scalars):
      kv_blocks: contiguous [pages, 2, L, page_size, H, D] of bfloat16, or of float8_e4m3fn
        (uint8 e4m3 bits are accepted too; on the CPU either one is passed as bits): MAX's
        paged layout (K half = index 0 of dim 1). Mutated in place.
      cache_lengths: [B] tokens already cached per sequence; lookup_table: [B, max_pages]
        logical → physical page; both any integer dtype (converted to uint32).
    Op operands, as in `mojo_gemm.k_matmul_ragged_paged_scale`: hidden_state fp8 [T, K],
    input_row_offsets [B + 1] (integer), weight fp8 [N = H·D, K], input_scale float32
    [ceil(K/gk), >= ceil(T/gm)], weight_scale float32 [ceil(N/gn), ceil(K/gk)], kv_scale
    float32 [1] or [H] (fp8 cache only; None = 1). fp8 operands may be float8_e4m3fn or uint8
    bits. layer_idx: int in [0, L) (passed as a CPU scalar: every layer shares one graph).
    max_prompt_length / max_cache_length: MAX's cache scalars, only carried by the op
    (defaults: T and max_pages · page_size, upper bounds known without a device sync).
    Rules: `contracts.K_MATMUL_RAGGED_PAGED_SCALE`.
    """
    torch = _torch()
    device = hidden_state.device
    _same_device(device, kv_blocks=kv_blocks, cache_lengths=cache_lengths,
                 lookup_table=lookup_table, input_row_offsets=input_row_offsets,
                 weight=weight, input_scale=input_scale, weight_scale=weight_scale,
                 kv_scale=kv_scale)
    if kv_blocks.dim() != 6 or not kv_blocks.is_contiguous():
        raise ValueError(
            "kv_blocks: expected a contiguous [pages, 2, L, page_size, H, D] tensor, got "
            f"shape {tuple(kv_blocks.shape)} (contiguous={kv_blocks.is_contiguous()})"
        )
    if not isinstance(layer_idx, int):
        raise TypeError(f"layer_idx: expected an int, got {type(layer_idx).__name__}")
    fp8_cache = kv_blocks.dtype in (torch.float8_e4m3fn, torch.uint8)
    blocks = _fp8_for(kv_blocks) if fp8_cache else kv_blocks
    hidden, w = _fp8_for(hidden_state), _fp8_for(weight)
    dev = _device_ref(device)
    _, _, layers, page_size, heads, head_dim = (int(d) for d in kv_blocks.shape)
    n, k = (int(d) for d in weight.shape)
    cache_dtype = DType.float8_e4m3fn if fp8_cache else _max_dtype(kv_blocks.dtype)
    in_dtype = _max_dtype(hidden.dtype)
    gran = tuple(int(g) for g in scales_granularity_mnk)
    scale_len = 1 if kv_scale is None else int(kv_scale.shape[0])
    params = MHAKVCacheParams(dtype=cache_dtype, n_kv_heads=heads, head_dim=head_dim,
                              num_layers=layers, page_size=page_size, devices=[dev])
    key = ("kcache", str(device), cache_dtype, layers, page_size, heads, head_dim, n, k,
           in_dtype, gran, scale_len)
    cpu = DeviceRef.CPU()

    def fn(cache_lengths: TensorValue, lookup_table: TensorValue, max_prompt: TensorValue,
           max_cache: TensorValue, hidden: TensorValue, offsets: TensorValue,
           weight: TensorValue, input_scale: TensorValue, weight_scale: TensorValue,
           kv_scale: TensorValue, layer: TensorValue) -> None:
        # The cache is the op's destination: graph input 0, a buffer written in place.
        collection = PagedCacheValues(
            kv_blocks=Graph.current.inputs[0].buffer,
            cache_lengths=cache_lengths,
            lookup_table=lookup_table,
            max_prompt_length=max_prompt,
            max_cache_length=max_cache,
            page_stride=ops.constant(np.array([-1], np.int64), DType.int64, device=cpu),
        )
        _k_matmul(params, hidden, offsets, weight, input_scale, weight_scale, collection,
                  gran, layer, kv_scale=kv_scale if fp8_cache else None)

    op = _custom_op(
        key, fn,
        [TensorType(DType.uint32, ["b"], dev),
         TensorType(DType.uint32, ["b", "lut_cols"], dev),
         TensorType(DType.uint32, [1], cpu), TensorType(DType.uint32, [1], cpu),
         TensorType(in_dtype, ["t", k], dev), TensorType(DType.uint32, ["b1"], dev),
         TensorType(in_dtype, [n, k], dev),
         TensorType(DType.float32, [int(input_scale.shape[0]), "ts"], dev),
         TensorType(DType.float32, list(weight_scale.shape), dev),
         TensorType(DType.float32, [scale_len], dev),
         TensorType(DType.uint32, [], cpu)],
        [TensorType(_max_dtype(blocks.dtype), ["pages", *blocks.shape[1:]], dev)],
    )
    tokens, cols = int(hidden.shape[0]), int(lookup_table.shape[1])

    def host_u32(value: int) -> torch.Tensor:
        return _u32(torch.tensor([value]))

    op(blocks, _u32(cache_lengths), _u32(lookup_table),
       host_u32(tokens if max_prompt_length is None else max_prompt_length),
       host_u32(cols * page_size if max_cache_length is None else max_cache_length),
       hidden.contiguous(), _u32(input_row_offsets), w.contiguous(),
       input_scale.contiguous(), weight_scale.contiguous(),
       torch.ones(1, dtype=torch.float32, device=device) if kv_scale is None else kv_scale,
       _u32(torch.tensor(layer_idx)))

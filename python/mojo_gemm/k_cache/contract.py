"""The contracts of the FP8 KV-cache path: `k_matmul_ragged_paged_scale` (FP8 block-scaled K
projection into the cache), its V twin `v_matmul_ragged_paged_scale` (same rules, V half) and the
`PagedKVProjection` layer (construction and call). The activation quantizer `quantize_fp8_rows`
that feeds them has its own contract (`mojo_gemm.fp8.contract`).

Argument names are those of the Python functions; the cache's graph values are named
`kv_collection.<field>`. Rules are checked in order, so a rule may rely on the ones above it.
"""

from __future__ import annotations

from collections.abc import Callable

from max.dtype import DType
from max.graph import DeviceRef, TensorValue

from ..core.rules import (
    DEVICE,
    DTYPE,
    INT,
    INT_SEQ,
    KV_COLLECTION,
    KV_PARAMS,
    TENSOR,
    Args,
    Contract,
    Rule,
    Violation,
    dtype_in,
    layer_attr,
    optional,
    positive_int,
    rank_is,
    same_device,
    shape_of,
)
from ..fp8.contract import FP8, FP8_BITS, QUANTIZE_INPUT_DTYPES, block_scaled_rules

K_CACHE_DTYPES = (DType.bfloat16, DType.float8_e4m3fn)
"""Cache dtypes the op writes: bf16 (plain rounding cast) and fp8 (k / kv_scale, then cast)."""


def _fp8_dtype_on(device: DeviceRef) -> DType:
    return FP8_BITS if device.is_cpu() else FP8


def _coll(a: Args, field: str) -> object:
    return getattr(a["kv_collection"], field)


def _kv_params_dtype(a: Args) -> Violation:
    d = a["kv_params"].dtype
    return None if d in K_CACHE_DTYPES else ("bfloat16 or float8_e4m3fn", d)


def _kv_params_plain(a: Args) -> Violation:
    p = a["kv_params"]
    if p.kvcache_quant_config is None and p.kv_dim == 2 and not p.per_layer_buffers:
        return None
    return (
        "a K/V cache (kv_dim 2) without kvcache_quant_config or per_layer_buffers",
        f"kv_dim {p.kv_dim}, kvcache_quant_config {p.kvcache_quant_config}, "
        f"per_layer_buffers {p.per_layer_buffers}",
    )


def _n(a: Args) -> int:
    p = a["kv_params"]
    return p.n_kv_heads_per_device * p.head_dim


def _blocks_dtype(a: Args) -> Violation:
    blocks = _coll(a, "kv_blocks")
    want = a["kv_params"].dtype
    if want == FP8:
        want = _fp8_dtype_on(blocks.device)
    return None if blocks.dtype == want else (f"{want} on {blocks.device}", blocks.dtype)


def _blocks_shape(a: Args) -> Violation:
    blocks = _coll(a, "kv_blocks")
    got = shape_of(blocks)
    want = list(a["kv_params"].shape_per_block)
    return None if len(got) == 6 and got[1:] == want else (["pages", *want], got)


def _blocks_device(a: Args) -> Violation:
    dev, got = a["hidden_state"].device, _coll(a, "kv_blocks").device
    return None if got == dev else (f"{dev} (the device of hidden_state)", got)


def _no_cache_scales(a: Args) -> Violation:
    c = a["kv_collection"]
    extra = c.kv_scales is not None or c.kv_blocks_per_layer is not None
    return None if not extra else ("kv_scales and kv_blocks_per_layer None", "set")


def _coll_tensor(field: str, dtype: DType, shape: list[int] | int) -> Callable[[Args], Violation]:
    """dtype + exact shape (a list: a CPU tensor) or rank (an int: on hidden_state's device)."""

    def check(a: Args) -> Violation:
        v = _coll(a, field)
        got = shape_of(v)
        if isinstance(shape, list):
            dev, want = DeviceRef.CPU(), f"{dtype} {shape} on CPU"
            shape_ok = got == shape
        else:
            dev, want = (
                a["hidden_state"].device,
                f"{dtype} rank {shape} on {a['hidden_state'].device}",
            )
            shape_ok = len(got) == shape
        ok = v.dtype == dtype and v.device == dev and shape_ok
        return None if ok else (want, f"{v.dtype} {got} on {v.device}")

    return check


def _layer_idx(a: Args) -> Violation:
    v = a["layer_idx"]
    layers = a["kv_params"].num_layers
    if not isinstance(v, TensorValue):
        return None if 0 <= v < layers else (f"an int in [0, {layers})", v)
    ok = v.dtype == DType.uint32 and v.rank == 0 and v.device.is_cpu()
    return (
        None
        if ok
        else ("a uint32 scalar (rank 0) on CPU", f"{v.dtype} rank {v.rank} on {v.device}")
    )


def _kv_scale_for(halves: int) -> Callable[[Args], Violation]:
    """kv_scale: None, or float32 [halves] (per tensor) or [halves · n_kv_heads] (per head), K's
    values first; a float8_e4m3fn cache only."""

    def check(a: Args) -> Violation:
        v = a["kv_scale"]
        if v is None:
            return None
        p = a["kv_params"]
        if p.dtype != FP8:
            return (
                "None (kv_scale applies to a float8_e4m3fn cache only)",
                f"a tensor for a {p.dtype} cache",
            )
        counts = ([halves], [halves * p.n_kv_heads_per_device])
        ok = v.dtype == DType.float32 and shape_of(v) in counts
        return None if ok else (f"float32 {counts[0]} or {counts[1]}", f"{v.dtype} {shape_of(v)}")

    return check



def _summary(half: str) -> str:
    return (
        f"{half.lower()}[t, n] = Σ_k a[t, k]·w[n, k]·input_scale[k//gk, t//gm]·"
        "weight_scale[n//gn, k//gk] (fp32), written in place into the "
        f"{half} half of layer `layer_idx` of MAX's paged cache at position "
        "cache_lengths[b] + t − offsets[b] of token t's sequence b; an fp8 cache stores "
        f"{half.lower()} / kv_scale. Runtime data is trusted, but a row whose page column is "
        "outside the lookup table or whose page id is ≥ the cache's page count is skipped "
        "(never written out of bounds); tokens outside [offsets[0], offsets[B]) are skipped too."
    )


_KV_PARAMS_RULES: tuple[Rule, ...] = (
    Rule("kv_params", "dtype bfloat16 or float8_e4m3fn", _kv_params_dtype, TypeError),
    Rule(
        "kv_params",
        "a plain K/V cache: kv_dim 2, no kvcache_quant_config, no per_layer_buffers",
        _kv_params_plain,
    ),
)
"""What both the K/V ops and PagedKVProjection require of the cache parameters."""

def _kv_rules(
    weights: tuple[str, ...], scales: tuple[str, ...], kv_scale_rule: str
) -> tuple[Rule, ...]:
    """The rules of a K/V op projecting with `weights` (scales `scales`): one for the K op and
    its V twin, two (K's, V's) for the fused op."""
    return (
        *_KV_PARAMS_RULES,
        *block_scaled_rules(
            "hidden_state", weights, "input_scale", scales, _n,
            "N = n_kv_heads · head_dim of the cache",
        ),
        Rule(
            "input_row_offsets",
            "dtype uint32",
            dtype_in("input_row_offsets", (DType.uint32,)),
            TypeError,
        ),
        Rule("input_row_offsets", "rank 1 [B + 1]", rank_is("input_row_offsets", 1)),
        Rule(
            "kv_collection.kv_blocks",
            "dtype equals kv_params.dtype (uint8 bits for a float8 cache on CPU)",
            _blocks_dtype,
            TypeError,
        ),
        Rule("kv_collection.kv_blocks", "shape [pages, *kv_params.shape_per_block]", _blocks_shape),
        Rule(
            "kv_collection", "no cache scales or per-layer buffers (use kv_scale)", _no_cache_scales
        ),
        Rule(
            "kv_collection.cache_lengths",
            "uint32 [B] on hidden_state's device",
            _coll_tensor("cache_lengths", DType.uint32, 1),
        ),
        Rule(
            "kv_collection.lookup_table",
            "uint32 [B, max_pages] on hidden_state's device",
            _coll_tensor("lookup_table", DType.uint32, 2),
        ),
        *(
            Rule(f"kv_collection.{f}", f"{d.name} [1] on CPU", _coll_tensor(f, d, [1]))
            for f, d in (
                ("page_stride", DType.int64),
                ("max_prompt_length", DType.uint32),
                ("max_cache_length", DType.uint32),
            )
        ),
        Rule("layer_idx", "an int in [0, num_layers) or a uint32 scalar on CPU", _layer_idx),
        Rule("kv_scale", kv_scale_rule, _kv_scale_for(len(weights))),
        *(
            Rule(n, "on hidden_state's device", same_device(n, "hidden_state"))
            for n in ("input_row_offsets", "kv_scale")
        ),
        Rule("kv_collection.kv_blocks", "on hidden_state's device", _blocks_device),
    )


_KV_RULES = _kv_rules(
    ("weight",),
    ("weight_scale",),
    "None (scale 1), or for a float8_e4m3fn cache float32 [1] (per tensor) or [n_kv_heads] "
    "(per head); the cache stores k / kv_scale",
)
"""The rules shared by the K op and its V twin (same operands, same kernels)."""

_KV_TYPES = {
    "kv_params": KV_PARAMS,
    **{n: TENSOR for n in ("hidden_state", "input_row_offsets", "weight", "input_scale",
                           "weight_scale")},
    "kv_collection": KV_COLLECTION,
    "scales_granularity_mnk": INT_SEQ,
    "layer_idx": INT | TENSOR,
    "kv_scale": optional(TENSOR),
}
"""Python types of the K/V ops' arguments (kv_params is e.g. an MHAKVCacheParams)."""

K_MATMUL_RAGGED_PAGED_SCALE = Contract(
    op="k_matmul_ragged_paged_scale", summary=_summary("K"), rules=_KV_RULES, types=_KV_TYPES
)
"""Rules of `mojo_gemm.k_matmul_ragged_paged_scale`."""

V_MATMUL_RAGGED_PAGED_SCALE = Contract(
    op="v_matmul_ragged_paged_scale", summary=_summary("V"), rules=_KV_RULES, types=_KV_TYPES
)
"""Rules of `mojo_gemm.v_matmul_ragged_paged_scale` (the K op's rules, V half)."""

KV_MATMUL_RAGGED_PAGED_SCALE = Contract(
    op="kv_matmul_ragged_paged_scale",
    summary=(
        "k and v as `k_matmul_ragged_paged_scale` and `v_matmul_ragged_paged_scale` compute "
        "them, k with k_weight / k_weight_scale into the K half and v with v_weight / "
        "v_weight_scale into the V half of layer `layer_idx`, in one op (one kernel launch "
        "for both halves at decode); same skipping rules."
    ),
    rules=_kv_rules(
        ("k_weight", "v_weight"),
        ("k_weight_scale", "v_weight_scale"),
        "None (scale 1), or for a float8_e4m3fn cache float32 [2] (K's, V's, per tensor) or "
        "[2 · n_kv_heads] (K's per head, then V's); the cache stores k / kv_scale",
    ),
    types={
        **{n: t for n, t in _KV_TYPES.items() if n not in ("weight", "weight_scale")},
        **{n: TENSOR for n in ("k_weight", "v_weight", "k_weight_scale", "v_weight_scale")},
    },
)
"""Rules of `mojo_gemm.kv_matmul_ragged_paged_scale` (both halves in one op)."""


# ------------------------------------------------------------ the PagedKVProjection layer
def _layer_in_range(a: Args) -> Violation:
    v, layers = a["layer_idx"], a["kv_params"].num_layers
    return None if 0 <= v < layers else (f"an int in [0, {layers})", v)


def _dtype_member(name: str, allowed: tuple[DType, ...]) -> Callable[[Args], Violation]:
    def check(a: Args) -> Violation:
        v = a[name]
        return None if v in allowed else (" or ".join(map(str, allowed)), v)

    return check


PAGED_KV_PROJECTION = Contract(
    op="PagedKVProjection",
    summary=(
        "x [T, hidden_size] (`dtype`) is quantized per token and per `block` columns to e4m3 "
        "(`quantize_fp8_rows`), then K and V = x_q · W_qᵀ with block-scaled e4m3 weights "
        "(k_weight, v_weight [n_kv_heads · head_dim, hidden_size], scales per block × block) "
        "are written into layer `layer_idx` of the paged cache by `kv_matmul_ragged_paged_scale` "
        "(both halves in one op; scales_granularity_mnk = (1, block, block))."
    ),
    rules=(
        *_KV_PARAMS_RULES,
        Rule("hidden_size", "a positive int", positive_int("hidden_size")),
        Rule("layer_idx", "an int in [0, num_layers)", _layer_in_range),
        Rule("dtype", "bfloat16, float16 or float32 (the activations' dtype)",
             _dtype_member("dtype", QUANTIZE_INPUT_DTYPES), TypeError),
        Rule("block", "a positive int (scale block of activations and weights)",
             positive_int("block")),
    ),
    types={"kv_params": KV_PARAMS, "hidden_size": INT, "layer_idx": INT, "dtype": DTYPE,
           "device": DEVICE, "block": INT},
)
"""Construction rules of `mojo_gemm.PagedKVProjection`."""


def _x_hidden(a: Args) -> Violation:
    got = shape_of(a["x"])
    return None if got[1] == a["hidden_size"] else (f"[T, {a['hidden_size']}]", got)


PAGED_KV_PROJECTION_CALL = Contract(
    op="PagedKVProjection.__call__",
    summary="x must match the layer's dtype, hidden size and device; the rest is the ops' rules.",
    types={"x": TENSOR, "input_row_offsets": TENSOR, "kv_collection": KV_COLLECTION},
    rules=(
        Rule("x", "the layer's dtype", layer_attr("x", "dtype"), TypeError),
        Rule("x", "rank 2 [T, hidden_size]", rank_is("x", 2)),
        Rule("x", "dim 1 equals the layer's hidden_size", _x_hidden),
        Rule("x", "on the layer's device", layer_attr("x", "device")),
    ),
)
"""Call rules of `PagedKVProjection.__call__` (the ops check offsets and the cache)."""

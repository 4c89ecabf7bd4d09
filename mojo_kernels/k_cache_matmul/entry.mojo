"""Graph-tensor entry of `k_matmul_ragged_paged_scale`, its V twin `v_matmul_ragged_paged_scale`
and the fused `kv_matmul_ragged_paged_scale` (both halves, a weight each): checks, builds MAX's
paged-cache collection from the PagedCacheValues tensors, takes the K and / or V half of layer
`layer_idx` (compile-time `half`), then picks the CPU or GPU path (`launch_k_cache_matmul`; GPU:
dispatch.mojo). The kernels only see a `RowSink` (sink.mojo) and write through it alone: the
V twin runs exactly the K kernels on the V half's `PagedRows`, and `fp8_blockwise_matmul`
(dense.mojo) runs them on `DenseRows`."""

from extensibility import InputTensor, _MutableInputTensor
from max.gpu.host import DeviceContext
from builtin_kernels.kv_cache import generic_get_paged_cache
from kv_cache.types import KVCacheStaticParams, KVCacheT, KVCollectionT
from layout import TileTensor

from ..common.target import (
    PATH_UNSUPPORTED,
    SUPPORTED_TARGETS,
    gpu_arch,
    gpu_path,
    has_fp8_mma,
    path_for_arch,
)
from .cpu import k_cache_matmul_cpu
from .dispatch import k_cache_gpu_plan_text, k_cache_matmul_gpu
from .layout import F32Ptr, Fp8Ptr, KCacheShape, KV_BOTH, K_HALF, U32Ptr, V_HALF, op_name
from .sink import PagedRows, RowSink


def half_matmul_ragged_paged_scale[
    in_dtype: DType, cache_dtype: DType, //, gm: Int, gn: Int, gk: Int, half: Int, target: StaticString,
    force: Int = 0,
](
    hidden_state: InputTensor[dtype=in_dtype, rank=2, ...],
    input_row_offsets: InputTensor[dtype=DType.uint32, rank=1, ...],
    weight: InputTensor[dtype=in_dtype, rank=2, ...],
    input_scale: InputTensor[dtype=DType.float32, rank=2, ...],
    weight_scale: InputTensor[dtype=DType.float32, rank=2, ...],
    kv_scale: InputTensor[dtype=DType.float32, rank=1, ...],
    kv_blocks: _MutableInputTensor[dtype=cache_dtype, rank=6, ...],
    page_stride: InputTensor[dtype=DType.int64, rank=1, ...],
    cache_lengths: InputTensor[dtype=DType.uint32, rank=1, ...],
    lookup_table: InputTensor[dtype=DType.uint32, rank=2, ...],
    max_prompt_length: InputTensor[dtype=DType.uint32, rank=1, ...],
    max_cache_length: InputTensor[dtype=DType.uint32, rank=1, ...],
    layer_idx: UInt32,
    ctx: DeviceContext,
) raises:
    """The K op or its V twin (one weight): see KMatmulRaggedPagedScale in registrations.mojo;
    `half` is K_HALF or V_HALF, `force` a FORCE_* value of common/target.mojo
    (`launch_k_cache_matmul`'s GPU path). Raises an Error naming the tensor for a bad shape, a
    page_stride below one page, or layer_idx >= the cache's layers."""
    comptime assert half == K_HALF or half == V_HALF, "one half: K_HALF or V_HALF"
    cache_matmul[gm, gn, gk, half, target, force](
        hidden_state, input_row_offsets, weight, weight, input_scale, weight_scale, weight_scale, kv_scale,
        kv_blocks, page_stride, cache_lengths, lookup_table, max_prompt_length, max_cache_length, layer_idx, ctx,
    )


def cache_matmul[
    in_dtype: DType, cache_dtype: DType, //, gm: Int, gn: Int, gk: Int, half: Int, target: StaticString,
    force: Int = 0,
](
    hidden_state: InputTensor[dtype=in_dtype, rank=2, ...],
    input_row_offsets: InputTensor[dtype=DType.uint32, rank=1, ...],
    k_weight: InputTensor[dtype=in_dtype, rank=2, ...],
    v_weight: InputTensor[dtype=in_dtype, rank=2, ...],
    input_scale: InputTensor[dtype=DType.float32, rank=2, ...],
    k_weight_scale: InputTensor[dtype=DType.float32, rank=2, ...],
    v_weight_scale: InputTensor[dtype=DType.float32, rank=2, ...],
    kv_scale: InputTensor[dtype=DType.float32, rank=1, ...],
    kv_blocks: _MutableInputTensor[dtype=cache_dtype, rank=6, ...],
    page_stride: InputTensor[dtype=DType.int64, rank=1, ...],
    cache_lengths: InputTensor[dtype=DType.uint32, rank=1, ...],
    lookup_table: InputTensor[dtype=DType.uint32, rank=2, ...],
    max_prompt_length: InputTensor[dtype=DType.uint32, rank=1, ...],
    max_cache_length: InputTensor[dtype=DType.uint32, rank=1, ...],
    layer_idx: UInt32,
    ctx: DeviceContext,
) raises:
    """The K/V-cache projection of `half`: K_HALF or V_HALF (k_weight / k_weight_scale; the v_*
    tensors are not read) or KV_BOTH (K with the k_* tensors, V with the v_* tensors; kv_scale
    holds K's [1] or [n_kv_heads] values, then V's). Raises an Error naming the tensor for a bad
    shape, a page_stride below one page, or layer_idx >= the cache's layers."""
    comptime OP_NAME = op_name[half]()
    comptime assert in_dtype == DType.float8_e4m3fn or in_dtype == DType.uint8, String(
        OP_NAME, ": hidden_state/weight must be float8_e4m3fn (uint8 bits on CPU), got ", in_dtype
    )
    var kv_scales = kv_scale.dim_size(0)
    comptime if half == KV_BOTH:
        if kv_scales % 2 != 0:
            raise Error(OP_NAME, ": kv_scale must have 2 (K, V) or 2 * n_kv_heads = ", 2 * kv_blocks.dim_size(4),
                        " elements (K's then V's), got ", kv_scales)
        kv_scales //= 2
    var shape = KCacheShape.validate[gm, gn, gk, half](
        hidden_state.shape(), hidden_state.strides(), input_row_offsets.dim_size(0),
        k_weight.shape(), k_weight.strides(), input_scale.shape(), input_scale.strides(),
        k_weight_scale.shape(), k_weight_scale.strides(), kv_scales,
        kv_blocks.dim_size(4), kv_blocks.dim_size(5), cache_lengths.dim_size(0),
        lookup_table.shape(), lookup_table.strides(), kv_blocks.dim_size(0),
    )
    comptime if half == KV_BOTH:
        if v_weight.shape() != k_weight.shape() or v_weight.strides() != k_weight.strides():
            raise Error(OP_NAME, ": v_weight must have k_weight's shape [", k_weight.dim_size(0), ", ",
                        k_weight.dim_size(1), "] and strides, got [", v_weight.dim_size(0), ", ",
                        v_weight.dim_size(1), "]")
        if v_weight_scale.shape() != k_weight_scale.shape() or v_weight_scale.strides() != k_weight_scale.strides():
            raise Error(OP_NAME, ": v_weight_scale must have k_weight_scale's shape [", k_weight_scale.dim_size(0),
                        ", ", k_weight_scale.dim_size(1), "] and strides, got [", v_weight_scale.dim_size(0), ", ",
                        v_weight_scale.dim_size(1), "]")
    var ps = Int(page_stride.unsafe_ptr()[unsafe_offset=0])
    if ps != -1 and ps < kv_blocks.stride_length(0):
        raise Error(OP_NAME, ": page_stride = ", ps, " is below one page (", kv_blocks.stride_length(0),
                    " elements); use -1 for packed pages")
    var layers = kv_blocks.dim_size(2)
    if Int(layer_idx) >= layers:
        raise Error(OP_NAME, ": layer_idx = ", layer_idx, " but the cache has ", layers, " layers")
    var hidden = hidden_state.unsafe_ptr().as_unsafe_any_origin().unsafe_bitcast[Float8_e4m3fn]()
    var kw = k_weight.unsafe_ptr().as_unsafe_any_origin().unsafe_bitcast[Float8_e4m3fn]()
    var vw = v_weight.unsafe_ptr().as_unsafe_any_origin().unsafe_bitcast[Float8_e4m3fn]()
    var offsets = input_row_offsets.unsafe_ptr().as_unsafe_any_origin()
    var in_scale = input_scale.unsafe_ptr().as_unsafe_any_origin()
    var kws = k_weight_scale.unsafe_ptr().as_unsafe_any_origin()
    var vws = v_weight_scale.unsafe_ptr().as_unsafe_any_origin()
    var kvs = kv_scale.unsafe_ptr().as_unsafe_any_origin()
    var lengths = cache_lengths.unsafe_ptr().as_unsafe_any_origin()
    var lut = lookup_table.unsafe_ptr().as_unsafe_any_origin()
    comptime if cache_dtype == DType.uint8:
        # e4m3fn bits (CPU graphs cannot hold fp8): MAX's tensor-slice constructor reads a
        # uint8 cache as NVFP4, so view the blocks as float8_e4m3fn and build it from views.
        comptime spec = kv_blocks.static_spec.shape_tuple
        var fp8_blocks = TileTensor(
            ptr=kv_blocks.unsafe_ptr().as_unsafe_any_origin().unsafe_bitcast[Float8_e4m3fn](),
            layout=kv_blocks.to_tile_tensor[DType.int64]().layout,
        )
        var coll = generic_get_paged_cache[
            DType.float8_e4m3fn,
            KVCacheStaticParams(Int(spec[4]), Int(spec[5]), Int(spec[1]) == 1),
            Int(spec[3]),
        ](
            fp8_blocks,
            page_stride.to_tile_tensor[DType.int64](),
            cache_lengths.to_tile_tensor[DType.int64](),
            lookup_table.to_tile_tensor[DType.int64](),
            max_prompt_length.to_tile_tensor[DType.int64](),
            max_cache_length.to_tile_tensor[DType.int64](),
        )
        _launch[gm, gn, gk, half, target, force](
            coll, Int(layer_idx), hidden, offsets, in_scale, kw, kws, vw, vws, kvs, lengths, lut, shape, ctx
        )
    else:
        var coll = generic_get_paged_cache(
            kv_blocks, page_stride, cache_lengths, lookup_table, max_prompt_length, max_cache_length
        )
        _launch[gm, gn, gk, half, target, force](
            coll, Int(layer_idx), hidden, offsets, in_scale, kw, kws, vw, vws, kvs, lengths, lut, shape, ctx
        )


def _launch[gm: Int, gn: Int, gk: Int, half: Int, target: StaticString, force: Int](
    coll: Some[KVCollectionT],
    layer_idx: Int,
    hidden: Fp8Ptr,
    offsets: U32Ptr,
    in_scale: F32Ptr,
    k_weight: Fp8Ptr,
    k_w_scale: F32Ptr,
    v_weight: Fp8Ptr,
    v_w_scale: F32Ptr,
    kv_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    shape: KCacheShape,
    ctx: DeviceContext,
) raises:
    """Launches the projection of `half` into layer `layer_idx`: K_HALF into the K cache with the
    k_* operands, V_HALF into the V cache with the k_* operands (a single half's op has one
    weight), KV_BOTH into both (V's kv_scale values after K's)."""
    var k_cache = coll.get_key_cache(layer_idx)
    comptime C = type_of(k_cache)
    var k_rows = PagedRows(k_cache)
    var v_rows = PagedRows(rebind[C](coll.get_value_cache(layer_idx)))
    comptime if half == K_HALF:
        launch_k_cache_matmul[gm, gn, gk, PagedRows[C], target, force](
            hidden, offsets, in_scale, cache_lengths, lut, shape,
            k_weight, k_w_scale, kv_scale, k_rows, k_weight, k_w_scale, kv_scale, k_rows, False, ctx)
    elif half == V_HALF:
        launch_k_cache_matmul[gm, gn, gk, PagedRows[C], target, force](
            hidden, offsets, in_scale, cache_lengths, lut, shape,
            k_weight, k_w_scale, kv_scale, v_rows, k_weight, k_w_scale, kv_scale, v_rows, False, ctx)
    else:
        launch_k_cache_matmul[gm, gn, gk, PagedRows[C], target, force](
            hidden, offsets, in_scale, cache_lengths, lut, shape, k_weight, k_w_scale, kv_scale, k_rows,
            v_weight, v_w_scale, kv_scale.unsafe_offset(Int(shape.n_kv_scale)), v_rows, True, ctx)


def launch_k_cache_matmul[
    gm: Int, gn: Int, gk: Int, sink_t: RowSink, target: StaticString, force: Int = 0
](
    hidden: Fp8Ptr,
    offsets: U32Ptr,
    in_scale: F32Ptr,
    cache_lengths: U32Ptr,
    lut: U32Ptr,
    shape: KCacheShape,
    k_weight: Fp8Ptr,
    k_w_scale: F32Ptr,
    k_kv_scale: F32Ptr,
    k_sink: sink_t,
    v_weight: Fp8Ptr,
    v_w_scale: F32Ptr,
    v_kv_scale: F32Ptr,
    v_sink: sink_t,
    both: Bool,
    ctx: DeviceContext,
) raises:
    """Writes k[t, n] = sum_k a[t,k] w[n,k] as[k//gk, t//gm] ws[n//gn, k//gk] into the rows of
    k_sink with the K operands (k_weight, k_w_scale, k_kv_scale), and with `both` the same product
    with the V operands into v_sink (sink.mojo: a paged cache's K / V half, or a dense matrix).

    Pointers live on the target's device (see KCacheShape for the shapes; both halves share
    them). target "cpu" -> cpu.mojo, one half after the other; "gpu" -> dispatch.mojo, given the
    GPU's path under the FORCE_* value `force` (common/target.mojo) and whether it has FP8
    mma.sync: wgmma kernels on Hopper only, the mma.sync kernel on sm_90a / sm_100a (both halves
    in one launch), the SIMT kernel everywhere (sm_80 / 86 / 89 and AMD take it for every call).
    A target no path supports fails to compile, naming it.
    """
    comptime if target == "cpu":
        k_cache_matmul_cpu[gm, gn, gk](
            hidden, offsets, k_weight, in_scale, k_w_scale, k_kv_scale, cache_lengths, lut, k_sink, shape
        )
        if both:
            k_cache_matmul_cpu[gm, gn, gk](
                hidden, offsets, v_weight, in_scale, v_w_scale, v_kv_scale, cache_lengths, lut, v_sink, shape
            )
    elif target == "gpu":
        comptime path = gpu_path[force]()
        comptime assert path != PATH_UNSUPPORTED, String(
            "k_matmul_ragged_paged_scale: unsupported GPU target '", gpu_arch(), "' (supported: ",
            SUPPORTED_TARGETS, ")")
        k_cache_matmul_gpu[gm, gn, gk, sink_t, path, has_fp8_mma(gpu_arch())](
            hidden, offsets, in_scale, cache_lengths, lut, shape, k_weight, k_w_scale, k_kv_scale, k_sink, v_weight, v_w_scale, v_kv_scale, v_sink, both, ctx
        )
    else:
        comptime assert False, String("k_matmul_ragged_paged_scale: unsupported target '", target, "'")


def k_cache_plan_text[gm: Int, gn: Int, gk: Int, arch: StaticString, force: Int](shape: KCacheShape) raises -> String:
    """The launch `launch_k_cache_matmul` makes on GPU `arch` (e.g. "sm_90a", "sm_80", "gfx950")
    under `force`, as text: host arithmetic, for the plan op. Raises for a target no path
    supports."""
    comptime path = path_for_arch(arch, force)
    comptime if path == PATH_UNSUPPORTED:
        raise Error("k_matmul_ragged_paged_scale: unsupported GPU target '", arch, "' (supported: ",
                    SUPPORTED_TARGETS, ")")
    else:
        return k_cache_gpu_plan_text[gm, gn, gk, path, has_fp8_mma(arch)](shape)

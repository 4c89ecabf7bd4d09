"""Every custom op of the package: thin wrappers (tensors -> pointers/shapes -> the op's entry.mojo)."""

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .common.checks import row_major_shape
from .int4_gemm.entry import launch_int4_gemm
from .int4_gemm.plan import write_int4_gpu_plan


@extensibility.register("multistage_gemm_q")
struct MultistageGemmQ[group_size: Int, has_zeros: Bool, has_bias: Bool, force_path: Int = 0]:
    """Computes out = x · dequant(qweight)ᵀ (+ bias) with int4 weights (mojo_gemm.quant.int4_layout).

    Parameters: group_size (32, 64, 128, or -1 = per-channel), has_zeros, has_bias.
    Shapes: output [M, N]; x [M, Kp]; qweight uint32 [Np/64, Kp*8]; scales [Kp/g, Np];
    zeros [Kp/g, Np] (any dummy, e.g. [1, 1], when not has_zeros); bias [1, N] (any rank-2
    dummy when not has_bias: rank 2 so the scales can stand in without a reshape, which MAX's
    graph runtime charges as an op of its own). dtype (output, x, scales, zeros, bias): bfloat16 or float16.
    force_path: common/target.mojo FORCE_* (0: the GPU's own path; 1 Ampere, 2 portable).
    """

    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        output: OutputTensor[dtype=dtype, rank=2, ...],
        x: InputTensor[dtype=dtype, rank=2, ...],
        qweight: InputTensor[dtype=DType.uint32, rank=2, ...],
        scales: InputTensor[dtype=dtype, rank=2, ...],
        zeros: InputTensor[dtype=dtype, rank=2, ...],
        bias: InputTensor[dtype=dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var bias_shape = row_major_shape(bias.shape(), bias.strides(), "bias")
        launch_int4_gemm[dtype, Self.group_size, Self.has_zeros, Self.has_bias, target, Self.force_path](
            output.unsafe_ptr().as_unsafe_any_origin(),
            x.unsafe_ptr().as_unsafe_any_origin(),
            qweight.unsafe_ptr().as_unsafe_any_origin(),
            scales.unsafe_ptr().as_unsafe_any_origin(),
            zeros.unsafe_ptr().as_unsafe_any_origin(),
            bias.unsafe_ptr().as_unsafe_any_origin(),
            row_major_shape(output.shape(), output.strides(), "output"),
            row_major_shape(x.shape(), x.strides(), "x"),
            row_major_shape(qweight.shape(), qweight.strides(), "qweight"),
            row_major_shape(scales.shape(), scales.strides(), "scales"),
            row_major_shape(zeros.shape(), zeros.strides(), "zeros"),
            bias_shape[0] * bias_shape[1],
            ctx,
        )


@extensibility.register("multistage_gemm_q_plan")
struct MultistageGemmQPlan[group_size: Int, has_zeros: Bool, arch: StaticString = "sm_90a", force_path: Int = 0]:
    """The launch plan `multistage_gemm_q` picks for (M, N, Kp) on GPU `arch` (e.g. "sm_90a",
    "sm_89", "gfx950") under force_path, as text (diagnostics).

    Shapes: plan uint8 [C] (NUL-padded ASCII, C >= 128); sizes int64 [3] = (M, N, Kp), on the
    CPU. Runs on any target: the plan is host arithmetic (int4_gemm/plan.mojo).
    """

    @staticmethod
    def execute[target: StaticString](
        plan: OutputTensor[dtype=DType.uint8, rank=1, ...],
        sizes: InputTensor[dtype=DType.int64, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var s = sizes.unsafe_ptr()
        write_int4_gpu_plan(
            plan.unsafe_ptr().as_unsafe_any_origin(), plan.shape()[0], Int(s[0]), Int(s[1]), Int(s[2]),
            Self.group_size, Self.has_zeros, Self.arch, Self.force_path,
        )


# ---- grouped_matmul_sm100_persistent (MoE grouped GEMM; kernels in grouped_gemm/) ----------
from extensibility import _MutableInputTensor
from .grouped_gemm.entry import dense_shape, grouped_execute


@extensibility.register("grouped_matmul_sm100_persistent")
struct GroupedMatmulSm100Persistent[
    a_plane_split0: Int, a_plane_split1: Int, swiglu: Bool, has_row_scale: Bool, routing_settled: Bool = False,
    force_path: Int = 0,
]:
    """MoE grouped GEMM: c[r] = epilogue(a[r] · b[expert_ids[g]]ᵀ) for rows r of group g.

    Shapes: c [T, N] (N / 2 with swiglu); a [T, K] ([3 T, K] with plane splits); b [E, N, K];
    a_offsets uint32 [G + 1]; expert_ids int32 [G]; expert_usage_stats uint32 [2] =
    [max tokens per group, G_active] (read on the device); row_scale float32 [T] (any dummy,
    e.g. [1], when not has_row_scale). dtype (c, a, b): bfloat16 or float16.
    Semantics and clamping: grouped_gemm/scheduler.mojo; epilogue: grouped_gemm/epilogue.mojo.
    routing_settled: a_offsets, expert_ids and expert_usage_stats were read by an earlier grouped
    matmul of the stream and b holds weights the stream never writes, so the kernel may read them
    before the kernel ahead of it completes (grouped_gemm/entry.mojo). force_path:
    common/target.mojo FORCE_* (0: the GPU's own path; 1 Ampere, 2 portable).
    """

    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        c: OutputTensor[dtype=dtype, rank=2, ...],
        a: InputTensor[dtype=dtype, rank=2, ...],
        b: InputTensor[dtype=dtype, rank=3, ...],
        a_offsets: InputTensor[dtype=DType.uint32, rank=1, ...],
        expert_ids: InputTensor[dtype=DType.int32, rank=1, ...],
        expert_usage_stats: InputTensor[dtype=DType.uint32, rank=1, ...],
        row_scale: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        grouped_execute[dtype, Self.a_plane_split0, Self.a_plane_split1, Self.swiglu,
                         Self.has_row_scale, target, Self.force_path, Self.routing_settled](
            c.unsafe_ptr().as_unsafe_any_origin(), dense_shape(c.shape(), c.strides(), "c"),
            a, b, a_offsets, expert_ids, expert_usage_stats, row_scale, ctx)


@extensibility.register("grouped_matmul_sm100_persistent_inplace")
struct GroupedMatmulSm100PersistentInplace[
    a_plane_split0: Int, a_plane_split1: Int, swiglu: Bool, has_row_scale: Bool, routing_settled: Bool = False,
    force_path: Int = 0,
]:
    """`grouped_matmul_sm100_persistent` writing into an existing buffer c (rows of inactive
    groups keep their contents). Same operands, with c first as a mutable buffer."""

    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        c: _MutableInputTensor[dtype=dtype, rank=2, ...],
        a: InputTensor[dtype=dtype, rank=2, ...],
        b: InputTensor[dtype=dtype, rank=3, ...],
        a_offsets: InputTensor[dtype=DType.uint32, rank=1, ...],
        expert_ids: InputTensor[dtype=DType.int32, rank=1, ...],
        expert_usage_stats: InputTensor[dtype=DType.uint32, rank=1, ...],
        row_scale: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        grouped_execute[dtype, Self.a_plane_split0, Self.a_plane_split1, Self.swiglu,
                         Self.has_row_scale, target, Self.force_path, Self.routing_settled](
            c.unsafe_ptr().as_unsafe_any_origin(), dense_shape(c.shape(), c.strides(), "c"),
            a, b, a_offsets, expert_ids, expert_usage_stats, row_scale, ctx)


# ---- k_matmul_ragged_paged_scale (issue 5): FP8 block-scaled K projection into MAX's paged cache
from extensibility import _MutableInputTensor
from .k_cache_matmul.entry import cache_matmul, half_matmul_ragged_paged_scale
from .k_cache_matmul.layout import KV_BOTH, K_HALF, V_HALF
from .k_cache_matmul.plan import write_k_cache_gpu_plan


@extensibility.register("k_matmul_ragged_paged_scale")
struct KMatmulRaggedPagedScale[
    m_scale_granularity: Int, n_scale_granularity: Int, k_scale_granularity: Int, force_path: Int = 0
]:
    """FP8 block-scaled K projection written into MAX's paged KV cache, in place.

    k[t, n] = sum_k a[t, k] w[n, k] input_scale[k // gk, t // gm] weight_scale[n // gn, k // gk]
    in fp32, divided by kv_scale for an fp8 cache, cast to the cache dtype and stored at
    kv_blocks[lut[b, pos // P], 0, layer_idx, pos % P, n // D, n % D], pos = cache_lengths[b] +
    t - offsets[b] (rows whose page is outside the table or the cache are skipped:
    k_cache_matmul/layout.mojo). Parameters: (gm, gn, gk) = scales_granularity_mnk, any positive.
    Shapes: hidden_state [T, K], weight [N, K] float8_e4m3fn (uint8 bits on CPU);
    input_row_offsets uint32 [B + 1]; input_scale float32 [ceil(K/gk), >= ceil(T/gm)];
    weight_scale float32 [ceil(N/gn), ceil(K/gk)]; kv_scale float32 [1] or [n_kv_heads] (read
    for an fp8 cache only); PagedCacheValues.flatten_without_attention_dispatch_metadata()
    (blocks bf16 or float8_e4m3fn, uint8 e4m3fn bits on CPU); layer_idx uint32 scalar on CPU.
    force_path: common/target.mojo FORCE_* (0: the GPU's own path; 1 Ampere, 2 portable).
    """

    @staticmethod
    def execute[in_dtype: DType, cache_dtype: DType, //, target: StaticString](
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
        half_matmul_ragged_paged_scale[
            Self.m_scale_granularity, Self.n_scale_granularity, Self.k_scale_granularity, K_HALF, target,
            Self.force_path,
        ](
            hidden_state, input_row_offsets, weight, input_scale, weight_scale, kv_scale, kv_blocks,
            page_stride, cache_lengths, lookup_table, max_prompt_length, max_cache_length, layer_idx, ctx,
        )


@extensibility.register("v_matmul_ragged_paged_scale")
struct VMatmulRaggedPagedScale[
    m_scale_granularity: Int, n_scale_granularity: Int, k_scale_granularity: Int, force_path: Int = 0
]:
    """The V twin of `k_matmul_ragged_paged_scale`: the same operands, math and kernels, writing
    kv_blocks[lut[b, pos // P], 1, layer_idx, pos % P, n // D, n % D] (the V half) instead."""

    @staticmethod
    def execute[in_dtype: DType, cache_dtype: DType, //, target: StaticString](
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
        half_matmul_ragged_paged_scale[
            Self.m_scale_granularity, Self.n_scale_granularity, Self.k_scale_granularity, V_HALF, target,
            Self.force_path,
        ](
            hidden_state, input_row_offsets, weight, input_scale, weight_scale, kv_scale, kv_blocks,
            page_stride, cache_lengths, lookup_table, max_prompt_length, max_cache_length, layer_idx, ctx,
        )


@extensibility.register("kv_matmul_ragged_paged_scale")
struct KVMatmulRaggedPagedScale[
    m_scale_granularity: Int, n_scale_granularity: Int, k_scale_granularity: Int, force_path: Int = 0
]:
    """K and V projections of the same tokens in one op: k_matmul_ragged_paged_scale with k_weight /
    k_weight_scale into the K half and with v_weight / v_weight_scale into the V half of layer
    `layer_idx`, one kernel launch for both where the GPU plan is an mma.sync one (decode), two
    launches otherwise. Shapes: as the K op's; v_weight and v_weight_scale have k_weight's and
    k_weight_scale's shapes and strides; kv_scale float32 [2] (K's, V's) or [2 n_kv_heads] (K's
    per head, then V's), read for an fp8 cache only.
    """

    @staticmethod
    def execute[in_dtype: DType, cache_dtype: DType, //, target: StaticString](
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
        cache_matmul[
            Self.m_scale_granularity, Self.n_scale_granularity, Self.k_scale_granularity, KV_BOTH, target,
            Self.force_path,
        ](
            hidden_state, input_row_offsets, k_weight, v_weight, input_scale, k_weight_scale, v_weight_scale,
            kv_scale, kv_blocks, page_stride, cache_lengths, lookup_table, max_prompt_length, max_cache_length,
            layer_idx, ctx,
        )


@extensibility.register("k_matmul_ragged_paged_scale_plan")
struct KMatmulRaggedPagedScalePlan[
    m_scale_granularity: Int, n_scale_granularity: Int, k_scale_granularity: Int,
    arch: StaticString = "sm_90a", force_path: Int = 0,
]:
    """The launch plan `k_matmul_ragged_paged_scale` (and its V twin) picks on GPU `arch`, as
    text (diagnostics), e.g. "wgmma 128x128", "mma.sync MT=1 NB=2 U=2 late", "simt", "none (T=0)".

    Parameters: (gm, gn, gk) as the op's; arch (e.g. "sm_90a", "sm_80", "gfx950") and
    force_path (FORCE_*) name the target. Shapes: plan uint8 [C] (NUL-padded ASCII, C >= 64);
    sizes int64 [5] = (T, N, K, a_stride, w_stride) (row strides of hidden_state and weight, K
    when dense), on the CPU. Runs on any target: the plan is host arithmetic
    (k_cache_matmul/plan.mojo).
    """

    @staticmethod
    def execute[target: StaticString](
        plan: OutputTensor[dtype=DType.uint8, rank=1, ...],
        sizes: InputTensor[dtype=DType.int64, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        if sizes.dim_size(0) != 5:
            raise Error("k_matmul_ragged_paged_scale_plan: sizes must be int64 [5] = (T, N, K, a_stride, w_stride), got ",
                        sizes.dim_size(0), " elements")
        var s = sizes.unsafe_ptr()
        write_k_cache_gpu_plan[
            Self.m_scale_granularity, Self.n_scale_granularity, Self.k_scale_granularity, Self.arch, Self.force_path
        ](
            plan.unsafe_ptr().as_unsafe_any_origin(), plan.shape()[0],
            Int(s[unsafe_offset=0]), Int(s[unsafe_offset=1]), Int(s[unsafe_offset=2]),
            Int(s[unsafe_offset=3]), Int(s[unsafe_offset=4]),
        )


# ---- fp8_blockwise_matmul: the K-cache op's kernels with a dense bf16 output
from .k_cache_matmul.dense import fp8_blockwise_matmul


@extensibility.register("fp8_blockwise_matmul")
struct Fp8BlockwiseMatmul[
    m_scale_granularity: Int, n_scale_granularity: Int, k_scale_granularity: Int, force_path: Int = 0
]:
    """FP8 block-scaled matmul with a dense bfloat16 output (k_cache_matmul/dense.mojo).

    output[m, n] = sum_k a[m, k] w[n, k] a_scale[k // gk, m // gm] w_scale[n // gn, k // gk] in
    fp32 (promoted per gk block), rounded once. Shapes: output [M, N] bfloat16; a [M, K], w [N, K]
    float8_e4m3fn (uint8 bits on CPU); a_scale float32 [ceil(K/gk), >= ceil(M/gm)]; w_scale
    float32 [ceil(N/gn), ceil(K/gk)]. Parameters and force_path as k_matmul_ragged_paged_scale's;
    the launch plan is that op's for (T = M, N, K) (`k_matmul_ragged_paged_scale_plan`).
    """

    @staticmethod
    def execute[in_dtype: DType, //, target: StaticString](
        output: OutputTensor[dtype=DType.bfloat16, rank=2, ...],
        a: InputTensor[dtype=in_dtype, rank=2, ...],
        a_scale: InputTensor[dtype=DType.float32, rank=2, ...],
        w: InputTensor[dtype=in_dtype, rank=2, ...],
        w_scale: InputTensor[dtype=DType.float32, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        fp8_blockwise_matmul[
            Self.m_scale_granularity, Self.n_scale_granularity, Self.k_scale_granularity, target,
            Self.force_path,
        ](output, a, a_scale, w, w_scale, ctx)


# ---- quantize_fp8_rows (issue 6): per-token, per-block e4m3 activation quantizer
from .fp8_quant.entry import quantize_fp8_rows


@extensibility.register("quantize_fp8_rows")
struct QuantizeFp8Rows[block: Int]:
    """Quantizes activations per token and per `block` columns to e4m3 (kernels in fp8_quant/).

    data[t, c] = round_e4m3(x[t, c] / scales[c // block, t]) with scales[kb, t] = amax over the
    block / 448 (1.0 for an all-zero block): mojo_gemm.quantize_fp8_input(x, 1, block)
    without its token padding. Shapes: x [T, H] bfloat16, float16 or float32; data [T, H]
    float8_e4m3fn (uint8 bits on CPU); scales float32 [ceil(H/block), T] (the input_scale
    layout of k_matmul_ragged_paged_scale with gm = 1).
    """

    @staticmethod
    def execute[in_dtype: DType, out_dtype: DType, //, target: StaticString](
        data: OutputTensor[dtype=out_dtype, rank=2, ...],
        scales: OutputTensor[dtype=DType.float32, rank=2, ...],
        x: InputTensor[dtype=in_dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        quantize_fp8_rows[Self.block, target](data, scales, x, ctx)


# ---- moe_route_topk_group: MoE router + top-k + softmax + grouping by expert (kernels in moe_route/)
from .moe_route.entry import moe_route_topk_group


@extensibility.register("moe_route_topk_group")
struct MoeRouteTopkGroup:
    """MoE routing for `grouped_matmul`: logits, top-k, softmax and the rows sorted by expert.

    logits[t, e] = Σ_h f32(x[t, h]) · f32(router_weight[e, h]) in float32; topk_ids[t] = the K
    experts of the largest logits, decreasing, ties towards the lower id (K = topk_ids.dim(1));
    topk_weights[t, j] = exp(v_j - v_0) / Σ_i exp(v_i - v_0) over those logits. Assignments
    a = t K + j sorted by (expert, a) give sorted row r its token_index[r] = a // K and
    row_scale[r] = topk_weights[a]; inverse[a] = r; a_offsets[e] = rows of experts < e;
    expert_usage_stats = [max rows of one expert, E].
    Shapes: x [T, H], router_weight [E, H] (bfloat16 or float16, H a multiple of 8, 1 <= E <=
    1024); topk_ids int32 [T, K]; topk_weights float32 [T, K]; token_index int64 [T K];
    row_scale float32 [T K]; inverse int64 [T K]; a_offsets uint32 [E + 1];
    expert_usage_stats uint32 [2].
    """

    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        topk_ids: OutputTensor[dtype=DType.int32, rank=2, ...],
        topk_weights: OutputTensor[dtype=DType.float32, rank=2, ...],
        token_index: OutputTensor[dtype=DType.int64, rank=1, ...],
        row_scale: OutputTensor[dtype=DType.float32, rank=1, ...],
        inverse: OutputTensor[dtype=DType.int64, rank=1, ...],
        a_offsets: OutputTensor[dtype=DType.uint32, rank=1, ...],
        expert_usage_stats: OutputTensor[dtype=DType.uint32, rank=1, ...],
        x: InputTensor[dtype=dtype, rank=2, ...],
        router_weight: InputTensor[dtype=dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        moe_route_topk_group[target](
            topk_ids, topk_weights, token_index, row_scale, inverse, a_offsets, expert_usage_stats,
            x, router_weight, ctx,
        )


# ---- moe_combine_rows: an MoE layer's expert outputs summed back per token (kernels in moe_combine/)
from .moe_combine.entry import moe_combine_rows


@extensibility.register("moe_combine_rows")
struct MoeCombineRows:
    """Sums an MoE layer's expert rows back per token: combined[t, h] = Σ_{j < K}
    y[inverse[t K + j], h], in float32 in j order, rounded once.

    K = inverse.dim(0) / combined.dim(0); rows of inverse outside [0, y.dim(0)) add nothing.
    Shapes: combined [T, H], y [T K, H] (bfloat16 or float16), inverse int64 [T K].
    """

    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        combined: OutputTensor[dtype=dtype, rank=2, ...],
        y: InputTensor[dtype=dtype, rank=2, ...],
        inverse: InputTensor[dtype=DType.int64, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        moe_combine_rows[target](combined, y, inverse, ctx)


# ---- rms_norm_rows / add_rms_norm_rows: a decoder's residual add, RMSNorm and cast in one pass
from .rms_norm.entry import rms_norm_rows_run


@extensibility.register("rms_norm_rows")
struct RmsNormRows[eps: Float32, fp8_block: Int]:
    """normed = round(s · rsqrt(mean(s²) + eps) · weight) per row, s = f32(h) (rms_norm/norm.mojo);
    fp8_block > 0: also normed's e4m3 quantization, as `quantize_fp8_rows` with that block.

    Shapes: sum float32 [T, H] (s; 0 rows: not written), normed [T, H] bfloat16 or float16,
    data [T, H] float8_e4m3fn (uint8 bits on CPU) and scales float32 [ceil(H / fp8_block), T]
    (fp8_block 0: [0, H] and [0, 0]), h [T, H] float32, bfloat16 or float16, weight float32 [H].
    """

    @staticmethod
    def execute[
        h_dtype: DType, out_dtype: DType, data_dtype: DType, //, target: StaticString
    ](
        sum: OutputTensor[dtype=DType.float32, rank=2, ...],
        normed: OutputTensor[dtype=out_dtype, rank=2, ...],
        data: OutputTensor[dtype=data_dtype, rank=2, ...],
        scales: OutputTensor[dtype=DType.float32, rank=2, ...],
        h: InputTensor[dtype=h_dtype, rank=2, ...],
        weight: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        rms_norm_rows_run[False, Self.fp8_block, target](
            sum, normed, data, scales, h, h, weight, Self.eps, ctx)


@extensibility.register("add_rms_norm_rows")
struct AddRmsNormRows[eps: Float32, fp8_block: Int]:
    """`rms_norm_rows` of s = f32(h) + f32(y): the residual add before the norm, s written to sum.

    Shapes: as `rms_norm_rows`, plus y [T, H] float32, bfloat16 or float16.
    """

    @staticmethod
    def execute[
        h_dtype: DType, y_dtype: DType, out_dtype: DType, data_dtype: DType, //,
        target: StaticString,
    ](
        sum: OutputTensor[dtype=DType.float32, rank=2, ...],
        normed: OutputTensor[dtype=out_dtype, rank=2, ...],
        data: OutputTensor[dtype=data_dtype, rank=2, ...],
        scales: OutputTensor[dtype=DType.float32, rank=2, ...],
        h: InputTensor[dtype=h_dtype, rank=2, ...],
        y: InputTensor[dtype=y_dtype, rank=2, ...],
        weight: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        rms_norm_rows_run[True, Self.fp8_block, target](
            sum, normed, data, scales, h, y, weight, Self.eps, ctx)

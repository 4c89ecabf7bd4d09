"""Entry of `grouped_matmul_sm100_persistent`: checks shapes, then the CPU path or the GPU
dispatch (dispatch.mojo).

Dispatch (compile time, from the target; nothing is read back from the device):
- target "cpu"                   -> cpu.mojo
- target "gpu", arch sm_100a     -> kernels/sm100.mojo (tcgen05 / TMEM persistent kernel; cta_group 2
                                    when N % 256 == 0 and the plane splits are multiples of 256,
                                    else cta_group 1)
- target "gpu", arch sm_90a      -> kernels/sm90.mojo (TMA + wgmma persistent, warp-specialized kernel)
- token tile: sm_90a the narrowest of BN = 32 (decode) and 128 (mid) that a typical group
                                    (T / G + 2 sqrt(T / G) rows) fits, else 256 (prefill);
                                    sm_100a 32 when T <= 64 G, else 256: host choices from shapes
                                    (dispatch.sm90_token_regime / use_decode_tiles, tiles in
                                    tuning_sm90.mojo)
- the Ampere path (sm_80 / 86 / 87 / 89 / 120, or forced, common/target.mojo) -> kernels/mma.mojo
                                    (mma.sync from global memory, no TMA / wgmma / clusters)
- any of these, K * sizeof(dtype) % 16 != 0 (TMA / 16-byte loads cannot read a or b rows)
                                 -> kernels/naive.mojo
- the portable path (AMD gfx9xx, or forced) -> kernels/naive.mojo (no inline PTX)
- any other target or GPU arch   -> compile-time error naming the arch.
"""

from std.utils.index import IndexList
from extensibility import InputTensor
from max.gpu.host import DeviceContext

from ..common.target import PATH_UNSUPPORTED, SUPPORTED_TARGETS, gpu_arch, gpu_path
from .cpu import grouped_matmul_cpu
from .dispatch import grouped_matmul_gpu
from .scheduler import ElemPtr, F32Ptr, GroupedShape, I32Ptr, OP_NAME, U32Ptr


def dense_shape[rank: Int](
    shape: IndexList[rank], strides: IndexList[rank], name: StaticString
) raises -> IndexList[rank]:
    """`shape` after checking the tensor is dense row-major (the kernels index raw pointers)."""
    var expected = 1
    comptime for r in range(rank):
        comptime i = rank - 1 - r
        if shape[i] > 1 and strides[i] != expected:
            raise Error(OP_NAME, ": tensor '", name, "' is not dense row-major")
        expected *= shape[i]
    return shape


def launch_grouped_matmul[
    dtype: DType,
    s0: Int,
    s1: Int,
    swiglu: Bool,
    has_row_scale: Bool,
    target: StaticString,
    force: Int = 0,
    routing_settled: Bool = False,
](
    c: ElemPtr[dtype],
    a: ElemPtr[dtype],
    b: ElemPtr[dtype],
    a_offsets: U32Ptr,
    expert_ids: I32Ptr,
    stats: U32Ptr,
    row_scale: F32Ptr,
    shape: GroupedShape,
    ctx: DeviceContext,
) raises:
    """c = grouped(a · b[expert]ᵀ) with the epilogue; pointers on the target's device.

    shape: from GroupedShape.validate. row_scale is read only when has_row_scale. force: a
    FORCE_* value of common/target.mojo. routing_settled: the caller vouches that a_offsets,
    expert_ids and expert_usage_stats were already read by an earlier grouped matmul of the same
    stream (e.g. the down projection after gate_up on the same routing) and that b is not written
    by the stream (model weights). The SM90 kernel, the only one that uses it, releases its
    programmatic dependents only after its own wait, so that routing was complete before this
    kernel could start; it then reads the routing and streams its first weight tiles while the
    kernel ahead of it still runs. The other paths ignore it.
    """
    comptime assert dtype == DType.bfloat16 or dtype == DType.float16, String(
        OP_NAME, ": a, b and c must be bfloat16 or float16, got ", dtype)
    comptime if target == "cpu":
        grouped_matmul_cpu[dtype, s0, s1, swiglu, has_row_scale](
            c, a, b, a_offsets, expert_ids, stats, row_scale, shape)
    elif target == "gpu":
        comptime arch = gpu_arch()
        comptime path = gpu_path[force]()
        comptime assert path != PATH_UNSUPPORTED, String(
            OP_NAME, ": unsupported GPU target '", arch, "' (supported: ", SUPPORTED_TARGETS, ")")
        grouped_matmul_gpu[dtype, s0, s1, swiglu, has_row_scale, path, routing_settled](
            c, a, b, a_offsets, expert_ids, stats, row_scale, shape, ctx)
    else:
        comptime assert False, String(OP_NAME, ": unsupported target '", target, "' (expected 'cpu' or 'gpu')")


def grouped_execute[
    dtype: DType, s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool, target: StaticString,
    force: Int = 0, routing_settled: Bool = False,
](
    c: Pointer[Scalar[dtype], MutAnyOrigin],
    c_shape: IndexList[2],
    a: InputTensor[dtype=dtype, rank=2, ...],
    b: InputTensor[dtype=dtype, rank=3, ...],
    a_offsets: InputTensor[dtype=DType.uint32, rank=1, ...],
    expert_ids: InputTensor[dtype=DType.int32, rank=1, ...],
    expert_usage_stats: InputTensor[dtype=DType.uint32, rank=1, ...],
    row_scale: InputTensor[dtype=DType.float32, rank=1, ...],
    ctx: DeviceContext,
) raises:
    """Validates the op's tensors (shapes, dense layout) and runs `launch_grouped_matmul`; `c` is the
    output's pointer and shape (a new tensor or the in-place buffer); force: FORCE_*;
    routing_settled: see `launch_grouped_matmul`."""
    var shape = GroupedShape.validate[s0, s1, swiglu, has_row_scale](
        c_shape,
        dense_shape(a.shape(), a.strides(), "a"),
        dense_shape(b.shape(), b.strides(), "b"),
        a_offsets.dim_size(0), expert_ids.dim_size(0), expert_usage_stats.dim_size(0),
        row_scale.dim_size(0),
    )
    launch_grouped_matmul[dtype, s0, s1, swiglu, has_row_scale, target, force, routing_settled](
        c,
        a.unsafe_ptr().as_unsafe_any_origin(),
        b.unsafe_ptr().as_unsafe_any_origin(),
        a_offsets.unsafe_ptr().as_unsafe_any_origin(),
        expert_ids.unsafe_ptr().as_unsafe_any_origin(),
        expert_usage_stats.unsafe_ptr().as_unsafe_any_origin(),
        row_scale.unsafe_ptr().as_unsafe_any_origin(),
        shape,
        ctx,
    )

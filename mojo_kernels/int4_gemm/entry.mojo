"""Entry of `multistage_gemm_q`: checks shapes, then takes the CPU path (cpu.mojo) or the GPU
path of the target (dispatch.mojo, kernels/portable.mojo)."""

from max.gpu.host import DeviceContext
from std.utils.index import IndexList

from ..common.checks import assert_activation_dtype
from ..common.target import (
    PATH_HOPPER,
    PATH_PORTABLE,
    PATH_UNSUPPORTED,
    SUPPORTED_TARGETS,
    gpu_arch,
    gpu_path,
    has_clusters,
    path_for_arch,
    smem_budget,
)
from .cpu import int4_gemm_cpu
from .dispatch import int4_gemm_gpu, int4_gemm_gpu_config, int4_gemm_gpu_mma, int4_gemm_gpu_mma_config
from .kernels.portable import int4_gemm_gpu_portable, int4_portable_plan_text
from .layout import Int4GemmShape

comptime U32Ptr = Pointer[UInt32, MutAnyOrigin]
comptime ElemPtr[dtype: DType] = Pointer[Scalar[dtype], MutAnyOrigin]


def launch_int4_gemm[
    dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool, target: StaticString,
    force: Int = 0,
](
    output: ElemPtr[dtype],
    x: ElemPtr[dtype],
    qweight: U32Ptr,
    scales: ElemPtr[dtype],
    zeros: ElemPtr[dtype],
    bias: ElemPtr[dtype],
    out_shape: IndexList[2],
    x_shape: IndexList[2],
    qweight_shape: IndexList[2],
    scales_shape: IndexList[2],
    zeros_shape: IndexList[2],
    bias_len: Int,
    ctx: DeviceContext,
) raises:
    """Computes out[M, N] = x[M, Kp] · dequant(qweight)ᵀ (+ bias), fp32 accumulation, cast to dtype.

    Pointers live on the target's device; shapes are those of the dense row-major tensors
    (see Int4GemmShape.validate for the rules). dtype: bfloat16 or float16.
    target: "cpu" -> cpu.mojo; "gpu" -> by the GPU's path (common/target.mojo, under the
    FORCE_* value `force`):
    - Hopper (sm_90a): dispatch.int4_gemm_gpu (wgmma from 17 tokens, else mma.sync);
    - Blackwell (sm_100a): the mma.sync kernels (int4_gemm_gpu_mma) with clusters;
    - Ampere (sm_80 / 86 / 87 / 89 / 120): the mma.sync kernels without clusters (split_k 1),
      configs resolved against the target's shared memory;
    - portable (AMD gfx9xx): kernels/portable.mojo;
    anything else fails to compile, naming the target. `int4_gpu_plan_text` describes the
    same choice on the host.
    """
    assert_activation_dtype[dtype, "multistage_gemm_q"]()
    var shape = Int4GemmShape.validate[group_size, has_zeros, has_bias](
        out_shape, x_shape, qweight_shape, scales_shape, zeros_shape, bias_len
    )
    comptime if target == "cpu":
        int4_gemm_cpu[dtype, has_zeros, has_bias](output, x, qweight, scales, zeros, bias, shape)
    elif target == "gpu":
        comptime path = gpu_path[force]()
        comptime assert path != PATH_UNSUPPORTED, String(
            "multistage_gemm_q: unsupported GPU target '", gpu_arch(), "' (supported: ", SUPPORTED_TARGETS, ")")
        comptime if path == PATH_HOPPER:
            int4_gemm_gpu[dtype, group_size, has_zeros, has_bias](
                output, x, qweight, scales, zeros, bias, shape.M, shape.N, shape.Kp, ctx, np_=shape.Np
            )
        elif path == PATH_PORTABLE:
            int4_gemm_gpu_portable[dtype, has_zeros, has_bias](
                output, x, qweight, scales, zeros, bias, shape.M, shape.N, shape.Kp, shape.Np, shape.group, ctx
            )
        else:
            int4_gemm_gpu_mma[dtype, group_size, has_zeros, has_bias, has_clusters(path), smem_budget(gpu_arch(), path)](
                output, x, qweight, scales, zeros, bias, shape.M, shape.N, shape.Kp, ctx, np_=shape.Np
            )
    else:
        comptime assert False, String("multistage_gemm_q: unsupported target '", target, "' (expected 'cpu' or 'gpu')")


def int4_gpu_plan_text(
    m: Int, n: Int, kp: Int, group_size: Int, has_zeros: Bool, arch: StaticString, force: Int
) raises -> String:
    """The launch `launch_int4_gemm` makes on GPU `arch` (e.g. "sm_90a", "gfx950") under `force`,
    as text: host arithmetic, for the plan op. Raises for a target no path supports."""
    var path = path_for_arch(arch, force)
    if path == PATH_UNSUPPORTED:
        raise Error("multistage_gemm_q: unsupported GPU target '", arch, "' (supported: ", SUPPORTED_TARGETS, ")")
    if path == PATH_HOPPER:
        return int4_gemm_gpu_config(m, n, kp, group_size, has_zeros)
    if path == PATH_PORTABLE:
        return int4_portable_plan_text(m, n)
    return int4_gemm_gpu_mma_config(m, n, kp, group_size, has_zeros, 0, has_clusters(path), smem_budget(arch, path))

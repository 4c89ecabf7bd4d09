"""Entry point of `multistage_gemm_q`: checks shapes, then picks the kernel for the target."""

from max.gpu.host import DeviceContext
from std.utils.index import IndexList

from ..common.checks import assert_activation_dtype
from .cpu import int4_gemm_cpu
from .gpu_dispatch import int4_gemm_gpu
from .layout import Int4GemmShape

comptime U32Ptr = Pointer[UInt32, MutAnyOrigin]
comptime ElemPtr[dtype: DType] = Pointer[Scalar[dtype], MutAnyOrigin]


def launch_int4_gemm[
    dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool, target: StaticString
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
    target: "cpu" -> cpu.mojo; "gpu" -> gpu_dispatch.mojo (tensor-core kernels, config by M, N,
    K); anything else fails to compile.
    """
    assert_activation_dtype[dtype, "multistage_gemm_q"]()
    var shape = Int4GemmShape.validate[group_size, has_zeros, has_bias](
        out_shape, x_shape, qweight_shape, scales_shape, zeros_shape, bias_len
    )
    comptime if target == "cpu":
        int4_gemm_cpu[dtype, has_zeros, has_bias](output, x, qweight, scales, zeros, bias, shape)
    elif target == "gpu":
        int4_gemm_gpu[dtype, group_size, has_zeros, has_bias](
            output, x, qweight, scales, zeros, bias, shape.M, shape.N, shape.Kp, ctx, np_=shape.Np
        )
    else:
        comptime assert False, String("multistage_gemm_q: unsupported target '", target, "' (expected 'cpu' or 'gpu')")

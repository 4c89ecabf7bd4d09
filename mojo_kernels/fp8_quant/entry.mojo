"""Entry of `quantize_fp8_rows`: checks the tensors, then runs the CPU or GPU path."""

from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .cpu import quantize_rows_cpu
from .kernels.quantize import quantize_rows_gpu
from .rows import OP_NAME


def quantize_fp8_rows[in_dtype: DType, out_dtype: DType, //, block: Int, target: StaticString](
    data: OutputTensor[dtype=out_dtype, rank=2, ...],
    scales: OutputTensor[dtype=DType.float32, rank=2, ...],
    x: InputTensor[dtype=in_dtype, rank=2, ...],
    ctx: DeviceContext,
) raises:
    """Quantizes x [T, H] to data e4m3 [T, H] (uint8 bits on CPU) and scales float32 [ceil(H/block), T].

    Raises an Error naming the tensor when the shapes disagree or a tensor is not dense.
    """
    comptime assert block > 0, String(OP_NAME, ": block must be positive")
    comptime assert (
        in_dtype == DType.bfloat16 or in_dtype == DType.float16 or in_dtype == DType.float32
    ), String(OP_NAME, ": x must be bfloat16, float16 or float32, got ", in_dtype)
    comptime assert out_dtype == DType.float8_e4m3fn or out_dtype == DType.uint8, String(
        OP_NAME, ": data must be float8_e4m3fn (uint8 bits on CPU), got ", out_dtype
    )
    var T = x.dim_size(0)
    var H = x.dim_size(1)
    var n_kb = (H + block - 1) // block
    if x.strides()[1] != 1:
        raise Error(OP_NAME, ": x must have unit column stride")
    if data.dim_size(0) != T or data.dim_size(1) != H or data.strides()[0] != H or data.strides()[1] != 1:
        raise Error(OP_NAME, ": data must be dense [", T, ", ", H, "]")
    if scales.dim_size(0) != n_kb or scales.dim_size(1) != T or scales.strides()[0] != T or scales.strides()[1] != 1:
        raise Error(OP_NAME, ": scales must be dense [ceil(H/block) = ", n_kb, ", T = ", T, "]")
    var xp = x.unsafe_ptr().as_unsafe_any_origin()
    var dp = data.unsafe_ptr().as_unsafe_any_origin().unsafe_bitcast[Float8_e4m3fn]()
    var sp = scales.unsafe_ptr().as_unsafe_any_origin()
    comptime if target == "cpu":
        quantize_rows_cpu[in_dtype, block](xp, dp, sp, T, H, x.strides()[0])
    elif target == "gpu":
        quantize_rows_gpu[in_dtype, block](xp, dp, sp, T, H, x.strides()[0], ctx)
    else:
        comptime assert False, String(OP_NAME, ": unsupported target '", target, "'")

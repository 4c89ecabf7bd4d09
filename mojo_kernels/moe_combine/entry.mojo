"""Entry of `moe_combine_rows`: checks the tensors, then runs the CPU or GPU path."""

from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .combine import OP_NAME
from .cpu import combine_rows_cpu
from .kernels.gather_sum import combine_rows_gpu


def moe_combine_rows[dtype: DType, //, target: StaticString](
    combined: OutputTensor[dtype=dtype, rank=2, ...],
    y: InputTensor[dtype=dtype, rank=2, ...],
    inverse: InputTensor[dtype=DType.int64, rank=1, ...],
    ctx: DeviceContext,
) raises:
    """Writes combined [T, H] from y [R, H] and inverse [R = T K] (combine.mojo). Raises an Error naming
    the tensor when the shapes disagree or a tensor is not dense."""
    comptime assert dtype == DType.bfloat16 or dtype == DType.float16, String(
        OP_NAME, ": y must be bfloat16 or float16, got ", dtype
    )
    var T = combined.dim_size(0)
    var H = combined.dim_size(1)
    var R = inverse.dim_size(0)
    if y.dim_size(0) != R or y.dim_size(1) != H:
        raise Error(OP_NAME, ": y must be [R = ", R, ", H = ", H, "], got [", y.dim_size(0), ", ",
                    y.dim_size(1), "]")
    if (T == 0 and R != 0) or (T > 0 and R % T != 0):
        raise Error(OP_NAME, ": inverse has ", R, " entries, not a multiple of the ", T, " tokens")
    if H > 0 and (y.strides()[1] != 1 or (R > 1 and y.strides()[0] != H)):
        raise Error(OP_NAME, ": y must be dense [R, H]")
    if H > 0 and (combined.strides()[1] != 1 or (T > 1 and combined.strides()[0] != H)):
        raise Error(OP_NAME, ": combined must be dense [T, H]")
    if R > 1 and inverse.strides()[0] != 1:
        raise Error(OP_NAME, ": inverse must be dense [R]")
    var K = R // T if T > 0 else 0
    var op = combined.unsafe_ptr().as_unsafe_any_origin()
    var yp = y.unsafe_ptr().as_unsafe_any_origin()
    var ip = inverse.unsafe_ptr().as_unsafe_any_origin()
    comptime if target == "cpu":
        combine_rows_cpu[dtype](op, yp, ip, T, R, H, K)
    elif target == "gpu":
        combine_rows_gpu[dtype](op, yp, ip, T, R, H, K, ctx)
    else:
        comptime assert False, String(OP_NAME, ": unsupported target '", target, "'")

"""Entries of `rms_norm_rows` and `add_rms_norm_rows`: check the tensors, then run the CPU or GPU
path."""

from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .cpu import rms_norm_rows_cpu
from .kernels.rows import rms_norm_rows_gpu
from .norm import ADD_OP_NAME, OP_NAME, is_norm_input, is_norm_output


def _check_dense[dtype: DType](
    name: StaticString, op: StaticString, t: InputTensor[dtype=dtype, rank=2, ...], T: Int, H: Int
) raises:
    if t.dim_size(0) != T or t.dim_size(1) != H:
        raise Error(op, ": ", name, " must be [T = ", T, ", H = ", H, "], got [", t.dim_size(0),
                    ", ", t.dim_size(1), "]")
    if H > 0 and (t.strides()[1] != 1 or (T > 1 and t.strides()[0] != H)):
        raise Error(op, ": ", name, " must be dense [T, H]")


def rms_norm_rows_run[
    h_dtype: DType, y_dtype: DType, out_dtype: DType, data_dtype: DType, //,
    has_y: Bool, fp8_block: Int, target: StaticString,
](
    sum: OutputTensor[dtype=DType.float32, rank=2, ...],
    normed: OutputTensor[dtype=out_dtype, rank=2, ...],
    data: OutputTensor[dtype=data_dtype, rank=2, ...],
    scales: OutputTensor[dtype=DType.float32, rank=2, ...],
    h: InputTensor[dtype=h_dtype, rank=2, ...],
    y: InputTensor[dtype=y_dtype, rank=2, ...],
    weight: InputTensor[dtype=DType.float32, rank=1, ...],
    eps: Float32,
    ctx: DeviceContext,
) raises:
    """Writes normed [T, H] and, unless sum has 0 rows, sum [T, H] (norm.mojo's rule) from h [T, H],
    y [T, H] (read only when has_y) and weight [H]; fp8_block > 0: also the normed rows' e4m3
    data [T, H] (uint8 bits on CPU) and scales [ceil(H / fp8_block), T], as `quantize_fp8_rows`
    writes them (fp8_block 0: data [0, H] and scales [0, 0], untouched). Raises an Error naming
    the tensor when the shapes disagree or a tensor is not dense."""
    comptime op: StaticString = ADD_OP_NAME if has_y else OP_NAME
    comptime assert is_norm_input(h_dtype), String(op, ": h must be float32, bfloat16 or float16")
    comptime assert is_norm_input(y_dtype), String(op, ": y must be float32, bfloat16 or float16")
    comptime assert is_norm_output(out_dtype), String(op, ": normed must be bfloat16 or float16")
    comptime assert fp8_block >= 0, String(op, ": fp8_block must be >= 0")
    comptime assert data_dtype == DType.float8_e4m3fn or data_dtype == DType.uint8, String(
        op, ": data must be float8_e4m3fn (uint8 bits on CPU)"
    )
    var T = h.dim_size(0)
    var H = h.dim_size(1)
    _check_dense(StaticString("h"), op, h, T, H)
    comptime if has_y:
        _check_dense(StaticString("y"), op, y, T, H)
    if weight.dim_size(0) != H or (H > 1 and weight.strides()[0] != 1):
        raise Error(op, ": weight must be dense [H = ", H, "], got [", weight.dim_size(0), "]")
    if normed.dim_size(0) != T or normed.dim_size(1) != H:
        raise Error(op, ": normed must be [T = ", T, ", H = ", H, "]")
    if H > 0 and (normed.strides()[1] != 1 or (T > 1 and normed.strides()[0] != H)):
        raise Error(op, ": normed must be dense [T, H]")
    var write_sum = sum.dim_size(0) != 0
    if write_sum and (sum.dim_size(0) != T or sum.dim_size(1) != H):
        raise Error(op, ": sum must be [T = ", T, ", H = ", H, "] or have 0 rows, got [",
                    sum.dim_size(0), ", ", sum.dim_size(1), "]")
    if write_sum and H > 0 and (sum.strides()[1] != 1 or (T > 1 and sum.strides()[0] != H)):
        raise Error(op, ": sum must be dense [T, H]")
    var rows = T if fp8_block > 0 else 0
    var n_kb = (H + fp8_block - 1) // fp8_block if fp8_block > 0 else 0
    if data.dim_size(0) != rows or data.dim_size(1) != H or (
        rows > 1 and (data.strides()[0] != H or data.strides()[1] != 1)
    ):
        raise Error(op, ": data must be dense [", rows, ", H = ", H, "]")
    if scales.dim_size(0) != n_kb or scales.dim_size(1) != rows or (
        n_kb > 0 and rows > 1 and (scales.strides()[0] != rows or scales.strides()[1] != 1)
    ):
        raise Error(op, ": scales must be dense [", n_kb, ", ", rows, "]")
    var dp = data.unsafe_ptr().as_unsafe_any_origin().unsafe_bitcast[Float8_e4m3fn]()
    var qp = scales.unsafe_ptr().as_unsafe_any_origin()
    var sp = sum.unsafe_ptr().as_unsafe_any_origin()
    var np = normed.unsafe_ptr().as_unsafe_any_origin()
    var hp = h.unsafe_ptr().as_unsafe_any_origin()
    var yp = y.unsafe_ptr().as_unsafe_any_origin()
    var wp = weight.unsafe_ptr().as_unsafe_any_origin()
    comptime if target == "cpu":
        rms_norm_rows_cpu[h_dtype, y_dtype, out_dtype, has_y, fp8_block](
            sp, np, dp, qp, hp, yp, wp, T, H, eps, write_sum)
    elif target == "gpu":
        rms_norm_rows_gpu[h_dtype, y_dtype, out_dtype, has_y, fp8_block](
            sp, np, dp, qp, hp, yp, wp, T, H, eps, write_sum, ctx)
    else:
        comptime assert False, String(op, ": unsupported target '", target, "'")

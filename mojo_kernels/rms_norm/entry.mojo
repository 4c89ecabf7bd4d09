"""Entries of `rms_norm_rows` and `add_rms_norm_rows`: check the tensors, then run the CPU or GPU
path."""

from std.utils.index import IndexList
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from ..common.checks import row_major_shape
from .cpu import rms_norm_rows_cpu
from .kernels.rows import rms_norm_rows_gpu
from .norm import ADD_OP_NAME, OP_NAME, is_norm_input, is_norm_output


def _expect(
    op: StaticString, name: StaticString, shape: IndexList[2], strides: IndexList[2], rows: Int,
    cols: Int,
) raises:
    """Raises an Error naming the tensor unless it is a dense row-major [rows, cols]."""
    if shape[0] != rows or shape[1] != cols:
        raise Error(op, ": ", name, " must be [", rows, ", ", cols, "], got [", shape[0], ", ",
                    shape[1], "]")
    _ = row_major_shape(shape, strides, name)


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
    _expect(op, "h", h.shape(), h.strides(), T, H)
    comptime if has_y:
        _expect(op, "y", y.shape(), y.strides(), T, H)
    if weight.dim_size(0) != H:
        raise Error(op, ": weight must be [H = ", H, "], got [", weight.dim_size(0), "]")
    _ = row_major_shape(weight.shape(), weight.strides(), "weight")
    _expect(op, "normed", normed.shape(), normed.strides(), T, H)
    var write_sum = sum.dim_size(0) != 0  # 0 rows: the caller does not keep the sum
    if write_sum:
        _expect(op, "sum", sum.shape(), sum.strides(), T, H)
    var rows = T if fp8_block > 0 else 0
    var n_kb = (H + fp8_block - 1) // fp8_block if fp8_block > 0 else 0
    _expect(op, "data", data.shape(), data.strides(), rows, H)
    _expect(op, "scales", scales.shape(), scales.strides(), n_kb, rows)
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

"""Compile-time and run-time checks shared by the custom ops."""

from std.utils.index import IndexList


@always_inline
def assert_activation_dtype[dtype: DType, op_name: StaticString]():
    """Compile-time check that `dtype` is an activation dtype the int4 kernels support."""
    comptime assert dtype == DType.bfloat16 or dtype == DType.float16, String(
        op_name, ": activations/scales must be bfloat16 or float16, got ", dtype
    )


def row_major_shape[rank: Int](
    shape: IndexList[rank], strides: IndexList[rank], name: StaticString
) raises -> IndexList[rank]:
    """Return `shape` after checking that the tensor is dense row-major (the kernels index raw
    pointers). Raises an Error naming the tensor otherwise."""
    var expected = 1
    comptime for r in range(rank):
        comptime i = rank - 1 - r
        if shape[i] > 1 and strides[i] != expected:
            raise Error("tensor '", name, "' is not dense row-major")
        expected *= shape[i]
    return shape

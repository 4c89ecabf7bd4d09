"""Graph-tensor entry of `fp8_blockwise_matmul`: the FP8 block-scaled kernels of the K-cache op
(same dispatch, same kernels, same sums) writing a dense row-major matrix (`DenseRows` of
sink.mojo) instead of cache slots. It is the dense GEMM the cache-writing op is measured
against, and a block-scaled FP8 linear layer of its own.

    output[m, n] = sum_k a[m, k] w[n, k] a_scale[k // gk, m // gm] w_scale[n // gn, k // gk]

in fp32 (promoted per gk block), one rounding to bfloat16.
"""

from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .entry import launch_k_cache_matmul
from .layout import KCacheShape, check_scales
from .sink import DenseRows

comptime OP_NAME = "fp8_blockwise_matmul"


def dense_shape[gm: Int, gn: Int, gk: Int](
    output: OutputTensor[dtype=DType.bfloat16, rank=2, ...],
    a: InputTensor[rank=2, ...],
    a_scale: InputTensor[dtype=DType.float32, rank=2, ...],
    w: InputTensor[rank=2, ...],
    w_scale: InputTensor[dtype=DType.float32, rank=2, ...],
) raises -> KCacheShape:
    """The kernels' sizes and strides of one call (B = 1, no cache), after checking every shape
    rule they rely on; raises an Error naming the tensor."""
    comptime assert gm > 0 and gn > 0 and gk > 0, "scale granularities must be positive"
    var M = a.dim_size(0)
    var K = a.dim_size(1)
    var N = w.dim_size(0)
    if K <= 0:
        raise Error(OP_NAME, ": a has K = ", K, " columns; K must be positive")
    if a.strides()[1] != 1 or w.strides()[1] != 1:
        raise Error(OP_NAME, ": a and w must have unit column stride")
    if w.dim_size(1) != K:
        raise Error(OP_NAME, ": w has ", w.dim_size(1), " columns but a has K = ", K)
    if output.dim_size(0) != M or output.dim_size(1) != N:
        raise Error(OP_NAME, ": output must be [M = ", M, ", N = ", N, "], got [", output.dim_size(0), ", ",
                    output.dim_size(1), "]")
    if output.strides()[1] != 1 or (M > 1 and output.strides()[0] < N):
        raise Error(OP_NAME, ": output must be row-major with unit column stride")
    check_scales[gm, gn, gk](OP_NAME, "a_scale", "w_scale", M, N, K, a_scale.shape(), a_scale.strides(),
                             w_scale.shape(), w_scale.strides())
    return KCacheShape(
        Int32(M), Int32(K), Int32(N), Int32(1),
        Int32(a_scale.strides()[0]), Int32(w_scale.strides()[0]),
        Int32(0), Int32(0), Int32(0), Int32(1),
        Int32(a.strides()[0]), Int32(w.strides()[0]),
    )


def fp8_blockwise_matmul[
    in_dtype: DType, //, gm: Int, gn: Int, gk: Int, target: StaticString, force: Int = 0
](
    output: OutputTensor[dtype=DType.bfloat16, rank=2, ...],
    a: InputTensor[dtype=in_dtype, rank=2, ...],
    a_scale: InputTensor[dtype=DType.float32, rank=2, ...],
    w: InputTensor[dtype=in_dtype, rank=2, ...],
    w_scale: InputTensor[dtype=DType.float32, rank=2, ...],
    ctx: DeviceContext,
) raises:
    """output [M, N] bfloat16 = the block-scaled product of a [M, K] and w [N, K] (float8_e4m3fn,
    uint8 e4m3fn bits on CPU) with a_scale float32 [ceil(K/gk), >= ceil(M/gm)] and w_scale
    float32 [ceil(N/gn), ceil(K/gk)] (the K-cache op's input_scale / weight_scale layout).
    `force`: a FORCE_* value of common/target.mojo. Raises an Error naming the tensor for a bad
    shape."""
    comptime assert in_dtype == DType.float8_e4m3fn or in_dtype == DType.uint8, String(
        OP_NAME, ": a/w must be float8_e4m3fn (uint8 bits on CPU), got ", in_dtype
    )
    var shape = dense_shape[gm, gn, gk](output, a, a_scale, w, w_scale)
    var rows = DenseRows[DType.bfloat16](Int(output.unsafe_ptr()), output.strides()[0])
    var ap = a.unsafe_ptr().as_unsafe_any_origin().unsafe_bitcast[Float8_e4m3fn]()
    var wp = w.unsafe_ptr().as_unsafe_any_origin().unsafe_bitcast[Float8_e4m3fn]()
    var asp = a_scale.unsafe_ptr().as_unsafe_any_origin()
    var wsp = w_scale.unsafe_ptr().as_unsafe_any_origin()
    # offsets, cache lengths and lookup table are read by paged sinks only (pointers are
    # non-nullable: any valid one stands in)
    var none = asp.unsafe_bitcast[UInt32]()
    # kv_scale is read for float8 destinations only: never here
    launch_k_cache_matmul[gm, gn, gk, DenseRows[DType.bfloat16], target, force](
        ap, none, asp, none, none, shape, wp, wsp, asp, rows, wp, wsp, asp, rows, False, ctx
    )

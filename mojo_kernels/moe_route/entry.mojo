"""Entry of `moe_route_topk_group`: checks the tensors, then runs the CPU or GPU path."""

from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .cpu import group_rows_cpu, route_tokens_cpu
from .kernels.topk_group import VEC, route_gpu
from .route import MAX_EXPERTS, OP_NAME


def _check_dense_1d(n: Int, size: Int, stride: Int, name: StaticString, what: StaticString) raises:
    if size != n or (n > 1 and stride != 1):
        raise Error(OP_NAME, ": ", name, " must be dense [", what, " = ", n, "], got ", size, " elements")


def moe_route_topk_group[dtype: DType, //, target: StaticString](
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
    """Routes x [T, H] through router_weight [E, H]; K = topk_ids.dim(1) (see registrations.mojo).

    Raises an Error naming the tensor when the shapes disagree or a tensor is not dense.
    """
    comptime assert dtype == DType.bfloat16 or dtype == DType.float16, String(
        OP_NAME, ": x and router_weight must be bfloat16 or float16, got ", dtype
    )
    var T = x.dim_size(0)
    var H = x.dim_size(1)
    var E = router_weight.dim_size(0)
    var K = topk_ids.dim_size(1)
    var R = T * K
    if E < 1 or E > MAX_EXPERTS:
        raise Error(OP_NAME, ": router_weight must have 1 to ", MAX_EXPERTS, " experts, got ", E)
    if K < 1 or K > E:
        raise Error(OP_NAME, ": top_k must be in [1, E = ", E, "], got ", K)
    if H % VEC != 0:
        raise Error(OP_NAME, ": H must be a multiple of ", VEC, ", got ", H)
    if x.strides()[1] != 1 or (T > 1 and x.strides()[0] % VEC != 0):
        raise Error(OP_NAME, ": x must have unit column stride and a row stride that is a multiple of ", VEC)
    if router_weight.dim_size(1) != H or router_weight.strides()[0] != H or router_weight.strides()[1] != 1:
        raise Error(OP_NAME, ": router_weight must be dense [E, H = ", H, "]")
    if topk_ids.dim_size(0) != T or topk_ids.strides()[0] != K or topk_ids.strides()[1] != 1:
        raise Error(OP_NAME, ": topk_ids must be dense [T = ", T, ", K]")
    if topk_weights.dim_size(0) != T or topk_weights.dim_size(1) != K or topk_weights.strides()[0] != K:
        raise Error(OP_NAME, ": topk_weights must be dense [T = ", T, ", K = ", K, "]")
    _check_dense_1d(R, token_index.dim_size(0), token_index.strides()[0], "token_index", "T * K")
    _check_dense_1d(R, row_scale.dim_size(0), row_scale.strides()[0], "row_scale", "T * K")
    _check_dense_1d(R, inverse.dim_size(0), inverse.strides()[0], "inverse", "T * K")
    _check_dense_1d(E + 1, a_offsets.dim_size(0), a_offsets.strides()[0], "a_offsets", "E + 1")
    _check_dense_1d(2, expert_usage_stats.dim_size(0), expert_usage_stats.strides()[0], "expert_usage_stats", "2")
    var xp = x.unsafe_ptr().as_unsafe_any_origin()
    var wp = router_weight.unsafe_ptr().as_unsafe_any_origin()
    var ids = topk_ids.unsafe_ptr().as_unsafe_any_origin()
    var wts = topk_weights.unsafe_ptr().as_unsafe_any_origin()
    var tok = token_index.unsafe_ptr().as_unsafe_any_origin()
    var rs = row_scale.unsafe_ptr().as_unsafe_any_origin()
    var inv = inverse.unsafe_ptr().as_unsafe_any_origin()
    var offs = a_offsets.unsafe_ptr().as_unsafe_any_origin()
    var st = expert_usage_stats.unsafe_ptr().as_unsafe_any_origin()
    comptime if target == "cpu":
        route_tokens_cpu[dtype](xp, wp, ids, wts, T, H, E, K, x.strides()[0])
        group_rows_cpu(ids, wts, tok, rs, inv, offs, st, R, E, K)
    elif target == "gpu":
        route_gpu[dtype](xp, wp, ids, wts, tok, rs, inv, offs, st, T, H, E, K, x.strides()[0], ctx)
    else:
        comptime assert False, String(OP_NAME, ": unsupported target '", target, "'")

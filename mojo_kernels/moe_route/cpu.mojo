"""CPU path of `moe_route_topk_group`: plain loops (tokens in parallel for the router)."""

from std.math import ceildiv, exp
from std.sys import num_logical_cores
from std.memory.alloc import unsafe_alloc
from max.algorithm import sync_parallelize

from .route import key_expert, key_logit, logit_key


def route_tokens_cpu[dtype: DType](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    w: Pointer[Scalar[dtype], MutAnyOrigin],
    ids: Pointer[Int32, MutAnyOrigin],
    weights: Pointer[Float32, MutAnyOrigin],
    T: Int,
    H: Int,
    E: Int,
    K: Int,
    x_stride: Int,
) raises:
    """ids / weights [T, K]: the top-K experts of each token by float32 logit, and their softmax."""
    if T == 0:
        return
    var items = min(T, 4 * num_logical_cores())
    var per_item = ceildiv(T, items)

    def item(i: Int) raises {var x, var w, var ids, var weights, var T, var H, var E, var K, var x_stride, var per_item}:
        var logits = unsafe_alloc[Float32](E)
        for t in range(i * per_item, min(T, (i + 1) * per_item)):
            var xr = x.unsafe_offset(t * x_stride)
            for e in range(E):
                var wr = w.unsafe_offset(e * H)
                var acc = Float32(0)
                for h in range(H):
                    acc += xr[unsafe_offset=h].cast[DType.float32]() * wr[unsafe_offset=h].cast[DType.float32]()
                logits[unsafe_offset=e] = acc
            var prev = UInt64(0)
            var v0 = Float32(0)
            var total = Float32(0)
            for r in range(K):
                var best = UInt64(0)
                for e in range(E):
                    var key = logit_key(logits[unsafe_offset=e], e)
                    if (r == 0 or key < prev) and key > best:
                        best = key
                prev = best
                var v = key_logit(best)
                if r == 0:
                    v0 = v
                var p = exp(v - v0)
                total += p
                ids[unsafe_offset=t * K + r] = key_expert(best)
                weights[unsafe_offset=t * K + r] = p
            for r in range(K):
                weights[unsafe_offset=t * K + r] = weights[unsafe_offset=t * K + r] / total
        logits.unsafe_free()

    sync_parallelize(item, ceildiv(T, per_item))


def group_rows_cpu(
    ids: Pointer[Int32, MutAnyOrigin],
    weights: Pointer[Float32, MutAnyOrigin],
    token_index: Pointer[Int64, MutAnyOrigin],
    row_scale: Pointer[Float32, MutAnyOrigin],
    inverse: Pointer[Int64, MutAnyOrigin],
    offsets: Pointer[UInt32, MutAnyOrigin],
    stats: Pointer[UInt32, MutAnyOrigin],
    R: Int,
    E: Int,
    K: Int,
):
    """Counting sort of the R assignments by expert, stable (assignment order inside an expert)."""
    for e in range(E + 1):
        offsets[unsafe_offset=e] = 0
    for a in range(R):
        offsets[unsafe_offset=Int(ids[unsafe_offset=a]) + 1] += 1
    var most = UInt32(0)
    for e in range(E):
        most = max(most, offsets[unsafe_offset=e + 1])
        offsets[unsafe_offset=e + 1] += offsets[unsafe_offset=e]
    var next = unsafe_alloc[UInt32](max(E, 1))
    for e in range(E):
        next[unsafe_offset=e] = offsets[unsafe_offset=e]
    for a in range(R):
        var e = Int(ids[unsafe_offset=a])
        var row = Int(next[unsafe_offset=e])
        next[unsafe_offset=e] = UInt32(row + 1)
        token_index[unsafe_offset=row] = Int64(a // K)
        row_scale[unsafe_offset=row] = weights[unsafe_offset=a]
        inverse[unsafe_offset=a] = Int64(row)
    next.unsafe_free()
    stats[unsafe_offset=0] = most
    stats[unsafe_offset=1] = UInt32(E)

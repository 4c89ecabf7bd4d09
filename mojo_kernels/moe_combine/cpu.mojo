"""CPU path of `moe_combine_rows`: a plain loop per token (combine.mojo's summation rule)."""

from std.memory.alloc import unsafe_alloc


def combine_rows_cpu[dtype: DType](
    combined: Pointer[Scalar[dtype], MutAnyOrigin],
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    inverse: Pointer[Int64, MutAnyOrigin],
    T: Int,
    R: Int,
    H: Int,
    K: Int,
):
    """Writes combined [T, H]: the sum of the K rows of y [R, H] that inverse [T K] names per token."""
    var acc = unsafe_alloc[Float32](max(H, 1))
    for t in range(T):
        for h in range(H):
            acc[unsafe_offset=h] = 0
        for j in range(K):
            var r = Int(inverse[unsafe_offset=t * K + j])
            if r >= 0 and r < R:
                for h in range(H):
                    acc[unsafe_offset=h] += y[unsafe_offset=r * H + h].cast[DType.float32]()
        for h in range(H):
            combined[unsafe_offset=t * H + h] = acc[unsafe_offset=h].cast[dtype]()
    acc.unsafe_free()

"""The GPU launch plan of `k_matmul_ragged_paged_scale` (and its V twin) as text, computable on the
host (any target).

Benchmarks record it per row and tests check it without a GPU: the plan is a pure function of
(T, N, K, a_stride, w_stride), the scale granularity and the GPU target (arch and forced path),
the same function the GPU dispatch launches from (`k_cache_gpu_plan` in dispatch.mojo, given the
target's path by `entry.k_cache_plan_text`).
"""

from ..common.plan_text import write_nul_padded
from .entry import k_cache_plan_text
from .layout import KCacheShape

comptime _INT32_MAX = 2**31 - 1


def plan_shape(t: Int, n: Int, k: Int, a_stride: Int, w_stride: Int) -> KCacheShape:
    """The KCacheShape the plan sees: only T, K, N and the row strides enter `k_cache_gpu_plan`;
    the cache fields are placeholders."""
    return KCacheShape(
        T=Int32(t), K=Int32(k), N=Int32(n), B=Int32(1), as_stride=Int32(0), ws_stride=Int32(0),
        lut_stride=Int32(0), lut_cols=Int32(0), num_pages=Int32(0), n_kv_scale=Int32(1),
        a_stride=Int32(a_stride), w_stride=Int32(w_stride),
    )


def write_k_cache_gpu_plan[gm: Int, gn: Int, gk: Int, arch: StaticString = "sm_90a", force: Int = 0](
    dst: Pointer[UInt8, MutAnyOrigin], capacity: Int, t: Int, n: Int, k: Int, a_stride: Int, w_stride: Int
) raises:
    """Writes the plan for T tokens x N weight rows x K (rows of hidden_state / weight a_stride /
    w_stride elements apart) on GPU `arch` under the FORCE_* value `force` as NUL-padded ASCII
    into dst[0:capacity].

    Raises if the text does not fit (capacity too small), T, N or a stride is negative, K is not
    positive, a size does not fit the kernels' Int32 fields, or no path supports `arch`.
    """
    comptime assert gm > 0 and gn > 0 and gk > 0, "scale granularities must be positive"
    if t < 0 or n < 0 or k <= 0 or a_stride < 0 or w_stride < 0:
        raise Error(
            "k_matmul_ragged_paged_scale_plan: need T, N, a_stride, w_stride >= 0 and K > 0, got T=", t,
            " N=", n, " K=", k, " a_stride=", a_stride, " w_stride=", w_stride,
        )
    if max(t, n, k, a_stride, w_stride) > _INT32_MAX:
        raise Error("k_matmul_ragged_paged_scale_plan: sizes must fit in Int32, got T=", t, " N=", n, " K=", k,
                    " a_stride=", a_stride, " w_stride=", w_stride)
    write_nul_padded(dst, capacity, k_cache_plan_text[gm, gn, gk, arch, force](plan_shape(t, n, k, a_stride, w_stride)),
                     "k_matmul_ragged_paged_scale_plan")

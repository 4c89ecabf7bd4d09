"""The GPU launch plan of `multistage_gemm_q` as text, computable on the host (any target).

Benchmarks record it per row and tests check it (e.g. warp_k > 1 at decode sizes) without a GPU:
the plan is a pure function of (M, N, Kp, group size, zeros) and the GPU target (arch and forced
path), the same choice the GPU dispatch makes (`entry.int4_gpu_plan_text`).
"""

from ..common.plan_text import write_nul_padded
from .entry import int4_gpu_plan_text


def write_int4_gpu_plan(
    dst: Pointer[UInt8, MutAnyOrigin], capacity: Int, m: Int, n: Int, kp: Int, group_size: Int, has_zeros: Bool,
    arch: StaticString, force: Int,
) raises:
    """Writes the plan for out[M, N] = x[M, Kp] · Wᵀ on GPU `arch` under the FORCE_* value
    `force` as NUL-padded ASCII into dst[0:capacity].

    Raises if the text does not fit (capacity too small), a size is not positive or no path
    supports `arch`.
    """
    if m <= 0 or n <= 0 or kp <= 0:
        raise Error("multistage_gemm_q_plan: sizes must be positive, got M=", m, " N=", n, " Kp=", kp)
    write_nul_padded(dst, capacity, int4_gpu_plan_text(m, n, kp, group_size, has_zeros, arch, force),
                     "multistage_gemm_q_plan")

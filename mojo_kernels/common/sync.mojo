"""CTA synchronization for warp-specialized kernels (NVIDIA).

`max.gpu.barrier()` emits `bar.sync 0`, PTX's *aligned* barrier: every thread of the CTA must
execute the same barrier instruction. A kernel whose producer and consumer warpgroups reach a
CTA barrier from different branches (each role's code path has its own instruction) must use
the non-aligned form instead; with the aligned one the behaviour is undefined, and
compute-sanitizer's synccheck reports "Divergent thread(s) in block".
"""

from std.sys import inlined_assembly


@always_inline
def role_barrier():
    """CTA-wide barrier 0 (`barrier.sync 0`, non-aligned) for code reached from different
    branches by different warps; a memory clobber keeps shared-memory accesses on their side."""
    inlined_assembly["barrier.sync 0;", NoneType, constraints="~{memory}", has_side_effect=True]()

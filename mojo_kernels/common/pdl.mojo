"""Programmatic dependent launch (PDL, SM90+): how the package's kernels overlap their start with
the end of the kernel before them.

A kernel launched with `pdl_attributes()` may become resident while its predecessor on the
stream still runs (once every CTA of the predecessor has called `launch_dependent_grids`). It
fetches what no earlier kernel writes (weights, scales) first, then calls
`wait_on_dependent_grids`, which returns when the predecessor has completed and its stores are
visible, and only then touches activations, caches or outputs. A captured device graph keeps
these programmatic edges, so decode replays overlap consecutive kernels too. On targets
without PDL the attributes are empty and both calls compile to nothing.

A kernel may instead release its dependents only after its own wait (the grouped GEMM does):
then everything it reads is complete before the next kernel can start, so a later kernel that
reads the same data may read it before its own wait (the MoE down projection's routing, which
gate_up read: grouped_gemm/entry.mojo `routing_settled`).
"""

from std.sys import inlined_assembly, is_nvidia_gpu

from max.gpu.host.launch_attribute import LaunchAttribute
from max.gpu.primitives.grid_controls import (
    PDLLevel,
    launch_dependent_grids,
    pdl_launch_attributes,
    wait_on_dependent_grids,
)


@always_inline
def pdl_attributes() -> List[LaunchAttribute]:
    """Launch attributes of a kernel that follows the PDL protocol above (empty without PDL)."""
    return pdl_launch_attributes(PDLLevel.ON)


@always_inline
def prefetch_l2[dtype: DType](p: Pointer[Scalar[dtype], MutAnyOrigin], i: Int):
    """Starts fetching the 128-byte line holding p[i] into L2 without waiting for it (NVIDIA's
    `prefetch.global.L2`; nothing elsewhere): a kernel's pre-wait work for data it reads after
    `wait_on_dependent_grids` as dependent loads it cannot hold in registers."""
    comptime if is_nvidia_gpu():
        inlined_assembly["prefetch.global.L2 [$0];", NoneType, constraints="l",
                         has_side_effect=True](p.unsafe_offset(i))

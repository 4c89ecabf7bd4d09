"""Programmatic dependent launch (PDL, SM90+): how the package's kernels overlap their start with
the end of the kernel before them.

A kernel launched with `pdl_attributes()` may become resident while its predecessor on the
stream still runs (once every CTA of the predecessor has called `launch_dependent_grids`). It
fetches what no earlier kernel writes (weights, scales) first, then calls
`wait_on_dependent_grids`, which returns when the predecessor has completed and its stores are
visible, and only then touches activations, caches or outputs. A captured device graph keeps
these programmatic edges, so decode replays overlap consecutive kernels too. On targets
without PDL the attributes are empty and both calls compile to nothing.
"""

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

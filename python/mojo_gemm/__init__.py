"""mojo-gemm: fast Mojo matmul kernels as MAX graph custom ops, with typed Python bindings.

Public API:
- `int4_matmul`, `Int4WeightValues`, `Int4Linear`, `Int4Weight`: W4A16 (GPTQ/AWQ int4 weights)
  through the `multistage_gemm_q` op.
- `kernels_path`: the Mojo package to pass as `custom_extensions` when needed.
- `contracts`: the shape/dtype rules of every op.
"""

from . import contracts
from ._extension import kernels_path
from .int4 import Int4WeightValues, int4_matmul
from .layers import Int4Linear
from .quant.int4 import Int4Weight

__all__ = [
    "Int4Linear",
    "Int4Weight",
    "Int4WeightValues",
    "contracts",
    "int4_matmul",
    "kernels_path",
]

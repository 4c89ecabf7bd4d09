"""mojo-gemm: fast Mojo matmul kernels as MAX graph custom ops, with typed Python bindings.

Public API:
- W4A16 (GPTQ/AWQ int4 weights, op `multistage_gemm_q`): `int4_matmul`, `Int4WeightValues`,
  `Int4Linear`, `Int4Weight`; `int4_gpu_plan`: the H200 launch plan of a call, computed on the
  CPU (op `multistage_gemm_q_plan`).
- MoE grouped GEMM (op `grouped_matmul_sm100_persistent`): `grouped_matmul`, `GroupedLinear`,
  `group_tokens_by_expert`, `ExpertGrouping`, `interleave_gate_up`.
- FP8 K projection into MAX's paged KV cache (op `k_matmul_ragged_paged_scale`):
  `k_matmul_ragged_paged_scale`, `fp8_dtype_for`, `quantize_fp8_blockwise`,
  `quantize_fp8_input`, `Fp8Blockwise`, `fp8_buffer`; `k_cache_gpu_plan`: the H200 launch plan
  of a call (kernel and CTA tile), computed on the CPU (op `k_matmul_ragged_paged_scale_plan`).
- MoE layer: `MoEBlock` (router top-k, on-device token grouping, grouped SwiGLU experts, weighted
  combine).
- FP8 K/V projection layer: `PagedKVProjection` (`quantize_fp8_rows` + the K op and its V twin
  `v_matmul_ragged_paged_scale`).
- `kernels_package`: the precompiled kernels (`.mojoc`) the graph functions add to every graph;
  pass it as `custom_extensions` to `session.compile` of a multi-graph `Module`. `kernels_path`:
  their source directory (never both in one process: two definitions of every op).
- `contracts`: the shape/dtype rules of every op.
- `gpu_path(arch)`: the kernel path a GPU target gets ("hopper", "blackwell", "ampere",
  "portable", or None when unsupported; README "Supported GPUs").
"""

from . import contracts
from ._extension import kernels_package, kernels_path
from ._targets import gpu_path
from .fp8_quantize import quantize_fp8_rows
from .grouped import grouped_matmul
from .grouped_layer import GroupedLinear
from .int4 import Int4WeightValues, int4_matmul
from .int4_plan import int4_gpu_plan
from .k_cache import fp8_dtype_for, k_matmul_ragged_paged_scale, v_matmul_ragged_paged_scale
from .k_cache_plan import k_cache_gpu_plan
from .kv_projection import PagedKVProjection
from .layers import Int4Linear
from .moe_block import MoEBlock
from .moe_routing import ExpertGrouping, group_tokens_by_expert, interleave_gate_up
from .quant.fp8 import Fp8Blockwise, fp8_buffer, quantize_fp8_blockwise, quantize_fp8_input
from .quant.int4 import Int4Weight

__all__ = [
    "ExpertGrouping",
    "Fp8Blockwise",
    "GroupedLinear",
    "Int4Linear",
    "Int4Weight",
    "Int4WeightValues",
    "MoEBlock",
    "PagedKVProjection",
    "contracts",
    "fp8_buffer",
    "fp8_dtype_for",
    "gpu_path",
    "group_tokens_by_expert",
    "grouped_matmul",
    "int4_gpu_plan",
    "int4_matmul",
    "interleave_gate_up",
    "k_cache_gpu_plan",
    "k_matmul_ragged_paged_scale",
    "kernels_package",
    "kernels_path",
    "quantize_fp8_blockwise",
    "quantize_fp8_input",
    "quantize_fp8_rows",
    "v_matmul_ragged_paged_scale",
]

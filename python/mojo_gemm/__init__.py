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
- MoE routing in one op (op `moe_route_topk_group`): `moe_route`, `MoERouting` (router logits,
  top-k, softmax and the rows grouped by expert: `grouped_matmul`'s routing operands).
- MoE combine in one op (op `moe_combine_rows`): `moe_combine` (each token's k expert rows
  summed back through `MoERouting.inverse`).
- Residual add + RMSNorm + cast in one op (ops `rms_norm_rows`, `add_rms_norm_rows`):
  `add_rms_norm` (a pre-norm decoder's float32 residual stream and its bf16 normed rows),
  `add_rms_norm_fp8` (the same plus the rows' e4m3 quantization, for
  `PagedKVProjection.write_quantized`).
- MoE layer: `MoEBlock` (router top-k, on-device token grouping, grouped SwiGLU experts, weighted
  combine).
- Dense FP8 block-scaled GEMM (op `fp8_blockwise_matmul`): `fp8_blockwise_matmul` (bf16 out;
  the K-cache op's kernels with a dense output), `Fp8Linear` (its layer, activations quantized
  on the graph by `quantize_fp8_rows`).
- FP8 K/V projection layer: `PagedKVProjection` (`quantize_fp8_rows` + both halves in one op,
  `kv_matmul_ragged_paged_scale`: the K op and its V twin `v_matmul_ragged_paged_scale` fused).
- `kernels_package`: the precompiled kernels (`.mojoc`) the graph functions add to every graph;
  pass it as `custom_extensions` to `session.compile` of a multi-graph `Module`. `kernels_path`:
  their source directory (never both in one process: two definitions of every op).
- `contracts`: the shape/dtype rules of every op.
- `gpu_path(arch)`: the kernel path a GPU target gets ("hopper", "blackwell", "ampere",
  "portable", or None when unsupported; README "Supported GPUs").
"""

from . import contracts
from .core.extension import kernels_package, kernels_path
from .core.targets import gpu_path
from .fp8.layer import Fp8Linear
from .fp8.matmul import fp8_blockwise_matmul
from .fp8.op import quantize_fp8_rows
from .fp8.quant import Fp8Blockwise, fp8_buffer, quantize_fp8_blockwise, quantize_fp8_input
from .grouped.layer import GroupedLinear
from .grouped.moe import MoEBlock
from .grouped.op import grouped_matmul
from .grouped.routing import ExpertGrouping, group_tokens_by_expert, interleave_gate_up
from .int4.layer import Int4Linear
from .int4.op import Int4WeightValues, int4_matmul
from .int4.plan import int4_gpu_plan
from .int4.quant import Int4Weight
from .k_cache.layer import PagedKVProjection
from .k_cache.op import (
    fp8_dtype_for,
    k_matmul_ragged_paged_scale,
    kv_matmul_ragged_paged_scale,
    v_matmul_ragged_paged_scale,
)
from .k_cache.plan import k_cache_gpu_plan
from .norm.op import add_rms_norm, add_rms_norm_fp8
from .router.combine import moe_combine
from .router.op import MoERouting, moe_route

__all__ = [
    "ExpertGrouping",
    "Fp8Blockwise",
    "Fp8Linear",
    "GroupedLinear",
    "Int4Linear",
    "Int4Weight",
    "Int4WeightValues",
    "MoEBlock",
    "MoERouting",
    "PagedKVProjection",
    "add_rms_norm",
    "add_rms_norm_fp8",
    "contracts",
    "fp8_blockwise_matmul",
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
    "kv_matmul_ragged_paged_scale",
    "moe_combine",
    "moe_route",
    "quantize_fp8_blockwise",
    "quantize_fp8_input",
    "quantize_fp8_rows",
    "v_matmul_ragged_paged_scale",
]

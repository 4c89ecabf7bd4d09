"""Graph function of `rms_norm_rows` / `add_rms_norm_rows`: a pre-norm decoder's residual add,
RMSNorm and cast to the projections' dtype in one op.

As graph ops the residual add and the norm fuse into MAX's float32 RMSNorm kernel, and the cast
to bf16 for the next projection is a kernel of its own that reads the float32 rows back; one
kernel here writes both the float32 residual stream and the bf16 rows (kernels:
mojo_kernels/rms_norm/).
"""

from __future__ import annotations

from max.dtype import DType
from max.graph import TensorType, TensorValue, ops

from ..core.extension import ensure_kernels_loaded
from ..core.rules import INT, check_types
from ..core.targets import op_target_parameters
from ..fp8.contract import FP8, FP8_BITS
from .contract import ADD_RMS_NORM

OP_NAME = "rms_norm_rows"
ADD_OP_NAME = "add_rms_norm_rows"


def add_rms_norm(h: TensorValue, y: TensorValue | None, weight: TensorValue, eps: float,
                 out_dtype: DType = DType.bfloat16,
                 keep_sum: bool = True) -> tuple[TensorValue | None, TensorValue]:
    """Residual add, RMSNorm and cast: returns (s, normed).

    h: float32, bfloat16 or float16 [T, H] (the residual stream; T may be symbolic, H static);
    y: the branch output to add to it, float32, bfloat16 or float16 [T, H], or None; weight:
    float32 [H]; eps: float >= 0; out_dtype: bfloat16 or float16. s = f32(h) + f32(y) (f32(h)
    when y is None) float32 [T, H], or None when keep_sum is False (not written);
    normed = round(s · rsqrt(mean(s²) + eps) · weight) out_dtype [T, H], the mean a float32 sum
    of squares over H. Raises TypeError / ValueError naming the argument
    (`norm.contract.ADD_RMS_NORM`) at graph build time, ValueError for a GPU target no kernel
    path supports (`core.targets`).
    """
    ADD_RMS_NORM.validate({"h": h, "y": y, "weight": weight, "eps": eps,
                           "out_dtype": out_dtype, "keep_sum": keep_sum})
    s, normed, _, _ = _emit(h, y, weight, eps, out_dtype, keep_sum, 0)
    return s, normed


def add_rms_norm_fp8(h: TensorValue, y: TensorValue | None, weight: TensorValue, eps: float,
                     block: int = 128, out_dtype: DType = DType.bfloat16, keep_sum: bool = True,
                     ) -> tuple[TensorValue | None, TensorValue, TensorValue, TensorValue]:
    """`add_rms_norm` that also quantizes the normed rows to e4m3 in the same kernel: returns
    (s, normed, data, scales), data and scales exactly what `quantize_fp8_rows(normed, block)`
    returns (e4m3 [T, H], float8_e4m3fn on GPU / uint8 bits on CPU; float32
    [ceil(H / block), T]), e.g. the input of `PagedKVProjection.write_quantized`. block: a
    positive int. Raises as `add_rms_norm`, and TypeError / ValueError for a block that is not
    a positive int."""
    check_types("add_rms_norm_fp8", {"block": block}, {"block": INT})
    ADD_RMS_NORM.validate({"h": h, "y": y, "weight": weight, "eps": eps,
                           "out_dtype": out_dtype, "keep_sum": keep_sum})
    if block <= 0:
        raise ValueError(f"add_rms_norm_fp8: block must be a positive int, got {block}")
    return _emit(h, y, weight, eps, out_dtype, keep_sum, block)


def _emit(h: TensorValue, y: TensorValue | None, weight: TensorValue, eps: float,
          out_dtype: DType, keep_sum: bool, fp8_block: int,
          ) -> tuple[TensorValue | None, TensorValue, TensorValue, TensorValue]:
    """The op on the graph, on arguments the caller has validated: (s or None, normed, data,
    scales); data [0, H] and scales [0, 0] when fp8_block is 0."""
    ensure_kernels_loaded()
    device = h.device
    name = OP_NAME if y is None else ADD_OP_NAME
    op_target_parameters(name, device)
    t, hidden = h.shape
    rows = t if fp8_block else 0
    blocks = -(-int(hidden) // fp8_block) if fp8_block else 0
    operands = [h, weight] if y is None else [h, y, weight]
    s, normed, data, scales = ops.custom(
        name, device, operands,
        [TensorType(DType.float32, [t if keep_sum else 0, hidden], device),
         TensorType(out_dtype, [t, hidden], device),
         TensorType(FP8_BITS if device.is_cpu() else FP8, [rows, hidden], device),
         TensorType(DType.float32, [blocks, rows], device)],
        parameters={"eps": float(eps), "fp8_block": fp8_block})
    return (s.tensor if keep_sum else None), normed.tensor, data.tensor, scales.tensor

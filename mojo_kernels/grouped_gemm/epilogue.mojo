"""The optional elementwise epilogue of `grouped_matmul_sm100_persistent`, shared by every path.

Parameters of the op: `swiglu: Bool` and `has_row_scale: Bool` (both may be on).

- SwiGLU (MoE gate_up projection): b's N matmul columns hold gate and up interleaved in blocks
  of 8 (matmul columns [16j, 16j + 8) = gate rows 8j..8j+7, [16j + 8, 16j + 16) = the matching
  up rows; `mojo_gemm.interleave_gate_up` builds it). Output column i = silu(gate) * up, so c
  has N / 2 columns. The block-8 interleave keeps each gate/up pair in one thread for both
  wgmma fragment layouts (plain: column groups 8j and 8j + 8; swap-AB: rows l/4 and l/4 + 8).
- row_scale (router weights): float32 [T]; output row r is multiplied by row_scale[r] (after
  SwiGLU when both are on).

Everything is applied to the fp32 accumulators, then rounded once to c's dtype. Zero-filled
rows (invalid expert id) stay zero: both epilogues map 0 to 0.
"""

from std.math import exp


@always_inline
def silu[w: Int](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """x * sigmoid(x) in fp32."""
    return x / (1 + exp(-x))


@always_inline
def apply_epilogue[swiglu: Bool, has_row_scale: Bool, w: Int](
    gate_or_value: SIMD[DType.float32, w], up: SIMD[DType.float32, w], scale: Float32
) -> SIMD[DType.float32, w]:
    """The output value: `gate_or_value` alone without SwiGLU (`up` unused), times the row scale."""
    var v = gate_or_value
    comptime if swiglu:
        v = silu(gate_or_value) * up
    comptime if has_row_scale:
        v = v * scale
    return v

"""The names and the arithmetic rule of `rms_norm_rows` / `add_rms_norm_rows`, shared by the CPU and
GPU paths.

Per token row t: s = h[t] (+ f32(y[t]) for the add form), summed in float32; written to `sum`
(float32 [T, H]) unless `sum` has 0 rows; normed[t] = round(s · rsqrt(mean(s²) + eps) · w) in
`normed`'s dtype, the mean a float32 sum of squares over H divided by H. This is the pre-norm
decoder's residual add, RMSNorm and cast to the projections' input dtype in one pass: as graph
ops it is MAX's fused residual RMSNorm (a float32 output) plus a cast kernel.
"""

comptime OP_NAME: StaticString = "rms_norm_rows"
comptime ADD_OP_NAME: StaticString = "add_rms_norm_rows"
comptime F32 = DType.float32


@always_inline
def is_norm_input(dtype: DType) -> Bool:
    """h and y may be float32, bfloat16 or float16."""
    return dtype == DType.float32 or dtype == DType.bfloat16 or dtype == DType.float16


@always_inline
def is_norm_output(dtype: DType) -> Bool:
    """normed is bfloat16 or float16 (the projections' input dtype)."""
    return dtype == DType.bfloat16 or dtype == DType.float16

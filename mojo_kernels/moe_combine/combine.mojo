"""The name and the summation rule of `moe_combine_rows`, shared by the CPU and GPU paths.

combined[t, h] = Σ_{j < K} f32(y[inverse[t K + j], h]), summed in float32 in the order j = 0, 1, ...
and rounded to y's dtype once; K = inverse.dim(0) / combined.dim(0). A row index outside [0, R)
(R = y.dim(0)) adds nothing, so no value of `inverse` reads outside y.
"""

comptime OP_NAME = "moe_combine_rows"

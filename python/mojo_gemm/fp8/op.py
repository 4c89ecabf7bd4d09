"""Graph function of the activation quantizer `quantize_fp8_rows` (the FP8 KV projections' input).

x [T, H] -> (data e4m3 [T, H], scales float32 [ceil(H/block), T]): one scale per token and per
`block` columns, computed in the graph by our Mojo op, bit-identical to the host quantizer
`mojo_gemm.fp8.quant.quantize_fp8_input(x, 1, block)` (which pads the token dim of its scales).
On CPU the data is uint8 holding the e4m3 bits (MAX 26.7 CPU graphs cannot hold float8), on GPU
float8_e4m3fn: exactly the hidden_state / input_scale pair `k_matmul_ragged_paged_scale` and
`v_matmul_ragged_paged_scale` take with scales_granularity_mnk = (1, gn, block).
"""

from __future__ import annotations

from max.dtype import DType
from max.graph import TensorType, TensorValue, ops

from ..core.extension import ensure_kernels_loaded
from ..core.targets import op_target_parameters
from .contract import FP8, FP8_BITS, QUANTIZE_FP8_ROWS

OP_NAME = "quantize_fp8_rows"


def quantize_fp8_rows(x: TensorValue, block: int = 128) -> tuple[TensorValue, TensorValue]:
    """Quantizes activations per token and per `block` columns to e4m3.

    x: bfloat16, float16 or float32 [T, H] (T may be symbolic, H static). Returns
    (data, scales): data [T, H] float8_e4m3fn on GPU / uint8 e4m3 bits on CPU, with
    data[t, c] = round_e4m3(x[t, c] / scales[c // block, t]); scales float32
    [ceil(H/block), T], scales[kb, t] = amax(|x[t, kb·block : (kb+1)·block]|) / 448, or 1.0
    for an all-zero block. Subnormal x follows the same formula (bit-identical to the host
    quantizer, on CPU and GPU alike); a block holding inf or NaN gets scale NaN and all its
    data NaN (e4m3 0x7F). Both live on x's device. Raises TypeError / ValueError
    (`contracts.QUANTIZE_FP8_ROWS`) at graph build time, ValueError for a GPU target
    no kernel path supports (`mojo_gemm.core.targets`).
    """
    QUANTIZE_FP8_ROWS.validate({"x": x, "block": block})
    ensure_kernels_loaded()
    device = x.device
    # one kernel for every GPU (no forced path): only the target check applies
    op_target_parameters(OP_NAME, device)
    t, h = x.shape
    n_blocks = -(-int(h) // block)
    data_dtype = FP8_BITS if device.is_cpu() else FP8
    data, scales = ops.custom(
        OP_NAME,
        device,
        [x],
        [
            TensorType(data_dtype, [t, h], device),
            TensorType(DType.float32, [n_blocks, t], device),
        ],
        parameters={"block": block},
    )
    return data.tensor, scales.tensor

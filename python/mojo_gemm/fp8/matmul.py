"""Graph function of the dense block-scaled FP8 GEMM, `fp8_blockwise_matmul`.

out [M, N] bfloat16 = a [M, K] · w [N, K]ᵀ with e4m3 operands and float32 block scales in the
layout DeepSeek-style checkpoints and MAX's FP8 K-cache op use: a_scale [ceil(K/gk), >=
ceil(M/gm)] (tokens contiguous: what `quantize_fp8_rows` returns for gm = 1), w_scale
[ceil(N/gn), ceil(K/gk)]. The Mojo op runs the kernels of `k_matmul_ragged_paged_scale` with a
dense output, so the two ops' times on one shape differ only by where the rows go.
"""

from __future__ import annotations

from collections.abc import Sequence

from max.dtype import DType
from max.graph import TensorType, TensorValue, ops

from ..core.extension import ensure_kernels_loaded
from ..core.targets import op_target_parameters
from .contract import FP8_BLOCKWISE_MATMUL


def fp8_blockwise_matmul(
    a: TensorValue,
    a_scale: TensorValue,
    w: TensorValue,
    w_scale: TensorValue,
    scales_granularity_mnk: Sequence[int] = (1, 128, 128),
) -> TensorValue:
    """out[m, n] = Σ_k a[m, k]·w[n, k]·a_scale[k//gk, m//gm]·w_scale[n//gn, k//gk].

    Summed in fp32 one gk block at a time (each block's sum is scaled, then added: no long sum
    stays in the FP8 tensor cores' reduced-precision accumulator), rounded once to bfloat16.
    a [M, K] (M may be symbolic) and w [N, K]: float8_e4m3fn on GPU, uint8 e4m3fn bits on CPU
    (`mojo_gemm.fp8_buffer`); a_scale float32 [ceil(K/gk), >= ceil(M/gm)]; w_scale float32
    [ceil(N/gn), ceil(K/gk)]; (gm, gn, gk) = scales_granularity_mnk, any positive values (GPU
    tensor cores need gk % 64 == 0, the Hopper wgmma kernels gk % 128 == 0). Returns bfloat16
    [M, N] on a's device. Raises TypeError / ValueError (`contracts.FP8_BLOCKWISE_MATMUL`) at
    graph build time, ValueError for a GPU target no kernel path supports.
    """
    g = scales_granularity_mnk
    args = {
        "a": a,
        "a_scale": a_scale,
        "w": w,
        "w_scale": w_scale,
        "scales_granularity_mnk": tuple(g) if isinstance(g, (tuple, list)) else g,
    }
    FP8_BLOCKWISE_MATMUL.validate(args)
    ensure_kernels_loaded()
    gm, gn, gk = g
    device = a.device
    out = ops.custom(
        FP8_BLOCKWISE_MATMUL.op,
        device,
        [a, a_scale, w, w_scale],
        [TensorType(DType.bfloat16, [a.shape[0], w.shape[0]], device)],
        parameters={
            "m_scale_granularity": int(gm),
            "n_scale_granularity": int(gn),
            "k_scale_granularity": int(gk),
            **op_target_parameters(FP8_BLOCKWISE_MATMUL.op, device),
        },
    )
    return out[0].tensor

"""Graph function of the W4A16 op: `int4_matmul` emits the `multistage_gemm_q` custom op."""

from __future__ import annotations

from dataclasses import dataclass

from max.graph import TensorType, TensorValue, ops

from ..core.extension import ensure_kernels_loaded
from ..core.rules import INT, TENSOR, check_types, instance_of, optional
from ..core.targets import op_target_parameters
from .contract import INT4_MATMUL, int4_padded

OP_NAME = "multistage_gemm_q"


@dataclass(frozen=True)
class Int4WeightValues:
    """A packed int4 weight as graph values (the layout of `mojo_gemm.int4.layout`).

    qweight: uint32 [Np/64, Kp*8]; scales: x's dtype [groups, Np]; zeros: same shape or None
    (symmetric, zero point 8); perm: int32/int64 [K] or None (act-order: packed position j
    holds input feature perm[j]). n, k: the logical out/in features; group_size: 32, 64, 128
    or -1 (per channel).
    """

    qweight: TensorValue
    scales: TensorValue
    zeros: TensorValue | None
    perm: TensorValue | None
    n: int
    k: int
    group_size: int

    def __post_init__(self) -> None:
        check_types("Int4WeightValues", self.__dict__, _WEIGHT_TYPES)


_WEIGHT_TYPES = {
    "qweight": TENSOR,
    "scales": TENSOR,
    "zeros": optional(TENSOR),
    "perm": optional(TENSOR),
    "n": INT,
    "k": INT,
    "group_size": INT,
}


def int4_matmul(
    x: TensorValue, weight: Int4WeightValues, bias: TensorValue | None = None
) -> TensorValue:
    """y = x · dequant(weight)ᵀ (+ bias) through the `multistage_gemm_q` Mojo op.

    x: bfloat16 or float16 [..., K] (rank >= 2; leading dims may be symbolic);
    bias: x's dtype [N] or None. Returns x's dtype [..., N]. Raises TypeError/ValueError
    (`contracts.INT4_MATMUL`) at graph-build time for bad shapes, dtypes or devices, TypeError
    naming the argument for a value of the wrong Python type, and ValueError for a GPU target
    no kernel path supports (`mojo_gemm.core.targets`).
    """
    check_types(
        "int4_matmul",
        {"x": x, "weight": weight, "bias": bias},
        {"x": TENSOR, "weight": instance_of("an Int4WeightValues", Int4WeightValues),
         "bias": optional(TENSOR)},
    )
    INT4_MATMUL.validate(
        {
            "x": x,
            "qweight": weight.qweight,
            "scales": weight.scales,
            "zeros": weight.zeros,
            "perm": weight.perm,
            "bias": bias,
            "n": weight.n,
            "k": weight.k,
            "group_size": weight.group_size,
        }
    )
    ensure_kernels_loaded()
    n, k = weight.n, weight.k
    _, kp = int4_padded(n, k)
    leading = list(x.shape[:-1])
    rows = x.reshape([-1, k])
    m = rows.shape[0]
    # x's gather and K-padding run as MAX kernels, which fail at run time on an empty tensor
    # (M = 0, symbolic here, so no build-time branch can skip them): they get one extra zero
    # row, which the op never reads (its M is the output's rows).
    if weight.perm is not None:
        # act-order: the packed K order is the sorted-by-group order of the input features
        rows = ops.gather(ops.pad(rows, [0, 1, 0, 0]), weight.perm, axis=1)
        if kp != k:
            rows = ops.pad(rows, [0, 0, 0, kp - k])
    elif kp != k:
        rows = ops.pad(rows, [0, 1, 0, kp - k])
    device = x.device

    # The op always takes zeros and bias (rank 2); when absent it never reads them, so the
    # scales stand in as they are (no new constant: a broadcast costs a kernel launch; no
    # reshape: MAX's graph runtime charges a view as an op of its own).
    scales = weight.scales
    out = ops.custom(
        OP_NAME,
        device,
        [
            rows,
            weight.qweight,
            scales,
            weight.zeros if weight.zeros is not None else scales,
            bias.reshape([1, n]) if bias is not None else scales,
        ],
        [TensorType(x.dtype, [m, n], device)],
        parameters={
            "group_size": weight.group_size,
            "has_zeros": weight.zeros is not None,
            "has_bias": bias is not None,
            **op_target_parameters(OP_NAME, device),
        },
    )[0].tensor
    return out.reshape([*leading, n])


"""Stream-K and global split-K launches of the int4 op in a captured device graph (GPU only).

kernels/wgmma.launch_int4_gemm_wgmma_streamk and _gsplit allocate a workspace and flags (or
counters) inside the op, from MAX's allocator; a captured graph must replay them right. Run
alone (scripts/gpu-session.sh): a capture reserves fresh device memory, and beside other
capturing test processes it failed with CUDA_ERROR_OUT_OF_MEMORY.
"""

from __future__ import annotations

import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType, ops

from mojo_gemm import kernels_package
from mojo_gemm.core.host import to_buffer, to_numpy
from mojo_gemm.int4.layout import pack_codes, padded_shape, permute_group_params
from mojo_gemm.int4.plan import int4_gpu_plan

OP = "multistage_gemm_q"
REL_TOL = 1e-2


def rounded(a: np.ndarray) -> np.ndarray:
    """`a` rounded to bf16, as float64 (what the op sees)."""
    return to_numpy(to_buffer(np.asarray(a), DType.bfloat16)).astype(np.float64)


# Stream-K and global split-K launches (kernels/wgmma.launch_int4_gemm_wgmma_streamk / _gsplit:
# a per-call workspace and flags or counters allocated inside the op) in a captured device
# graph: (M, N, Kp) the dispatch sends to the 128 x 256 and the 256 x 128 stream-K launches and
# to the 128 x 256 and 64 x 256 splits without a cluster (checked through the plan below).
STREAMK_CASES = ((128, 10240, 8192), (200, 3072, 8192), (128, 4096, 14336), (60, 5120, 14336))


def build_streamk_graph() -> Graph:
    """Inputs per case: x [M, Kp], qweight, scales [Kp/128, Np], bias [1, N] (bf16, g = 128,
    symmetric); one output [M, N] per case. Static shapes, as a captured graph has them."""
    dev, bf16 = DeviceRef.GPU(), DType.bfloat16
    types = []
    for m, n, kp in STREAMK_CASES:
        np_, _ = padded_shape(n, kp)
        types += [TensorType(bf16, [m, kp], dev),
                  TensorType(DType.uint32, [np_ // 64, kp * 8], dev),
                  TensorType(bf16, [kp // 128, np_], dev), TensorType(bf16, [1, n], dev)]
    extensions = [kernels_package()]
    with Graph("int4_streamk_capture", input_types=types, custom_extensions=extensions) as g:
        ins = [v.tensor for v in g.inputs]
        outs = []
        for i, (m, n, _) in enumerate(STREAMK_CASES):
            x, qweight, scales, bias = ins[4 * i:4 * i + 4]
            zeros = ops.constant([[0.0]], bf16, dev)
            parameters = {"group_size": 128, "has_zeros": False, "has_bias": True}
            outs.append(ops.custom(OP, dev, [x, qweight, scales, zeros, bias],
                                   [TensorType(bf16, [m, n], dev)], parameters=parameters)[0])
        g.output(*outs)
    return g


@pytest.mark.gpu
def test_gpu_streamk_captured_replays_match_reference() -> None:
    """The stream-K and global split launches, eager and replayed from one capture with new
    activations (workspace and flags from MAX's allocator inside the captured op): within 1e-2
    of float64 every time."""
    plans = [int4_gpu_plan(m, n, kp) for m, n, kp in STREAMK_CASES]
    kinds = [next((k for k in ("streamk", "gsplit") if f" {k} " in p), p) for p in plans]
    assert kinds == ["streamk", "streamk", "gsplit", "gsplit"], plans
    acc = Accelerator()
    model = InferenceSession(devices=[CPU(), acc]).load(build_streamk_graph())
    rng = np.random.default_rng(19)
    inputs, weights = [], []
    for m, n, kp in STREAMK_CASES:
        np_, _ = padded_shape(n, kp)
        codes = rng.integers(0, 16, (np_, kp), dtype=np.uint8)
        scales = rounded(rng.uniform(0.002, 0.02, (kp // 128, np_)))
        bias = rounded(rng.uniform(-1, 1, n))
        w = (codes.T.astype(np.float64) - 8.0) * np.repeat(scales, 128, axis=0)  # Wᵀ [kp, np]
        weights.append((w[:, :n], bias))
        x = rounded(rng.uniform(-1, 1, (m, kp)))
        inputs += [to_buffer(x, DType.bfloat16).to(acc),
                   Buffer.from_numpy(pack_codes(codes)).to(acc),
                   to_buffer(permute_group_params(scales), DType.bfloat16).to(acc),
                   to_buffer(bias[None, :], DType.bfloat16).to(acc)]

    def check(outs: list, what: str) -> None:
        for i, (out, (w, bias)) in enumerate(zip(outs, weights, strict=True)):
            x = to_numpy(inputs[4 * i]).astype(np.float64)
            ref = x @ w + bias
            got = to_numpy(out).astype(np.float64)
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            assert err <= REL_TOL, f"{what} case {STREAMK_CASES[i]}: rel err {err:.3e}"

    check(model.execute(*inputs), "eager")
    outs = model.capture(1, *inputs)
    poison = [to_buffer(np.full((m, n), np.nan), DType.bfloat16) for m, n, _ in STREAMK_CASES]
    for replay in range(2):
        # new activations into the captured buffers, outputs poisoned; the host sources stay
        # referenced until the copies are done
        fresh = [to_buffer(rounded(rng.uniform(-1, 1, (m, kp))), DType.bfloat16)
                 for m, _, kp in STREAMK_CASES]
        for i, src in enumerate(fresh):
            inputs[4 * i].inplace_copy_from(src)
        for out, p in zip(outs, poison, strict=True):
            out.inplace_copy_from(p)
        acc.synchronize()
        model.replay(1, *inputs)
        acc.synchronize()
        check(outs, f"replay {replay}")

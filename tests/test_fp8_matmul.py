"""`fp8_blockwise_matmul` through a MAX graph vs float64.

The op instances live in tests/shared_op_graph.py's graph (a symbolic token count, so the Mojo
op compiles once per device). Cases cover the GPU plans the K-cache dispatch picks for a dense
output: gk = 128 with an N tail (wgmma above 128 tokens, the swap-AB or mma.sync kernels
below), gk = 64 with a partial last K block (mma.sync), and odd granularities (the CUDA-core
kernel); token counts from 1 to past the wgmma threshold, input scales padded past ceil(M/gm).
Every call gets fresh random data, so a row the kernel failed to write cannot match by chance.
Then the contract: bad dtypes, shapes and granularities raise before anything compiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType
from test_k_cache import reference

from mojo_gemm.core.host import to_numpy
from mojo_gemm.fp8.matmul import fp8_blockwise_matmul
from mojo_gemm.fp8.quant import fp8_buffer, quantize_fp8_blockwise, quantize_fp8_input
from mojo_gemm.k_cache.op import fp8_dtype_for
from shared_op_graph import fp8_matmul_part


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Case:
    n: int
    k: int
    gran: tuple[int, int, int]

    @property
    def k_blocks(self) -> int:
        return _ceil(self.k, self.gran[2])

    @property
    def n_blocks(self) -> int:
        return _ceil(self.n, self.gran[1])


CASES = (
    Case(200, 384, (1, 128, 128)),
    Case(64, 336, (1, 64, 64)),
    Case(96, 200, (3, 40, 50)),
)
TOKENS = (1, 7, 130, 300)
BF16_REL = 2.0**-8
"""bf16's relative rounding bound (half an ulp at 8 significant bits)."""
ACC_REL = 2.0**-12
"""Error bound of the fp32 sums relative to Σ|a·w| (scaled): Hopper's FP8 wgmma adds the
products of each 32-wide K step with about 14 significant bits (the kernels promote its block
sums to fp32 every 128 K), measured at 2^-15 of Σ|a·w| on the H200; a wrong scale, block or row
errs by O(1) of it."""


def run(device_kind: str, tokens: int, seed: int) -> None:
    part, dev = fp8_matmul_part(device_kind)
    rng = np.random.default_rng(seed)
    inputs: list[Buffer] = []
    refs = []
    for c in CASES:
        gm, gn, gk = c.gran
        x = rng.standard_normal((tokens, c.k)) * 10.0 ** rng.uniform(-2, 1, (tokens, 1))
        data, a_scale = quantize_fp8_input(x, gm, gk)  # token dim of a_scale padded
        wq = quantize_fp8_blockwise(rng.standard_normal((c.n, c.k)) * 0.05, (gn, gk))
        inputs += [
            fp8_buffer(data, dev),
            Buffer.from_numpy(np.ascontiguousarray(a_scale, np.float32)).to(dev),
            fp8_buffer(wq.data, dev),
            Buffer.from_numpy(np.ascontiguousarray(wq.scales, np.float32)).to(dev),
        ]
        a64, w64 = data.astype(np.float64), wq.data.astype(np.float64)
        refs.append((reference(a64, w64, a_scale, wq.scales, c.gran),
                     reference(np.abs(a64), np.abs(w64), a_scale, wq.scales, c.gran)))
    outs = part.execute(*inputs)
    for c, out, (ref, abs_sum) in zip(CASES, outs, refs, strict=True):
        got = to_numpy(out).astype(np.float64)
        assert got.shape == (tokens, c.n), c
        err = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err <= 1e-2, (c, tokens, err)
        # elementwise: one bf16 rounding of an fp32 sum of scaled block sums
        bound = BF16_REL * np.abs(ref) + ACC_REL * abs_sum + 1e-30
        bad = np.argwhere(np.abs(got - ref) > bound)
        assert bad.size == 0, (c, tokens, bad[:5], got[tuple(bad[0])], ref[tuple(bad[0])])


@pytest.mark.parametrize("tokens", TOKENS)
def test_fp8_matmul_cpu(tokens: int) -> None:
    run("cpu", tokens, seed=tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", TOKENS)
def test_fp8_matmul_gpu(tokens: int) -> None:
    run("gpu", tokens, seed=100 + tokens)


# ------------------------------------------------------------------------------ the contract
CPU = DeviceRef.CPU()
FP8 = fp8_dtype_for(CPU)
F32 = DType.float32
BF16 = DType.bfloat16
G = (1, 128, 128)
VALID = {
    "a": TensorType(FP8, ["M", 256], CPU),
    "a_scale": TensorType(F32, [2, "Ms"], CPU),
    "w": TensorType(FP8, [192, 256], CPU),
    "w_scale": TensorType(F32, [2, 2], CPU),
}


def _build(gran: object = (1, 128, 128), **over: TensorType) -> None:
    types = {**VALID, **over}
    with Graph("fp8_matmul_contract", input_types=list(types.values())) as g:
        vals = dict(zip(types, (v.tensor for v in g.inputs), strict=True))
        out = fp8_blockwise_matmul(vals["a"], vals["a_scale"], vals["w"], vals["w_scale"], gran)
        assert out.dtype == DType.bfloat16 and out.shape[1] == 192


def test_valid_call_builds() -> None:
    _build()


@pytest.mark.parametrize(
    ("over", "gran", "error", "match"),
    [
        ({"a": TensorType(BF16, ["M", 256], CPU)}, G, TypeError, "'a': dtype"),
        ({"w": TensorType(BF16, [192, 256], CPU)}, G, TypeError, "'w': dtype"),
        ({"a": TensorType(FP8, ["M", "K"], CPU)}, G, ValueError, "static K"),
        ({"w": TensorType(FP8, [192, 128], CPU)}, G, ValueError, r"'w': shape \[N, K\]"),
        ({"w": TensorType(FP8, ["N", 256], CPU)}, G, ValueError, "static N"),
        ({"a_scale": TensorType(F32, [3, "Ms"], CPU)}, G, ValueError, "'a_scale': shape"),
        ({"a_scale": TensorType(DType.float16, [2, "Ms"], CPU)}, G, TypeError,
         "'a_scale': dtype float32"),
        ({"a": TensorType(FP8, [8, 256], CPU), "a_scale": TensorType(F32, [2, 7], CPU)},
         G, ValueError, "'a_scale': shape"),
        ({"w_scale": TensorType(F32, [3, 2], CPU)}, G, ValueError, "'w_scale': shape"),
        ({}, (1, 128), ValueError, "scales_granularity_mnk"),
        ({}, (1, 0, 128), ValueError, "scales_granularity_mnk"),
    ],
)
def test_bad_input_raises(
    over: dict[str, TensorType], gran: object, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        _build(gran, **over)


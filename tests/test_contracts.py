"""Bad input to `int4_matmul` raises the documented error at graph-build time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue

from mojo_gemm import Int4WeightValues, contracts, int4_matmul

CPU, GPU = DeviceRef.CPU(), DeviceRef.GPU()
BF16, F16, F32, U32, I32 = DType.bfloat16, DType.float16, DType.float32, DType.uint32, DType.int32
N, K, G = 200, 256, 128  # Np = 256, Kp = 256, groups = 2


def spec(**over: object) -> dict[str, object]:
    """Graph input types of a valid call, with `over` replacing some of them."""
    base: dict[str, object] = {
        "x": TensorType(BF16, ["m", K], CPU),
        "qweight": TensorType(U32, [256 // 64, 256 * 8], CPU),
        "scales": TensorType(BF16, [2, 256], CPU),
        "zeros": TensorType(BF16, [2, 256], CPU),
        "perm": TensorType(DType.int64, [K], CPU),
        "bias": TensorType(BF16, [N], CPU),
        "n": N,
        "k": K,
        "group_size": G,
    }
    base.update(over)
    return base


def build(s: dict[str, object]) -> None:
    """Builds a graph that calls int4_matmul with `s` (types become graph inputs)."""
    names = [k for k, v in s.items() if isinstance(v, TensorType)]
    with Graph("contract", input_types=[s[k] for k in names]) as g:
        vals: dict[str, TensorValue] = {k: v.tensor for k, v in zip(names, g.inputs, strict=True)}
        weight = Int4WeightValues(
            qweight=vals["qweight"], scales=vals["scales"], zeros=vals.get("zeros"),
            perm=vals.get("perm"), n=s["n"], k=s["k"], group_size=s["group_size"],
        )
        g.output(int4_matmul(vals["x"], weight, vals.get("bias")))


def without(name: str) -> Callable[[dict[str, object]], dict[str, object]]:
    return lambda s: {k: v for k, v in s.items() if k != name}


BAD = [
    ("rank", spec(x=TensorType(BF16, [K], CPU)), ValueError, "'x'.*rank >= 2"),
    ("dtype", spec(x=TensorType(F32, ["m", K], CPU)), TypeError, "'x'.*bfloat16 or float16"),
    ("K mismatch", spec(x=TensorType(BF16, ["m", 128], CPU)), ValueError, "'x'.*K = 256"),
    ("symbolic K", spec(x=TensorType(BF16, ["m", "k"], CPU)), ValueError, "'x'.*static"),
    ("group not dividing K", spec(k=200, x=TensorType(BF16, ["m", 200], CPU), perm=None),
     ValueError, "'group_size'.*multiple of group_size 128.*K = 200"),
    ("N not multiple of 8", spec(n=100, bias=None), ValueError, "'n'.*multiple of 8.*100"),
    ("scales shape", spec(scales=TensorType(BF16, [4, 256], CPU)), ValueError,
     r"'scales'.*\[2, 256\].*\[4, 256\]"),
    ("scales dtype", spec(scales=TensorType(F16, [2, 256], CPU)), TypeError, "'scales'"),
    ("zeros shape", spec(zeros=TensorType(BF16, [2, 200], CPU)), ValueError, "'zeros'.*shape"),
    ("perm length", spec(perm=TensorType(DType.int64, [K - 1], CPU)), ValueError,
     r"'perm'.*\[256\].*\[255\]"),
    ("perm dtype", spec(perm=TensorType(F32, [K], CPU)), TypeError, "'perm'.*int"),
    ("bias shape", spec(bias=TensorType(BF16, [N + 8], CPU)), ValueError, r"'bias'.*\[200\]"),
    ("bias dtype", spec(bias=TensorType(F16, [N], CPU)), TypeError, "'bias'"),
    ("device mismatch", spec(qweight=TensorType(U32, [4, 2048], GPU)), ValueError,
     "'qweight'.*same device"),
    ("packed dtype", spec(qweight=TensorType(I32, [4, 2048], CPU)), TypeError,
     "'qweight'.*uint32"),
    ("packed shape", spec(qweight=TensorType(U32, [4, 1024], CPU)), ValueError,
     r"'qweight'.*\[4, 2048\]"),
    ("group size value", spec(group_size=48), ValueError, "'group_size'.*48"),
]


@pytest.mark.parametrize(("case", "s", "error", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises(case: str, s: dict[str, object], error: type, match: str) -> None:
    """Each broken rule raises its error type, naming the argument, expected and actual."""
    with pytest.raises(error, match=match):
        build(s)


def test_valid_call_builds() -> None:
    """The valid baseline of the cases above builds (and the symmetric form, too)."""
    build(spec())
    build(spec(zeros=None, perm=None, bias=None))


def test_readme_documents_every_contract() -> None:
    """The README's contract section is generated from the same rules that raise."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for contract in contracts.ALL_CONTRACTS:
        assert contract.markdown() in readme, f"README is missing {contract.op}'s contract"

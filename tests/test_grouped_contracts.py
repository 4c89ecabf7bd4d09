"""Bad input to `grouped_matmul` / `GroupedLinear` raises the documented error at graph-build
time, and the numpy helpers (`group_tokens_by_expert`, `interleave_gate_up`) are exact.
No graph is compiled here."""

from __future__ import annotations

import re

import numpy as np
import pytest
from max.dtype import DType
from max.graph import BufferType, DeviceRef, Graph, TensorType, TensorValue

from mojo_gemm.grouped.contract import GROUPED_MATMUL
from mojo_gemm.grouped.layer import GroupedLinear
from mojo_gemm.grouped.op import grouped_matmul
from mojo_gemm.grouped.routing import group_tokens_by_expert, interleave_gate_up

CPU, GPU = DeviceRef.CPU(), DeviceRef.GPU()
BF16, F16, F32, U32, I32 = DType.bfloat16, DType.float16, DType.float32, DType.uint32, DType.int32
E, N, K = 4, 256, 64


def spec(**over: object) -> dict[str, object]:
    """Graph input types (and options) of a valid call, with `over` replacing some."""
    base: dict[str, object] = {
        "a": TensorType(BF16, ["T", K], CPU),
        "b": TensorType(BF16, [E, N, K], CPU),
        "a_offsets": TensorType(U32, [E + 1], CPU),
        "expert_ids": TensorType(I32, [E], CPU),
        "expert_usage_stats": TensorType(U32, [2], CPU),
        "row_scale": None,
        "out": None,
        "a_plane_splits": (0, 0),
        "swiglu": False,
    }
    base.update(over)
    return base


def build(s: dict[str, object]) -> None:
    """Builds a graph calling grouped_matmul with `s` (types become graph inputs)."""
    names = [k for k, v in s.items() if isinstance(v, TensorType | BufferType)]
    with Graph("contract", input_types=[s[k] for k in names]) as g:
        vals = dict(zip(names, g.inputs, strict=True))
        t: dict[str, TensorValue] = {
            k: v.tensor for k, v in vals.items() if isinstance(s[k], TensorType)}
        y = grouped_matmul(
            t["a"], t["b"], t["a_offsets"], t["expert_ids"], t["expert_usage_stats"],
            a_plane_splits=s["a_plane_splits"], swiglu=s["swiglu"], row_scale=t.get("row_scale"),
            out=vals["out"].buffer if "out" in vals else None,
        )
        g.output(*([] if y is None else [y]))


BAD = [
    ("a dtype", spec(a=TensorType(F32, ["T", K], CPU)), TypeError, "'a'.*bfloat16 or float16"),
    ("a rank", spec(a=TensorType(BF16, [K], CPU)), ValueError, "'a'.*rank 2.*rank 1"),
    ("b dtype", spec(b=TensorType(F16, [E, N, K], CPU)), TypeError, "'b'.*dtype of a"),
    ("b rank", spec(b=TensorType(BF16, [N, K], CPU)), ValueError, "'b'.*rank 3"),
    ("b symbolic", spec(b=TensorType(BF16, ["E", N, K], CPU)), ValueError, "'b'.*static"),
    ("K mismatch", spec(a=TensorType(BF16, ["T", K + 8], CPU)), ValueError,
     "'a'.*K = 64.*72"),
    ("offsets dtype", spec(a_offsets=TensorType(I32, [E + 1], CPU)), TypeError,
     "'a_offsets'.*uint32"),
    ("offsets rank", spec(a_offsets=TensorType(U32, [E + 1, 1], CPU)), ValueError,
     "'a_offsets'.*rank 1"),
    ("ids dtype", spec(expert_ids=TensorType(DType.int64, [E], CPU)), TypeError,
     "'expert_ids'.*int32.*int64"),
    ("ids length", spec(expert_ids=TensorType(I32, [E + 1], CPU)), ValueError,
     "'expert_ids'.*G = 4.*5"),
    ("stats dtype", spec(expert_usage_stats=TensorType(I32, [2], CPU)), TypeError,
     "'expert_usage_stats'.*uint32"),
    ("stats shape", spec(expert_usage_stats=TensorType(U32, [3], CPU)), ValueError,
     r"'expert_usage_stats'.*\[2\].*\[3\]"),
    ("splits unaligned", spec(a_plane_splits=(100, 200)), ValueError,
     "'a_plane_splits'.*multiples of 128"),
    ("splits past N", spec(a_plane_splits=(128, 384)), ValueError, "'a_plane_splits'.*N = 256"),
    ("splits order", spec(a_plane_splits=(256, 128)), ValueError, "'a_plane_splits'"),
    ("plane rows", spec(a=TensorType(BF16, [10, K], CPU), a_plane_splits=(128, 256)),
     ValueError, "'a'.*multiple of 3"),
    ("swiglu N", spec(b=TensorType(BF16, [E, 200, K], CPU), swiglu=True), ValueError,
     "'swiglu'.*multiple of 16.*200"),
    ("row_scale dtype", spec(row_scale=TensorType(BF16, ["T"], CPU)), TypeError,
     "'row_scale'.*float32"),
    ("row_scale shape", spec(row_scale=TensorType(F32, ["U"], CPU)), ValueError,
     "'row_scale'.*T"),
    ("row_scale rows with planes", spec(a=TensorType(BF16, ["T3", K], CPU),
                                        a_plane_splits=(128, 256),
                                        row_scale=TensorType(F32, ["T3"], CPU)),
     ValueError, "'row_scale'.*T3 // 3"),
    ("out dtype", spec(out=BufferType(F16, ["T", N], CPU)), TypeError, "'out'.*dtype of a"),
    ("out shape", spec(out=BufferType(BF16, ["T", N // 2], CPU)), ValueError,
     r"'out'.*\[T, 256\]"),
    ("device", spec(expert_ids=TensorType(I32, [E], GPU)), ValueError,
     "'expert_ids'.*same device"),
]


@pytest.mark.parametrize(("case", "s", "error", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises(case: str, s: dict[str, object], error: type, match: str) -> None:
    """Each broken rule raises its error type naming the op, the argument and the values."""
    with pytest.raises(error, match="grouped_matmul: argument " + match):
        build(s)


GOOD = [
    ("plain", spec()),
    ("symbolic G", spec(a_offsets=TensorType(U32, ["G1"], CPU),
                        expert_ids=TensorType(I32, ["G"], CPU))),
    ("planes", spec(a=TensorType(BF16, ["T3", K], CPU), a_plane_splits=(128, 256))),
    ("swiglu + scale + out", spec(swiglu=True, row_scale=TensorType(F32, ["T"], CPU),
                                  out=BufferType(BF16, ["T", N // 2], CPU))),
    ("fp16", spec(a=TensorType(F16, ["T", K], CPU), b=TensorType(F16, [E, N, K], CPU))),
]


@pytest.mark.parametrize(("case", "s"), GOOD, ids=[g[0] for g in GOOD])
def test_valid_input_builds(case: str, s: dict[str, object]) -> None:
    """Valid calls build."""
    build(s)


def test_contract_markdown_lists_every_rule() -> None:
    text = GROUPED_MATMUL.markdown()
    assert text.startswith("**`grouped_matmul`**")
    assert len(re.findall(r"^- `", text, flags=re.M)) == len(GROUPED_MATMUL.rules)


def test_layer_checks() -> None:
    with pytest.raises(TypeError, match="GroupedLinear: dtype"):
        GroupedLinear(4, 64, 64, dtype=F32)
    with pytest.raises(ValueError, match="out_features must be a multiple of 8"):
        GroupedLinear(4, 64, 60, swiglu=True)
    layer = GroupedLinear(2, 16, 8, swiglu=True)
    assert [int(d) for d in layer.weight.shape] == [2, 16, 16]
    with pytest.raises(ValueError, match=r"shape \(2, 16, 16\)"):
        layer.expert_state(np.zeros((2, 8, 16)))
    state = layer.expert_state(gate=np.zeros((2, 8, 16)), up=np.ones((2, 8, 16)))
    assert list(state) == ["weight"]


# ---------------------------------------------------------------- numpy helpers
def test_group_tokens_by_expert() -> None:
    topk = np.array([[2, 0], [2, 3], [0, 2]])
    g = group_tokens_by_expert(topk, 5)
    # assignments sorted by expert (stable): e0: (0,1) (2,0); e2: (0,0) (1,0) (2,1); e3: (1,1)
    assert g.row_order.tolist() == [1, 4, 0, 2, 5, 3]
    assert g.token_index.tolist() == [0, 2, 0, 1, 2, 1]
    assert g.expert_ids.tolist() == [0, 2, 3, 1, 4]
    assert g.a_offsets.tolist() == [0, 2, 5, 6, 6, 6]
    assert g.expert_usage_stats.tolist() == [3, 3]
    assert g.a_offsets.dtype == np.uint32 and g.expert_ids.dtype == np.int32
    assert g.expert_usage_stats.dtype == np.uint32
    flat = topk.reshape(-1)
    assert (flat[g.row_order][g.inverse_order] == flat).all()
    for j in range(3):  # every sorted row lies in its expert's group
        lo, hi = g.a_offsets[j], g.a_offsets[j + 1]
        assert (flat[g.row_order[lo:hi]] == g.expert_ids[j]).all()


def test_group_tokens_by_expert_edges() -> None:
    g = group_tokens_by_expert(np.array([1, 1, 1]), 2)  # top-1
    assert g.token_index.tolist() == [0, 1, 2]
    assert g.expert_ids.tolist() == [1, 0] and g.a_offsets.tolist() == [0, 3, 3]
    empty = group_tokens_by_expert(np.zeros((0, 2), np.int64), 3)
    assert empty.a_offsets.tolist() == [0, 0, 0, 0]
    assert empty.expert_usage_stats.tolist() == [0, 0]
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        group_tokens_by_expert(np.array([[0, 2]]), 2)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        group_tokens_by_expert(np.array([[0, -1]]), 2)
    with pytest.raises(TypeError, match="integers"):
        group_tokens_by_expert(np.array([0.5]), 2)


def test_interleave_gate_up() -> None:
    gate = np.arange(2 * 16 * 3).reshape(2, 16, 3)
    up = -gate
    w = interleave_gate_up(gate, up)
    assert w.shape == (2, 32, 3)
    for i in range(16):
        gc = 16 * (i // 8) + i % 8
        assert (w[:, gc] == gate[:, i]).all() and (w[:, gc + 8] == up[:, i]).all()
    with pytest.raises(ValueError, match="multiple of 8"):
        interleave_gate_up(np.zeros((4, 3)), np.zeros((4, 3)))

"""`grouped_matmul` / `GroupedLinear` through one MAX graph vs a float64 numpy reference.

One graph holds four op instances (symbolic T, G), so the Mojo op compiles once per device:
- `plain`:   bf16, functional output, K and N not multiples of any tile;
- `inplace`: fp16, written into a poisoned buffer (untouched rows must keep the poison);
- `planes`:  bf16, a_plane_splits = (128, 256) over a [3 T, K] plane stack;
- `layer`:   fp16 `GroupedLinear` with the SwiGLU epilogue and row_scale (router weights).
Every scenario (runtime offsets / ids / stats) runs through the same compiled model.
"""

from __future__ import annotations

from dataclasses import dataclass

import graph_pool
import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import BufferType, DeviceRef, Graph, TensorType
from max.graph import Module as GraphModule

from mojo_gemm.core.host import numpy_dtype, to_buffer, to_numpy
from mojo_gemm.grouped.layer import GroupedLinear
from mojo_gemm.grouped.op import grouped_matmul
from mojo_gemm.grouped.routing import group_tokens_by_expert, interleave_gate_up

E = 4
K1, N1 = 136, 200  # plain (bf16)
K2, N2 = 264, 136  # inplace (fp16)
K3, N3 = 72, 320  # planes (bf16): planes [0, 128), [128, 256), [256, 320)
SPLITS = (128, 256)
K4, I4 = 96, 40  # layer (fp16, swiglu): bank [E, 80, 96], output 40 columns
POISON = -1234.0


@dataclass(frozen=True)
class Scenario:
    """Runtime routing data: T tokens, offsets [G + 1], ids [G], stats [2]."""

    name: str
    T: int
    offsets: tuple[int, ...]
    ids: tuple[int, ...]
    stats: tuple[int, int]


def _from_topk(name: str, T: int, top_k: int, seed: int) -> Scenario:
    rng = np.random.default_rng(seed)
    topk = np.stack([rng.choice(E, size=top_k, replace=False) for _ in range(T // top_k)])
    g = group_tokens_by_expert(topk, E)
    return Scenario(name, topk.size, tuple(int(x) for x in g.a_offsets),
                    tuple(int(x) for x in g.expert_ids),
                    (int(g.expert_usage_stats[0]), int(g.expert_usage_stats[1])))


SCENARIOS = (
    # empty group (37, 37), single-token group (100, 101), -1 expert, ragged sizes
    Scenario("ragged", 150, (0, 37, 37, 100, 101, 150), (2, 0, -1, 3, 1), (63, 5)),
    # G_active = 2 < G = 4: rows 50..80 are not touched
    Scenario("inactive_tail", 80, (0, 20, 50, 70, 80), (1, 2, 3, 0), (30, 2)),
    Scenario("one_token", 1, (0, 1), (3,), (1, 1)),
    # from the routing helper: 9 tokens x top-2, experts sorted, unused experts trail
    _from_topk("routed", 18, 2, seed=5),
    # a big group (several token tiles of every kernel) next to a small one
    Scenario("large", 300, (0, 260, 300), (1, 3), (260, 2)),
    # trusted-but-clamped data: ids >= E and < -1 zero-fill, offsets past T are clamped,
    # G_active > G is clamped to G
    Scenario("clamped_ids", 64, (0, 10, 30, 9999), (7, -5, 1), (5000, 100)),
    # non-monotone offsets: group 1 [40, 20) is empty, group 2 [20, 60) overlaps group 0
    Scenario("non_monotone", 60, (0, 40, 20, 60), (0, 1, 2), (40, 3)),
    # empty inputs: no token and no group (a_offsets holds one entry), no token in two groups,
    # tokens but no group (the in-place buffer keeps every row)
    Scenario("empty_T0_G0", 0, (0,), (), (0, 0)),
    Scenario("empty_T0_G2", 0, (0, 0, 0), (1, -1), (0, 2)),
    Scenario("empty_T5_G0", 5, (0,), (), (0, 0)),
)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def reference(
    s: Scenario, a: np.ndarray, b: np.ndarray, *, splits: tuple[int, int] = (0, 0),
    swiglu: bool = False, row_scale: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(c, owners): float64 c [T, Nc] (NaN in unowned rows) and how many groups own each row."""
    T, n = s.T, b.shape[1]
    nc = n // 2 if swiglu else n
    c = np.full((T, nc), np.nan)
    owners = np.zeros(T, dtype=np.int64)
    g_active = min(s.stats[1], len(s.ids))
    for g in range(g_active):
        lo, hi = min(s.offsets[g], T), min(s.offsets[g + 1], T)
        if hi <= lo:
            continue
        owners[lo:hi] += 1
        e = s.ids[g]
        if not 0 <= e < b.shape[0]:
            c[lo:hi] = 0.0
            continue
        acc = np.empty((hi - lo, n))
        for col0, col1, plane in ((0, splits[0], 0), (splits[0], splits[1], 1),
                                  (splits[1], n, 2)) if splits[0] else ((0, n, 0),):
            rows = a[lo + plane * T: hi + plane * T]
            acc[:, col0:col1] = rows @ b[e, col0:col1].T
        if swiglu:
            blocks = acc.reshape(hi - lo, n // 16, 2, 8)
            acc = (_silu(blocks[:, :, 0]) * blocks[:, :, 1]).reshape(hi - lo, nc)
        if row_scale is not None:
            acc = acc * row_scale[lo:hi, None]
        c[lo:hi] = acc
    return c, owners


def check(name: str, got: np.ndarray, ref: np.ndarray, owners: np.ndarray) -> None:
    """Rows owned by exactly one group match (rel. Frobenius <= 1e-2; zero rows exactly);
    rows owned by several groups are finite (which group wins is unspecified)."""
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, expected {ref.shape}"
    one = owners == 1
    g, r = got[one].astype(np.float64), ref[one]
    assert np.isfinite(got[owners > 0]).all(), f"{name}: non-finite output"
    zero_rows = np.all(r == 0, axis=1)
    assert np.all(g[zero_rows] == 0), f"{name}: zero-filled rows are not zero"
    norm = np.linalg.norm(r)
    if norm > 0:
        err = np.linalg.norm(g - r) / norm
        assert err <= 1e-2, f"{name}: rel. Frobenius error {err:.3e} > 1e-2"


def build_graph(device: DeviceRef, layer: GroupedLinear, module: GraphModule | None = None
                ) -> Graph:
    """The four op instances, symbolic T / G (the last one `layer`), built into `module`."""
    types = [
        TensorType(DType.bfloat16, ["T", K1], device),  # a1
        TensorType(DType.bfloat16, [E, N1, K1], device),  # b1
        TensorType(DType.float16, ["T", K2], device),  # a2
        TensorType(DType.float16, [E, N2, K2], device),  # b2
        BufferType(DType.float16, ["T", N2], device),  # c2 (in place)
        TensorType(DType.bfloat16, ["T3", K3], device),  # a3 (3 planes)
        TensorType(DType.bfloat16, [E, N3, K3], device),  # b3
        TensorType(DType.float16, ["T", K4], device),  # a4
        TensorType(DType.float32, ["T", ], device),  # router weights
        TensorType(DType.uint32, ["G1"], device),
        TensorType(DType.int32, ["G"], device),
        TensorType(DType.uint32, [2], device),
    ]
    with Graph(POOL_KEY, input_types=types, module=module) as graph:
        a1, b1, a2, b2, c2, a3, b3, a4, rs, offs, ids, stats = (v for v in graph.inputs)
        route = (offs.tensor, ids.tensor, stats.tensor)
        y1 = grouped_matmul(a1.tensor, b1.tensor, *route)
        grouped_matmul(a2.tensor, b2.tensor, *route, out=c2.buffer)
        y3 = grouped_matmul(a3.tensor, b3.tensor, *route, a_plane_splits=SPLITS)
        y4 = layer(a4.tensor, *route, row_scale=rs.tensor)
        graph.output(y1, y3, y4)
    return graph


POOL_KEY = "grouped_test"


def swiglu_layer(device: DeviceRef) -> GroupedLinear:
    """The graph's layer instance: fp16 SwiGLU experts, K4 -> I4 (weights loaded by the caller)."""
    return GroupedLinear(E, K4, I4, swiglu=True, dtype=DType.float16, device=device)


def _pooled(module: GraphModule) -> graph_pool.Built:
    layer = swiglu_layer(DeviceRef.CPU())
    weights = graph_pool.prefixed_weights(POOL_KEY, layer)
    return build_graph(DeviceRef.CPU(), layer, module), weights


graph_pool.register(POOL_KEY, _pooled)


def load_graph(device_kind: str, layer: GroupedLinear) -> Model:
    """`build_graph` compiled for `device_kind` with `layer`'s weights (the CPU graph comes
    from the suite's pool: compiled once, weights bound here)."""
    if device_kind == "cpu":
        return graph_pool.model(POOL_KEY, layer)
    session = InferenceSession(devices=[CPU(), Accelerator()])
    return session.load(build_graph(DeviceRef.GPU(), layer), weights_registry=layer.state_dict())


def run_all(device_kind: str) -> None:
    """Compiles the graph once on `device_kind` and checks every scenario."""
    rng = np.random.default_rng(2026)
    on_gpu = device_kind == "gpu"
    device = DeviceRef.GPU() if on_gpu else DeviceRef.CPU()
    dev = Accelerator() if on_gpu else CPU()

    def rounded(shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        return rng.standard_normal(shape).astype(numpy_dtype(dtype)).astype(np.float64)

    b1 = rounded((E, N1, K1), DType.bfloat16)
    b2 = rounded((E, N2, K2), DType.float16)
    b3 = rounded((E, N3, K3), DType.bfloat16)
    gate = rounded((E, I4, K4), DType.float16)
    up = rounded((E, I4, K4), DType.float16)
    layer = swiglu_layer(device)
    layer.load_experts(gate=gate, up=up)
    b4 = interleave_gate_up(gate, up)
    model = load_graph(device_kind, layer)

    for s in SCENARIOS:
        T = s.T
        a1 = rounded((T, K1), DType.bfloat16)
        a2 = rounded((T, K2), DType.float16)
        a3 = rounded((3 * T, K3), DType.bfloat16)
        a4 = rounded((T, K4), DType.float16)
        rs = rng.uniform(0.1, 1.0, T).astype(np.float32)
        c2 = Buffer.from_numpy(np.full((T, N2), POISON, np.float16)).to(dev)
        inputs = [
            to_buffer(a1, DType.bfloat16), to_buffer(b1, DType.bfloat16),
            to_buffer(a2, DType.float16), to_buffer(b2, DType.float16), c2,
            to_buffer(a3, DType.bfloat16), to_buffer(b3, DType.bfloat16),
            to_buffer(a4, DType.float16), Buffer.from_numpy(rs),
            Buffer.from_numpy(np.array(s.offsets, np.uint32)),
            Buffer.from_numpy(np.array(s.ids, np.int32)),
            Buffer.from_numpy(np.array(s.stats, np.uint32)),
        ]
        inputs = [x if x is c2 else x.to(dev) for x in inputs]
        y1, y3, y4 = model.execute(*inputs)

        ref1, owners = reference(s, a1, b1)
        check(f"{s.name}/plain", to_numpy(y1), ref1, owners)
        ref2, _ = reference(s, a2, b2)
        got2 = to_numpy(c2)
        check(f"{s.name}/inplace", got2, ref2, owners)
        untouched = owners == 0
        assert np.all(got2[untouched] == np.float16(POISON)), (
            f"{s.name}/inplace: rows outside the active groups were written")
        ref3, _ = reference(s, a3, b3, splits=SPLITS)
        check(f"{s.name}/planes", to_numpy(y3), ref3, owners)
        ref4, _ = reference(s, a4, b4, swiglu=True, row_scale=rs.astype(np.float64))
        check(f"{s.name}/layer_swiglu", to_numpy(y4), ref4, owners)


def test_grouped_matmul_cpu() -> None:
    """Every scenario on the CPU path (bf16 and fp16, planes, SwiGLU + row scale, in place)."""
    run_all("cpu")


@pytest.mark.gpu
def test_grouped_matmul_gpu() -> None:
    """Every scenario on the GPU path (SM90 on an H200, SM100 on a B200)."""
    run_all("gpu")

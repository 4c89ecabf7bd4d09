"""Seeded property-based fuzz of the CPU path against float64 references, mostly through
the graphs the op tests already compile (symbolic token and group counts), so those add no
compile of their own when the op tests run in the same process:
- `grouped_matmul` / `GroupedLinear` (test_grouped's graph: plain bf16, fp16 in place into a
  poisoned buffer, Q/K/V planes, SwiGLU + row scale): random T, G, ragged and empty groups,
  offsets past T and non-monotone, expert ids in [-3, E + 3) (−1 and out-of-range ids zero-fill),
  G_active below and above G;
- `multistage_gemm_q` (the int4 op, as `int4_matmul` emits it, in a graph of its own with
  symbolic M, N and K, so the weights of every shape are graph inputs): one instance per group
  size (32, 64, 128, per channel) and symmetric / asymmetric, bfloat16; per case random M
  (0 included), N a multiple of 8, K a multiple of the group, act-order or not, a random bias;
- `k_matmul_ragged_paged_scale` / `v_matmul_ragged_paged_scale` (test_k_cache's graph: four
  granularities, bf16 and fp8 caches, per-head and per-tensor kv_scale, padded page stride):
  random ragged batches, cache lengths, random page layouts (a permutation of the arena's
  pages per batch) and bad lookup-table entries (page ids past the cache) that must be skipped.
Each op gets FUZZ_CASES cases from its own seeded generator; every failure names its case.
"""

from __future__ import annotations

import graph_pool
import numpy as np
from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, ops
from max.graph import Module as GraphModule
from test_grouped import POISON, Scenario, check, load_graph, reference, swiglu_layer
from test_k_cache import PAGE, Batch
from test_k_cache import run as run_k_cache

from checkpoint_fixtures import make_gptq
from mojo_gemm import Int4Weight
from mojo_gemm.core.extension import ensure_kernels_loaded
from mojo_gemm.core.host import numpy_dtype, to_buffer, to_numpy
from mojo_gemm.grouped.routing import interleave_gate_up
from mojo_gemm.int4.contract import int4_padded

FUZZ_CASES = 200
E = 4
K1, N1, K2, N2, K3, N3, K4, I4 = 136, 200, 264, 136, 72, 320, 96, 40  # test_grouped's sizes
SPLITS = (128, 256)
ARENA_PAGES = 40  # test_k_cache's caches have 41 pages, the last one the null page


def random_scenario(rng: np.random.Generator, i: int) -> Scenario:
    """Random routing: T in [0, 160], G in [0, 8], offsets sorted cut points (some empty
    groups), sometimes past T or shuffled, ids in [-3, E + 3), stats[1] in [0, G + 2]."""
    T = int(rng.integers(0, 161))
    G = int(rng.integers(0, 9))
    cuts = np.sort(rng.integers(0, T + 1, size=max(G - 1, 0)))
    offsets = np.concatenate([[0], cuts, [T]]) if G else np.array([0])
    if G and rng.random() < 0.15:
        offsets[-1] = T + int(rng.integers(1, 500))  # past T: clamped
    if G > 1 and rng.random() < 0.1:
        rng.shuffle(offsets[1:])  # non-monotone: decreasing ranges are empty
    ids = rng.integers(-3, E + 3, size=G) if rng.random() < 0.3 else rng.integers(0, E, size=G)
    g_active = int(rng.integers(0, G + 3)) if rng.random() < 0.2 else G
    return Scenario(f"case{i}", T, tuple(int(x) for x in offsets), tuple(int(x) for x in ids),
                    (T, g_active))


def test_fuzz_grouped_cpu() -> None:
    """FUZZ_CASES random routings through the four grouped op instances of one graph."""
    rng = np.random.default_rng(23)

    def rounded(shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        return rng.standard_normal(shape).astype(numpy_dtype(dtype)).astype(np.float64)

    device = DeviceRef.CPU()
    b1 = rounded((E, N1, K1), DType.bfloat16)
    b2 = rounded((E, N2, K2), DType.float16)
    b3 = rounded((E, N3, K3), DType.bfloat16)
    gate, up = rounded((E, I4, K4), DType.float16), rounded((E, I4, K4), DType.float16)
    layer = swiglu_layer(device)
    layer.load_experts(gate=gate, up=up)
    b4 = interleave_gate_up(gate, up)
    model = load_graph("cpu", layer)
    weights = (to_buffer(b1, DType.bfloat16), to_buffer(b2, DType.float16),
               to_buffer(b3, DType.bfloat16))
    for i in range(FUZZ_CASES):
        s = random_scenario(rng, i)
        T = s.T
        a1, a2 = rounded((T, K1), DType.bfloat16), rounded((T, K2), DType.float16)
        a3, a4 = rounded((3 * T, K3), DType.bfloat16), rounded((T, K4), DType.float16)
        rs = rng.uniform(0.1, 1.0, T).astype(np.float32)
        c2 = Buffer.from_numpy(np.full((T, N2), POISON, np.float16))
        y1, y3, y4 = model.execute(
            to_buffer(a1, DType.bfloat16), weights[0], to_buffer(a2, DType.float16), weights[1],
            c2, to_buffer(a3, DType.bfloat16), weights[2], to_buffer(a4, DType.float16),
            Buffer.from_numpy(rs), Buffer.from_numpy(np.array(s.offsets, np.uint32)),
            Buffer.from_numpy(np.array(s.ids, np.int32)),
            Buffer.from_numpy(np.array(s.stats, np.uint32)),
        )
        where = f"{s.name} {s}"
        ref1, owners = reference(s, a1, b1)
        check(f"{where}/plain", to_numpy(y1), ref1, owners)
        got2 = to_numpy(c2)
        check(f"{where}/inplace", got2, reference(s, a2, b2)[0], owners)
        assert np.all(got2[owners == 0] == np.float16(POISON)), (
            f"{where}/inplace: rows outside the active groups were written")
        check(f"{where}/planes", to_numpy(y3), reference(s, a3, b3, splits=SPLITS)[0], owners)
        ref4, _ = reference(s, a4, b4, swiglu=True, row_scale=rs.astype(np.float64))
        check(f"{where}/layer_swiglu", to_numpy(y4), ref4, owners)


def random_batch(rng: np.random.Generator) -> Batch:
    """A ragged batch of 1..6 sequences (lengths 0..24, some zero; cache lengths 0..60) whose
    pages fit the arena, sometimes with a short lookup table or page ids past the cache."""
    while True:
        B = int(rng.integers(1, 7))
        lengths = [int(x) if rng.random() > 0.2 else 0 for x in rng.integers(1, 25, size=B)]
        cache_lengths = [int(x) for x in rng.integers(0, 61, size=B)]
        need = sum(-(-(c + n) // PAGE) for c, n in zip(cache_lengths, lengths, strict=True))
        if need <= ARENA_PAGES:
            break
    overrides: dict[tuple[int, int], int] = {}
    lut_cols = None
    if rng.random() < 0.2:
        b = int(rng.integers(0, B))
        overrides[(b, (cache_lengths[b] + max(lengths[b] - 1, 0)) // PAGE)] = int(
            rng.integers(41, 100_000))
    elif rng.random() < 0.15:
        lut_cols = int(rng.integers(1, 6))
    return Batch(lengths, cache_lengths, overrides, lut_cols=lut_cols)


def test_fuzz_k_cache_cpu() -> None:
    """FUZZ_CASES random batches through test_k_cache's six K / V op instances; each run
    poisons the arena, checks that exactly the target slots changed and their values."""
    rng = np.random.default_rng(2323)
    for i in range(FUZZ_CASES):
        batch = random_batch(rng)
        try:
            run_k_cache("cpu", batch, seed=1000 + i)
        except AssertionError as e:
            raise AssertionError(f"case {i} {batch}: {e}") from e


INT4_VARIANTS = tuple((g, zeros) for g in (32, 64, 128, -1) for zeros in (False, True))
"""(group_size, has_zeros) of each int4 op instance."""
INT4_TOL = 1e-2


def int4_graph(module: GraphModule | None = None,
               variants: tuple[tuple[int, bool], ...] = INT4_VARIANTS) -> Graph:
    """One `multistage_gemm_q` per `variants` entry (default INT4_VARIANTS), bfloat16,
    symbolic M (shared) and per-instance symbolic Kp, Np; inputs per instance: x [M, Kp]
    (already permuted and padded), qweight [Np / 64, 8 Kp], scales [G, Np], zeros [G, Np]
    (has_zeros), bias [1, Np]; built into `module` if given."""
    dev = DeviceRef.CPU()
    bf16 = DType.bfloat16
    types: list[TensorType] = []
    for i, (_, zeros) in enumerate(variants):
        types += [TensorType(bf16, ["m", f"kp{i}"], dev),
                  TensorType(DType.uint32, [f"nb{i}", f"kw{i}"], dev),
                  TensorType(bf16, [f"g{i}", f"np{i}"], dev)]
        if zeros:
            types.append(TensorType(bf16, [f"g{i}", f"np{i}"], dev))
        types.append(TensorType(bf16, [1, f"np{i}"], dev))
    with Graph("int4_fuzz", input_types=types, module=module) as g:
        ensure_kernels_loaded()
        it = (v.tensor for v in g.inputs)
        outs = []
        for group, zeros in variants:
            x, q, sc = next(it), next(it), next(it)
            z = next(it) if zeros else sc
            bias = next(it)
            outs.append(ops.custom(
                "multistage_gemm_q", dev, [x, q, sc, z, bias],
                [TensorType(bf16, [x.shape[0], sc.shape[1]], dev)],
                parameters={"group_size": group, "has_zeros": zeros, "has_bias": True},
            )[0].tensor)
        g.output(*outs)
    return g


graph_pool.register("int4_fuzz", lambda module: (int4_graph(module), {}))


def int4_case(
    rng: np.random.Generator, m: int, group: int, zeros: bool, seed: int
) -> tuple[list[Buffer], np.ndarray, str]:
    """Random weight of one variant: (graph inputs, float64 reference [m, n], description)."""
    g = 32 if group == -1 else group
    n = 8 * int(rng.integers(1, 41))
    k = g * int(rng.integers(1, max(2, 384 // g + 1)))
    act = bool(rng.random() < 0.5)
    ck = make_gptq(n, k, group, sym=not zeros, act_order=act, seed=seed)
    w = Int4Weight.from_gptq(ck.qweight, ck.qzeros, ck.scales, ck.g_idx, group_size=group)
    assert (w.zeros is not None) == zeros, "fixture symmetry"
    x = rng.standard_normal((m, k)).astype(numpy_dtype(DType.bfloat16)).astype(np.float64)
    bias = rng.standard_normal(n) if rng.random() < 0.5 else np.zeros(n)
    bias = bias.astype(numpy_dtype(DType.bfloat16)).astype(np.float64)
    n_p, k_p = int4_padded(n, k)
    rows = x[:, w.perm] if w.perm is not None else x
    rows = np.pad(rows, ((0, 0), (0, k_p - k)))
    inputs = [to_buffer(rows, DType.bfloat16), Buffer.from_numpy(np.ascontiguousarray(w.qweight)),
              to_buffer(w.scales, DType.bfloat16)]
    if zeros:
        inputs.append(to_buffer(w.zeros, DType.bfloat16))
    inputs.append(to_buffer(np.pad(bias, (0, n_p - n))[None, :], DType.bfloat16))
    ref = x @ ck.w_ref.T + bias
    return inputs, ref, f"n={n} k={k} group={group} zeros={zeros} act_order={act}"


def test_fuzz_int4_cpu() -> None:
    """FUZZ_CASES random M; each case gives every variant a fresh random weight shape."""
    rng = np.random.default_rng(4)
    model = graph_pool.model("int4_fuzz")
    for i in range(FUZZ_CASES):
        m = int(rng.integers(0, 49))
        inputs, refs, names = [], [], []
        for j, (group, zeros) in enumerate(INT4_VARIANTS):
            ins, ref, name = int4_case(rng, m, group, zeros, seed=i * 16 + j)
            inputs += ins
            refs.append(ref)
            names.append(name)
        outs = model.execute(*inputs)
        for out, ref, name in zip(outs, refs, names, strict=True):
            got = to_numpy(out)[:, : ref.shape[1]].astype(np.float64)
            assert got.shape == ref.shape, f"case {i} m={m} {name}: shape {got.shape}"
            norm = np.linalg.norm(ref)
            if norm > 0:
                err = np.linalg.norm(got - ref) / norm
                assert err <= INT4_TOL, f"case {i} m={m} {name}: rel. Frobenius error {err:.3e}"

"""The checkpoint loader: safetensors files in GPTQ / AWQ / FP8 / dense formats → our layers.

Fixture files are written with the `safetensors` package from tensors built by the independent
encoders of checkpoint_fixtures.py (GPTQ, AWQ) or by hand (DeepSeek FP8 weight +
weight_scale_inv, dense bf16), split over two files. References are float64 numpy from the
checkpoint tensors' own dequant formulas, never from our packer. One CPU graph holds every
Int4Linear (symbolic M), one more the grouped expert banks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import graph_pool
import ml_dtypes
import numpy as np
import pytest
from max.driver import Buffer
from max.dtype import DType
from max.graph import (
    BufferType,
    DeviceRef,
    Graph,
    ShardingStrategy,
    TensorType,
    TensorValue,
    Value,
    ops,
)
from max.graph import Module as GraphModule
from max.nn import LayerList, Module
from max.nn.kv_cache import MHAKVCacheParams, PagedCacheValues
from safetensors.numpy import save_file

from checkpoint_fixtures import make_awq, make_gptq
from mojo_gemm import GroupedLinear, Int4Linear, group_tokens_by_expert
from mojo_gemm.checkpoints import (
    Checkpoint,
    CheckpointError,
    detect_format,
    grouped_linear_state,
    int4_linear_kwargs,
    int4_linear_state,
    kv_projection_state,
    moe_block_state,
    read_int4,
)
from mojo_gemm.core.host import numpy_dtype, to_buffer, to_numpy
from mojo_gemm.fp8.quant import quantize_fp8_input
from mojo_gemm.grouped.moe import MoEBlock
from mojo_gemm.k_cache.layer import PagedKVProjection

F8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
TOL = 1e-2
TOL_FP8 = 2e-2


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def fp8_checkpoint(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek-style (weight e4m3 [n, k], weight_scale_inv f32 [ceil(n/128), ceil(k/128)]),
    random codes and scales (not produced by our quantizer)."""
    codes = np.clip(rng.standard_normal((n, k)) * 100, -448, 448).astype(F8)
    scale_inv = rng.uniform(1e-3, 4e-3, size=(-(-n // 128), -(-k // 128))).astype(np.float32)
    return codes, scale_inv


def fp8_ref(weight: np.ndarray, scale_inv: np.ndarray) -> np.ndarray:
    """W[n, k] = weight[n, k] · weight_scale_inv[n // 128, k // 128], float64."""
    n, k = weight.shape
    rows = np.arange(n)[:, None] // 128
    cols = np.arange(k)[None, :] // 128
    return weight.astype(np.float64) * scale_inv.astype(np.float64)[rows, cols]


# --------------------------------------------------------------------------------------------
# Int4Linear from GPTQ / AWQ checkpoints


@dataclass(frozen=True)
class Int4Case:
    prefix: str
    source: str  # gptq | gptq_v2 | awq
    n: int
    k: int
    group_size: int
    sym: bool
    act_order: bool
    bias: bool
    dtype: DType
    config: dict | None


INT4_CASES = (
    Int4Case("model.layers.0.self_attn.q_proj", "gptq", 200, 256, 128, True, False, False,
             DType.bfloat16, {"bits": 4, "group_size": 128, "desc_act": False, "sym": True}),
    Int4Case("model.layers.0.mlp.up_proj", "gptq", 72, 192, 64, False, True, True,
             DType.float16, None),  # group size and act-order from the shapes / g_idx
    Int4Case("model.layers.1.self_attn.o_proj", "gptq_v2", 136, 384, 128, False, True, False,
             DType.bfloat16, {"quantization_config": {
                 "quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True,
                 "sym": False, "checkpoint_format": "gptq_v2"}}),
    Int4Case("model.layers.1.mlp.down_proj", "awq", 136, 96, 32, False, False, True,
             DType.bfloat16, {"quant_method": "awq", "w_bit": 4, "q_group_size": 32,
                              "zero_point": True, "version": "GEMM"}),
    Int4Case("lm_head", "gptq", 64, 200, -1, True, False, False, DType.float16, None),
)


def int4_tensors(case: Int4Case, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The case's checkpoint tensors (names with prefix) and its float64 W [N, K]."""
    rng = np.random.default_rng(seed)
    if case.source == "awq":
        ck = make_awq(case.n, case.k, case.group_size, seed=seed)
        tensors = {"qweight": ck.qweight, "qzeros": ck.qzeros, "scales": ck.scales}
    else:
        ck = make_gptq(case.n, case.k, case.group_size, sym=case.sym, act_order=case.act_order,
                       checkpoint_format=case.source, seed=seed)
        tensors = {"qweight": ck.qweight, "qzeros": ck.qzeros, "scales": ck.scales,
                   "g_idx": ck.g_idx}
    if case.bias:
        tensors["bias"] = rng.standard_normal(case.n).astype(np.float16)
    return {f"{case.prefix}.{k}": v for k, v in tensors.items()}, ck.w_ref


@dataclass(frozen=True)
class Files:
    """The fixture checkpoint: files, and every reference."""

    paths: list[Path]
    int4_refs: list[tuple[np.ndarray, np.ndarray | None]]
    fp8: dict[str, tuple[np.ndarray, np.ndarray]]
    dense: dict[str, np.ndarray]
    experts: dict[str, np.ndarray]  # proj -> float64 [E, N, K]; "router" -> [E, HIDDEN]


E, HIDDEN, INTER = 3, 64, 32
"""Experts, hidden size and intermediate size of the fixture MoE layer."""
MOE = "model.layers.2.mlp"


def expert_tensors(rng: np.random.Generator, seed: int) -> tuple[dict, dict[str, np.ndarray]]:
    """Per-expert gate/up/down in mixed formats: expert 0 dense bf16, 1 FP8, 2 GPTQ / AWQ."""
    tensors: dict[str, np.ndarray] = {}
    refs: dict[str, list[np.ndarray]] = {"gate_proj": [], "up_proj": [], "down_proj": []}
    for proj, (n, k) in (("gate_proj", (INTER, HIDDEN)), ("up_proj", (INTER, HIDDEN)),
                         ("down_proj", (HIDDEN, INTER))):
        for e in range(E):
            p = f"{MOE}.experts.{e}.{proj}"
            if e == 0:
                w = (rng.standard_normal((n, k)) * 0.2).astype(BF16)
                tensors[f"{p}.weight"] = w
                refs[proj].append(w.astype(np.float64))
            elif e == 1:
                w8, s = fp8_checkpoint(rng, n, k)
                tensors[f"{p}.weight"], tensors[f"{p}.weight_scale_inv"] = w8, s
                refs[proj].append(fp8_ref(w8, s))
            elif proj == "down_proj":
                ck = make_awq(n, k, 32, seed=seed + len(tensors))
                tensors.update({f"{p}.qweight": ck.qweight, f"{p}.qzeros": ck.qzeros,
                                f"{p}.scales": ck.scales})
                refs[proj].append(ck.w_ref)
            else:
                ck = make_gptq(n, k, 32, sym=False, act_order=True, seed=seed + len(tensors))
                tensors.update({f"{p}.qweight": ck.qweight, f"{p}.qzeros": ck.qzeros,
                                f"{p}.scales": ck.scales, f"{p}.g_idx": ck.g_idx})
                refs[proj].append(ck.w_ref)
    return tensors, {proj: np.stack(ws) for proj, ws in refs.items()}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    rng = np.random.default_rng(7)
    part0: dict[str, np.ndarray] = {}
    part1: dict[str, np.ndarray] = {}
    int4_refs = []
    for i, case in enumerate(INT4_CASES):
        tensors, w_ref = int4_tensors(case, seed=300 + i)
        (part0 if i % 2 == 0 else part1).update(tensors)
        bias = tensors.get(f"{case.prefix}.bias")
        int4_refs.append((w_ref, bias))
    fp8 = {}
    for proj, n in (("k_proj", 192), ("v_proj", 192)):
        w8, s = fp8_checkpoint(rng, n, 320)
        prefix = f"model.layers.0.self_attn.{proj}"
        part1.update({f"{prefix}.weight": w8, f"{prefix}.weight_scale_inv": s})
        fp8[prefix] = (w8, s)
    dense = {}
    for proj in ("k_proj", "v_proj"):
        prefix = f"model.layers.1.self_attn.{proj}"
        w = (rng.standard_normal((128, 200)) * 0.05).astype(BF16)
        part0[f"{prefix}.weight"] = w
        dense[prefix] = w.astype(np.float64)
    tensors, experts = expert_tensors(rng, seed=900)
    part1.update(tensors)
    router = (rng.standard_normal((E, HIDDEN)) * 0.1).astype(BF16)
    part0[f"{MOE}.gate.weight"] = router
    experts["router"] = router.astype(np.float64)
    root = tmp_path_factory.mktemp("ckpt")
    paths = [root / "model-00001-of-00002.safetensors", root / "model-00002-of-00002.safetensors"]
    save_file(part0, str(paths[0]))
    save_file(part1, str(paths[1]))
    return Files(paths, int4_refs, fp8, dense, experts)


class Int4Layers(Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = LayerList([
            Int4Linear(c.k, c.n, group_size=c.group_size, symmetric=c.sym,
                       act_order=c.act_order, has_bias=c.bias, dtype=c.dtype)
            for c in INT4_CASES
        ])

    def __call__(self, *xs: TensorValue) -> tuple[TensorValue, ...]:
        return tuple(layer(x) for layer, x in zip(self.layers, xs, strict=True))


def test_detect_format(files: Files) -> None:
    ckpt = Checkpoint(files.paths[0].parent)
    for case in INT4_CASES:
        expected = "awq" if case.source == "awq" else "gptq"
        assert detect_format(ckpt, case.prefix, case.config) == expected, case.prefix
    assert detect_format(ckpt, "model.layers.0.self_attn.k_proj") == "fp8"
    assert detect_format(ckpt, "model.layers.1.self_attn.k_proj") == "dense"


def test_int4_linears_cpu(files: Files, cpu_runs: CpuRuns) -> None:
    """Every GPTQ / AWQ case loaded into Int4Linear and run, M in {1, 5, 33}."""
    ckpt = Checkpoint(files.paths)
    for case in INT4_CASES:
        kwargs = int4_linear_kwargs(read_int4(ckpt, case.prefix, case.config), has_bias=case.bias)
        assert kwargs == {"in_features": case.k, "out_features": case.n,
                          "group_size": case.group_size, "symmetric": case.sym,
                          "act_order": case.act_order, "has_bias": case.bias}, case.prefix
    for m, xs, outs in cpu_runs.int4:
        for case, x, out, (w_ref, bias) in zip(INT4_CASES, xs, outs, files.int4_refs,
                                               strict=True):
            ref = x.astype(np.float64) @ w_ref.T
            if bias is not None:
                ref += bias.astype(numpy_dtype(case.dtype)).astype(np.float64)
            got = to_numpy(out).astype(np.float64)
            assert got.shape == (m, case.n)
            err = rel_err(got, ref)
            assert err <= TOL, f"{case.prefix} M={m}: rel. error {err:.3e}"


# --------------------------------------------------------------------------------------------
# FP8 K/V projection weights


def kv_layer(heads: int, hidden: int, device: DeviceRef | None = None) -> PagedKVProjection:
    """A PagedKVProjection (layer 1 of a 2-layer bf16 cache, head_dim 64) for `hidden`."""
    device = device if device is not None else DeviceRef.CPU()
    params = MHAKVCacheParams(dtype=DType.bfloat16, n_kv_heads=heads, head_dim=64,
                              num_layers=2, page_size=PAGE, devices=[device])
    return PagedKVProjection(params, hidden, 1, device=device)


def decode_fp8_state(state: dict, name: str) -> np.ndarray:
    """float64 W from a kv_projection_state's CPU uint8 bits and block scales."""
    bits = to_numpy(state[f"{name}_weight"])
    assert bits.dtype == np.uint8
    return fp8_ref(bits.view(F8), to_numpy(state[f"{name}_weight_scale"]))


def test_kv_projection_state_fp8_is_exact(files: Files) -> None:
    """DeepSeek FP8 tensors pass through unchanged (bits and scales)."""
    ckpt = Checkpoint(files.paths)
    state = kv_projection_state(ckpt, "model.layers.0.self_attn.k_proj",
                                "model.layers.0.self_attn.v_proj", kv_layer(3, 320),
                                state_prefix="kv.")
    assert sorted(state) == ["kv.k_weight", "kv.k_weight_scale", "kv.v_weight",
                             "kv.v_weight_scale"]
    for name, proj in (("kv.k", "k_proj"), ("kv.v", "v_proj")):
        w8, s = files.fp8[f"model.layers.0.self_attn.{proj}"]
        assert np.array_equal(to_numpy(state[f"{name}_weight"]), w8.view(np.uint8))
        assert np.array_equal(to_numpy(state[f"{name}_weight_scale"]), s)
        assert to_numpy(state[f"{name}_weight_scale"]).shape == (2, 3)


def test_kv_projection_state_dense_is_quantized(files: Files) -> None:
    """Dense bf16 K/V weights are block-quantized to fp8 with 128 x 128 scales: every element
    within half an e4m3 step (2^-4 relative; 2^-10 · scale in the subnormal range)."""
    ckpt = Checkpoint(files.paths)
    state = kv_projection_state(ckpt, "model.layers.1.self_attn.k_proj",
                                "model.layers.1.self_attn.v_proj", kv_layer(2, 200))
    for name, proj in (("k", "k_proj"), ("v", "v_proj")):
        ref = files.dense[f"model.layers.1.self_attn.{proj}"]
        scales = to_numpy(state[f"{name}_weight_scale"]).astype(np.float64)
        assert scales.shape == (1, 2)
        got = decode_fp8_state(state, name)
        step = np.abs(ref) * 2.0**-4 + fp8_ref(np.ones(ref.shape, F8), scales) * 2.0**-10
        assert np.all(np.abs(got - ref) <= step * (1 + 1e-6)), proj
        assert rel_err(got, ref) <= 0.05, proj


def test_kv_projection_state_gpu_dtype(files: Files) -> None:
    """For a GPU layer the host buffers hold float8_e4m3fn (no device needed to build them)."""
    ckpt = Checkpoint(files.paths)
    state = kv_projection_state(ckpt, "model.layers.0.self_attn.k_proj",
                                "model.layers.0.self_attn.v_proj",
                                kv_layer(3, 320, DeviceRef.GPU()))
    assert state["k_weight"].dtype == DType.float8_e4m3fn
    assert state["k_weight_scale"].dtype == DType.float32


PAGE, PAGES = 16, 9


def test_kv_projection_layer_cpu(files: Files, cpu_runs: CpuRuns) -> None:
    """The FP8 checkpoint loaded into PagedKVProjection; K and V land in the paged cache as
    x_q · Wᵀ with W = weight · weight_scale_inv (x_q: the layer's per-token e4m3 rounding of
    x, `quantize_fp8_input`, which its in-graph quantizer matches); nothing else changes."""
    x, lut, arena, cache = cpu_runs.kv
    lengths, cached = KV_LENGTHS, KV_CACHED
    tokens = sum(lengths)
    got = to_numpy(cache)
    before = (arena.astype(np.uint32) << 16).view(np.float32)
    a_q, a_s = quantize_fp8_input(x.astype(np.float64), 1, 128)
    x_q = a_q.astype(np.float64) * np.repeat(a_s[:, :tokens].T, 128, axis=1)[:, :320]
    written = np.zeros(got.shape, bool)
    for half, proj in enumerate(("k_proj", "v_proj")):
        ref = x_q @ fp8_ref(*files.fp8[f"model.layers.0.self_attn.{proj}"]).T
        got_rows, ref_rows = [], []
        for b, (n_tok, start) in enumerate(zip(lengths, cached, strict=True)):
            for i in range(n_tok):
                pos = start + i
                slot = (int(lut[b, pos // PAGE]), half, 1, pos % PAGE)
                written[slot] = True
                got_rows.append(got[slot].reshape(-1))
                ref_rows.append(ref[[0, lengths[0]][b] + i])
        err = rel_err(np.array(got_rows, np.float64), np.array(ref_rows))
        assert err <= TOL_FP8, f"{proj}: rel. error {err:.3e}"
    assert np.array_equal(got[~written], before[~written]), "cache changed outside the slots"


# --------------------------------------------------------------------------------------------
# GroupedLinear expert banks


TP = 2
"""Tensor-parallel shards of the expert banks (all on the CPU device)."""


class Experts(Module):
    """The two banks, and their TP shards: gate/up column-parallel (outputs concatenated),
    down row-parallel (h's column slices in, partial outputs summed in float32)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up = GroupedLinear(E, HIDDEN, INTER, swiglu=True)
        self.down = GroupedLinear(E, INTER, HIDDEN)
        self.gate_up.sharding_strategy = ShardingStrategy.axiswise(1, TP)
        self.down.sharding_strategy = ShardingStrategy.axiswise(2, TP)

    def __call__(self, x: TensorValue, h: TensorValue, offsets: TensorValue,
                 ids: TensorValue, stats: TensorValue) -> tuple[TensorValue, ...]:
        cpus = [DeviceRef.CPU()] * TP
        cols = [s(x, offsets, ids, stats) for s in self.gate_up.shard(cpus)]
        k = INTER // TP
        parts = [ops.cast(s(h[:, i * k:(i + 1) * k], offsets, ids, stats), DType.float32)
                 for i, s in enumerate(self.down.shard(cpus))]
        return (self.gate_up(x, offsets, ids, stats), self.down(h, offsets, ids, stats),
                ops.concat(cols, axis=1), parts[0] + parts[1])


KV_LENGTHS, KV_CACHED = [5, 21], [3, 10]
"""Tokens per sequence of the K/V projection run, and its cache lengths."""


class CpuLayers(Module):
    """The int4 linears, the K/V projection and the expert banks: one CPU graph for the three
    checkpoint-loading runs, since a CPU graph compile has a large fixed cost."""

    def __init__(self) -> None:
        super().__init__()
        self.int4 = Int4Layers()
        self.kv = kv_layer(3, 320)
        self.experts = Experts()

    def __call__(self, *ins: Value) -> tuple[TensorValue, ...]:
        """Inputs: one x per INT4_CASES entry, the K/V layer's 8 (offsets, x, its cache
        collection), the expert banks' 5; outputs: the int4 outputs, gate_up, down and the
        banks' TP-shard results."""
        xs_in, kv_in, ex_in = ins[:len(INT4_CASES)], ins[len(INT4_CASES):-5], ins[-5:]
        int4_outs = self.int4(*(v.tensor for v in xs_in))
        offsets, x, blocks, stride, lens, lut, mp, mc = kv_in
        self.kv(x.tensor, offsets.tensor, PagedCacheValues(
            kv_blocks=blocks.buffer, cache_lengths=lens.tensor, lookup_table=lut.tensor,
            max_prompt_length=mp.tensor, max_cache_length=mc.tensor, page_stride=stride.tensor))
        return (*int4_outs, *self.experts(*(v.tensor for v in ex_in)))


POOL_KEY = "checkpoint_layers"


def cpu_graph(module: GraphModule) -> graph_pool.Built:
    """CpuLayers' graph (zero weights named `checkpoint_layers.*`), for the suite's CPU pool;
    `cpu_runs` binds the checkpoints' weights."""
    model = CpuLayers()
    weights = graph_pool.prefixed_weights(POOL_KEY, model)
    cpu = DeviceRef.CPU()
    shape = model.kv.kv_params.shape_per_block
    types = [TensorType(c.dtype, [f"m{i}", c.k], cpu) for i, c in enumerate(INT4_CASES)]
    types += [TensorType(DType.uint32, ["b1"], cpu), TensorType(DType.bfloat16, ["t", 320], cpu),
              BufferType(DType.bfloat16, ["pages", *shape], cpu),
              TensorType(DType.int64, [1], cpu), TensorType(DType.uint32, ["b"], cpu),
              TensorType(DType.uint32, ["b", "cols"], cpu), TensorType(DType.uint32, [1], cpu),
              TensorType(DType.uint32, [1], cpu)]
    types += [TensorType(DType.bfloat16, ["te", HIDDEN], cpu),
              TensorType(DType.bfloat16, ["te", INTER], cpu),
              TensorType(DType.uint32, [E + 1], cpu), TensorType(DType.int32, [E], cpu),
              TensorType(DType.uint32, [2], cpu)]
    with Graph(POOL_KEY, input_types=types, module=module) as g:
        g.output(*model(*g.inputs))
    return g, weights


graph_pool.register(POOL_KEY, cpu_graph)


@dataclass(frozen=True, eq=False)
class CpuRuns:
    """Results of the shared graph. int4: per M, (M, inputs, outputs); kv: (x, lut, the
    poisoned arena before, the cache after); experts: (grouping, x, h, (gate_up, down))."""

    int4: list[tuple[int, list[np.ndarray], list[Buffer]]]
    kv: tuple[np.ndarray, np.ndarray, np.ndarray, Buffer]
    experts: tuple[object, np.ndarray, np.ndarray, tuple[Buffer, Buffer]]


@pytest.fixture(scope="module")
def cpu_runs(files: Files) -> CpuRuns:
    """Loads every checkpoint layer into CpuLayers, compiles it once and runs it for M in
    {1, 5, 33} (the K/V and expert inputs are the same in each run; the last run's kept)."""
    ckpt = Checkpoint(files.paths)
    model = CpuLayers()
    state = {}
    for i, (case, layer) in enumerate(zip(INT4_CASES, model.int4.layers, strict=True)):
        state.update(int4_linear_state(ckpt, case.prefix, layer, quant_config=case.config,
                                       state_prefix=f"int4.layers.{i}."))
    kv_state = kv_projection_state(ckpt, "model.layers.0.self_attn.k_proj",
                                   "model.layers.0.self_attn.v_proj", model.kv)
    state |= {f"kv.{k}": v for k, v in kv_state.items()}
    state |= grouped_linear_state(ckpt, MOE, model.experts.gate_up,
                                  state_prefix="experts.gate_up.")
    state |= grouped_linear_state(ckpt, MOE, model.experts.down, state_prefix="experts.down.")
    model.load_state_dict(state)
    compiled = graph_pool.model(POOL_KEY, model)
    shape = model.kv.kv_params.shape_per_block

    rng = np.random.default_rng(9)
    lengths, cached = KV_LENGTHS, KV_CACHED
    tokens = sum(lengths)
    kv_x = (rng.standard_normal((tokens, 320)) * 2).astype(BF16)
    kv_lut = rng.permutation(PAGES).reshape(3, 3)[:2].astype(np.uint32)
    arena = rng.integers(0, 0x3F00, size=(PAGES, *shape), dtype=np.uint16)  # finite bf16 bits
    rng = np.random.default_rng(5)
    e_tokens = 37
    grouping = group_tokens_by_expert(rng.integers(0, E, size=e_tokens), E)
    e_x = rng.standard_normal((e_tokens, HIDDEN)).astype(BF16)
    e_h = rng.standard_normal((e_tokens, INTER)).astype(BF16)

    rng = np.random.default_rng(11)
    int4_runs = []
    for m in (1, 5, 33):
        xs = [rng.standard_normal((m, c.k)).astype(numpy_dtype(c.dtype)) for c in INT4_CASES]
        cache = Buffer.from_numpy(arena.copy()).view(DType.bfloat16)
        outs = compiled.execute(
            *[to_buffer(x, c.dtype) for x, c in zip(xs, INT4_CASES, strict=True)],
            Buffer.from_numpy(np.array([0, lengths[0], tokens], np.uint32)),
            to_buffer(kv_x, DType.bfloat16),
            cache, Buffer.from_numpy(np.array([-1], np.int64)),
            Buffer.from_numpy(np.array(cached, np.uint32)), Buffer.from_numpy(kv_lut),
            Buffer.from_numpy(np.array([max(lengths)], np.uint32)),
            Buffer.from_numpy(np.array([max(c + n for c, n in zip(cached, lengths, strict=True))],
                                       np.uint32)),
            to_buffer(e_x, DType.bfloat16), to_buffer(e_h, DType.bfloat16),
            *[to_buffer(a, d) for a, d in ((grouping.a_offsets, DType.uint32),
                                           (grouping.expert_ids, DType.int32),
                                           (grouping.expert_usage_stats, DType.uint32))])
        int4_runs.append((m, xs, list(outs[:len(INT4_CASES)])))
    return CpuRuns(int4_runs, (kv_x, kv_lut, arena, cache), (grouping, e_x, e_h, tuple(outs[-4:])))


def test_grouped_linear_experts_cpu(files: Files, cpu_runs: CpuRuns) -> None:
    """Mixed-format experts → gate/up (SwiGLU) and down banks, run through grouped_matmul."""
    grouping, x, h, outs = cpu_runs.experts
    tokens = x.shape[0]
    got_gu, got_down = (to_numpy(o).astype(np.float64) for o in outs[:2])
    expert_of_row = np.empty(tokens, np.int64)
    for g, e in enumerate(grouping.expert_ids):
        expert_of_row[grouping.a_offsets[g]:grouping.a_offsets[g + 1]] = e
    w = {p: ref.astype(BF16).astype(np.float64) for p, ref in files.experts.items()}
    x64, h64 = x.astype(np.float64), h.astype(np.float64)
    gate = np.einsum("tk,tnk->tn", x64, w["gate_proj"][expert_of_row])
    up = np.einsum("tk,tnk->tn", x64, w["up_proj"][expert_of_row])
    ref_gu = gate / (1 + np.exp(-gate)) * up
    ref_down = np.einsum("tk,tnk->tn", h64, w["down_proj"][expert_of_row])
    assert rel_err(got_gu, ref_gu) <= TOL
    assert rel_err(got_down, ref_down) <= TOL


def test_grouped_linear_tensor_parallel_shards_cpu(cpu_runs: CpuRuns) -> None:
    """GroupedLinear's TP shards (ShardingStrategy.axiswise): the column-parallel gate/up
    shards' outputs, concatenated, are the full bank's bit for bit; the row-parallel down
    shards' partial outputs sum to the full bank's (bf16 tolerance)."""
    outs = cpu_runs.experts[3]
    gu, down, gu_tp, down_tp = (to_numpy(o).astype(np.float64) for o in outs)
    np.testing.assert_array_equal(gu_tp, gu)
    assert rel_err(down_tp, down) <= TOL


def test_grouped_linear_sharding_rejects() -> None:
    bank = GroupedLinear(E, HIDDEN, INTER, swiglu=True)
    with pytest.raises(ValueError, match=r"expected ShardingStrategy\.axiswise\(1, n\)"):
        bank.sharding_strategy = ShardingStrategy.rowwise(TP)
    with pytest.raises(ValueError, match="row parallel"):
        bank.sharding_strategy = ShardingStrategy.axiswise(2, TP)
    with pytest.raises(ValueError, match="needs out_features to be a multiple of 24, got 32"):
        bank.sharding_strategy = ShardingStrategy.axiswise(1, 3)
    with pytest.raises(ValueError, match="sharding_strategy must be set first"):
        GroupedLinear(E, INTER, HIDDEN).shard([DeviceRef.CPU()] * TP)


def test_moe_block_state(files: Files) -> None:
    """MoEBlock's router, gate/up (interleaved) and down banks: the checkpoint formulas'
    weights rounded to bf16, loadable into the block."""
    ckpt = Checkpoint(files.paths)
    block = MoEBlock(HIDDEN, INTER, E, 2)
    state = moe_block_state(ckpt, MOE, block, state_prefix="")
    assert sorted(state) == ["down.weight", "gate_up.weight", "router_weight"]
    block.load_state_dict(state)

    def bf16(a: np.ndarray) -> np.ndarray:
        return a.astype(BF16).astype(np.float32)

    ref = files.experts
    assert np.array_equal(to_numpy(state["router_weight"]), bf16(ref["router"]))
    assert np.array_equal(to_numpy(state["down.weight"]), bf16(ref["down_proj"]))
    gate_up = to_numpy(state["gate_up.weight"]).reshape(E, INTER // 8, 2, 8, HIDDEN)
    assert np.array_equal(gate_up[:, :, 0].reshape(E, INTER, HIDDEN), bf16(ref["gate_proj"]))
    assert np.array_equal(gate_up[:, :, 1].reshape(E, INTER, HIDDEN), bf16(ref["up_proj"]))
    with pytest.raises(CheckpointError, match=r"mlp\.gate: expected a \[3, 32\] router weight"):
        moe_block_state(ckpt, MOE, MoEBlock(32, INTER, E, 2))


# --------------------------------------------------------------------------------------------
# errors


def write(tmp_path: Path, tensors: dict[str, np.ndarray], name: str = "m.safetensors") -> Path:
    path = tmp_path / name
    save_file(tensors, str(path))
    return path


def gptq_tensors(prefix: str = "l", **override: np.ndarray) -> dict[str, np.ndarray]:
    ck = make_gptq(16, 64, 32, sym=False, act_order=False, seed=3)
    tensors = {f"{prefix}.qweight": ck.qweight, f"{prefix}.qzeros": ck.qzeros,
               f"{prefix}.scales": ck.scales}
    tensors.update({f"{prefix}.{k}": v for k, v in override.items()})
    return tensors


def test_missing_companion_tensor(tmp_path: Path) -> None:
    tensors = gptq_tensors()
    del tensors["l.qzeros"]
    ckpt = Checkpoint(write(tmp_path, tensors))
    with pytest.raises(CheckpointError, match=r"l\.qzeros: tensor missing"):
        read_int4(ckpt, "l")


def test_unknown_prefix(tmp_path: Path) -> None:
    ckpt = Checkpoint(write(tmp_path, gptq_tensors()))
    with pytest.raises(CheckpointError, match=r"nope: no linear weight.*nope\.qweight"):
        read_int4(ckpt, "nope")


def test_wrong_dtype_named(tmp_path: Path) -> None:
    ck = make_gptq(16, 64, 32, sym=False, act_order=False, seed=3)
    ckpt = Checkpoint(write(tmp_path, gptq_tensors(scales=ck.scales.astype(np.int32))))
    with pytest.raises(CheckpointError, match=r"l\.scales: expected dtype BF16 or F16 or F32, "
                                              r"got I32"):
        read_int4(ckpt, "l")


def test_wrong_shape_named(tmp_path: Path) -> None:
    ck = make_gptq(16, 64, 32, sym=False, act_order=False, seed=3)
    ckpt = Checkpoint(write(tmp_path, gptq_tensors(qzeros=ck.qzeros[:1])))
    with pytest.raises(CheckpointError, match=r"l\.qzeros: expected shape \[2, 2\], got \[1, 2\]"):
        read_int4(ckpt, "l")


def test_qweight_fits_no_format(tmp_path: Path) -> None:
    ck = make_gptq(16, 64, 32, sym=False, act_order=False, seed=3)
    ckpt = Checkpoint(write(tmp_path, gptq_tensors(qweight=ck.qweight[:, :8].copy())))
    with pytest.raises(CheckpointError, match=r"l\.qweight: expected \[K/8, 16\] \(GPTQ\) or "
                                              r"\[K, 2\] \(AWQ\).*got \[8, 8\]"):
        detect_format(ckpt, "l")


def test_bad_g_idx_named(tmp_path: Path) -> None:
    g_idx = np.zeros(64, np.int32)  # every row in group 0: not a valid act-order grouping
    ckpt = Checkpoint(write(tmp_path, gptq_tensors(g_idx=g_idx)))
    with pytest.raises(CheckpointError, match=r"^l: g_idx: expected every group"):
        read_int4(ckpt, "l")


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"quant_method": "awq"}, r"l\.qweight: quant_method 'awq' expects the AWQ layout"),
        ({"bits": 8}, r"quant_config: expected bits 4, got 8"),
        ({"group_size": 64}, r"l\.scales: expected 1 rows \(K = 64, group_size 64\), got 2"),
        ({"group_size": 48}, r"l\.qweight: expected K a multiple of the config's group_size 48"),
        ({"quant_method": "awq", "version": "gemv"}, r"expected AWQ version 'gemm'"),
    ],
)
def test_bad_config(tmp_path: Path, config: dict, match: str) -> None:
    ckpt = Checkpoint(write(tmp_path, gptq_tensors()))
    with pytest.raises(ValueError, match=match):
        read_int4(ckpt, "l", config)


def test_layer_mismatch(tmp_path: Path) -> None:
    tensors = gptq_tensors(bias=np.ones(16, np.float16))
    ckpt = Checkpoint(write(tmp_path, tensors))
    with pytest.raises(CheckpointError, match=r"l\.bias: present, but the layer has no bias"):
        int4_linear_state(ckpt, "l", Int4Linear(64, 16, group_size=32, symmetric=False))
    with pytest.raises(CheckpointError, match=r"^l: Int4Linear: weight .* must be"):
        int4_linear_state(ckpt, "l", Int4Linear(64, 16, group_size=32, has_bias=True))
    del tensors["l.bias"]
    ckpt = Checkpoint(write(tmp_path, tensors, "nobias.safetensors"))
    with pytest.raises(CheckpointError, match=r"l\.bias: tensor missing"):
        int4_linear_state(ckpt, "l", Int4Linear(64, 16, group_size=32, symmetric=False,
                                                has_bias=True))


def test_fp8_errors(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    w8, s = fp8_checkpoint(rng, 128, 130)
    layer = kv_layer(2, 130)
    ckpt = Checkpoint(write(tmp_path, {"k.weight": w8, "k.weight_scale_inv": s[:, :1],
                                       "v.weight": w8}))
    with pytest.raises(CheckpointError,
                       match=r"k\.weight_scale_inv: expected shape \[1, 2\], got \[1, 1\]"):
        kv_projection_state(ckpt, "k", "v", layer)
    with pytest.raises(CheckpointError, match=r"v\.weight_scale_inv: tensor missing"):
        detect_format(ckpt, "v")
    ckpt = Checkpoint(write(tmp_path, {"k.weight": w8, "k.weight_scale_inv": s,
                                       "v.weight": w8[:, :128].astype(np.float32)}, "b.st"))
    with pytest.raises(CheckpointError, match=r"v\.weight: expected \[128, 130\] \(N = "
                                              r"n_kv_heads · head_dim, hidden\) for the layer, "
                                              r"got \[128, 128\]"):
        kv_projection_state(ckpt, "k", "v", layer)
    with pytest.raises(CheckpointError, match=r"k\.weight: expected \[128, 64\].*got \[128, 130\]"):
        kv_projection_state(ckpt, "k", "v", kv_layer(2, 64))
    s64 = np.ones((2, 3), np.float32)  # a 64 x 64-block checkpoint: the layer needs 128 x 128
    ckpt = Checkpoint(write(tmp_path, {"k.weight": w8, "k.weight_scale_inv": s64}, "d.st"))
    with pytest.raises(CheckpointError, match=r"k\.weight_scale_inv: expected \(128, 128\) "
                                              r"blocks, got \(64, 64\)"):
        kv_projection_state(ckpt, "k", "k", layer, quant_config={
            "quant_method": "fp8", "weight_block_size": [64, 64]})
    ckpt = Checkpoint(write(tmp_path, {"k.weight": np.ones((8, 8), np.int32)}, "c.st"))
    with pytest.raises(CheckpointError, match=r"k\.weight: expected dtype F8_E4M3 or BF16"):
        detect_format(ckpt, "k")


def test_expert_errors(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    tensors = {f"m.experts.{e}.down_proj.weight": rng.standard_normal((16, 8)).astype(BF16)
               for e in (0, 2)}
    ckpt = Checkpoint(write(tmp_path, tensors))
    with pytest.raises(CheckpointError, match=r"m\.experts\.1: expert missing"):
        grouped_linear_state(ckpt, "m", GroupedLinear(3, 8, 16))
    tensors["m.experts.1.down_proj.weight"] = rng.standard_normal((16, 16)).astype(BF16)
    ckpt = Checkpoint(write(tmp_path, tensors, "b.st"))
    with pytest.raises(CheckpointError, match=r"m\.experts\.1\.down_proj: expected the shape of "
                                              r"expert 0 \[16, 8\], got \[16, 16\]"):
        grouped_linear_state(ckpt, "m", GroupedLinear(3, 8, 16))
    with pytest.raises(CheckpointError, match=r"m\.experts\.0\.gate_proj: no linear weight"):
        grouped_linear_state(ckpt, "m", GroupedLinear(3, 8, 16, swiglu=True))
    with pytest.raises(ValueError, match=r"projections: expected 2 name"):
        grouped_linear_state(ckpt, "m", GroupedLinear(3, 8, 16, swiglu=True),
                             projections=("down_proj",))


def test_duplicate_tensor_across_files(tmp_path: Path) -> None:
    a = write(tmp_path, gptq_tensors(), "a.safetensors")
    b = write(tmp_path, gptq_tensors(), "b.safetensors")
    with pytest.raises(CheckpointError, match=r"l\.qweight: stored twice"):
        Checkpoint([a, b])

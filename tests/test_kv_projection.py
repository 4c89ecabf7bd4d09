"""`PagedKVProjection` in a MAX graph vs float64, writing MAX's own paged KV cache.

One graph per device holds three layers with symbolic T and B: two bf16 layers (hidden 256,
cache layers 0 and 2 of one bf16 cache) reading one x, and a float16 layer (hidden 200: a
partial scale block) writing layer 1 of an fp8 cache. Weights are deterministic random floats
quantized by `state_from_float`. Each batch poisons both cache arenas and checks that exactly the
K and V slots of the layers' tokens changed (K half from the K op, V half from the V op), and that
each holds the float64 product of the host-quantized activations (`quantize_fp8_input`, which
the in-graph quantizer matches bit for bit) and the dequantized weights, within rel. Frobenius
error 2e-2 (fp8 cache: of its e4m3 rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import graph_pool
import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer, Device
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import BufferType, DeviceRef, Graph, ShardingStrategy, TensorType, TensorValue
from max.graph import Module as GraphModule
from max.nn import Module
from max.nn.kv_cache import MHAKVCacheParams, PagedCacheValues
from max.nn.kv_cache.cache_params import contiguous_page_view_and_stride
from test_k_cache import BATCHES, PAGE, Batch, decode_storage, make_lut, reference

from mojo_gemm.core.host import numpy_dtype, to_buffer
from mojo_gemm.fp8.quant import quantize_fp8_blockwise, quantize_fp8_input, to_e4m3
from mojo_gemm.k_cache.layer import PagedKVProjection
from mojo_gemm.k_cache.op import fp8_dtype_for

TOL = 2e-2


@dataclass(frozen=True)
class Cache:
    name: str
    dtype: DType
    heads: int
    head_dim: int
    layers: int
    pages: int = 41

    @property
    def n(self) -> int:
        return self.heads * self.head_dim

    def params(self, device: DeviceRef) -> MHAKVCacheParams:
        return MHAKVCacheParams(dtype=self.dtype, n_kv_heads=self.heads, head_dim=self.head_dim,
                                num_layers=self.layers, page_size=PAGE, devices=[device])

    @property
    def storage(self) -> np.dtype:
        return np.dtype(np.uint16 if self.dtype == DType.bfloat16 else np.uint8)


@dataclass(frozen=True)
class LayerSpec:
    attr: str
    cache: str
    layer: int
    x: int  # which x input
    seed: int


CACHES = {
    "bf16": Cache("bf16", DType.bfloat16, heads=2, head_dim=64, layers=3),
    "fp8": Cache("fp8", DType.float8_e4m3fn, heads=4, head_dim=32, layers=2),
}
XS = ((DType.bfloat16, 256), (DType.float16, 200))
LAYERS = (
    LayerSpec("a", "bf16", layer=0, x=0, seed=11),
    LayerSpec("b", "bf16", layer=2, x=0, seed=12),
    LayerSpec("c", "fp8", layer=1, x=1, seed=13),
)


def float_weights(spec: LayerSpec) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic random K and V weights [N, hidden] of a layer."""
    c = CACHES[spec.cache]
    rng = np.random.default_rng(spec.seed)
    hidden = XS[spec.x][1]
    scale = rng.uniform(0.01, 0.1, (c.n, 1))
    return (rng.standard_normal((c.n, hidden)) * scale, rng.standard_normal((c.n, hidden)) * scale)


class Model3(Module):
    """The three layers of LAYERS as attributes a, b, c."""

    def __init__(self, dref: DeviceRef) -> None:
        super().__init__()
        for spec in LAYERS:
            dtype, hidden = XS[spec.x]
            setattr(self, spec.attr, PagedKVProjection(
                CACHES[spec.cache].params(dref), hidden, spec.layer, dtype=dtype, device=dref))

    def __call__(
        self, offsets: TensorValue, xs: list[TensorValue], colls: dict[str, PagedCacheValues]
    ) -> None:
        for spec in LAYERS:
            getattr(self, spec.attr)(xs[spec.x], offsets, colls[spec.cache])


def build_graph(device_kind: str, module: GraphModule | None = None
                ) -> tuple[Graph, dict[str, Any]]:
    """Model3 with its float weights loaded, in one graph (built into `module` if given), and
    its weights (named `kv_projection.*`)."""
    dref = DeviceRef.CPU() if device_kind == "cpu" else DeviceRef.GPU()
    model = Model3(dref)
    state = {}
    for spec in LAYERS:
        layer = getattr(model, spec.attr)
        for k, v in layer.state_from_float(*float_weights(spec)).items():
            state[f"{spec.attr}.{k}"] = v
    model.load_state_dict(state)
    weights = graph_pool.prefixed_weights("kv_projection", model)
    types: list[TensorType | BufferType] = [TensorType(DType.uint32, ["B1"], dref)]
    types += [TensorType(dt, ["T", h], dref) for dt, h in XS]
    for c in CACHES.values():
        p = c.params(dref)
        bdt = fp8_dtype_for(dref) if c.dtype == DType.float8_e4m3fn else c.dtype
        types += [
            BufferType(bdt, [f"pages_{c.name}", *p.shape_per_block], dref),
            TensorType(DType.int64, [1], DeviceRef.CPU()),
            TensorType(DType.uint32, ["B"], dref),
            TensorType(DType.uint32, ["B", f"cols_{c.name}"], dref),
            TensorType(DType.uint32, [1], DeviceRef.CPU()),
            TensorType(DType.uint32, [1], DeviceRef.CPU()),
        ]
    with Graph(f"kv_projection_{device_kind}", input_types=types, module=module) as g:
        it = iter(g.inputs)
        offsets = next(it).tensor
        xs = [next(it).tensor for _ in XS]
        colls = {}
        for c in CACHES.values():
            blocks, stride, lens, lut, mp, mc = (next(it) for _ in range(6))
            colls[c.name] = PagedCacheValues(
                kv_blocks=blocks.buffer, cache_lengths=lens.tensor, lookup_table=lut.tensor,
                max_prompt_length=mp.tensor, max_cache_length=mc.tensor,
                page_stride=stride.tensor,
            )
        model(offsets, xs, colls)
        g.output()
    return g, weights


graph_pool.register("kv_projection", lambda module: build_graph("cpu", module))


@cache
def compiled(device_kind: str) -> tuple[Model, Device]:
    """`build_graph` compiled for `device_kind` (the CPU one comes from the suite's pool)."""
    if device_kind == "cpu":
        return graph_pool.model("kv_projection"), CPU()
    dev = Accelerator()
    g, weights = build_graph(device_kind)
    return InferenceSession(devices=[CPU(), dev]).load(g, weights_registry=weights), dev


def run(device_kind: str, batch: Batch, seed: int) -> None:
    model, dev = compiled(device_kind)
    dref = DeviceRef.CPU() if device_kind == "cpu" else DeviceRef.GPU()
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(batch.lengths)]).astype(np.uint32)
    t_total = int(offsets[-1]) + batch.extra_rows
    cache_lengths = np.array(batch.cache_lengths, np.uint32)
    max_cache = int((cache_lengths + np.array(batch.lengths, np.uint32)).max(initial=0))
    xs = [
        (rng.standard_normal((t_total, h)) * rng.uniform(0.2, 3.0, (t_total, 1)))
        .astype(numpy_dtype(dt)).astype(np.float64)
        for dt, h in XS
    ]
    inputs: list[Buffer] = [Buffer.from_numpy(offsets).to(dev)]
    inputs += [to_buffer(x, dt).to(dev) for x, (dt, _) in zip(xs, XS, strict=True)]
    state = {}
    for c in CACHES.values():
        page_elems = 2 * c.layers * PAGE * c.n
        arena = rng.integers(0, np.iinfo(c.storage).max, size=c.pages * page_elems,
                             dtype=c.storage)
        slab = Buffer.from_numpy(arena.view(np.uint8).copy()).to(dev)
        bdt = fp8_dtype_for(dref) if c.dtype == DType.float8_e4m3fn else c.dtype
        blocks, stride = contiguous_page_view_and_stride(slab, c.params(dref).shape_per_block, bdt)
        lut = make_lut(batch, c.pages, rng)
        state[c.name] = (arena, slab, lut)
        inputs += [
            blocks,
            Buffer.from_numpy(np.array([stride], np.int64)),
            Buffer.from_numpy(cache_lengths).to(dev),
            Buffer.from_numpy(lut).to(dev),
            Buffer.from_numpy(np.array([max(batch.lengths, default=0)], np.uint32)),
            Buffer.from_numpy(np.array([max_cache], np.uint32)),
        ]
    model.execute(*inputs)

    for c in CACHES.values():
        arena, slab, lut = state[c.name]
        got = slab.to(CPU()).to_numpy().view(arena.dtype)
        want_mask = np.zeros(got.shape, bool)
        page_elems = 2 * c.layers * PAGE * c.n
        for spec in (s for s in LAYERS if s.cache == c.name):
            a_q, a_s = quantize_fp8_input(xs[spec.x], 1, 128)
            for half, w in enumerate(float_weights(spec)):
                w_q = quantize_fp8_blockwise(w, (128, 128))
                ref = reference(a_q, w_q.data, a_s, w_q.scales, (1, 128, 128))
                if c.dtype == DType.float8_e4m3fn:
                    ref = to_e4m3(ref).astype(np.float64)
                vals, refs = [], []
                for b, n_tok in enumerate(batch.lengths):
                    for i in range(n_tok):
                        pos = int(cache_lengths[b]) + i
                        col = pos // PAGE
                        if col >= lut.shape[1] or lut[b, col] >= c.pages:
                            continue
                        slot = (half * c.layers + spec.layer) * PAGE + pos % PAGE
                        base = int(lut[b, col]) * page_elems + slot * c.n
                        want_mask[base : base + c.n] = True
                        vals.append(decode_storage(got[base : base + c.n], c.dtype))
                        refs.append(ref[int(offsets[b]) + i])
                if refs:
                    v, r = np.array(vals), np.array(refs)
                    err = np.linalg.norm(v - r) / np.linalg.norm(r)
                    assert err <= TOL, f"{spec.attr} {'KV'[half]}: rel. error {err:.3g} > {TOL}"
        changed = got != arena
        stray = changed & ~want_mask
        assert not stray.any(), f"{c.name}: {int(stray.sum())} elements changed outside the slots"
        if want_mask.any():
            assert changed[want_mask].mean() > 0.9, f"{c.name}: target slots not written"


CASES = ("prefill_ragged", "decode", "prefill_long", "empty", "no_sequence",
         "rows_without_sequence")


@pytest.mark.parametrize("batch", CASES)
def test_kv_projection_cpu(batch: str) -> None:
    run("cpu", BATCHES[batch], seed=CASES.index(batch))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", CASES)
def test_kv_projection_gpu(batch: str) -> None:
    run("gpu", BATCHES[batch], seed=CASES.index(batch))


# ------------------------------------------------------------------------ bad configuration
_P = CACHES["bf16"].params(DeviceRef.CPU())
BAD_INIT = [
    ("kv_params type", {"kv_params": "bf16"}, TypeError, "kv_params must be .*KVCacheParams"),
    (
        "cache dtype",
        {"kv_params": MHAKVCacheParams(dtype=DType.float16, n_kv_heads=2, head_dim=64,
                                       num_layers=3, page_size=PAGE, devices=[DeviceRef.CPU()])},
        TypeError,
        "'kv_params'.*bfloat16 or float8",
    ),
    ("hidden_size", {"hidden_size": 0}, ValueError, "'hidden_size'.*positive"),
    ("layer_idx", {"layer_idx": 3}, ValueError, r"'layer_idx'.*\[0, 3\)"),
    ("dtype", {"dtype": DType.int8}, TypeError, "'dtype'.*bfloat16, float16 or float32"),
    ("block", {"block": -128}, ValueError, "'block'.*positive"),
]


@pytest.mark.parametrize(("case", "over", "error", "match"), BAD_INIT,
                         ids=[b[0] for b in BAD_INIT])
def test_bad_configuration_raises(case: str, over: dict, error: type, match: str) -> None:
    kw = {"kv_params": _P, "hidden_size": 256, "layer_idx": 0, **over}
    with pytest.raises(error, match=match):
        PagedKVProjection(kw.pop("kv_params"), kw.pop("hidden_size"), kw.pop("layer_idx"), **kw)


def _call(x_type: TensorType) -> None:
    layer = PagedKVProjection(_P, 256, 0)
    p = _P
    cpu = DeviceRef.CPU()
    types = [
        x_type,
        TensorType(DType.uint32, ["B1"], cpu),
        BufferType(DType.bfloat16, ["pages", *p.shape_per_block], cpu),
        TensorType(DType.int64, [1], cpu),
        TensorType(DType.uint32, ["B"], cpu),
        TensorType(DType.uint32, ["B", "cols"], cpu),
        TensorType(DType.uint32, [1], cpu),
        TensorType(DType.uint32, [1], cpu),
    ]
    with Graph("kv_projection_contract", input_types=types) as g:
        x, off, blocks, stride, lens, lut, mp, mc = g.inputs
        coll = PagedCacheValues(kv_blocks=blocks.buffer, cache_lengths=lens.tensor,
                                lookup_table=lut.tensor, max_prompt_length=mp.tensor,
                                max_cache_length=mc.tensor, page_stride=stride.tensor)
        layer(x.tensor, off.tensor, coll)


def test_valid_call_builds() -> None:
    _call(TensorType(DType.bfloat16, ["T", 256], DeviceRef.CPU()))


BAD_CALL = [
    ("x dtype", TensorType(DType.float16, ["T", 256], DeviceRef.CPU()), TypeError,
     r"'x'.*bfloat16 \(the layer's dtype\)"),
    ("hidden mismatch", TensorType(DType.bfloat16, ["T", 128], DeviceRef.CPU()), ValueError,
     r"'x'.*hidden_size.*\[T, 256\]"),
    ("x rank", TensorType(DType.bfloat16, [256], DeviceRef.CPU()), ValueError, "'x'.*rank 2"),
    ("x device", TensorType(DType.bfloat16, ["T", 256], DeviceRef.GPU()), ValueError,
     "'x'.*layer's device"),
]


@pytest.mark.parametrize(("case", "x_type", "error", "match"), BAD_CALL,
                         ids=[b[0] for b in BAD_CALL])
def test_bad_call_raises(case: str, x_type: TensorType, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _call(x_type)


def test_state_from_float_checks_shapes() -> None:
    """N != n_kv_heads · head_dim or a hidden size mismatch names the weight."""
    layer = PagedKVProjection(_P, 256, 0)
    good = np.ones((128, 256))
    with pytest.raises(ValueError, match=r"k_weight.*\[128, 256\].*got \[96, 256\]"):
        layer.state_from_float(np.ones((96, 256)), good)
    with pytest.raises(ValueError, match=r"v_weight.*\[128, 256\].*got \[128, 200\]"):
        layer.state_from_float(good, np.ones((128, 200)))
    with pytest.raises(ValueError, match=r"k_weight \(shape, block\)"):
        layer.fp8_state(quantize_fp8_blockwise(good, (64, 128)),
                        quantize_fp8_blockwise(good, (128, 128)))


def test_state_matches_weights() -> None:
    """The state dict has the layer's weight names, dtypes and shapes (uint8 on CPU)."""
    layer = PagedKVProjection(_P, 256, 1)
    state = layer.state_from_float(*float_weights(LAYERS[0]))
    assert set(state) == {"k_weight", "k_weight_scale", "v_weight", "v_weight_scale"}
    assert state["k_weight"].dtype == DType.uint8 and state["k_weight"].shape == (128, 256)
    assert state["v_weight_scale"].dtype == DType.float32
    assert state["v_weight_scale"].shape == (1, 2)
    gpu_layer = PagedKVProjection(_P, 256, 1, device=DeviceRef.GPU())
    gpu_state = gpu_layer.state_from_float(*float_weights(LAYERS[0]))
    assert gpu_state["v_weight"].dtype == DType.float8_e4m3fn
    layer.load_state_dict(state)


# ------------------------------------------------------------------------ head-parallel shards
SHARD_HEADS, SHARD_HEAD_DIM, SHARD_HIDDEN, SHARD_PAGES = 4, 64, 256, 12
SHARD_N = 2


class HeadShards(Module):
    """A bf16-cache layer of SHARD_HEADS heads and its SHARD_N head shards (all on one device):
    the full layer writes cache `full`, shard i cache `parts[i]` (SHARD_HEADS / SHARD_N heads)."""

    def __init__(self, device: DeviceRef) -> None:
        super().__init__()
        self.device = device
        self.full = PagedKVProjection(self.params(SHARD_HEADS, device), SHARD_HIDDEN, 1,
                                      device=device)
        self.full.sharding_strategy = ShardingStrategy.rowwise(SHARD_N)

    @staticmethod
    def params(heads: int, device: DeviceRef) -> MHAKVCacheParams:
        return MHAKVCacheParams(dtype=DType.bfloat16, n_kv_heads=heads,
                                head_dim=SHARD_HEAD_DIM, num_layers=2, page_size=PAGE,
                                devices=[device])

    def __call__(self, x: TensorValue, offsets: TensorValue,
                 colls: list[PagedCacheValues]) -> None:
        self.full(x, offsets, colls[0])
        for shard, coll in zip(self.full.shard([self.device] * SHARD_N), colls[1:],
                               strict=True):
            shard(x, offsets, coll)


SHARDS_KEY = "kv_projection_head_shards"
SHARD_LAYERS = [SHARD_HEADS] + [SHARD_HEADS // SHARD_N] * SHARD_N
"""KV heads of the full layer, then of each shard."""


def head_shards_graph(dref: DeviceRef, model: HeadShards, module: GraphModule | None = None
                      ) -> Graph:
    """`model` (the full layer and its shards) writing one cache each, in one graph."""
    cpu = DeviceRef.CPU()
    types: list[TensorType | BufferType] = [
        TensorType(DType.bfloat16, ["T", SHARD_HIDDEN], dref),
        TensorType(DType.uint32, ["B1"], dref), TensorType(DType.int64, [1], cpu),
        TensorType(DType.uint32, ["B"], dref), TensorType(DType.uint32, ["B", "cols"], dref),
        TensorType(DType.uint32, [1], cpu), TensorType(DType.uint32, [1], cpu),
    ]
    types += [BufferType(DType.bfloat16,
                         [f"pages{i}", *HeadShards.params(h, dref).shape_per_block], dref)
              for i, h in enumerate(SHARD_LAYERS)]
    with Graph(SHARDS_KEY, input_types=types, module=module) as g:
        x, offsets, stride, lens, lut, mp, mc, *blocks = g.inputs
        model(x.tensor, offsets.tensor, [
            PagedCacheValues(kv_blocks=b.buffer, cache_lengths=lens.tensor,
                             lookup_table=lut.tensor, max_prompt_length=mp.tensor,
                             max_cache_length=mc.tensor, page_stride=stride.tensor)
            for b in blocks])
        g.output()
    return g


def _pooled_head_shards(module: GraphModule) -> graph_pool.Built:
    model = HeadShards(DeviceRef.CPU())
    weights = graph_pool.prefixed_weights(SHARDS_KEY, model)
    return head_shards_graph(DeviceRef.CPU(), model, module), weights


graph_pool.register(SHARDS_KEY, _pooled_head_shards)


def run_head_shards(device_kind: str) -> None:
    """Shard i's cache equals heads [i H/n, (i+1) H/n) of the full layer's cache, bit for bit
    (written slots and untouched poison alike); every shard on the same device (the one-device
    path of a multi-device model)."""
    rng = np.random.default_rng(12)
    dref = DeviceRef.CPU() if device_kind == "cpu" else DeviceRef.GPU()
    dev: Device = CPU() if device_kind == "cpu" else Accelerator()
    model = HeadShards(dref)
    n = SHARD_HEADS * SHARD_HEAD_DIM
    model.load_state_dict({f"full.{k}": v for k, v in model.full.state_from_float(
        rng.standard_normal((n, SHARD_HIDDEN)) * 0.05,
        rng.standard_normal((n, SHARD_HIDDEN)) * 0.05).items()})
    if device_kind == "cpu":
        compiled = graph_pool.model(SHARDS_KEY, model)
    else:
        session = InferenceSession(devices=[CPU(), dev])
        compiled = session.load(head_shards_graph(dref, model),
                                weights_registry=model.state_dict())
    batch = BATCHES["prefill_ragged"]
    offs = np.concatenate([[0], np.cumsum(batch.lengths)]).astype(np.uint32)
    lengths = np.array(batch.cache_lengths, np.uint32)
    lut_np = make_lut(batch, SHARD_PAGES, rng)
    shape = (SHARD_PAGES, 2, 2, PAGE, SHARD_HEADS, SHARD_HEAD_DIM)
    full = rng.integers(0, 0x3F00, size=shape, dtype=np.uint16)  # finite bf16 bits
    h = SHARD_HEADS // SHARD_N
    arenas = [full.copy()] + [full[..., i * h:(i + 1) * h, :].copy() for i in range(SHARD_N)]
    raw = [Buffer.from_numpy(a).to(dev) for a in arenas]
    compiled.execute(
        to_buffer(rng.standard_normal((int(offs[-1]), SHARD_HIDDEN)), DType.bfloat16).to(dev),
        Buffer.from_numpy(offs).to(dev), Buffer.from_numpy(np.array([-1], np.int64)),
        Buffer.from_numpy(lengths).to(dev), Buffer.from_numpy(lut_np).to(dev),
        Buffer.from_numpy(np.array([max(batch.lengths)], np.uint32)),
        Buffer.from_numpy(np.array([int((lengths + np.array(batch.lengths)).max())], np.uint32)),
        *(r.view(DType.bfloat16) for r in raw))
    got = [r.to(CPU()).to_numpy() for r in raw]
    assert (got[0] != full).any(), "the full layer wrote nothing"
    for i in range(SHARD_N):
        np.testing.assert_array_equal(got[1 + i], got[0][..., i * h:(i + 1) * h, :],
                                      err_msg=f"{device_kind} shard {i}")


def test_head_shards_write_their_heads_cpu() -> None:
    run_head_shards("cpu")


@pytest.mark.gpu
def test_head_shards_write_their_heads_gpu() -> None:
    run_head_shards("gpu")


def test_head_sharding_rejects() -> None:
    """Another strategy, heads not dividing by n, or shard rows off the scale block raise."""
    layer = PagedKVProjection(HeadShards.params(SHARD_HEADS, DeviceRef.CPU()), SHARD_HIDDEN, 0)
    with pytest.raises(ValueError, match=r"expected ShardingStrategy\.rowwise"):
        layer.sharding_strategy = ShardingStrategy.columnwise(2)
    with pytest.raises(ValueError, match="n_kv_heads = 4, head_dim = 64"):
        layer.sharding_strategy = ShardingStrategy.rowwise(4)  # 64 rows < the 128 block
    with pytest.raises(ValueError, match="sharding_strategy must be set first"):
        layer.shard([DeviceRef.CPU()] * 2)
    with pytest.raises(TypeError, match="strategy"):
        layer.sharding_strategy = 2  # type: ignore[assignment]

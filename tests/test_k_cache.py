"""`k_matmul_ragged_paged_scale`, its V twin `v_matmul_ragged_paged_scale` and the fused
`kv_matmul_ragged_paged_scale` through a MAX graph vs a float64 reference, written into MAX's own
paged KV cache.

One graph per device holds four K op instances (granularities (1,128,128), (2,64,32),
(3,16,96), (128,128,128); a bf16 cache with a padded page_stride and an fp8 cache (uint8 bits
on CPU) with per-head and per-tensor kv_scale; layer_idx as an int and as a uint32 scalar) and
two V op instances (V half of a layer whose K half a K op writes; (1,128,128) on bf16, and
(1,128,64) on fp8 with per-head kv_scale) and three fused K+V instances (a weight per half;
bf16, fp8 with per-head and per-tensor kv_scale [2·heads] / [2]), with symbolic T and B, so
the Mojo ops compile once per device and every batch below runs through the same compiled
model (on GPU the batches
reach the mma.sync, wgmma (T > 128) and SIMT kernels). Each run poisons the whole cache arena
(padding between pages included) and checks that exactly the target slots changed (each op
its own half of its own layer), and that they hold k (or v) within rel. Frobenius error 2e-2
of the float64 product of the dequantized operands (for the fp8 cache: of its e4m3 rounding of
k / kv_scale).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import graph_pool
import ml_dtypes
import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer, Device
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import BufferType, DeviceRef, Graph, TensorType, ops
from max.graph import Module as GraphModule
from max.nn.kv_cache import MHAKVCacheParams, PagedCacheValues
from max.nn.kv_cache.cache_params import contiguous_page_view_and_stride

from mojo_gemm.fp8.quant import (
    E4M3,
    fp8_buffer,
    quantize_fp8_blockwise,
    quantize_fp8_input,
    to_e4m3,
)
from mojo_gemm.k_cache.op import (
    fp8_dtype_for,
    k_matmul_ragged_paged_scale,
    kv_matmul_ragged_paged_scale,
    v_matmul_ragged_paged_scale,
)

PAGE = 16
TOL = 2e-2
BF16_NP = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class CacheSpec:
    name: str
    dtype: DType  # logical cache dtype
    heads: int
    head_dim: int
    layers: int
    pages: int  # pages the graph sees (the last one plays MAX's null page)
    pad_elems: int  # extra elements between pages (0: packed, page_stride = -1)

    @property
    def n(self) -> int:
        return self.heads * self.head_dim

    def params(self, device: DeviceRef) -> MHAKVCacheParams:
        return MHAKVCacheParams(
            dtype=self.dtype,
            n_kv_heads=self.heads,
            head_dim=self.head_dim,
            num_layers=self.layers,
            page_size=PAGE,
            devices=[device],
        )

    def storage_np(self, device: DeviceRef) -> np.dtype:
        if self.dtype == DType.bfloat16:
            return np.dtype(np.uint16)
        return np.dtype(np.uint8)


@dataclass(frozen=True)
class OpSpec:
    name: str
    cache: str
    layer: int
    k: int
    gran: tuple[int, int, int]
    kv_scale: str | None = None  # None | "tensor" | "head"
    half: int = 0  # 0: K (k_matmul_ragged_paged_scale), 1: V (v_matmul_ragged_paged_scale),
    # 2: both (kv_matmul_ragged_paged_scale, a weight per half)

    @property
    def halves(self) -> tuple[int, ...]:
        """The cache halves the op writes, in the order of its weights."""
        return (0, 1) if self.half == 2 else (self.half,)


CACHES = (
    CacheSpec("bf16", DType.bfloat16, heads=2, head_dim=64, layers=3, pages=41, pad_elems=24),
    CacheSpec("fp8", DType.float8_e4m3fn, heads=4, head_dim=32, layers=4, pages=41, pad_elems=0),
)
OPS = (
    OpSpec("bf16_g1x128x128", "bf16", layer=0, k=256, gran=(1, 128, 128)),
    OpSpec("bf16_g2x64x32_kpad", "bf16", layer=2, k=200, gran=(2, 64, 32)),
    OpSpec("fp8_per_head_g3x16x96", "fp8", layer=1, k=160, gran=(3, 16, 96), kv_scale="head"),
    OpSpec("fp8_per_tensor_g128", "fp8", layer=0, k=384, gran=(128, 128, 128), kv_scale="tensor"),
    OpSpec("v_bf16_g1x128x128", "bf16", layer=0, k=256, gran=(1, 128, 128), half=1),
    OpSpec("v_fp8_per_head_g1x128x64", "fp8", layer=1, k=192, gran=(1, 128, 64), kv_scale="head",
           half=1),
    OpSpec("kv_bf16_g1x128x128", "bf16", layer=1, k=256, gran=(1, 128, 128), half=2),
    OpSpec("kv_fp8_per_head_g1x128x128", "fp8", layer=2, k=384, gran=(1, 128, 128),
           kv_scale="head", half=2),
    OpSpec("kv_fp8_per_tensor_g2x64x32", "fp8", layer=3, k=160, gran=(2, 64, 32),
           kv_scale="tensor", half=2),
)
CACHE_BY_NAME = {c.name: c for c in CACHES}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------------- the graph
def build_graph(device_kind: str, module: GraphModule | None = None) -> Graph:
    """One graph with every op of OPS; inputs per cache, then per op (see `run`)."""
    dref = DeviceRef.CPU() if device_kind == "cpu" else DeviceRef.GPU()
    fp8 = fp8_dtype_for(dref)
    types: list[TensorType | BufferType] = [TensorType(DType.uint32, ["B1"], dref)]
    for c in CACHES:
        p = c.params(dref)
        bdt = fp8 if c.dtype == DType.float8_e4m3fn else c.dtype
        types += [
            BufferType(bdt, [f"pages_{c.name}", *p.shape_per_block], dref),
            TensorType(DType.int64, [1], DeviceRef.CPU()),
            TensorType(DType.uint32, ["B"], dref),
            TensorType(DType.uint32, ["B", f"lut_cols_{c.name}"], dref),
            TensorType(DType.uint32, [1], DeviceRef.CPU()),
            TensorType(DType.uint32, [1], DeviceRef.CPU()),
        ]
    for i, op in enumerate(OPS):
        c = CACHE_BY_NAME[op.cache]
        _, gn, gk = op.gran
        n_halves = len(op.halves)
        types += [
            TensorType(fp8, ["T", op.k], dref),
            *[TensorType(fp8, [c.n, op.k], dref)] * n_halves,
            TensorType(DType.float32, [_ceil(op.k, gk), f"ts{i}"], dref),
            *[TensorType(DType.float32, [_ceil(c.n, gn), _ceil(op.k, gk)], dref)] * n_halves,
        ]
        if op.kv_scale is not None:
            per_half = 1 if op.kv_scale == "tensor" else c.heads
            types.append(TensorType(DType.float32, [n_halves * per_half], dref))
    with Graph(f"k_cache_{device_kind}", input_types=types, module=module) as g:
        it = iter(g.inputs)
        offsets = next(it).tensor
        colls = {}
        for c in CACHES:
            blocks, stride, lens, lut, mp, mc = (next(it) for _ in range(6))
            colls[c.name] = PagedCacheValues(
                kv_blocks=blocks.buffer,
                cache_lengths=lens.tensor,
                lookup_table=lut.tensor,
                max_prompt_length=mp.tensor,
                max_cache_length=mc.tensor,
                page_stride=stride.tensor,
            )
        for op in OPS:
            c = CACHE_BY_NAME[op.cache]
            n_halves = len(op.halves)
            hidden = next(it).tensor
            weights = [next(it).tensor for _ in range(n_halves)]
            in_s = next(it).tensor
            w_scales = [next(it).tensor for _ in range(n_halves)]
            kv_scale = next(it).tensor if op.kv_scale is not None else None
            if op.half == 2:
                kv_matmul_ragged_paged_scale(
                    c.params(dref), hidden, offsets, *weights, in_s, *w_scales, colls[c.name],
                    op.gran, op.layer, kv_scale=kv_scale,
                )
                continue
            weight, w_s = weights[0], w_scales[0]
            project = v_matmul_ragged_paged_scale if op.half else k_matmul_ragged_paged_scale
            project(
                c.params(dref),
                hidden,
                offsets,
                weight,
                in_s,
                w_s,
                colls[c.name],
                op.gran,
                # one op takes layer_idx as MAX's own ops do: a uint32 scalar on CPU
                ops.constant(op.layer, DType.uint32, device=DeviceRef.CPU())
                if op.kv_scale == "tensor"
                else op.layer,
                kv_scale=kv_scale,
            )
        g.output()
    return g


graph_pool.register("k_cache", lambda module: (build_graph("cpu", module), {}))


@cache
def compiled(device_kind: str) -> tuple[Model, Device]:
    """`build_graph` compiled for `device_kind` (the CPU one comes from the suite's pool)."""
    if device_kind == "cpu":
        return graph_pool.model("k_cache"), CPU()
    dev = Accelerator()
    return InferenceSession(devices=[CPU(), dev]).load(build_graph(device_kind)), dev


# ------------------------------------------------------------------------------- a batch
@dataclass
class Batch:
    lengths: list[int]
    cache_lengths: list[int]
    lut_overrides: dict[tuple[int, int], int]  # (b, col) -> page id (bad data on purpose)
    lut_cols: int | None = None
    extra_rows: int = 0
    """Hidden rows past input_row_offsets[B]: no sequence owns them, nothing may be written."""


BATCHES = {
    # empty sequences, one-token sequences, page-crossing sequences, non-zero cache lengths
    "prefill_ragged": Batch([3, 0, 1, 40, 7, 0], [5, 0, 15, 30, 0, 9], {}),
    "decode": Batch([1] * 9, [0, 1, 15, 16, 17, 31, 47, 100, 3], {}),
    "single_long": Batch([70], [0], {}),
    "prefill_long": Batch([150, 3], [0, 20], {}),
    "empty": Batch([0, 0], [4, 0], {}),
    # no sequence at all (input_row_offsets = [0]), without and with hidden rows
    "no_sequence": Batch([], [], {}),
    "rows_without_sequence": Batch([], [], {}, extra_rows=3),
    # bad runtime data: page ids past the cache and positions past the lookup table are skipped
    "bad_runtime_data": Batch([5, 20, 4], [14, 0, 62], {(0, 1): 10_000, (1, 1): 41}, lut_cols=4),
}


def make_lut(batch: Batch, pages: int, rng: np.random.Generator) -> np.ndarray:
    """Distinct random physical pages per sequence; unused columns hold the null page."""
    need = [_ceil(c + n, PAGE) for c, n in zip(batch.cache_lengths, batch.lengths, strict=True)]
    cols = batch.lut_cols or max([*need, 1]) + 3
    null = pages - 1
    lut = np.full((len(need), cols), null, np.uint32)
    free = rng.permutation(null)
    used = 0
    for b, k in enumerate(need):
        k = min(k, cols)
        lut[b, :k] = free[used : used + k]
        used += k
    for (b, col), page in batch.lut_overrides.items():
        lut[b, col] = page
    return lut


def poisoned_arena(c: CacheSpec, rng: np.random.Generator) -> np.ndarray:
    page_elems = 2 * c.layers * PAGE * c.n
    total = c.pages * (page_elems + c.pad_elems)
    st = c.storage_np(DeviceRef.CPU())
    return rng.integers(0, np.iinfo(st).max, size=total, dtype=st)


def reference(
    a: np.ndarray, w: np.ndarray, a_s: np.ndarray, w_s: np.ndarray, gran: tuple[int, int, int]
) -> np.ndarray:
    """float64 k[t, n] = Σ_k a·w·input_scale[k//gk, t//gm]·weight_scale[n//gn, k//gk]."""
    gm, gn, gk = gran
    t, k = a.shape
    n = w.shape[0]
    out = np.zeros((t, n))
    af, wf = a.astype(np.float64), w.astype(np.float64)
    for kb in range(_ceil(k, gk)):
        cols = slice(kb * gk, min(k, (kb + 1) * gk))
        sa = a_s[kb, np.arange(t) // gm].astype(np.float64)
        sw = w_s[np.arange(n) // gn, kb].astype(np.float64)
        out += (af[:, cols] * sa[:, None]) @ (wf[:, cols] * sw[:, None]).T
    return out


def decode_storage(bits: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype == DType.bfloat16:
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.view(E4M3).astype(np.float64)


def run(device_kind: str, batch: Batch, seed: int) -> None:
    """Runs every op of OPS on `batch` and checks each cache element by element."""
    model, dev = compiled(device_kind)
    dref = DeviceRef.CPU() if device_kind == "cpu" else DeviceRef.GPU()
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(batch.lengths)]).astype(np.uint32)
    t_total = int(offsets[-1]) + batch.extra_rows
    cache_lengths = np.array(batch.cache_lengths, np.uint32)
    max_cache = int((cache_lengths + np.array(batch.lengths, np.uint32)).max(initial=0))

    def to_dev(x: np.ndarray) -> Buffer:
        return Buffer.from_numpy(np.ascontiguousarray(x)).to(dev)

    inputs: list[Buffer] = [to_dev(offsets)]
    state = {}
    for c in CACHES:
        arena = poisoned_arena(c, rng)
        page_elems = 2 * c.layers * PAGE * c.n
        st = arena.dtype
        slab = Buffer.from_numpy(arena.view(np.uint8).copy()).to(dev)
        p = c.params(dref)
        bdt = DType.bfloat16 if c.dtype == DType.bfloat16 else fp8_dtype_for(dref)
        blocks, stride = contiguous_page_view_and_stride(
            slab,
            p.shape_per_block,
            bdt,
            padded_page_bytes=None
            if c.pad_elems == 0
            else (page_elems + c.pad_elems) * st.itemsize,
        )
        assert stride == (-1 if c.pad_elems == 0 else page_elems + c.pad_elems)
        lut = make_lut(batch, c.pages, rng)
        state[c.name] = (arena, slab, lut)
        inputs += [
            blocks,
            Buffer.from_numpy(np.array([stride], np.int64)),
            to_dev(cache_lengths),
            to_dev(lut),
            Buffer.from_numpy(np.array([max(batch.lengths, default=0)], np.uint32)),
            Buffer.from_numpy(np.array([max_cache], np.uint32)),
        ]
    expected: dict[str, list[tuple[np.ndarray, np.ndarray, int, int]]] = {
        c.name: [] for c in CACHES
    }
    for op in OPS:
        c = CACHE_BY_NAME[op.cache]
        gm, gn, gk = op.gran
        x = rng.standard_normal((t_total, op.k)) * rng.uniform(0.2, 3.0, (t_total, 1))
        a_q, a_s = quantize_fp8_input(x, gm, gk)
        w_qs = [
            quantize_fp8_blockwise(
                rng.standard_normal((c.n, op.k)) * rng.uniform(0.01, 0.1, (c.n, 1)), (gn, gk)
            )
            for _ in op.halves
        ]
        inputs += [
            fp8_buffer(a_q, dev),
            *(fp8_buffer(w_q.data, dev) for w_q in w_qs),
            to_dev(a_s),
            *(to_dev(w_q.scales) for w_q in w_qs),
        ]
        kv_scales = []
        for half, w_q in zip(op.halves, w_qs, strict=True):
            ref = reference(a_q, w_q.data, a_s, w_q.scales, op.gran)
            scale = np.ones(c.heads)
            if op.kv_scale is not None:
                amax = np.abs(ref).reshape(t_total, c.heads, c.head_dim).max(
                    axis=(0, 2), initial=1e-3
                )
                per = (amax / 190.0).astype(np.float32)  # |k / s| <= 190 (no rounding tie)
                ks = per if op.kv_scale == "head" else np.array([per.max()], np.float32)
                kv_scales.append(ks.astype(np.float32))
                scale = np.broadcast_to(ks.astype(np.float64), (c.heads,))
            if c.dtype == DType.float8_e4m3fn:
                # the cache itself rounds to e4m3: the reference is that rounding of k / kv_scale
                s_col = np.repeat(scale, c.head_dim)
                ref = to_e4m3(ref / s_col).astype(np.float64) * s_col
            expected[c.name].append((ref, scale, op.layer, half))
        if kv_scales:
            inputs.append(to_dev(np.concatenate(kv_scales)))
    model.execute(*inputs)

    for c in CACHES:
        arena, slab, lut = state[c.name]
        page_elems = 2 * c.layers * PAGE * c.n
        got = slab.to(CPU()).to_numpy().view(arena.dtype)
        changed = got != arena
        want_mask = np.zeros_like(changed)
        errs = []
        for ref, scale, layer, half in expected[c.name]:
            vals, refs = [], []
            for b, n_tok in enumerate(batch.lengths):
                for i in range(n_tok):
                    pos = int(cache_lengths[b]) + i
                    col = pos // PAGE
                    if col >= lut.shape[1] or lut[b, col] >= c.pages:
                        continue  # the op must skip it
                    page = int(lut[b, col])
                    slot = (half * c.layers + layer) * PAGE + pos % PAGE  # [2, L, PAGE] of a page
                    base = page * (page_elems + c.pad_elems) + slot * c.n
                    want_mask[base : base + c.n] = True
                    row = decode_storage(got[base : base + c.n], c.dtype)
                    vals.append(row * np.repeat(scale, c.head_dim))
                    refs.append(ref[int(offsets[b]) + i])
            if refs:
                v, r = np.array(vals), np.array(refs)
                errs.append(np.linalg.norm(v - r) / max(np.linalg.norm(r), 1e-30))
        # exactly the target slots changed (a target keeping its poison bits is allowed)
        stray = changed & ~want_mask
        assert not stray.any(), (
            f"{c.name}: {int(stray.sum())} elements changed outside the target slots"
        )
        if want_mask.any():
            assert changed[want_mask].mean() > 0.9, f"{c.name}: target slots not written"
        for e in errs:
            assert e <= TOL, f"{c.name}: rel. Frobenius error {e:.3g} > {TOL}"


@pytest.mark.parametrize("batch", list(BATCHES), ids=list(BATCHES))
def test_k_cache_cpu(batch: str) -> None:
    run("cpu", BATCHES[batch], seed=list(BATCHES).index(batch))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", list(BATCHES), ids=list(BATCHES))
def test_k_cache_gpu(batch: str) -> None:
    run("gpu", BATCHES[batch], seed=list(BATCHES).index(batch))


# ------------------------------------------------------------------------------- contracts
def _valid_types(**over: object) -> dict[str, object]:
    """Graph input types of a valid CPU call (bf16 cache, H=2, D=64, K=256, gran (1,128,128))."""
    cpu = DeviceRef.CPU()
    p = CACHES[0].params(cpu)
    base: dict[str, object] = {
        "hidden_state": TensorType(DType.uint8, ["T", 256], cpu),
        "input_row_offsets": TensorType(DType.uint32, ["B1"], cpu),
        "weight": TensorType(DType.uint8, [128, 256], cpu),
        "input_scale": TensorType(DType.float32, [2, "ts"], cpu),
        "weight_scale": TensorType(DType.float32, [1, 2], cpu),
        "kv_blocks": BufferType(DType.bfloat16, ["pages", *p.shape_per_block], cpu),
        "page_stride": TensorType(DType.int64, [1], cpu),
        "cache_lengths": TensorType(DType.uint32, ["B"], cpu),
        "lookup_table": TensorType(DType.uint32, ["B", "cols"], cpu),
        "max_prompt_length": TensorType(DType.uint32, [1], cpu),
        "max_cache_length": TensorType(DType.uint32, [1], cpu),
        "kv_scale": None,
        "kv_params": p,
        "gran": (1, 128, 128),
        "layer_idx": 0,
    }
    base.update(over)
    return base


def _build_call(
    s: dict[str, object], project: Callable[..., None] = k_matmul_ragged_paged_scale
) -> None:
    names = [k for k, v in s.items() if isinstance(v, (TensorType, BufferType))]
    with Graph("k_cache_contract", input_types=[s[k] for k in names]):
        g = Graph.current
        v = {
            k: (x.buffer if isinstance(s[k], BufferType) else x.tensor)
            for k, x in zip(names, g.inputs, strict=True)
        }
        coll = PagedCacheValues(
            kv_blocks=v["kv_blocks"],
            cache_lengths=v["cache_lengths"],
            lookup_table=v["lookup_table"],
            max_prompt_length=v["max_prompt_length"],
            max_cache_length=v["max_cache_length"],
            page_stride=v["page_stride"],
        )
        project(
            s["kv_params"],
            v["hidden_state"],
            v["input_row_offsets"],
            v["weight"],
            v["input_scale"],
            v["weight_scale"],
            coll,
            s["gran"],
            s["layer_idx"],
            kv_scale=v.get("kv_scale"),
        )


_CPU, _GPU = DeviceRef.CPU(), DeviceRef.GPU()
_FP8_PARAMS = CACHES[1].params(_CPU)
BAD = [
    ("kv_params type", _valid_types(kv_params="bf16"), TypeError, "kv_params must be .*Params"),
    (
        "cache dtype",
        _valid_types(
            kv_params=MHAKVCacheParams(
                dtype=DType.float32,
                n_kv_heads=2,
                head_dim=64,
                num_layers=3,
                page_size=PAGE,
                devices=[_CPU],
            )
        ),
        TypeError,
        "'kv_params'.*bfloat16 or float8",
    ),
    ("granularity", _valid_types(gran=(1, 0, 128)), ValueError, "'scales_granularity_mnk'"),
    ("granularity arity", _valid_types(gran=(128, 128)), ValueError, "'scales_granularity_mnk'"),
    (
        "fp8 on cpu",
        _valid_types(hidden_state=TensorType(DType.float8_e4m3fn, ["T", 256], _CPU)),
        TypeError,
        "'hidden_state'.*uint8 on cpu",
    ),
    (
        "rank",
        _valid_types(hidden_state=TensorType(DType.uint8, [256], _CPU)),
        ValueError,
        "'hidden_state'.*rank 2",
    ),
    (
        "symbolic K",
        _valid_types(hidden_state=TensorType(DType.uint8, ["T", "k"], _CPU)),
        ValueError,
        "'hidden_state'.*static",
    ),
    (
        "weight dtype",
        _valid_types(weight=TensorType(DType.bfloat16, [128, 256], _CPU)),
        TypeError,
        "'weight'.*uint8",
    ),
    (
        "weight N",
        _valid_types(weight=TensorType(DType.uint8, [64, 256], _CPU)),
        ValueError,
        r"'weight'.*\[128, 256\].*\[64, 256\]",
    ),
    (
        "offsets dtype",
        _valid_types(input_row_offsets=TensorType(DType.int32, ["B1"], _CPU)),
        TypeError,
        "'input_row_offsets'.*uint32",
    ),
    (
        "input_scale rows",
        _valid_types(input_scale=TensorType(DType.float32, [4, "ts"], _CPU)),
        ValueError,
        "'input_scale'.*ceil",
    ),
    (
        "input_scale too few tokens",
        _valid_types(
            hidden_state=TensorType(DType.uint8, [9, 256], _CPU),
            input_scale=TensorType(DType.float32, [2, 8], _CPU),
        ),
        ValueError,
        "'input_scale'.*>= ceil",
    ),
    (
        "input_scale dtype",
        _valid_types(input_scale=TensorType(DType.bfloat16, [2, "ts"], _CPU)),
        TypeError,
        "'input_scale'.*float32",
    ),
    (
        "weight_scale shape",
        _valid_types(weight_scale=TensorType(DType.float32, [2, 2], _CPU)),
        ValueError,
        r"'weight_scale'.*\[1, 2\]",
    ),
    (
        "blocks dtype",
        _valid_types(
            kv_blocks=BufferType(
                DType.float16, ["pages", *CACHES[0].params(_CPU).shape_per_block], _CPU
            )
        ),
        TypeError,
        "'kv_collection.kv_blocks'.*bfloat16",
    ),
    (
        "blocks shape",
        _valid_types(kv_blocks=BufferType(DType.bfloat16, ["pages", 2, 3, 32, 2, 64], _CPU)),
        ValueError,
        "'kv_collection.kv_blocks'.*shape",
    ),
    (
        "page_stride on device",
        _valid_types(page_stride=TensorType(DType.int64, [1], _GPU)),
        ValueError,
        "'kv_collection.page_stride'.*on CPU",
    ),
    (
        "lookup_table rank",
        _valid_types(lookup_table=TensorType(DType.uint32, ["B"], _CPU)),
        ValueError,
        "'kv_collection.lookup_table'.*rank 2",
    ),
    ("layer range", _valid_types(layer_idx=3), ValueError, r"'layer_idx'.*\[0, 3\)"),
    (
        "kv_scale on bf16",
        _valid_types(kv_scale=TensorType(DType.float32, [1], _CPU)),
        ValueError,
        "'kv_scale'.*float8_e4m3fn cache only",
    ),
    (
        "kv_scale shape",
        _valid_types(
            kv_params=_FP8_PARAMS,
            kv_blocks=BufferType(DType.uint8, ["pages", *_FP8_PARAMS.shape_per_block], _CPU),
            kv_scale=TensorType(DType.float32, [3], _CPU),
        ),
        ValueError,
        r"'kv_scale'.*\[1\] or \[4\]",
    ),
    (
        "fp8 cache as fp8 on cpu",
        _valid_types(
            kv_params=_FP8_PARAMS,
            kv_blocks=BufferType(
                DType.float8_e4m3fn, ["pages", *_FP8_PARAMS.shape_per_block], _CPU
            ),
        ),
        TypeError,
        "'kv_collection.kv_blocks'.*uint8",
    ),
    (
        "device mismatch",
        _valid_types(weight_scale=TensorType(DType.float32, [1, 2], _GPU)),
        ValueError,
        "'weight_scale'.*device",
    ),
]


def test_valid_call_builds() -> None:
    """The valid base call builds (the op is registered and takes this operand list)."""
    _build_call(_valid_types())
    _build_call(
        _valid_types(
            layer_idx=2,
            gran=[3, 16, 96],
            input_scale=TensorType(DType.float32, [3, "ts"], _CPU),
            weight_scale=TensorType(DType.float32, [8, 3], _CPU),
        )
    )


@pytest.mark.parametrize(("case", "s", "error", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises(case: str, s: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _build_call(s)


@pytest.mark.parametrize(("case", "s", "error", "match"), BAD[:8], ids=[b[0] for b in BAD[:8]])
def test_v_twin_bad_input_raises(case: str, s: dict[str, object], error: type, match: str) -> None:
    """The V twin checks the same contract and names its own op."""
    with pytest.raises(error, match="v_matmul_ragged_paged_scale: (argument )?" + match):
        _build_call(s, v_matmul_ragged_paged_scale)


def test_v_twin_valid_call_builds() -> None:
    _build_call(_valid_types(layer_idx=1), v_matmul_ragged_paged_scale)


def _build_fused(s: dict[str, object], **v_over: TensorType) -> None:
    """`_build_call` of the fused op: V's weight and scale are graph inputs too (K's types
    unless given in v_over)."""
    s = {
        **s,
        "v_weight": v_over.get("v_weight", s["weight"]),
        "v_weight_scale": v_over.get("v_weight_scale", s["weight_scale"]),
    }
    names = [k for k, x in s.items() if isinstance(x, (TensorType, BufferType))]

    def project(params: object, hidden: object, offsets: object, weight: object, in_s: object,
                w_s: object, coll: object, gran: object, layer: object,
                kv_scale: object = None) -> None:
        inputs = dict(zip(names, Graph.current.inputs, strict=True))
        kv_matmul_ragged_paged_scale(
            params, hidden, offsets, weight, inputs["v_weight"].tensor, in_s, w_s,
            inputs["v_weight_scale"].tensor, coll, gran, layer, kv_scale=kv_scale,
        )

    _build_call(s, project)


def test_fused_valid_call_builds() -> None:
    _build_fused(_valid_types(layer_idx=1))
    _build_fused(
        _valid_types(
            kv_params=_FP8_PARAMS,
            kv_blocks=BufferType(DType.uint8, ["pages", *_FP8_PARAMS.shape_per_block], _CPU),
            kv_scale=TensorType(DType.float32, [8], _CPU),
        )
    )


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"v_weight": TensorType(DType.uint8, [64, 256], _CPU)}, r"'v_weight'.*\[128, 256\]"),
        (
            {"v_weight_scale": TensorType(DType.float32, [2, 2], _CPU)},
            r"'v_weight_scale'.*\[1, 2\]",
        ),
    ],
    ids=["v_weight shape", "v_weight_scale shape"],
)
def test_fused_bad_v_operand_raises(over: dict[str, TensorType], match: str) -> None:
    with pytest.raises(ValueError, match="kv_matmul_ragged_paged_scale: (argument )?" + match):
        _build_fused(_valid_types(), **over)


def test_fused_kv_scale_counts_both_halves() -> None:
    """kv_scale of the fused op holds K's values, then V's: [2] or [2·heads], never [1]."""
    fp8 = {
        "kv_params": _FP8_PARAMS,
        "kv_blocks": BufferType(DType.uint8, ["pages", *_FP8_PARAMS.shape_per_block], _CPU),
    }
    with pytest.raises(ValueError, match=r"'kv_scale'.*\[2\] or \[8\]"):
        _build_fused(_valid_types(**fp8, kv_scale=TensorType(DType.float32, [1], _CPU)))

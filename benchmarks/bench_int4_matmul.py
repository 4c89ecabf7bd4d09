"""W4A16 benchmark: our `multistage_gemm_q` vs cuBLAS bf16, humming-kernels, torch int4 and MAX's
own GPTQ kernel.

    python benchmarks/bench_int4_matmul.py              # GPU when present, else the CPU table
    python benchmarks/bench_int4_matmul.py --device cpu # CPU GFLOP/s (N = K = 4096, g = 128)
    python benchmarks/bench_int4_matmul.py --shapes llama            # the 8 Llama-3 layers only
    python benchmarks/bench_int4_matmul.py --m 1,16 --layers 3B,405B.o  # a subset
    python benchmarks/bench_int4_matmul.py --estimate   # the time plan of a run, then exit

Shapes (`--shapes public`, the default): the linear layers (qkv, o, gate_up, down) of the public
model configs in MODELS (Llama-3 8B / 70B, Llama-3.2-3B, Mistral-Nemo-12B, Phi-3-medium-14B,
Gemma-2-27B, Llama-3.1-405B), N and K derived from each config's dims; `--shapes llama`: the 8
Llama-3 8B / 70B layers (LAYERS).

Method (harness.py): our op and MAX's kernel run as MAX graphs applying the op R times to R
distinct activations, rotating weight copies so L2 does not serve them (median of
(execute + synchronize) / R); `kernel_us` is the CUPTI-traced kernel time of our kernels / R,
at every M: in one replay of the captured graph where one is timed (the union of the kernels'
intervals: the graph a server runs; an uncaptured execute, host-bound at small M, runs each
kernel cold and longer), else in one execute (`exec_kernel_us`, recorded for every M).
torch contenders (cuBLAS bf16 on a bf16 weight, humming-kernels 0.1.20
W4A16 on the same weight quantized by humming's own quantizer, torch int4 on the Llama layers)
use do_bench with L2 flushed, in a subprocess; humming's calls also rotate weight copies where
the weights fit in L2, and each row checks humming's output against cuBLAS on humming's
dequantized weight (rel. Frobenius error <= 1e-2; a failure is recorded in the row).
Captured (issue 18's headline, as a MAX server runs decode): `replay_us` is the same graph
captured once (`Model.capture`) and replayed, median (replay + synchronize) / R;
`cublas_graph_us` is the same R cuBLAS calls (distinct x, rotated weight copies) in one
torch.cuda.CUDAGraph, timed the same way. Bars are printed as "bar: ... met/missed" lines:
issue 18's (geomean x_cublas_replay over the 8 Llama layers >= 2.0 at M = 1 and 16) and issue
19's (geomean over the public layers of x_humming_kernel = humming_us / kernel_us, and of
x_cublas_kernel at M = 4096).

Budget (BENCH_BUDGET_S, wall clock of the whole run): `plan` estimates each part from the shapes
and drops, in this order, MAX's own kernel, the captured rows at M >= REPLAY_BIG_M and torch
int4 at M >= REPLAY_BIG_M until the estimate fits; rows still left when the time is spent are
skipped. Everything dropped or skipped is printed and recorded (`plan`, `skipped`).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

MODELS: dict[str, dict[str, Any]] = {
    # prefix: the dims of the model's public config.json (hidden_size, num_attention_heads,
    # num_key_value_heads, head_dim (hidden_size / heads where the config has none),
    # intermediate_size); the layers follow from them in model_layers.
    "8B": {"model": "meta-llama/Meta-Llama-3-8B", "hidden": 4096, "heads": 32,
           "kv_heads": 8, "head_dim": 128, "intermediate": 14336},
    "70B": {"model": "meta-llama/Meta-Llama-3-70B", "hidden": 8192, "heads": 64,
            "kv_heads": 8, "head_dim": 128, "intermediate": 28672},
    "3B": {"model": "meta-llama/Llama-3.2-3B", "hidden": 3072, "heads": 24,
           "kv_heads": 8, "head_dim": 128, "intermediate": 8192},
    "12B": {"model": "mistralai/Mistral-Nemo-Base-2407", "hidden": 5120, "heads": 32,
            "kv_heads": 8, "head_dim": 128, "intermediate": 14336},
    "14B": {"model": "microsoft/Phi-3-medium-4k-instruct", "hidden": 5120, "heads": 40,
            "kv_heads": 10, "head_dim": 128, "intermediate": 17920},
    "27B": {"model": "google/gemma-2-27b", "hidden": 4608, "heads": 32,
            "kv_heads": 16, "head_dim": 128, "intermediate": 36864},
    "405B": {"model": "meta-llama/Llama-3.1-405B", "hidden": 16384, "heads": 128,
             "kv_heads": 8, "head_dim": 128, "intermediate": 53248},
}


def model_layers(prefix: str, cfg: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(N, K) of a decoder layer's four linear layers from its model config: qkv fused
    (N = (heads + 2 kv_heads) head_dim), o (K = heads head_dim: Gemma-2's differs from hidden),
    gate_up fused (N = 2 intermediate) and down."""
    hidden, hd, inter = cfg["hidden"], cfg["head_dim"], cfg["intermediate"]
    return {f"{prefix}.qkv": ((cfg["heads"] + 2 * cfg["kv_heads"]) * hd, hidden),
            f"{prefix}.o": (hidden, cfg["heads"] * hd),
            f"{prefix}.gate_up": (2 * inter, hidden),
            f"{prefix}.down": (hidden, inter)}


PUBLIC_LAYERS = {name: nk for prefix, cfg in MODELS.items()
                 for name, nk in model_layers(prefix, cfg).items()}
LAYERS = {name: nk for name, nk in PUBLIC_LAYERS.items() if name.split(".")[0] in ("8B", "70B")}
"""(N, K) of the Llama-3 8B and 70B linear layers (issue 18's bars are over these)."""
SHAPE_SETS = {"public": PUBLIC_LAYERS, "llama": LAYERS}
M_VALUES = (1, 16, 64, 128, 256, 1024, 4096)
GROUP = 128
R = 16  # op copies per timed graph (distinct activations, rotated weights)
T0 = time.perf_counter()
BUDGET_S = float(os.environ.get("BENCH_BUDGET_S", "480"))
STATIC = os.environ.get("BENCH_STATIC") == "1"  # our op's graph per layer with static N, K
"""Wall-clock budget of the whole run: see `plan`; MAX's own kernel (a compile per layer) is also
skipped for the layers left when less than a minute of it remains."""
REPLAY_BIG_M = 1024
REPLAY_BIG_NEED_S = 180.0
"""Rows at M >= REPLAY_BIG_M get a captured time only when the plan keeps them and while this
much of the budget is left."""
RECORD_RESERVE_S = 15.0
"""Budget kept for writing the results: our rows stop this long before the budget ends."""
HUMMING_VERSION = "0.1.20"
WHEELS = Path(__file__).resolve().parents[1] / ".wheels"
"""humming-kernels' wheel for machines that cannot download it (git-ignored)."""
HUMMING_CHECK_TOL = 1e-2
PLAN: dict[str, Any] = {"graph_big_m": True}
"""The run's plan (main sets it): which optional parts run."""


def weight_bytes(n: int, k: int) -> int:
    """Bytes of the packed int4 weight and its bf16 scales."""
    return n * k // 2 + 2 * n * (k // GROUP)


def select_layers(shapes: str, only: str | None) -> dict[str, tuple[int, int]]:
    """The layers of shape set `shapes`, narrowed to `only` (comma-separated layer names or
    model prefixes: "3B,405B.o" is the four 3B layers and 405B.o); unknown names raise."""
    base = SHAPE_SETS[shapes]
    if not only:
        return dict(base)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    known = {name.split(".")[0] for name in base} | set(base)
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise SystemExit(f"--layers: not in --shapes {shapes}: {', '.join(unknown)}")
    return {name: nk for name, nk in base.items()
            if name in wanted or name.split(".")[0] in wanted}


def parse_m(text: str | None) -> tuple[int, ...]:
    """M values from "1,16,4096" (sorted, unique); M_VALUES when empty."""
    values = sorted({int(v) for v in (text or "").split(",") if v.strip()})
    if any(v <= 0 for v in values):
        raise SystemExit(f"--m: M must be positive: {text}")
    return tuple(values) or M_VALUES


def replay_wanted(m: int) -> bool:
    """Whether a row gets its captured time: always below REPLAY_BIG_M; at M >= REPLAY_BIG_M
    (compute-bound, where a replay of 16 ops takes up to ~0.4 s) only when the plan keeps those
    rows and while REPLAY_BIG_NEED_S of the budget is left, so the later rows keep their time."""
    return m < REPLAY_BIG_M or (bool(PLAN.get("graph_big_m"))
                                and time.perf_counter() - T0 < BUDGET_S - REPLAY_BIG_NEED_S)


# ---------------------------------------------------------------- time plan
# Rough H200 rates and costs (from the 2026-12 runs of this benchmark; documented guesses where
# marked): enough to choose what fits in the budget, not a prediction to quote.
EST_BW = 3.0e12  # our op's and humming's weight stream at small M (B/s)
EST_FLOPS = 550e12  # our op at M >= 256 (cuBLAS ~700e12)
EST_CUBLAS_BW, EST_CUBLAS_FLOPS = 4.0e12, 700e12
EST_INT4PACK_FLOPS = 30e12  # torch._weight_int4pack_mm at large M
EST_HUMMING_KERNEL_S = 8.0  # guess: NVRTC seconds of CPU per humming kernel
EST_HUMMING_WORKERS = 12  # parallel NVRTC compiles that pay off on 16 cores
EST_OURS_COMPILE_S = 60.0  # MAX import, our graph and the graph-floor graph
EST_TORCH_START_S = 25.0  # torch import, CUDA init, humming import/install, its quantizer JIT
EST_MAX_LAYER_S = 45.0  # MAX's own kernel: compile and rows of one layer


def _op_s(m: int, n: int, k: int, bw: float, flops: float, floor: float = 8e-6) -> float:
    return max(weight_bytes(n, k) / bw, 2 * m * n * k / flops) + floor


def _do_bench_s(t: float) -> float:
    """triton do_bench: 5 estimate calls, >= 25 ms warm-up and >= 100 ms of timed calls."""
    return 5 * t + max(0.025, t) + max(0.1, t) + 0.03


def _graph_s(t: float) -> float:
    """torch_graph_seconds / time_max_replay over R calls: 2 warm-up rounds, 2 + 7 replays."""
    return 11 * R * t + 0.05


def estimate(layers: dict[str, tuple[int, int]], m_values: Iterable[int], *, humming: bool,
             torch_part: bool, graph_big_m: bool, int4pack_big_m: bool,
             max_layers: int) -> dict[str, float]:
    """Estimated seconds of each part of a run (see the EST_ constants): `torch` (the torch
    subprocess, humming's compiles included), `compile` (MAX, overlapping the torch part),
    `ours` (our rows), `max` (MAX's kernel) and `total`."""
    ms = tuple(m_values)
    torch_s, ours_s = EST_TORCH_START_S if torch_part else 0.0, 0.0
    if humming and torch_part:
        # distinct configs per layer are fewer than the M values; 2/3 of them is a guess
        kernels = len(layers) * max(1, math.ceil(len(ms) * 2 / 3))
        torch_s += kernels * EST_HUMMING_KERNEL_S / EST_HUMMING_WORKERS
    for name, (n, k) in layers.items():
        torch_s += 0.5 + 3 * n * k / 4e10 if torch_part else 0.0  # weights, quantization
        ours_s += 0.3 + n * k / 2 / 1e9  # host random codes and their upload
        for m in ms:
            big = m >= REPLAY_BIG_M
            ours = _op_s(m, n, k, EST_BW, EST_FLOPS)
            # check, time_max_model (9), host (5), trace (2) executes of R ops; replay
            ours_s += 0.6 + 17 * R * ours + (_graph_s(ours) if graph_big_m or not big else 0)
            if not torch_part:
                continue
            cublas = _op_s(m, n, k, EST_CUBLAS_BW / 2, EST_CUBLAS_FLOPS)  # bf16: 4x the bytes
            torch_s += _do_bench_s(cublas) + (_graph_s(cublas) if graph_big_m or not big else 0)
            if humming:
                torch_s += _do_bench_s(_op_s(m, n, k, EST_BW, EST_FLOPS)) + 0.1  # + the check
            if name in LAYERS and (int4pack_big_m or not big):
                i4 = _op_s(m, n, k, EST_BW, EST_INT4PACK_FLOPS)
                torch_s += _do_bench_s(i4) + (_graph_s(i4) if graph_big_m or not big else 0)
    max_s = max_layers * EST_MAX_LAYER_S
    total = max(torch_s, EST_OURS_COMPILE_S) + ours_s + max_s + RECORD_RESERVE_S
    return {"torch": torch_s, "compile": EST_OURS_COMPILE_S, "ours": ours_s, "max": max_s,
            "total": total}


def plan(layers: dict[str, tuple[int, int]], m_values: tuple[int, ...], budget: float, *,
         humming: bool, torch_part: bool, max_layers: int) -> dict[str, Any]:
    """What the run does within `budget` seconds: every part, then, while the estimate is over
    the budget, without (in this order) MAX's own kernel, the captured rows at M >= REPLAY_BIG_M
    and torch int4 at M >= REPLAY_BIG_M. Returns the flags, the estimate and what was dropped."""
    p: dict[str, Any] = {"max_builtin": max_layers > 0, "graph_big_m": True,
                         "int4pack_big_m": True, "dropped": []}

    def est() -> dict[str, float]:
        return estimate(layers, m_values, humming=humming, torch_part=torch_part,
                        graph_big_m=p["graph_big_m"], int4pack_big_m=p["int4pack_big_m"],
                        max_layers=max_layers if p["max_builtin"] else 0)

    drops = (("max_builtin", "MAX's own kernel (qmatmul_b4_g128)"),
             ("graph_big_m", f"captured rows at M >= {REPLAY_BIG_M} (replay_us, *_graph_us)"),
             ("int4pack_big_m", f"torch int4 at M >= {REPLAY_BIG_M}"))
    for key, what in drops:
        if est()["total"] <= budget:
            break
        if p[key]:
            p[key] = False
            p["dropped"].append(what)
    p["estimate_s"] = {k: round(v, 1) for k, v in est().items()}
    p["fits"] = p["estimate_s"]["total"] <= budget
    return p


# ---------------------------------------------------------------- torch contenders (subprocess)
def load_humming(work: Path) -> Any:
    """The humming package: imported as installed, else installed from WHEELS into
    `work`/site (pip --no-deps --no-index: the H200 cannot download; its deps, torch, triton,
    cuda-bindings, jinja2 and filelock, are there) and imported from there. Its JIT cache and
    temp files go under `work` (HUMMING_CACHE_DIR / HUMMING_TMP_DIR, unless set)."""
    for var, sub in (("HUMMING_CACHE_DIR", "cache"), ("HUMMING_TMP_DIR", "tmp")):
        os.environ.setdefault(var, str(work / sub))
        Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
    try:
        import humming
    except ImportError:
        wheels = sorted(WHEELS.glob(f"humming_kernels-{HUMMING_VERSION}-*.whl"))
        if not wheels:
            raise
        site = work / "site"
        if not (site / "humming" / "__init__.py").exists():
            install_wheel(wheels[-1], site)
        sys.path.insert(0, str(site))
        import importlib

        importlib.invalidate_caches()
        import humming
    return humming


def install_wheel(wheel: Path, site: Path) -> None:
    """Installs `wheel` alone into `site` by pip; by unzipping it (keeping the executable bits of
    its native helpers) where pip fails."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--no-compile", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        import zipfile

        print(f"humming: pip failed ({proc.stderr.strip()[-300:]}), unzipping", flush=True)
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                path = Path(z.extract(info, site))
                mode = info.external_attr >> 16
                if mode & 0o111:
                    path.chmod(mode & 0o777)
    print(f"humming: installed {wheel.name} into {site} in {time.perf_counter() - t0:.1f}s",
          flush=True)


def humming_tuning(hm_config: Any, m_values: Iterable[int]) -> tuple[str, dict[int, str]]:
    """humming's own heuristic kernel config at each M, as its tuning-config interval list
    ([lo, hi, config]: used for lo < M <= hi; equal neighbours merged) in JSON, and a short
    description per M. The default (no tuning config) compiles a kernel for every interval up
    to M = 8192; this picks the same configs for these M and compiles only those."""
    from humming.tune import get_heuristics_config

    intervals: list[list[Any]] = []
    desc: dict[int, str] = {}
    lo = 0
    for m in sorted(set(m_values)):
        cfg = copy.deepcopy(get_heuristics_config(hm_config, shape_m=m))
        desc[m] = " ".join(f"{key}={cfg[key]}" for key in ("mma_type", "block_shape",
                                                          "num_stages", "use_stream_k")
                           if key in cfg).replace(" ", "")
        if intervals and intervals[-1][2] == cfg:
            intervals[-1][1] = m
        else:
            intervals.append([lo, m, cfg])
        lo = m
    intervals[-1][1] = 1 << 30
    return json.dumps(intervals), desc


class HummingReady:
    """One layer's humming side: the transformed layer, the weight schema it was quantized with
    (`transform` replaces the layer's by its kernel-side one), its tuning JSON and descriptions."""

    def __init__(self, layer: Any, schema: Any, tuning: str, desc: dict[int, str]) -> None:
        self.layer, self.schema, self.tuning, self.desc = layer, schema, tuning, desc


def humming_layer(w: Any, n: int, k: int) -> tuple[Any, Any]:
    """A humming W4A16 layer (int4 symmetric, group GROUP, bf16) holding `w` [n, k] quantized by
    humming's quantizer and transformed to its kernel layout, and the weight schema of that
    quantization (for `HummingWeightSchema.quant_tensor` / `dequant_tensors`)."""
    import torch
    from humming.layer import HummingLayer
    from humming.schema import HummingWeightSchema

    layer = HummingLayer(shape_n=n, shape_k=k, torch_dtype=torch.bfloat16,
                         weight_config={"dtype": "int4", "group_size": GROUP}).cuda()
    schema = copy.deepcopy(layer.weight_schema)
    layer.load_from_tensors(HummingWeightSchema.quant_tensor(w, schema, torch.bfloat16))
    layer.transform()
    return layer, schema


def humming_prepare(layers: dict[str, tuple[int, int]], m_values: tuple[int, ...],
                    weight_of: Callable[[int, int, int], Any],
                    info: dict[str, Any]) -> dict[str, HummingReady]:
    """Every layer's humming layer and tuning, then all their kernels compiled at once (a few
    layers at a time, each compiling its configs in parallel): the JIT cost is paid before any
    timing. A layer that fails is left out with its error in `info["failed"]`."""
    import torch
    from humming.kernel.humming import HummingKernel

    ready: dict[str, HummingReady] = {}
    failed: dict[str, str] = info.setdefault("failed", {})
    t0 = time.perf_counter()
    for i, (name, (n, k)) in enumerate(layers.items()):
        try:
            w = weight_of(i, n, k)
            layer, schema = humming_layer(w, n, k)
            del w
            ready[name] = HummingReady(layer, schema, *humming_tuning(layer.humming_config,
                                                                      m_values))
        except Exception as e:  # a contender's failure is recorded, never ends the run
            failed[name] = f"setup: {e!r}"[:300]
            print(f"humming {name}: {failed[name]}", flush=True)
        torch.cuda.empty_cache()
    info["setup_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    os.environ.setdefault("HUMMING_MAX_PARALLEL_BUILD_WORKERS", "4")
    dev = torch.device("cuda", torch.cuda.current_device())

    def compile_layer(name: str) -> None:
        hr = ready[name]  # the same cache key as the layer's forward: compiled once
        HummingKernel.prepare_kernels(hr.layer.humming_config.to_str(), None, hr.tuning, dev)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(compile_layer, name) for name in ready}
    for name, fut in futures.items():
        if fut.exception() is not None:  # the first call compiles it again, or fails there
            print(f"humming {name}: precompile failed: {fut.exception()!r}"[:400], flush=True)
    info["compile_s"] = time.perf_counter() - t0
    print(f"humming: {len(ready)} layers set up in {info['setup_s']:.1f}s, kernels compiled in "
          f"{info['compile_s']:.1f}s", flush=True)
    return ready


def torch_part(out_path: str, cfg: dict[str, Any]) -> None:
    """cuBLAS bf16, humming-kernels and (on the Llama layers) torch._weight_int4pack_mm per layer
    and M, by do_bench and (cuBLAS, int4) captured (R calls on distinct x, rotated weight copies,
    one CUDA graph); writes JSON ({"rows", "skipped", "humming"}) to out_path after every row (a
    crash later keeps the rows so far). cfg: layers, m, deadline (time.time() after which rows
    are skipped), humming (bool), graph_big_m, int4pack_big_m, work (humming's folder)."""
    import torch

    dev = torch.device("cuda")
    layers = {name: tuple(nk) for name, nk in cfg["layers"].items()}
    m_values = tuple(cfg["m"])
    deadline = float(cfg["deadline"])
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    info: dict[str, Any] = {"version": None}

    def dump() -> None:
        Path(out_path).write_text(json.dumps({"rows": rows, "skipped": skipped, "humming": info}))

    def weight_of(i: int, n: int, k: int) -> Any:  # the same weight for every contender
        gen = torch.Generator(device=dev).manual_seed(1000 + i)
        return torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen)

    hm_ready: dict[str, HummingReady] = {}
    if cfg["humming"]:
        try:
            hm = load_humming(Path(cfg["work"]))
            info["version"] = getattr(hm, "__version__", "?")
            if info["version"] != HUMMING_VERSION:
                print(f"humming: version {info['version']}, not {HUMMING_VERSION}", flush=True)
            hm_ready = humming_prepare(layers, m_values, weight_of, info)
        except Exception as e:  # no humming: its columns stay empty, the reason is recorded
            info["error"] = repr(e)[:500]
            print(f"humming: unavailable: {info['error']}", flush=True)
    dump()
    if cfg.get("prepare_only"):
        return
    for i, (name, (n, k)) in enumerate(layers.items()):
        if time.time() > deadline:
            skipped.append(f"torch {name}: all M (budget)")
            hm_ready.pop(name, None)
            continue
        w = weight_of(i, n, k)
        ws = [w] + [w.clone() for _ in range(harness.weight_copies(2 * n * k) - 1)]
        wq, wqs = None, []
        if name in LAYERS:  # torch int4 is far slower than the rest at large M: Llama only
            codes = torch.randint(0, 16, (n, k), dtype=torch.int32, device=dev)
            packed = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)
            try:
                wq = torch._convert_weight_to_int4pack(packed, 8)
                sz = torch.randn(k // GROUP, n, 2, device=dev, dtype=torch.bfloat16)
                nq = harness.weight_copies(weight_bytes(n, k))
                wqs = [(wq, sz)] + [(wq.clone(), sz.clone()) for _ in range(nq - 1)]
            except RuntimeError:
                wq, wqs = None, []
            del codes, packed
        hm_layers: list[Any] = []
        hm_fail = info.get("failed", {}).get(name) or info.get("error")
        w_deq: Any = None
        tuning, desc = "", {}
        if name in hm_ready:
            hr = hm_ready.pop(name)
            tuning, desc = hr.tuning, hr.desc
            try:
                from humming.schema import HummingWeightSchema

                # the layer's quantization of this same weight, dequantized: the reference
                tensors = HummingWeightSchema.quant_tensor(w, hr.schema, torch.bfloat16)
                w_deq = hr.schema.dequant_tensors(tensors).reshape(n, k).to(torch.bfloat16)
                del tensors
                hm_layers = [hr.layer]
            except Exception as e:
                hm_fail = f"setup: {e!r}"[:300]
                print(f"humming {name}: {hm_fail}", flush=True)
            nh = harness.weight_copies(weight_bytes(n, k))
            try:  # copies to rotate (weights below L2 size), as for the other contenders
                hm_layers += [copy.deepcopy(hr.layer) for _ in range(nh - 1 if hm_layers else 0)]
            except Exception as e:
                info.setdefault("no_rotation", {})[name] = repr(e)[:200]
                hm_layers = hm_layers[:1]
            del hr
        for m in m_values:
            if time.time() > deadline:
                skipped.append(f"torch {name} M={m} (budget)")
                continue
            big = m >= REPLAY_BIG_M
            xs = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(R)]
            x = xs[0]
            row: dict[str, Any] = {
                "layer": name, "M": m,
                "cublas_us": harness.torch_do_bench(lambda x=x, w=w: x @ w.t()) * 1e6}
            if cfg["graph_big_m"] or not big:
                calls = [lambda x=x, w=w: x @ w.t() for x, w in zip(xs, itertools.cycle(ws))]
                row["cublas_graph_us"] = harness.try_us(f"torch cuBLAS {name} M={m}",
                                                        harness.torch_graph_seconds, calls)
            if wq is not None and (cfg["int4pack_big_m"] or not big):
                row["int4pack_us"] = harness.torch_do_bench(
                    lambda x=x, wq=wq, sz=sz: torch._weight_int4pack_mm(x, wq, GROUP, sz)) * 1e6
                if cfg["graph_big_m"] or not big:
                    calls = [lambda x=x, q=q: torch._weight_int4pack_mm(x, q[0], GROUP, q[1])
                             for x, q in zip(xs, itertools.cycle(wqs))]
                    row["int4pack_graph_us"] = harness.try_us(
                        f"torch int4pack {name} M={m}", harness.torch_graph_seconds, calls)
            if hm_layers:
                row.update(humming_row(hm_layers, tuning, x, w_deq))
                row["humming_config"] = desc.get(m)
            elif hm_fail:
                row["humming_fail"] = hm_fail
            rows.append(row)
            print("torch", row, flush=True)
            dump()
        del w, ws, wq, wqs, hm_layers, w_deq
        torch.cuda.empty_cache()
    dump()


def humming_row(layers: list[Any], tuning: str, x: Any, w_deq: Any) -> dict[str, Any]:
    """humming's columns of one row: its output checked against cuBLAS on its dequantized
    weight (humming_err, rel. Frobenius; humming_fail when over HUMMING_CHECK_TOL or raising)
    and humming_us, do_bench (L2 flushed) over calls that rotate the layer's weight copies."""
    import torch

    out: dict[str, Any] = {}
    try:
        got = layers[0](x, tuning_config=tuning).float()
        ref = (x @ w_deq.t()).float()
        err = float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref))
        out["humming_err"] = err
        if not err <= HUMMING_CHECK_TOL:
            out["humming_fail"] = f"check: rel err {err:.3g} > {HUMMING_CHECK_TOL}"
        del got, ref
        cycle = itertools.cycle(layers)
        out["humming_us"] = harness.torch_do_bench(
            lambda: next(cycle)(x, tuning_config=tuning)) * 1e6
    except Exception as e:  # recorded in the row; the next rows still run
        out["humming_fail"] = f"run: {e!r}"[:300]
        print(f"humming: {out['humming_fail']}", flush=True)
    return out


# ---------------------------------------------------------------- our op and MAX's, as graphs
def ours_graph(device: Any, dtype: Any, copies: int, nk: tuple[int, int] | None = None) -> Any:
    """`copies` ops on distinct x and rotated weights, symbolic M.

    nk None: symbolic N, K too (the benchmark layers have N % 64 == 0 and K % 128 == 0, so no
    padding is needed), so one compiled graph serves all layers; nk = (N, K): static weight
    dims, as in a model (BENCH_STATIC=1: one graph per layer, as MAX's kernel is timed).
    """
    from max.dtype import DType
    from max.graph import Graph, TensorType, ops

    from mojo_gemm import kernels_package

    n, k = nk if nk else ("np", "kp")
    nb, kw, g = (n // 64, k * 8, k // GROUP) if nk else ("nb", "kw", "g")
    types = [TensorType(dtype, ["m", k], device) for _ in range(copies)]
    types += [TensorType(DType.uint32, [nb, kw], device) for _ in range(copies)]
    types += [TensorType(dtype, [g, n], device) for _ in range(copies)]
    with Graph("int4_bench", input_types=types, custom_extensions=[kernels_package()]) as g:
        vals = [v.tensor for v in g.inputs]
        xs, qs, ss = vals[:copies], vals[copies:2 * copies], vals[2 * copies:]
        outs = []
        for x, q, s in zip(xs, qs, ss, strict=True):
            outs.append(ops.custom(
                "multistage_gemm_q", device,
                [x, q, s, s, s],  # zeros / bias unread: scales stand in
                [TensorType(dtype, [x.shape[0], s.shape[1]], device)],
                parameters={"group_size": GROUP, "has_zeros": False, "has_bias": False},
            )[0].tensor)
        g.output(*outs)
    return g


class OursLoaded:
    """Our op's session, device and (symbolic N, K) compiled graph, loaded before the rows so
    that the compile can overlap the torch part."""

    def __init__(self, device_kind: str) -> None:
        from max.driver import CPU, Accelerator
        from max.dtype import DType
        from max.engine import InferenceSession
        from max.graph import DeviceRef

        self.gpu = device_kind == "gpu"
        self.dev = Accelerator() if self.gpu else CPU()
        self.ref_dev = DeviceRef.GPU() if self.gpu else DeviceRef.CPU()
        self.copies = R if self.gpu else 1
        self.session = InferenceSession(devices=[CPU(), self.dev] if self.gpu else [CPU()])
        self.static = self.gpu and STATIC
        self.model: Any = None
        if not self.static:
            t0 = time.perf_counter()
            self.model = self.session.load(ours_graph(self.ref_dev, DType.bfloat16, self.copies))
            print(f"ours: compiled in {time.perf_counter() - t0:.1f}s", flush=True)


def run_ours(rows: dict[tuple[str, int], dict[str, Any]], loaded: OursLoaded,
             layers: dict[str, tuple[int, int]], m_values: tuple[int, ...],
             skipped: list[str] | None = None) -> None:
    """Times our op for every layer and M into `rows`; checks every M vs float64. On the GPU,
    rows left when the budget (less RECORD_RESERVE_S) is spent are skipped into `skipped`."""
    from max.dtype import DType

    from mojo_gemm.core.host import numpy_dtype, to_buffer, to_numpy
    from mojo_gemm.int4.layout import permute_group_params, unpack_codes
    from mojo_gemm.int4.plan import int4_gpu_plan

    gpu, dev, copies, model = loaded.gpu, loaded.dev, loaded.copies, loaded.model
    sync = dev.synchronize if gpu else None
    rng = np.random.default_rng(0)
    for name, (n, k) in layers.items():
        if gpu and time.perf_counter() - T0 > BUDGET_S - RECORD_RESERVE_S:
            if skipped is not None:
                skipped.append(f"ours {name}: all M (budget)")
            continue
        if loaded.static:
            t0 = time.perf_counter()
            model = loaded.session.load(ours_graph(loaded.ref_dev, DType.bfloat16, copies, (n, k)))
            print(f"ours {name} (static N, K): compiled in {time.perf_counter() - t0:.1f}s",
                  flush=True)
        # Random packed words are valid weights (any nibble is a code): no host quantization
        # of GB-sized matrices. Scales are rounded to bf16 as the op sees them.
        qweight = rng.integers(0, 1 << 32, (n // 64, k * 8), dtype=np.uint32)
        scales = rng.uniform(0.002, 0.02, (k // GROUP, n)).astype(numpy_dtype(DType.bfloat16))
        stored_scales = permute_group_params(scales.astype(np.float32))
        bands = np.sort(rng.choice(n // 64, min(4, n // 64), replace=False))
        cols = (bands[:, None] * 64 + np.arange(64)).ravel()
        codes = unpack_codes(qweight[bands]).astype(np.float64)  # [len(cols), k]
        w_cols = (codes - 8.0) * np.repeat(scales[:, cols].astype(np.float64), GROUP, axis=0).T
        nw = harness.weight_copies(weight_bytes(n, k)) if gpu else 1
        q = [to_device(qweight, dev) for _ in range(nw)]
        s = [to_buffer(stored_scales, DType.bfloat16).to(dev) for _ in range(nw)]
        del qweight
        for m in m_values:
            if gpu and time.perf_counter() - T0 > BUDGET_S - RECORD_RESERVE_S:
                if skipped is not None:
                    skipped.append(f"ours {name} M={m} (budget)")
                continue
            x_host = rng.standard_normal((m, k), dtype=np.float32)
            xs = [to_buffer(x_host, DType.bfloat16).to(dev) for _ in range(copies)]
            args = [*xs, *(q[i % nw] for i in range(copies)), *(s[i % nw] for i in range(copies))]
            # check every M on 4 random 64-column bands and up to 64 rows vs float64
            got = to_numpy(model.execute(*args)[0])[:64][:, cols].astype(np.float64)
            x64 = x_host[:64].astype(numpy_dtype(DType.bfloat16)).astype(np.float64)
            ref = x64 @ w_cols.T
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            if not err <= 1e-2:
                raise SystemExit(f"ours is wrong on {name} M={m}: rel err {err}")
            sec = harness.time_max_model(model, args, copies, sync)
            row = rows.setdefault((name, m), {"layer": name, "M": m})
            row.update(N=n, K=k, check_rel_err=err, ours_us=sec * 1e6,
                       TBps=weight_bytes(n, k) / sec / 1e12,
                       TFLOPs=2 * m * n * k / sec / 1e12, GFLOPs=2 * m * n * k / sec / 1e9)
            if gpu:
                assert sync is not None
                row["host_us"] = harness.time_max_host(model, args, copies, sync) * 1e6
                row["config"] = int4_gpu_plan(m, n, k, GROUP)
                # every M: issue 19 compares kernel clocks (humming and cuBLAS by do_bench):
                # the trace of the captured replay where one runs (the graph as a server
                # runs it), else of one execute
                union = harness.trace_kernel_union_us(model, args, sync)
                row["exec_kernel_us"] = union / copies if union else None
                row["kernel_us"] = row["exec_kernel_us"]
                if replay_wanted(m):
                    replay_us, replay_kernel = harness.try_replay_traced(
                        f"ours {name} M={m}", model, args, copies, dev)
                    if replay_us is not None:
                        row["replay_us"] = replay_us
                    if replay_kernel is not None:
                        row["kernel_us"] = replay_kernel
            print("ours", row, flush=True)


class FloorLoaded:
    """The graph-floor graph (R negates of a [1, k] bf16 tensor), compiled, with its inputs."""

    def __init__(self, k: int = 4096) -> None:
        from max.driver import Accelerator
        from max.dtype import DType
        from max.engine import InferenceSession
        from max.graph import DeviceRef, Graph, TensorType, ops

        from mojo_gemm.core.host import to_buffer

        self.acc, gpu = Accelerator(), DeviceRef.GPU()
        with Graph("graph_floor", input_types=[TensorType(DType.bfloat16, [1, k], gpu)] * R) as g:
            g.output(*[ops.negate(v.tensor) for v in g.inputs])
        self.model = InferenceSession(devices=[self.acc]).load(g)
        self.xs = [to_buffer(np.ones((1, k), np.float32), DType.bfloat16).to(self.acc)
                   for _ in range(R)]


def graph_floor(loaded: FloorLoaded) -> dict[str, float]:
    """Per-op time of the cheapest op MAX can run (negate of a [1, k] bf16 tensor) in a graph of
    R such ops, by the same method: the runtime's own per-op cost, which no op can go below."""
    model, xs, sync = loaded.model, loaded.xs, loaded.acc.synchronize
    floor = {"negate_us": harness.time_max_model(model, xs, R, sync) * 1e6,
             "negate_host_us": harness.time_max_host(model, xs, R, sync) * 1e6}
    print("graph floor", floor, flush=True)
    return floor


def to_device(array: np.ndarray, dev: Any) -> Any:
    """A device Buffer holding a numpy array."""
    from max.driver import Buffer

    return Buffer.from_numpy(np.ascontiguousarray(array)).to(dev)


def run_max_builtin(rows: dict[tuple[str, int], dict[str, Any]],
                    layers: dict[str, tuple[int, int]], m_values: tuple[int, ...],
                    skipped: list[str]) -> None:
    """MAX 26.7's qmatmul_b4_g128 (after its repack), per layer (static N, K), at m_values; a
    layer is skipped (into `skipped`) when less than a minute of the budget is left."""
    from max.driver import Accelerator
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    from mojo_gemm.core.host import to_buffer

    gpu, acc = DeviceRef.GPU(), Accelerator()
    session = InferenceSession(devices=[acc])
    rng = np.random.default_rng(1)
    for name, (n, k) in layers.items():
        if time.perf_counter() - T0 > BUDGET_S - 60:
            print(f"max {name}: skipped (benchmark budget {BUDGET_S:.0f}s spent)", flush=True)
            skipped.append(f"max {name}: all M (budget)")
            continue
        kp = k // 2 + 2 * k // GROUP
        try:
            t0 = time.perf_counter()
            raw_type = TensorType(DType.uint8, [kp, n], gpu)
            with Graph(f"max_repack_{n}_{k}", input_types=[raw_type]) as g:
                g.output(ops.custom("GPTQ_gpu_repack_b4_g128", gpu, [g.inputs[0].tensor],
                                    out_types=[TensorType(DType.uint8, [n, kp], gpu)])[0].tensor)
            repack = session.load(g)
            types = [TensorType(DType.bfloat16, ["m", k], gpu)] * R
            types += [TensorType(DType.uint8, [n, kp], gpu)] * R
            with Graph(f"max_qmm_{n}_{k}", input_types=types) as g:
                vals = [v.tensor for v in g.inputs]
                g.output(*[ops.custom("qmatmul_b4_g128", gpu, [x, w],
                                      out_types=[TensorType(DType.bfloat16, [x.shape[0], n], gpu)]
                                      )[0].tensor for x, w in zip(vals[:R], vals[R:], strict=True)])
            model = session.load(g)
            print(f"max {name}: compiled in {time.perf_counter() - t0:.1f}s", flush=True)
        except Exception as e:  # report and continue: MAX's kernel is a contender, not ours
            print(f"max {name}: failed: {e!r}"[:500], flush=True)
            skipped.append(f"max {name}: failed to build")
            continue
        nw = harness.weight_copies(weight_bytes(n, k))
        raw = rng.integers(0, 256, (kp, n), dtype=np.uint8)
        raw[k // 2:] = np.frombuffer(
            rng.uniform(0.002, 0.02, (2 * k // GROUP) * n // 2).astype(np.float16).tobytes(),
            np.uint8).reshape(-1, n)
        packed = [repack.execute(to_device(raw, acc))[0] for _ in range(nw)]
        for m in m_values:
            xs = [to_buffer(rng.standard_normal((m, k), dtype=np.float32), DType.bfloat16).to(acc)
                  for _ in range(R)]
            args = [*xs, *(packed[i % nw] for i in range(R))]
            sec = harness.time_max_model(model, args, R, acc.synchronize)
            row = rows.setdefault((name, m), {"layer": name, "M": m, "N": n, "K": k})
            row["max_us"] = sec * 1e6
            row["max_host_us"] = harness.time_max_host(model, args, R, acc.synchronize) * 1e6
            if m <= MAX_TRACE_MAX_M:  # every kernel of this graph is MAX's qmatmul
                union = harness.trace_kernel_union_us(model, args, acc.synchronize, "")
                row["max_kernel_us"] = union / R if union else None
            if replay_wanted(m):
                row["max_replay_us"] = harness.try_us(f"max {name} M={m}",
                                                      harness.time_max_replay, model, args, R,
                                                      acc)
            print("max", name, m, f"{sec * 1e6:.1f}us", flush=True)


def geomean(values: list[float]) -> float:
    """Geometric mean of positive values (nan when empty)."""
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def torch_deadline_s(p: dict[str, Any]) -> float:
    """Seconds from T0 the torch part may use: the budget less our rows' estimate (so they keep
    their time), or its share of the budget in proportion to the estimates when both do not
    fit; MAX's own kernel gets what is left after both."""
    est = p["estimate_s"]
    usable = BUDGET_S - RECORD_RESERVE_S
    share = usable * est["torch"] / max(est["torch"] + est["ours"], 1.0)
    return max(usable - est["ours"], share)


def start_torch_part(cfg: dict[str, Any], out_json: Path) -> subprocess.Popen[bytes]:
    """The torch part in a subprocess (torch and MAX in one process interfere; its rows are
    kept even when it dies), its configuration passed in a JSON file next to its output."""
    cfg_path = out_json.with_suffix(".cfg.json")
    cfg_path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, __file__, "--torch-part", str(out_json),
                             "--torch-config", str(cfg_path)])


def main() -> None:
    """Runs the contenders for the chosen device and records the table."""
    from max.driver import accelerator_count

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "gpu"],
                        default="gpu" if accelerator_count() > 0 else "cpu")
    parser.add_argument("--shapes", choices=sorted(SHAPE_SETS), default="public",
                        help="public: the layers of MODELS (default); llama: the 8 of LAYERS")
    parser.add_argument("--layers", default=os.environ.get("BENCH_LAYERS"),
                        help="comma-separated layer names or model prefixes (e.g. 3B,405B.o)")
    parser.add_argument("--m", default=os.environ.get("BENCH_M"),
                        help=f"comma-separated M values (default {M_VALUES})")
    parser.add_argument("--skip-humming", action="store_true", help="no humming-kernels rows")
    parser.add_argument("--skip-max", action="store_true", help="no MAX qmatmul_b4_g128 rows")
    parser.add_argument("--no-overlap", action="store_true",
                        help="compile our graphs after the torch part, not while it runs")
    parser.add_argument("--estimate", action="store_true",
                        help="print the time plan of this run and exit")
    parser.add_argument("--prepare-humming", action="store_true",
                        help="only compile humming's kernels for these layers and M into its "
                             "cache (benchmarks/out/humming), for a later run on this machine")
    parser.add_argument("--torch-part", help=argparse.SUPPRESS)
    parser.add_argument("--torch-config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_part:
        torch_part(args.torch_part, json.loads(Path(args.torch_config).read_text()))
        return
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    if args.device == "cpu":
        run_ours(rows, OursLoaded("cpu"), {"4096x4096": (4096, 4096)}, (1, 16, 128, 512))
        harness.record("int4_matmul_cpu", list(rows.values()),
                       ["layer", "M", "N", "K", "ours_us", "GFLOPs"],
                       method=f"MAX CPU graph, {os.cpu_count()} cores, median of execute times, "
                              "bf16, g=128, symmetric")
        return
    layers = select_layers(args.shapes, args.layers)
    m_values = parse_m(args.m)
    only_max = os.environ.get("BENCH_MAX_LAYERS")  # MAX compiles per layer (~40 s): pick some
    max_layers = {} if args.skip_max else {
        name: nk for name, nk in layers.items()
        if name in LAYERS and (not only_max or name in only_max.split(","))}
    torch_on = os.environ.get("BENCH_SKIP_TORCH") != "1"
    humming_on = torch_on and not args.skip_humming
    p = plan(layers, m_values, BUDGET_S, humming=humming_on, torch_part=torch_on,
             max_layers=len(max_layers))
    PLAN.update(p)
    print(f"plan ({len(layers)} layers x {len(m_values)} M, budget {BUDGET_S:.0f}s): estimate "
          f"{p['estimate_s']}; dropped: {p['dropped'] or 'nothing'}"
          + ("" if p["fits"] else "; over the budget even so: rows left at its end are "
             "skipped (subset with --m / --layers)"), flush=True)
    if args.estimate:
        return
    skipped: list[str] = []
    if not p["max_builtin"]:
        skipped += [f"max {name}: all M (plan)" for name in max_layers]
        max_layers = {}
    harness.OUT_DIR.mkdir(parents=True, exist_ok=True)
    torch_json = harness.OUT_DIR / "int4_torch_part.json"
    torch_json.unlink(missing_ok=True)
    proc = None
    if torch_on:
        cfg = {"layers": layers, "m": list(m_values), "humming": humming_on,
               "graph_big_m": p["graph_big_m"], "int4pack_big_m": p["int4pack_big_m"],
               "deadline": time.time() + torch_deadline_s(p) - (time.perf_counter() - T0),
               "work": str(harness.OUT_DIR / "humming")}
        if args.prepare_humming:
            cfg["prepare_only"] = True
        proc = start_torch_part(cfg, torch_json)
        if args.no_overlap or args.prepare_humming:
            proc.wait()
    if args.prepare_humming:
        print(f"humming prepared: {json.loads(torch_json.read_text())['humming']}"
              if torch_json.exists() else "humming: nothing prepared", flush=True)
        return
    # MAX's compiles (CPU) overlap the torch part; our timing starts once it has finished
    floor_loaded = FloorLoaded()
    ours_loaded = OursLoaded("gpu")
    if proc is not None:
        try:  # a row past the deadline ends within a few seconds; humming's compiles cannot
            proc.wait(timeout=max(torch_deadline_s(p) - (time.perf_counter() - T0), 0) + 120)
        except subprocess.TimeoutExpired:
            print("torch part: past its deadline, stopped (its rows so far are kept)", flush=True)
            proc.kill()
            proc.wait()
        if proc.returncode != 0:
            print(f"torch part: exit code {proc.returncode} (its rows so far are kept)",
                  flush=True)
    humming_info: dict[str, Any] = {}
    if torch_json.exists():
        part = json.loads(torch_json.read_text())
        for r in part["rows"]:
            rows.setdefault((r["layer"], r["M"]), {}).update(r)
        skipped += part["skipped"]
        humming_info = part["humming"]
    floor = graph_floor(floor_loaded)
    run_ours(rows, ours_loaded, layers, m_values, skipped)
    run_max_builtin(rows, max_layers, m_values, skipped)
    for r in rows.values():
        add_ratios(r)
    row_list = [r for r in rows.values() if r.get("layer") in layers]
    summary = summarize(row_list, m_values, layers)
    summary_llama = summarize(row_list, m_values, {n: v for n, v in layers.items() if n in LAYERS})
    print(json.dumps(summary, indent=1))
    bars = bar_lines(row_list) + bar_lines_19(row_list)
    print("\n".join(bars), flush=True)
    if skipped:
        print("skipped: " + "; ".join(skipped), flush=True)
    hm_failed = sorted({r["layer"] for r in row_list if r.get("humming_fail")})
    ours_dims = ("static N, K: one graph per layer" if STATIC
                 else "symbolic N, K: one graph for all layers")
    harness.record(
        "int4_matmul_gpu", row_list,
        ["layer", "M", "ours_us", "replay_us", "host_us", "kernel_us", "exec_kernel_us", "TBps",
         "TFLOPs",
         "cublas_us", "cublas_graph_us", "humming_us", "x_humming_kernel", "x_cublas_replay",
         "x_cublas", "x_cublas_kernel", "int4pack_us", "int4pack_graph_us", "max_us",
         "max_replay_us", "max_host_us", "max_kernel_us", "x_max_replay", "x_max",
         "x_max_kernel", "humming_err", "config"],
        method=f"shapes: {args.shapes} ({len(layers)} layers, N, K from MODELS' configs); ours "
               f"({ours_dims}) and MAX (static N, K): graph of R={R} ops on distinct x, "
               "rotated weight copies; ours_us / max_us: median (execute+sync)/R; replay_us / "
               "max_replay_us: the same graph captured once (Model.capture), median "
               f"(replay+sync)/R over {harness.REPLAY_REPS} replays (M >= {REPLAY_BIG_M}: "
               "only where the plan and budget allow); host_us: execute alone / R; kernel_us "
               "(every M): our kernels' time (union of their CUPTI-traced intervals) in one "
               "replay of the captured graph / R where replay_us is timed, else = "
               "exec_kernel_us; exec_kernel_us / max_kernel_us (M <= "
               f"{MAX_TRACE_MAX_M}): kernel time (union of intervals) of one execute / R "
               "(CUPTI trace); torch "
               "cublas_us / int4pack_us (Llama layers) / humming_us: do_bench median, L2 "
               f"flushed; humming: humming-kernels {humming_info.get('version')} (int4 "
               "symmetric, group 128, bf16 activations; quantized by its own quantizer; its "
               "heuristic config per M; calls rotate weight copies where they fit in L2); "
               "humming_err: rel. Frobenius error vs cuBLAS on humming's dequantized weight "
               f"(<= {HUMMING_CHECK_TOL} or the row records humming_fail); "
               "cublas_graph_us / int4pack_graph_us: the same R calls (distinct x, rotated "
               "weight copies) in one torch.cuda.CUDAGraph, median (replay+sync)/R. Ratios "
               "(> 1: ours faster): x_humming_kernel = humming_us / kernel_us, x_cublas_replay "
               "= cublas_graph_us / replay_us (issue 18's headline, captured vs captured), "
               "x_max_replay = max_replay_us / replay_us, x_cublas = cublas_us / ours_us, "
               "x_max = max_us / ours_us, x_cublas_kernel = cublas_us / kernel_us, "
               "x_max_kernel = max_kernel_us / kernel_us; bf16, g=128, symmetric; "
               f"graph floor (R negates of [1, 4096]): {floor}",
        extra={"summary": summary, "summary_llama": summary_llama, "bars": bars,
               "graph_floor": floor, "plan": p, "skipped": skipped, "humming": humming_info,
               "models": MODELS, "wall_s": time.perf_counter() - T0},
        notes_md="Bars (issue 18: captured vs captured over the 8 Llama layers; issue 19: "
                 "kernel clock over the public layers):\n\n"
                 + "\n".join(f"- {b}" for b in bars)
                 + (f"\n\nhumming failed on: {', '.join(hm_failed)} (see humming_fail)"
                    if hm_failed else "")
                 + (f"\n\nPlan dropped: {'; '.join(p['dropped'])}." if p["dropped"] else "")
                 + (f"\n\nSkipped: {'; '.join(skipped)}." if skipped else ""),
    )


RATIOS = {  # ratio: (numerator, denominator); > 1: ours is faster
    "x_humming_kernel": ("humming_us", "kernel_us"),
    "x_cublas_replay": ("cublas_graph_us", "replay_us"),
    "x_max_replay": ("max_replay_us", "replay_us"),
    "x_cublas": ("cublas_us", "ours_us"),
    "x_max": ("max_us", "ours_us"),
    "x_cublas_kernel": ("cublas_us", "kernel_us"),
    "x_max_kernel": ("max_kernel_us", "kernel_us"),
}
BAR_X_CUBLAS_REPLAY = 2.0
"""Issue 18: geomean over the 8 Llama layers of x_cublas_replay at M = 1 and at M = 16."""
BARS_19_HUMMING = {1: 1.10, 16: 1.10, 64: 1.05, 128: 1.05, 256: 1.0, 1024: 1.0, 4096: 1.0}
"""Issue 19: geomean over the public layers of x_humming_kernel (humming_us / kernel_us) >= this
at each M."""
BARS_19_CUBLAS = {4096: 1.0}
"""Issue 19: geomean over the public layers of x_cublas_kernel (cublas_us / kernel_us)."""
MAX_TRACE_MAX_M = 128
"""MAX's own kernel: kernel-only times (CUPTI) at M <= this, where its graph's per-op cost
matters."""


def add_ratios(row: dict[str, Any]) -> None:
    """Sets every ratio of RATIOS whose two times the row has (a None time: no ratio); no
    humming ratio where humming's check failed."""
    for name, (num, den) in RATIOS.items():
        if num == "humming_us" and row.get("humming_fail"):
            continue
        if row.get(num) and row.get(den):
            row[name] = row[num] / row[den]


def summarize(rows: list[dict[str, Any]], m_values: Iterable[int],
              layers: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per M: the geomean of every ratio of RATIOS over the rows of `layers`, and how many
    layers gave each (n_<ratio>)."""
    out: dict[str, dict[str, float]] = {}
    for m in m_values:
        mine = [r for r in rows if r.get("M") == m and r.get("layer") in layers]
        entry: dict[str, float] = {}
        for x in RATIOS:
            vals = [r[x] for r in mine if r.get(x)]
            entry[f"geomean_{x}"] = geomean(vals)
            entry[f"n_{x}"] = len(vals)
        out[f"M={m}"] = entry
    return out


def _bar(label: str, rows: list[dict[str, Any]], ratio: str, m: int, bar: float,
         layers: dict[str, Any], set_name: str) -> str:
    """One "bar: ... met/missed" line: met only when every layer of `layers` has the ratio at
    this M and their geomean reaches `bar`."""
    vals = [r[ratio] for r in rows if r.get("M") == m and r.get(ratio) and r.get("layer") in layers]
    geo = geomean(vals)
    ok = len(vals) == len(layers) and geo >= bar
    note = "" if len(vals) == len(layers) else f", only {len(vals)} of {len(layers)} layers"
    return (f"bar: {label} M={m} geomean {ratio} over the {set_name} layers {geo:.2f} >= {bar} "
            f"{'met' if ok else 'missed'}{note}")


def bar_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One "bar: ... met/missed" line per bar of issue 18 on this benchmark (M = 1, 16), over
    the 8 Llama layers whatever the shape set."""
    return [_bar("int4", rows, "x_cublas_replay", m, BAR_X_CUBLAS_REPLAY, LAYERS, "Llama")
            .replace("x_cublas_replay", "x_cublas_replay (cublas_graph_us / replay_us)")
            for m in (1, 16)]


def bar_lines_19(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 19's bars over the public layers (kernel clock vs do_bench): x_humming_kernel at
    every M of BARS_19_HUMMING, x_cublas_kernel at M = 4096."""
    lines = [_bar("issue19 int4", rows, "x_humming_kernel", m, bar, PUBLIC_LAYERS, "public")
             for m, bar in BARS_19_HUMMING.items()]
    lines += [_bar("issue19 int4", rows, "x_cublas_kernel", m, bar, PUBLIC_LAYERS, "public")
              for m, bar in BARS_19_CUBLAS.items()]
    return lines


if __name__ == "__main__":
    main()

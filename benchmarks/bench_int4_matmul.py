"""W4A16 benchmark: our `multistage_gemm_q` vs cuBLAS bf16, torch int4 and MAX's own GPTQ kernel.

    python benchmarks/bench_int4_matmul.py              # GPU when present, else the CPU table
    python benchmarks/bench_int4_matmul.py --device cpu # CPU GFLOP/s (N = K = 4096, g = 128)

Method (harness.py): our op and MAX's kernel run as MAX graphs applying the op R times to R
distinct activations, rotating weight copies so L2 does not serve them (median of
(execute + synchronize) / R); torch contenders use do_bench with L2 flushed, in a subprocess.
Captured (the headline, as a MAX server runs decode): `replay_us` is the same graph captured
once (`Model.capture`) and replayed, median (replay + synchronize) / R; `cublas_graph_us` is
the same R cuBLAS calls (distinct x, rotated weight copies) in one torch.cuda.CUDAGraph, timed
the same way; issue 18's bar (geomean x_cublas_replay over the 8 layers >= 2.0 at M = 1 and
16) is printed as "bar: ... met/missed" lines.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

LAYERS = {  # (N, K) of the Llama-3 8B and 70B linear layers
    "8B.qkv": (6144, 4096), "8B.o": (4096, 4096), "8B.gate_up": (28672, 4096),
    "8B.down": (4096, 14336), "70B.qkv": (10240, 8192), "70B.o": (8192, 8192),
    "70B.gate_up": (57344, 8192), "70B.down": (8192, 28672),
}
M_VALUES = (1, 16, 64, 128, 256, 1024, 4096)
GROUP = 128
R = 16  # op copies per timed graph (distinct activations, rotated weights)
TRACE_MAX_M = 128  # kernel-only times (CUPTI) where the graph's per-op cost matters
T0 = time.perf_counter()
BUDGET_S = float(os.environ.get("BENCH_BUDGET_S", "480"))
STATIC = os.environ.get("BENCH_STATIC") == "1"  # our op's graph per layer with static N, K
"""Wall-clock budget: MAX's own kernel (a compile per layer) is skipped for the layers left
when less than a minute of it remains; the skipped layers are printed and recorded."""
REPLAY_BIG_M = 1024
REPLAY_BIG_NEED_S = 180.0
"""Rows at M >= REPLAY_BIG_M get a captured time only while this much of the budget is left."""


def replay_wanted(m: int) -> bool:
    """Whether a row gets its captured time: always below REPLAY_BIG_M; at M >= REPLAY_BIG_M
    (compute-bound, where a replay of 16 ops takes up to ~0.1 s) only while REPLAY_BIG_NEED_S
    of the budget is left, so the later rows and MAX's kernel keep their time."""
    return m < REPLAY_BIG_M or time.perf_counter() - T0 < BUDGET_S - REPLAY_BIG_NEED_S


def weight_bytes(n: int, k: int) -> int:
    """Bytes of the packed int4 weight and its bf16 scales."""
    return n * k // 2 + 2 * n * (k // GROUP)


# ---------------------------------------------------------------- torch contenders (subprocess)
def torch_part(out_path: str) -> None:
    """cuBLAS bf16 and torch._weight_int4pack_mm per layer and M, each by do_bench and captured
    (R calls on distinct x, rotated weight copies, one CUDA graph); writes JSON to out_path
    after every row (a crash later keeps the rows so far)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    dev = torch.device("cuda")
    rows = []
    for name, (n, k) in LAYERS.items():
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        ws = [w] + [w.clone() for _ in range(harness.weight_copies(2 * n * k) - 1)]
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
        for m in M_VALUES:
            xs = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(R)]
            x = xs[0]
            row = {"layer": name, "M": m,
                   "cublas_us": harness.torch_do_bench(lambda x=x, w=w: x @ w.t()) * 1e6}
            calls = [lambda x=x, w=w: x @ w.t() for x, w in zip(xs, itertools.cycle(ws))]
            row["cublas_graph_us"] = harness.try_us(f"torch cuBLAS {name} M={m}",
                                                    harness.torch_graph_seconds, calls)
            if wq is not None:
                row["int4pack_us"] = harness.torch_do_bench(
                    lambda x=x, wq=wq, sz=sz: torch._weight_int4pack_mm(x, wq, GROUP, sz)) * 1e6
                calls = [lambda x=x, q=q: torch._weight_int4pack_mm(x, q[0], GROUP, q[1])
                         for x, q in zip(xs, itertools.cycle(wqs))]
                row["int4pack_graph_us"] = harness.try_us(f"torch int4pack {name} M={m}",
                                                          harness.torch_graph_seconds, calls)
            rows.append(row)
            print("torch", row, flush=True)
            Path(out_path).write_text(json.dumps(rows))
        del w, ws, wq, wqs
        torch.cuda.empty_cache()
    Path(out_path).write_text(json.dumps(rows))


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


def run_ours(rows: dict[tuple[str, int], dict[str, Any]], device_kind: str,
             layers: dict[str, tuple[int, int]], m_values: tuple[int, ...]) -> None:
    """Times our op for every layer and M into `rows`; checks one M per layer vs float64."""
    from max.driver import CPU, Accelerator
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef

    from mojo_gemm.core.host import numpy_dtype, to_buffer, to_numpy
    from mojo_gemm.int4.layout import permute_group_params, unpack_codes
    from mojo_gemm.int4.plan import int4_gpu_plan

    gpu = device_kind == "gpu"
    dev = Accelerator() if gpu else CPU()
    ref_dev = DeviceRef.GPU() if gpu else DeviceRef.CPU()
    copies = R if gpu else 1
    session = InferenceSession(devices=[CPU(), dev] if gpu else [CPU()])
    static = gpu and STATIC
    model = None
    if not static:
        t0 = time.perf_counter()
        model = session.load(ours_graph(ref_dev, DType.bfloat16, copies))
        print(f"ours: compiled in {time.perf_counter() - t0:.1f}s", flush=True)
    sync = dev.synchronize if gpu else None
    rng = np.random.default_rng(0)
    for name, (n, k) in layers.items():
        if static:
            t0 = time.perf_counter()
            model = session.load(ours_graph(ref_dev, DType.bfloat16, copies, (n, k)))
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
            x_host = rng.standard_normal((m, k), dtype=np.float32)
            xs = [to_buffer(x_host, DType.bfloat16).to(dev) for _ in range(copies)]
            args = [*xs, *(q[i % nw] for i in range(copies)), *(s[i % nw] for i in range(copies))]
            # check every M on 4 random 64-column bands and up to 64 rows vs float64
            got = to_numpy(model.execute(*args)[0]).astype(np.float64)[:64, cols]
            x64 = x_host[:64].astype(numpy_dtype(DType.bfloat16)).astype(np.float64)
            ref = x64 @ w_cols.T
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            if not err <= 1e-2:
                raise SystemExit(f"ours is wrong on {name} M={m}: rel err {err}")
            sec = harness.time_max_model(model, args, copies, sync)
            row = rows.setdefault((name, m), {"layer": name, "M": m, "N": n, "K": k})
            row.update(check_rel_err=err, ours_us=sec * 1e6, TBps=weight_bytes(n, k) / sec / 1e12,
                       TFLOPs=2 * m * n * k / sec / 1e12, GFLOPs=2 * m * n * k / sec / 1e9)
            if gpu:
                row["host_us"] = harness.time_max_host(model, args, copies, sync) * 1e6
                row["config"] = int4_gpu_plan(m, n, k, GROUP)
                if m <= TRACE_MAX_M:
                    total = harness.trace_kernel_total_us(model, args, sync)
                    row["kernel_us"] = total / copies if total else None
                if replay_wanted(m):
                    row["replay_us"] = harness.try_us(f"ours {name} M={m}",
                                                      harness.time_max_replay, model, args,
                                                      copies, dev)
            print("ours", row, flush=True)


def graph_floor(k: int = 4096) -> dict[str, float]:
    """Per-op time of the cheapest op MAX can run (negate of a [1, k] bf16 tensor) in a graph of
    R such ops, by the same method: the runtime's own per-op cost, which no op can go below."""
    from max.driver import Accelerator
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    from mojo_gemm.core.host import to_buffer

    acc, gpu = Accelerator(), DeviceRef.GPU()
    with Graph("graph_floor", input_types=[TensorType(DType.bfloat16, [1, k], gpu)] * R) as g:
        g.output(*[ops.negate(v.tensor) for v in g.inputs])
    model = InferenceSession(devices=[acc]).load(g)
    xs = [to_buffer(np.ones((1, k), np.float32), DType.bfloat16).to(acc) for _ in range(R)]
    floor = {"negate_us": harness.time_max_model(model, xs, R, acc.synchronize) * 1e6,
             "negate_host_us": harness.time_max_host(model, xs, R, acc.synchronize) * 1e6}
    print("graph floor", floor, flush=True)
    return floor


def to_device(array: np.ndarray, dev: Any) -> Any:
    """A device Buffer holding a numpy array."""
    from max.driver import Buffer

    return Buffer.from_numpy(np.ascontiguousarray(array)).to(dev)


def run_max_builtin(rows: dict[tuple[str, int], dict[str, Any]], m_values: tuple[int, ...]) -> None:
    """MAX 26.7's qmatmul_b4_g128 (after its repack), per layer (static N, K), at m_values."""
    from max.driver import Accelerator
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    from mojo_gemm.core.host import to_buffer

    gpu, acc = DeviceRef.GPU(), Accelerator()
    session = InferenceSession(devices=[acc])
    rng = np.random.default_rng(1)
    only = os.environ.get("BENCH_MAX_LAYERS")  # MAX compiles per layer (~40 s): pick some
    for name, (n, k) in LAYERS.items():
        if only and name not in only.split(","):
            continue
        if time.perf_counter() - T0 > BUDGET_S - 60:
            print(f"max {name}: skipped (benchmark budget {BUDGET_S:.0f}s spent)", flush=True)
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
            if m <= TRACE_MAX_M:  # every kernel of this graph is MAX's qmatmul
                total = harness.trace_kernel_total_us(model, args, acc.synchronize, "")
                row["max_kernel_us"] = total / R if total else None
            if replay_wanted(m):
                row["max_replay_us"] = harness.try_us(f"max {name} M={m}",
                                                      harness.time_max_replay, model, args, R,
                                                      acc)
            print("max", name, m, f"{sec * 1e6:.1f}us", flush=True)


def geomean(values: list[float]) -> float:
    """Geometric mean of positive values (nan when empty)."""
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def main() -> None:
    """Runs the contenders for the chosen device and records the table."""
    from max.driver import accelerator_count

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=["cpu", "gpu"],
                        default="gpu" if accelerator_count() > 0 else "cpu")
    parser.add_argument("--torch-part", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_part:
        torch_part(args.torch_part)
        return
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    if args.device == "cpu":
        run_ours(rows, "cpu", {"4096x4096": (4096, 4096)}, (1, 16, 128, 512))
        harness.record("int4_matmul_cpu", list(rows.values()),
                       ["layer", "M", "N", "K", "ours_us", "GFLOPs"],
                       method=f"MAX CPU graph, {os.cpu_count()} cores, median of execute times, "
                              "bf16, g=128, symmetric")
        return
    torch_json = harness.OUT_DIR / "int4_torch_part.json"
    harness.OUT_DIR.mkdir(parents=True, exist_ok=True)
    torch_json.unlink(missing_ok=True)
    if os.environ.get("BENCH_SKIP_TORCH") != "1":
        proc = subprocess.run([sys.executable, __file__, "--torch-part", str(torch_json)],
                              check=False)
        if proc.returncode != 0:
            print(f"torch part: exit code {proc.returncode} (its rows so far are kept)",
                  flush=True)
    if torch_json.exists():
        for r in json.loads(torch_json.read_text()):
            rows.setdefault((r["layer"], r["M"]), {}).update(r)
    only = os.environ.get("BENCH_LAYERS")  # e.g. "8B.o,8B.gate_up": a quick partial run
    layers = {k: v for k, v in LAYERS.items() if not only or k in only.split(",")}
    m_values = tuple(int(v) for v in os.environ.get("BENCH_M", "").split(",") if v) or M_VALUES
    floor = graph_floor()
    run_ours(rows, "gpu", layers, m_values)
    run_max_builtin(rows, m_values)
    for r in rows.values():
        add_ratios(r)
    summary = {f"M={m}": {f"geomean_{x}": geomean([r[x] for r in rows.values()
                                                   if r["M"] == m and r.get(x)])
                          for x in RATIOS}
               for m in M_VALUES}
    print(json.dumps(summary, indent=1))
    bars = bar_lines(list(rows.values()))
    print("\n".join(bars), flush=True)
    ours_dims = ("static N, K: one graph per layer" if STATIC
                 else "symbolic N, K: one graph for all layers")
    harness.record(
        "int4_matmul_gpu", list(rows.values()),
        ["layer", "M", "ours_us", "replay_us", "host_us", "kernel_us", "TBps", "TFLOPs",
         "cublas_us", "cublas_graph_us", "x_cublas_replay", "x_cublas", "x_cublas_kernel",
         "int4pack_us", "int4pack_graph_us", "max_us", "max_replay_us", "max_host_us",
         "max_kernel_us", "x_max_replay", "x_max", "x_max_kernel", "config"],
        method=f"ours ({ours_dims}) and MAX (static N, K): graph of R={R} ops on distinct x, "
               "rotated weight copies; ours_us / max_us: median (execute+sync)/R; replay_us / "
               "max_replay_us: the same graph captured once (Model.capture), median "
               f"(replay+sync)/R over {harness.REPLAY_REPS} replays (M >= {REPLAY_BIG_M}: "
               "only while the budget allows); host_us: execute alone / R; kernel_us / "
               f"max_kernel_us (M <= {TRACE_MAX_M}): summed kernel time of one execute / R "
               "(CUPTI trace); torch cublas_us / int4pack_us: do_bench median, L2 flushed; "
               f"cublas_graph_us / int4pack_graph_us: the same R calls (distinct x, rotated "
               "weight copies) in one torch.cuda.CUDAGraph, median (replay+sync)/R. Ratios "
               "(> 1: ours faster): x_cublas_replay = cublas_graph_us / replay_us (headline, "
               "captured vs captured), x_max_replay = max_replay_us / replay_us, x_cublas = "
               "cublas_us / ours_us, x_max = max_us / ours_us, x_cublas_kernel = cublas_us / "
               "kernel_us, x_max_kernel = max_kernel_us / kernel_us; bf16, g=128, symmetric; "
               f"graph floor (R negates of [1, 4096]): {floor}",
        extra={"summary": summary, "bars": bars, "graph_floor": floor},
        notes_md="Bars (issue 18, captured vs captured):\n\n"
                 + "\n".join(f"- {b}" for b in bars),
    )


RATIOS = {  # ratio: (numerator, denominator); > 1: ours is faster
    "x_cublas_replay": ("cublas_graph_us", "replay_us"),
    "x_max_replay": ("max_replay_us", "replay_us"),
    "x_cublas": ("cublas_us", "ours_us"),
    "x_max": ("max_us", "ours_us"),
    "x_cublas_kernel": ("cublas_us", "kernel_us"),
    "x_max_kernel": ("max_kernel_us", "kernel_us"),
}
BAR_X_CUBLAS_REPLAY = 2.0
"""Issue 18: geomean over the 8 Llama layers of x_cublas_replay at M = 1 and at M = 16."""


def add_ratios(row: dict[str, Any]) -> None:
    """Sets every ratio of RATIOS whose two times the row has (a None time: no ratio)."""
    for name, (num, den) in RATIOS.items():
        if row.get(num) and row.get(den):
            row[name] = row[num] / row[den]


def bar_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One "bar: ... met/missed" line per bar of issue 18 on this benchmark (M = 1, 16)."""
    lines = []
    for m in (1, 16):
        vals = [r["x_cublas_replay"] for r in rows if r.get("M") == m and r.get("x_cublas_replay")]
        geo = geomean(vals)
        ok = len(vals) == len(LAYERS) and geo >= BAR_X_CUBLAS_REPLAY
        note = "" if len(vals) == len(LAYERS) else f", only {len(vals)} of {len(LAYERS)} layers"
        lines.append(f"bar: int4 M={m} geomean x_cublas_replay (cublas_graph_us / replay_us) "
                     f"over the Llama layers {geo:.2f} >= {BAR_X_CUBLAS_REPLAY} "
                     f"{'met' if ok else 'missed'}{note}")
    return lines

if __name__ == "__main__":
    main()

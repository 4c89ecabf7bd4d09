"""Forced kernel paths on one GPU: the Ampere and portable paths of each op vs its Hopper path.

    python benchmarks/bench_targets.py                     # H200: the table (<= ~150 s)
    python benchmarks/bench_targets.py --virtual-compile   # build + compile every graph for a
                                                           # virtual sm_90a device, run nothing

For orientation only (no bar): how much slower the paths that other GPUs get (Ampere / Ada:
mma.sync; AMD: the portable kernels) run than the Hopper path on the same H200.

- MOJO_GEMM_FORCE_PATH (`mojo_gemm.core.targets.FORCE_ENV`) becomes an op parameter when a graph
  is built: each path's graphs are built with it set ("ampere", "portable") or unset (hopper).
- One module per path, compiled once (three compiles in all), holding one graph per op with a
  symbolic row count, so every size of an op runs through the same compiled graph:
  int4 (`int4_matmul`, N = K = 4096, group 128, bf16, symmetric, M in INT4_M), grouped
  (`grouped_matmul`, 8 experts of N = K = 2048 bf16, T in GROUPED_T rows spread evenly over
  the experts) and the FP8 K-cache op (`k_matmul_ragged_paged_scale`, N = 1024, K = 4096,
  granularity (1, 128, 128), into a bf16 paged cache of page 128, T in KCACHE_T tokens in a
  ragged batch; the batch and cache helpers of bench_k_matmul_paged.py).
- kernel_us: the device time of our kernels (name containing "mojo_kernels"; the union of
  their intervals) in one execute of the op's one-op graph (CUPTI trace,
  harness.trace_kernel_union_us), after a warm execute (so weights below L2 may be served
  from it); all_kernels_us: every kernel of that execute. x_vs_hopper = kernel_us / Hopper's
  kernel_us (> 1: slower than Hopper).
- rel_err: rel. Frobenius error of the path's output against the Hopper path's output on the
  same inputs (int4, grouped: the output tensor; K-cache: the whole cache, zeroed before each
  execute). Tolerance 1e-2 (bf16), 2e-2 (the fp8 K-cache op); `ok` is "ref" on Hopper's rows,
  "ok" within it, "BROKEN" over it, "FAILED: ..." where the execute raised; any BROKEN or
  FAILED row makes the run exit 1 after recording. The Hopper path itself is
  checked against float64 by the test suite.

Env: BENCH_BUDGET_S (wall budget, default 150 s): a path starts only while COMPILE_NEED_S of it
(or the previous path's time, if more) is left, a row only while ROW_NEED_S is; skips are
printed and recorded in the JSON (portable, last, is the first to go).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_k_matmul_paged as kp

import harness

PATHS = ("hopper", "ampere", "portable")
"""Kernel paths, Hopper first (the reference of the ratios and checks)."""
INT4_NK = 4096
INT4_GROUP = 128
INT4_M = (1, 16, 256)
GROUPED_E = 8
GROUPED_NK = 2048
GROUPED_T = (64, 1024)
KCACHE = kp.Problem(8, 4096)
"""N = 8 · 128 = 1024, K = 4096."""
KCACHE_T = (16, 1024)
TOL = {"int4": 1e-2, "grouped": 1e-2, "kcache": 2e-2}
BUDGET = harness.Budget(150.0)
left, log, skip = BUDGET.left, BUDGET.log, BUDGET.skip
COMPILE_NEED_S = 30.0
"""A path (its module of three one-op graphs compiled, then its rows) starts only when this much
of the budget is left, or as much as the previous path took, if more."""
ROW_NEED_S = 3.0
"""A row (two executes, two CUPTI traces) starts only when this much of the budget is left."""





@contextlib.contextmanager
def forced(path: str) -> Iterator[None]:
    """MOJO_GEMM_FORCE_PATH set to `path` ("ampere", "portable"; unset for "hopper") inside the
    block, restored afterwards."""
    from mojo_gemm.core.targets import FORCE_ENV

    if path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    old = os.environ.pop(FORCE_ENV, None)
    if path != "hopper":
        os.environ[FORCE_ENV] = path
    try:
        yield
    finally:
        os.environ.pop(FORCE_ENV, None)
        if old is not None:
            os.environ[FORCE_ENV] = old


# ---------------------------------------------------------------- graphs
def int4_graph(module: Any, path: str, device: Any) -> Any:
    """y = x · dequant(W)ᵀ: x bf16 [m, 4096] (m symbolic), qweight uint32 [4096/64, 4096·8],
    scales bf16 [4096/128, 4096] (symmetric, no act-order); y bf16 [m, 4096]."""
    from max.dtype import DType
    from max.graph import Graph, TensorType

    from mojo_gemm import Int4WeightValues, int4_matmul

    n = k = INT4_NK
    types = [TensorType(DType.bfloat16, ["m", k], device),
             TensorType(DType.uint32, [n // 64, k * 8], device),
             TensorType(DType.bfloat16, [k // INT4_GROUP, n], device)]
    with Graph(f"targets_int4_{path}", input_types=types, module=module) as g:
        x, q, s = (v.tensor for v in g.inputs)
        g.output(int4_matmul(x, Int4WeightValues(q, s, None, None, n, k, INT4_GROUP)))
    return g


def grouped_graph(module: Any, path: str, device: Any) -> Any:
    """c = a · b[e]ᵀ per expert group: a bf16 [rows, 2048] (rows symbolic), b bf16
    [8, 2048, 2048], a_offsets uint32 [9], expert_ids int32 [8], expert_usage_stats uint32
    [2]; c bf16 [rows, 2048]."""
    from max.dtype import DType
    from max.graph import Graph, TensorType

    from mojo_gemm import grouped_matmul

    e, nk = GROUPED_E, GROUPED_NK
    types = [TensorType(DType.bfloat16, ["rows", nk], device),
             TensorType(DType.bfloat16, [e, nk, nk], device),
             TensorType(DType.uint32, [e + 1], device),
             TensorType(DType.int32, [e], device),
             TensorType(DType.uint32, [2], device)]
    with Graph(f"targets_grouped_{path}", input_types=types, module=module) as g:
        a, b, offs, ids, stats = (v.tensor for v in g.inputs)
        g.output(grouped_matmul(a, b, offs, ids, stats))
    return g


def path_graphs(module: Any, path: str, device: Any) -> dict[str, Any]:
    """The path's three one-op graphs in `module`, built with its forced path set:
    {"int4" | "grouped" | "kcache": Graph} (the K-cache graph is bench_k_matmul_paged's
    one-op, one-layer graph of ours with a bf16 cache)."""
    with forced(path):
        return {"int4": int4_graph(module, path, device),
                "grouped": grouped_graph(module, path, device),
                "kcache": kp.build_graph(module, "ours", KCACHE, "bf16", 1, 1, device)}


# ---------------------------------------------------------------- inputs (shared by every path)
@dataclass
class Call:
    """One (op, size): the graph's arguments and how to read its output as float64."""

    op: str
    size: str
    args: list[Any]
    pool: Any = None  # kp.Pool of a K-cache call (its cache is the output), else None


def make_calls(dev: Any, device: Any) -> list[Call]:
    """Random inputs of every (op, size), on `dev`; the same buffers serve every path."""
    from max.driver import Buffer
    from max.dtype import DType

    from mojo_gemm.core.host import to_buffer
    from mojo_gemm.int4.layout import permute_group_params

    staged: list[Any] = []  # host sources of the (possibly asynchronous) copies, kept to the sync

    def put(array: np.ndarray, dtype: DType | None = None) -> Any:
        host = Buffer.from_numpy(np.ascontiguousarray(array)) if dtype is None else to_buffer(
            array, dtype)
        staged.append(host)
        return host.to(dev)

    rng = np.random.default_rng(0)
    calls = []
    n = k = INT4_NK
    bf16 = DType.bfloat16
    # random packed words are valid weights (any nibble is a code)
    q = put(rng.integers(0, 1 << 32, (n // 64, k * 8), dtype=np.uint32))
    s = put(permute_group_params(rng.uniform(0.002, 0.02, (k // INT4_GROUP, n))), bf16)
    for m in INT4_M:
        calls.append(Call("int4", f"M={m}", [put(rng.standard_normal((m, k)), bf16), q, s]))
    e, nk = GROUPED_E, GROUPED_NK
    b = put(rng.standard_normal((e, nk, nk), dtype=np.float32) / np.sqrt(nk), bf16)
    ids = put(np.arange(e, dtype=np.int32))
    for t in GROUPED_T:
        a = put(rng.standard_normal((t, nk), dtype=np.float32), bf16)
        offs = put((np.arange(e + 1) * (t // e)).astype(np.uint32))
        stats = put(np.array([t // e, e], np.uint32))
        calls.append(Call("grouped", f"T={t}", [a, b, offs, ids, stats]))
    d = kp.problem_data(KCACHE, 1, rng, dev, device)
    pages = max(kp.make_batch(t).pages for t in KCACHE_T)
    for t in KCACHE_T:
        pool = kp.Pool(KCACHE, "bf16", pages, 1, dev, device)
        case = kp.make_case(d, "bf16", t, pool, 1, rng, dev)
        calls.append(Call("kcache", f"T={t}", case.args, pool))
    dev.synchronize()
    return calls


def run_call(model: Any, call: Call, dev: Any) -> np.ndarray:
    """Executes `call` once; its output as float64 (a K-cache call: the whole cache, zeroed
    first, so only the rows the op writes are non-zero)."""
    from max.driver import Buffer

    from mojo_gemm.core.host import to_numpy

    if call.pool is not None:
        slab = call.pool.slab
        zeros = Buffer.from_numpy(np.zeros(slab.shape[0], np.uint16))
        slab.inplace_copy_from(zeros)
        dev.synchronize()  # the copy may be asynchronous: `zeros` must outlive it
        del zeros
        model.execute(*call.args)
        dev.synchronize()
        return kp.cache_f64(to_numpy(slab), "bf16")
    out = model.execute(*call.args)[0]
    dev.synchronize()
    return to_numpy(out).astype(np.float64)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """Rel. Frobenius error of `got` against `want` (inf where `got` is not finite)."""
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


# ---------------------------------------------------------------- the run
def compile_path(session: Any, path: str, device: Any) -> dict[str, Any]:
    """Builds (forced path set) and compiles the path's module; {op: Model}."""
    from max.graph import Module

    from mojo_gemm import kernels_package

    module = Module()
    graphs = path_graphs(module, path, device)
    t0 = time.perf_counter()
    log(f"{path}: compiling {len(graphs)} graphs")
    compiled = session.compile(module, custom_extensions=[kernels_package()])
    log(f"{path}: compiled in {time.perf_counter() - t0:.1f}s")
    models = session.init_all(compiled)
    return {op: models[g.name] for op, g in graphs.items()}


def run_gpu() -> list[dict[str, Any]]:
    """Compiles each path and times every call through it; the rows of the table."""
    from max.driver import CPU, Accelerator
    from max.engine import InferenceSession
    from max.graph import DeviceRef

    dev = Accelerator()
    device = DeviceRef.GPU()
    session = InferenceSession(devices=[CPU(), dev])
    calls = make_calls(dev, device)
    log(f"inputs ready ({len(calls)} calls)")
    hopper_out: dict[tuple[str, str], np.ndarray] = {}
    hopper_us: dict[tuple[str, str], float] = {}
    rows = []
    need = COMPILE_NEED_S
    for path in PATHS:
        if left() < need:
            skip(f"{path}: skipped ({left():.0f}s of the budget left, {need:.0f}s needed)")
            continue
        started = time.perf_counter()
        try:
            models = compile_path(session, path, device)
        except Exception as e:  # one path failing to compile must not lose the others
            skip(f"{path}: compile failed: {e!r}"[:800])
            continue
        for call in calls:
            key = (call.op, call.size)
            if left() < ROW_NEED_S:
                skip(f"{path} {call.op} {call.size}: skipped ({left():.0f}s left)")
                continue
            row: dict[str, Any] = {"op": call.op, "size": call.size, "path": path}
            model = models[call.op]
            try:
                out = run_call(model, call, dev)
                row["kernel_us"] = harness.trace_kernel_union_us(model, call.args,
                                                                 dev.synchronize)
                row["all_kernels_us"] = harness.trace_kernel_union_us(model, call.args,
                                                                      dev.synchronize, "")
            except Exception as e:  # a broken path shows as a row, the run goes on
                row["ok"] = f"FAILED: {e!r}"[:200]
                rows.append(row)
                log(path, call.op, call.size, row["ok"])
                continue
            if path == "hopper":
                row["ok"] = "ref"
                hopper_out[key] = out
                if row["kernel_us"]:
                    hopper_us[key] = row["kernel_us"]
            elif key in hopper_out:
                row["rel_err"] = rel_err(out, hopper_out[key])
                row["ok"] = "ok" if row["rel_err"] <= TOL[call.op] else "BROKEN"
            if row.get("kernel_us") and key in hopper_us:
                row["x_vs_hopper"] = row["kernel_us"] / hopper_us[key]
            rows.append(row)
            log({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in row.items()})
        del models
        # the next path's compile and rows cost about what this one's did
        need = max(COMPILE_NEED_S, time.perf_counter() - started)
    return rows


def compile_virtual(arch: str) -> None:
    """Builds and compiles every path's module for a virtual `arch` device; runs nothing."""
    harness.use_virtual_cuda_device(arch)
    from max.driver import CPU, Accelerator
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Module

    from mojo_gemm import kernels_package

    session = InferenceSession(devices=[CPU(), Accelerator()])
    for path in PATHS:
        module = Module()
        graphs = path_graphs(module, path, DeviceRef.GPU())
        t0 = time.perf_counter()
        session.compile(module, custom_extensions=[kernels_package()])
        log(f"{path}: {len(graphs)} graphs compiled for {arch} in "
            f"{time.perf_counter() - t0:.1f}s")
    log("all GPU graphs compiled")


COLUMNS = ["op", "size", "path", "kernel_us", "x_vs_hopper", "rel_err", "ok", "all_kernels_us"]


def main() -> None:
    """Runs the GPU table, or the virtual-device compile with --virtual-compile."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--virtual-compile", action="store_true",
                        help="build and compile every graph for a virtual GPU, run nothing")
    parser.add_argument("--arch", default="sm_90a", help="the --virtual-compile target")
    args = parser.parse_args()
    if args.virtual_compile:
        compile_virtual(args.arch)
        os._exit(0)  # MAX 26.7 may abort in teardown after virtual-device compiles
    from max.driver import accelerator_count

    if accelerator_count() == 0:
        raise SystemExit("bench_targets: needs a GPU (or --virtual-compile)")
    log(f"bench_targets: budget {BUDGET.seconds:.0f}s")
    rows = run_gpu()
    broken = [f"{r['op']} {r['size']} {r['path']}" for r in rows
              if r.get("ok") not in (None, "ok", "ref")]
    harness.record(
        "targets_gpu", rows, COLUMNS,
        method="per path (hopper = the GPU's own path; ampere / portable forced through "
               "MOJO_GEMM_FORCE_PATH at graph build) one compiled module of one-op graphs with "
               "symbolic rows; kernel_us: device time of our kernels (union of intervals) in "
               "one execute "
               "(CUPTI trace, after a warm execute), all_kernels_us: every kernel of it; "
               "x_vs_hopper = kernel_us / Hopper's (> 1: slower); rel_err: rel. Frobenius vs "
               "the Hopper path's output on the same inputs (tol 1e-2, fp8 K-cache 2e-2; the "
               "K-cache op's output is its whole zeroed bf16 cache). int4: N = K = 4096, g 128, "
               "bf16; grouped: 8 experts N = K = 2048 bf16, rows spread evenly; K-cache: "
               "N = 1024, K = 4096, granularity (1, 128, 128), page 128. Orientation only.",
        extra={"skipped": BUDGET.skipped, "broken": broken,
               "elapsed_s": round(BUDGET.elapsed(), 1)},
        notes_md=("Skipped: " + "; ".join(BUDGET.skipped)) if BUDGET.skipped else "",
    )
    if broken:
        print("broken paths: " + ", ".join(broken), flush=True)
        raise SystemExit(1)
    log("done")


if __name__ == "__main__":
    main()

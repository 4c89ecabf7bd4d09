"""Shared benchmark harness: the timing method of every benchmark, JSON and tables.

- MAX graphs (our ops, MAX's built-ins): one graph applies the op R times to R distinct
  activation copies (MAX merges identical ops), rotating >= 4 weight copies when the weights
  are smaller than L2 (60 MB) so L2 does not serve them; median over runs of
  (execute + synchronize) / R, after warm-up. `call_us` is one op per graph, as a user sees it.
- torch contenders: `torch_do_bench`, triton's do_bench method (warmup=25, rep=100, median, L2
  flushed) with a GPU sleep before each flush where the host issues calls slower than the GPU
  runs them, so host launch latency stays out of the timed interval.
- In-graph kernel time: `trace_kernel_union_us`, the union of our kernels' intervals in a
  CUPTI trace of one execute (per op: divided by R).
- Captured time, as a MAX server sees it (it captures its decode graphs): `time_max_replay`
  captures the same R-op graph once as a device graph and times replay + synchronize / R;
  `torch_graph_seconds` captures the same R torch calls (distinct inputs, rotated weight
  copies) in one `torch.cuda.CUDAGraph` and times its replay the same way. The headline ratios
  compare these two. `try_us` wraps either so that a failure records None, never loses a row.
- Results: a JSON file per run under benchmarks/out/ (timestamped, git-ignored), the latest
  one also at benchmarks/results/<name>.json, and the markdown table in benchmarks/RESULTS.md,
  whose section of that benchmark is replaced (only the latest run of each is kept).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import functools
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

L2_BYTES = 60e6
"""H200 L2 size: weights below it are rotated over several copies."""
H200_BANDWIDTH = 4.24e12
"""Measured device-to-device copy bandwidth of the H200 (bytes/s, L2 flushed)."""
H200_BF16_FLOPS = 728e12
"""Measured cuBLAS bf16 8192³ rate (FLOP/s)."""
HBM_PEAK = {"H100": 3.35e12, "H200": 4.8e12}
"""Spec HBM bandwidth (bytes/s) of the cards the benchmarks are lent."""

BENCH_DIR = Path(__file__).resolve().parent
OUT_DIR = BENCH_DIR / "out"
LATEST_DIR = BENCH_DIR / "results"
RESULTS_MD = BENCH_DIR / "RESULTS.md"
REPLAY_REPS = 7
"""Timed replays per captured graph (after warm-up): the median of these is reported."""
_GRAPH_KEYS = itertools.count(1 << 20)
"""Device-graph keys of `time_max_replay`: a fresh one per capture, so no two captures of a
model (or of two models) in this process share a key."""


class Budget:
    """A benchmark's wall-clock budget (BENCH_BUDGET_S seconds, else `default_s`), its progress
    log and what it left out (recorded in the benchmark's JSON)."""

    def __init__(self, default_s: float) -> None:
        self.t0 = time.perf_counter()
        self.seconds = float(os.environ.get("BENCH_BUDGET_S", str(default_s)))
        self.skipped: list[str] = []

    def elapsed(self) -> float:
        """Seconds since the benchmark started."""
        return time.perf_counter() - self.t0

    def left(self) -> float:
        """Seconds of the budget left."""
        return self.seconds - self.elapsed()

    def log(self, *parts: object) -> None:
        """A progress line with the elapsed time."""
        print(f"[{self.elapsed():6.1f}s]", *parts, flush=True)

    def skip(self, what: str) -> None:
        """Logs and records something left out."""
        self.skipped.append(what)
        self.log(what)


def weight_copies(weight_bytes: float) -> int:
    """How many weight copies to rotate so repeated ops do not hit L2."""
    return 1 if weight_bytes >= L2_BYTES else max(4, int(2 * L2_BYTES // max(weight_bytes, 1)) + 1)


def median_seconds(fn: Callable[[], None], *, warmup: int = 2, reps: int = 7) -> float:
    """Median wall seconds of `fn` (which must synchronize itself) after `warmup` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def time_max_model(
    model: Any, args: Sequence[Any], copies: int, synchronize: Callable[[], None] | None
) -> float:
    """Seconds per op of a MAX model that applies the op `copies` times per execute."""

    def once() -> None:
        model.execute(*args)
        if synchronize is not None:
            synchronize()

    single = median_seconds(once, warmup=1, reps=1)
    reps = 7 if single < 0.5 else 3
    return median_seconds(once, warmup=1, reps=reps) / copies


def time_max_host(model: Any, args: Sequence[Any], copies: int,
                  synchronize: Callable[[], None]) -> float:
    """Host seconds per op of `model.execute` alone (the device is synchronized outside the
    timed region): when it is close to `time_max_model`, the graph is host-bound."""
    samples = []
    for _ in range(5):
        synchronize()
        t = time.perf_counter()
        model.execute(*args)
        samples.append(time.perf_counter() - t)
        synchronize()
    return statistics.median(samples) / copies


def trace_kernel_union_us(model: Any, args: Sequence[Any], synchronize: Callable[[], None],
                          name_part: str = "mojo_kernels") -> float | None:
    """Device time (µs) during which the kernels whose name contains `name_part` ("" = every
    kernel; memory copies and sets excluded) run in one execute of `model`, from a CUPTI trace:
    the union of their intervals. A kernel launched through programmatic dependent launch
    becomes resident before its predecessor ends and waits for it; a sum or a median of the
    kernels' own durations would count that wait twice (and report more than the graph's
    wall time), the union counts it once. Divided by the ops per graph it is the kernel time
    per op, also when an op launches several kernels. None when torch is missing, the trace
    fails or has no such kernel."""

    def once() -> None:
        model.execute(*args)
        synchronize()

    once()  # warm-up: the traced execute is not the first
    spans = _traced_spans(once, name_part)
    return _union_us(spans) if spans else None


def time_max_replay(model: Any, args: Sequence[Any], copies: int, device: Any) -> float:
    """Seconds per op of `model` (a compiled MAX model applying the op `copies` times) captured
    once as a device graph (`Model.capture`) and replayed: median over REPLAY_REPS runs of
    (`model.replay` + `device.synchronize()`) after warm-up, divided by `copies`.

    args: the Buffers the graph is executed with (the same shapes, dtypes and buffers as an
    `execute`); replay reuses exactly these buffers, so the data is what a replay of a captured
    decode step sees. Host-resident inputs (e.g. scalar lengths on the CPU) are allowed, as MAX
    serve allows them: they are read once, at capture, which is right here because they never
    change between replays. device: the max.driver Device the graph runs on. The captured graph
    is released afterwards (its output handles dropped first), so timing many shapes does not
    grow memory. Raises whatever capture or replay raises (see `try_us`).
    """
    return time_max_replay_traced(model, args, copies, device, None)[0]


def time_max_replay_traced(model: Any, args: Sequence[Any], copies: int, device: Any,
                           name_part: str | None = "mojo_kernels") -> tuple[float, float | None]:
    """`time_max_replay`, and the device time (µs per op) of the kernels whose name contains
    `name_part` in one more replay, from a CUPTI trace: the union of their intervals (kernels
    that overlap their predecessor's end through programmatic dependent launch count that time
    once), over `copies`. None when `name_part` is None, torch is missing or the trace fails."""
    key = next(_GRAPH_KEYS)
    outputs: list[Any] = []
    traced: float | None = None
    try:
        outputs = list(model.capture(key, *args))
        # Instantiation may finish on a background thread (MAX serve awaits it after capture):
        # the timed replays must not include it. Private in MAX 26.7, hence the getattr.
        await_graphs = getattr(model, "_await_device_graphs", None)
        if await_graphs is not None:
            await_graphs()

        def once() -> None:
            model.replay(key, *args)
            device.synchronize()

        sec = median_seconds(once, warmup=2, reps=REPLAY_REPS)
        if name_part is not None:
            spans = _traced_spans(once, name_part)
            traced = _union_us(spans) / copies if spans else None
    finally:
        outputs.clear()  # the runtime cannot reclaim the graph's memory while these live
        model.release_captured_graph(key)
    return sec / copies, traced


def _traced_spans(run: Callable[[], None], name_part: str) -> list[tuple[float, float]] | None:
    """(start, end) µs of the CUDA kernels whose name contains `name_part` while `run` runs
    (CUPTI via torch.profiler, which sees the launches of MAX's graphs too); None without torch
    or when the trace fails."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
    except (RuntimeError, OSError, AssertionError) as e:  # diagnostic: never lose the row
        print(f"trace: no trace ({e!r})"[:300], flush=True)
        return None
    return [(e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type.name == "CUDA" and name_part in e.name
            and not e.name.startswith(("Memcpy", "Memset"))]


def _union_us(spans: Sequence[tuple[float, float]]) -> float:
    """Length of the union of the intervals `spans`."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def torch_graph_seconds(calls: Sequence[Callable[[], Any]]) -> float:
    """Seconds per call of torch callables captured in ONE `torch.cuda.CUDAGraph`: median over
    REPLAY_REPS runs of (replay + synchronize), divided by len(calls).

    calls: the R calls of the MAX side's R-op graph (distinct inputs, rotated weight copies),
    each a closure over its own tensors; their outputs are not kept. Warmed up on a side stream
    first (cuBLAS handles, workspaces, lazy init), as torch's CUDA-graph docs require.
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    torch.cuda.synchronize()

    def once() -> None:
        graph.replay()
        torch.cuda.synchronize()

    return median_seconds(once, warmup=2, reps=REPLAY_REPS) / len(calls)


def try_us(label: str, fn: Callable[..., float], *args: Any) -> float | None:
    """`fn(*args)` (seconds) in µs, or None when it raises: the error is printed with `label`,
    the row is kept. For the captured timings, which a capture-unsafe op or an API change
    breaks."""
    try:
        return fn(*args) * 1e6
    except Exception as e:  # diagnostic column: never lose the row
        print(f"{label}: no captured time ({e!r})"[:400], flush=True)
        return None


def try_replay_traced(label: str, model: Any, args: Sequence[Any], copies: int,
                      device: Any) -> tuple[float | None, float | None]:
    """`time_max_replay_traced` in µs per op: (replay, our kernels' union in the replay), or
    (None, None) when capture or replay raises (printed with `label`; the row is kept)."""
    try:
        sec, kernel_us = time_max_replay_traced(model, args, copies, device)
    except Exception as e:  # diagnostic columns: never lose the row
        print(f"{label}: no captured time ({e!r})"[:400], flush=True)
        return None, None
    return sec * 1e6, kernel_us


def torch_part_rows(script: str, name: str, budget: Budget) -> list[dict[str, Any]]:
    """Runs `script --torch-part FILE` in a subprocess (torch gets its own CUDA context, away
    from MAX's) within 35 % of what is left of `budget`, and returns the rows it wrote to FILE
    (benchmarks/out/<name>_torch_part.json), the rows so far if it failed or timed out."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}_torch_part.json"
    path.unlink(missing_ok=True)
    try:
        proc = subprocess.run([sys.executable, script, "--torch-part", str(path)], check=False,
                              timeout=max(30.0, 0.35 * budget.left()))
        if proc.returncode != 0:
            budget.skip(f"torch part: exit code {proc.returncode} (its rows so far are kept)")
    except subprocess.TimeoutExpired:
        budget.skip("torch part: timed out (its rows so far are kept)")
    rows = json.loads(path.read_text()) if path.exists() else []
    budget.log(f"torch part: {len(rows)} rows")
    return rows


def device_cli(doc: str | None, torch_part: Callable[[str], None],
               compile_virtual: Callable[[str], None]) -> str:
    """The command line of a benchmark with a torch subprocess and a compile-only mode:
    `--device cpu|gpu` (default: gpu when there is one), `--virtual-arch ARCH` (compile the GPU
    graphs for ARCH, run nothing, exit), `--torch-part FILE` (the subprocess of
    `torch_part_rows`; exits when done). Returns the device to run on."""
    from max.driver import accelerator_count

    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--device", choices=["cpu", "gpu"],
                        default="gpu" if accelerator_count() > 0 else "cpu")
    parser.add_argument("--virtual-arch", help="compile the GPU graphs for this arch, run nothing")
    parser.add_argument("--torch-part", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_part:
        torch_part(args.torch_part)
        raise SystemExit(0)
    if args.virtual_arch:
        compile_virtual(args.virtual_arch)
        os._exit(0)  # MAX 26.7 may abort in teardown after virtual-device compiles
    return str(args.device)


def use_virtual_cuda_device(arch: str) -> None:
    """Makes MAX's one accelerator a virtual CUDA device of `arch` (compile-only runs); call it
    before any max.driver device is created."""
    from max import driver

    driver.set_virtual_device_api("cuda")
    driver.set_virtual_device_target_arch(arch)
    driver.set_virtual_device_count(1)


def bar_lines(summary: dict[str, Any]) -> list[str]:
    """One "bar: <name>: worst <value> over <n> of <m> rows, met / missed / not measured" line
    per bar of a summary {name: {"worst", "ok", "rows", "rows_concerned"}}."""
    lines = []
    for name, b in summary.items():
        worst = "none" if b["worst"] is None else f"{b['worst']:.3g}"
        verdict = {True: "met", False: "missed", None: "not measured"}[b["ok"]]
        lines.append(f"bar: {name}: worst {worst} over {b['rows']} of {b['rows_concerned']} "
                     f"rows, {verdict}")
    return lines


FLUSH_BYTES = 256 * 2**20
"""do_bench's L2 flush: a buffer of 256 MiB zeroed before each timed call (triton's size)."""


def torch_do_bench(fn: Callable[[], Any], warmup_ms: float = 25.0, rep_ms: float = 100.0) -> float:
    """Seconds per call of a torch callable, by triton's do_bench method (the median over
    >= `rep_ms` of timed calls after >= `warmup_ms` of warm-up, each call preceded by an L2
    flush and bracketed by CUDA events), with one guard: where the host takes longer to issue
    a call than the GPU takes to flush and run it, each flush is preceded by a GPU sleep that
    covers the difference, so the host issues calls ahead of the GPU and the events time the
    kernels, not the host's launch latency (a Python-heavy contender's launch path otherwise
    lands inside its timed interval)."""
    import torch

    cache = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = time.perf_counter()
    start.record()
    for _ in range(5):
        cache.zero_()
        fn()
    end.record()
    host_s = (time.perf_counter() - host) / 5
    torch.cuda.synchronize()
    gpu_s = start.elapsed_time(end) * 1e-3 / 5
    sleep_cycles = int(max(0.0, 1.5 * host_s - gpu_s + 20e-6) * _gpu_cycles_per_s())
    n_warmup = max(1, int(warmup_ms * 1e-3 / gpu_s))
    n_repeat = max(1, int(rep_ms * 1e-3 / gpu_s))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    for _ in range(n_warmup):
        fn()
    for i in range(n_repeat):
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        cache.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) * 1e-3


@functools.cache
def _gpu_cycles_per_s() -> float:
    """Clock rate `torch.cuda._sleep` counts at, measured once (a 1M-cycle sleep, timed)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    torch.cuda.synchronize()
    return 1e6 / (start.elapsed_time(end) * 1e-3)


@functools.cache
def card_rates() -> tuple[float, float]:
    """(bytes/s, bf16 FLOP/s) that floors and bandwidth bars use on this machine's GPU: the
    H200's measured rates; on an H100 the bandwidth scaled by the two HBM peaks (same tensor
    cores and clocks, so the same FLOP rate)."""
    if "H100" in environment()["device"]:
        return H200_BANDWIDTH * HBM_PEAK["H100"] / HBM_PEAK["H200"], H200_BF16_FLOPS
    return H200_BANDWIDTH, H200_BF16_FLOPS


def environment() -> dict[str, str]:
    """Date, host, device and versions for the results header."""
    import max as max_pkg
    from max.driver import Accelerator, accelerator_count

    device = "cpu"
    if accelerator_count() > 0:
        device = str(getattr(Accelerator(), "label", "gpu"))
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            device = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=True,
            ).stdout.strip()
    else:
        device = f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device,
        "max": getattr(max_pkg, "__version__", "26.7.0"),
        "python": platform.python_version(),
    }


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A markdown table of `columns` over `rows` (floats with 4 significant digits)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def replace_section(text: str, name: str, section: str) -> str:
    """`text` (RESULTS.md) with the section of benchmark `name` replaced by `section`.

    A section runs from a line starting "## <name>:" to the next line starting "## " or the
    end. The first such section is replaced in place; any later ones (older runs) are dropped;
    without one, `section` is appended. Every other line is kept as it is. section: markdown
    starting with its "## <name>:" header line.
    """
    lines = text.splitlines(keepends=True)
    head = f"## {name}:"
    out: list[str] = []
    placed = inside = False
    for line in lines:
        if line.startswith("## "):
            inside = line.startswith(head)
            if inside and not placed:
                out.append(section if section.endswith("\n") else section + "\n")
                out.append("\n")
                placed = True
        if not inside:
            out.append(line)
    if not placed:
        if out and not out[-1].endswith("\n"):
            out.append("\n")
        out.append("\n" + section + ("" if section.endswith("\n") else "\n"))
    return "".join(out)


def record(
    name: str,
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    *,
    method: str,
    extra: dict[str, Any] | None = None,
    append_results: bool = True,
    notes_md: str = "",
) -> Path:
    """Writes benchmarks/out/<name>-<stamp>.json (and the same JSON, overwritten, to
    benchmarks/results/<name>.json), prints the table and, with `append_results`, replaces the
    benchmark's section of RESULTS.md by this run's (`notes_md`: markdown after the table, in
    the same section). Returns the timestamped JSON's path."""
    env = environment()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    path = OUT_DIR / f"{name}-{stamp}.json"
    payload = json.dumps({"env": env, "method": method, **(extra or {}), "rows": list(rows)},
                         indent=1)
    path.write_text(payload)
    table = markdown_table(rows, columns)
    print(table, flush=True)
    if append_results:
        LATEST_DIR.mkdir(parents=True, exist_ok=True)
        (LATEST_DIR / f"{name}.json").write_text(payload)
        section = (f"## {name}: {env['date']}\n\n- device: {env['device']}\n"
                   f"- MAX {env['max']}, Python {env['python']}\n- method: {method}\n\n"
                   + table + "\n" + (f"\n{notes_md.strip()}\n" if notes_md.strip() else ""))
        old = RESULTS_MD.read_text() if RESULTS_MD.exists() else "# Benchmark results\n"
        RESULTS_MD.write_text(replace_section(old, name, section))
    return path

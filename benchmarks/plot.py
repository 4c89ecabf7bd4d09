"""Draws the performance plots of docs/performance.md from the benchmark JSON.

    python benchmarks/plot.py [--results benchmarks/results] [--out docs/img]

Reads `<results>/<name>.json` (the dict `harness.record` writes: {"env": ..., "method": ...,
"rows": [...]}) for `int4_matmul_gpu`, `k_matmul_paged_gpu`, `grouped_matmul_gpu` and
`fp8_matmul_gpu`, skips the ones that are missing, and writes:

- `speedup.png`: per op, the geomean over the benchmark's shapes of (peer time / our time) by
  tokens per call (M or T), one line per peer; > 1 means ours is faster.
- `speedup_captured.png`: the same on the clock a MAX server gives users: our R-op graph
  captured and replayed (`replay_us`) against the peers' same R calls captured in one CUDA
  graph (`*_graph_us`).
- `<name>_speedup.png`: the same per shape, one panel per peer.
- `bandwidth.png`: weight bytes / our time for the calls with at most 64 tokens (the
  bandwidth-bound ones) against the H200's 4.24 TB/s copy rate.

Clocks: our time is the row's `kernel_us` (CUPTI kernel time inside the graph) where the run
recorded it, else `ours_us` (graph time per op); MAX's int4 op likewise (`max_kernel_us`, else
`max_us`); torch peers are `triton.testing.do_bench` medians (L2 flushed). Each figure's title
names the run's date and card (`env.date`, `env.device`).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib import ticker

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
IMG_DIR = BENCH_DIR.parent / "docs" / "img"
H200_TBPS = 4.24
"""Measured H200 device copy bandwidth (TB/s): the roofline of the bandwidth plot."""
BANDWIDTH_MAX_TOKENS = 64
"""Calls with at most this many tokens are drawn in the bandwidth plot."""

Row = dict[str, Any]


def _first(r: Row, *keys: str) -> float | None:
    """The first of `keys` that `r` holds as a positive number, else None."""
    for k in keys:
        v = r.get(k)
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    return None


@dataclass(frozen=True)
class Peer:
    """A contender: its label and the row key(s) holding its µs per call (first present)."""

    label: str
    keys: tuple[str, ...]

    def us(self, r: Row) -> float | None:
        """The peer's µs per call in row `r`, or None when the run did not time it."""
        return _first(r, *self.keys)


@dataclass(frozen=True)
class OpPlot:
    """How to read one benchmark's rows: token axis, shape label, our time, bytes, peers."""

    name: str
    title: str
    tokens: str
    shape: Callable[[Row], str]
    ours_keys: tuple[str, ...]
    bytes_of: Callable[[Row], float | None]
    peers: tuple[Peer, ...]
    clock: str | None = None
    """The clock note of every figure, when both sides use one fixed clock."""

    def ours_us(self, r: Row) -> float | None:
        """Our µs per call in row `r` (kernel time where recorded, else graph time)."""
        return _first(r, *self.ours_keys)


def _bytes_from(rate_key: str, time_key: str = "ours_us") -> Callable[[Row], float | None]:
    """Weight bytes of a row from its recorded rate (TB/s over `time_key`): rate x time."""

    def f(r: Row) -> float | None:
        rate, us = _first(r, rate_key), _first(r, time_key)
        return None if rate is None or us is None else rate * 1e12 * us * 1e-6

    return f


OPS = (
    OpPlot("int4_matmul_gpu", "W4A16 int4 matmul (8 Llama-3 layers)", "M",
           lambda r: str(r["layer"]), ("kernel_us", "ours_us"), _bytes_from("TBps"),
           (Peer("cuBLAS bf16", ("cublas_us",)),
            Peer("MAX qmatmul_b4_g128", ("max_kernel_us", "max_us")))),
    OpPlot("k_matmul_paged_gpu", "FP8 K-cache projection", "T",
           lambda r: f"{r['problem']} {r.get('cache', '')}".strip(), ("kernel_us", "ours_us"),
           _bytes_from("TBps"),
           (Peer("torch _scaled_mm + scatter", ("torch_scatter_us",)),
            Peer("torch _scaled_mm alone", ("torch_us",)),
            Peer("MAX matmul_k_cache_ragged_scaled_float8", ("max_us",)))),
    OpPlot("grouped_matmul_gpu", "MoE grouped matmul (bf16)", "T",
           lambda r: f"{r['model']} {r['routing']}", ("kernel_us", "ours_us"),
           _bytes_from("w_TBps"),
           (Peer("torch._grouped_mm", ("torch_us",)),
            Peer("MAX grouped_matmul_ragged", ("max_us",)))),
    OpPlot("fp8_matmul_gpu", "FP8 block-scaled dense matmul", "M",
           lambda r: str(r["shape"]), ("kernel_us",), _bytes_from("kTBps", "kernel_us"),
           (Peer("torch _scaled_mm", ("torch_us",)),)),
)


CAPTURED_CLOCK = "ours and peers: captured device graphs (R calls replayed, / R)"
CAPTURED = (
    OpPlot("int4_matmul_gpu", "W4A16 int4 matmul, captured", "M",
           lambda r: str(r["layer"]), ("replay_us",), _bytes_from("TBps"),
           (Peer("cuBLAS bf16", ("cublas_graph_us",)),
            Peer("MAX qmatmul_b4_g128", ("max_replay_us",))), CAPTURED_CLOCK),
    OpPlot("k_matmul_paged_gpu", "FP8 K-cache projection, captured", "T",
           lambda r: f"{r['problem']} {r.get('cache', '')}".strip(), ("replay_us",),
           _bytes_from("TBps"),
           (Peer("torch _scaled_mm + scatter", ("torch_scatter_graph_us",)),
            Peer("torch _scaled_mm alone", ("torch_graph_us",))), CAPTURED_CLOCK),
    OpPlot("grouped_matmul_gpu", "MoE grouped matmul (bf16), captured", "T",
           lambda r: f"{r['model']} {r['routing']}", ("replay_us",), _bytes_from("w_TBps"),
           (Peer("torch._grouped_mm", ("torch_graph_us",)),), CAPTURED_CLOCK),
)
"""The same benchmarks read on the clock a MAX server gives users: captured decode graphs."""


def load(results: Path, name: str) -> dict[str, Any] | None:
    """The JSON of benchmark `name` under `results`, or None when there is none."""
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def geomean(values: list[float]) -> float:
    """Geometric mean of positive values."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def speedups(op: OpPlot, rows: list[Row], peer: Peer) -> dict[str, dict[int, float]]:
    """{shape: {tokens: peer time / our time}} over the rows that time both."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        ours, theirs = op.ours_us(r), peer.us(r)
        if ours is not None and theirs is not None:
            out.setdefault(op.shape(r), {})[int(r[op.tokens])] = theirs / ours
    return out


def _ratio_text(v: float) -> str:
    """A speed-up as a short label: 2 significant digits, whole numbers from 100 on."""
    return f"{v:.0f}" if v >= 100 else f"{v:.2g}"


def _token_axis(ax: Any, op: OpPlot, tokens: list[int]) -> None:
    """Log-2 token axis ticked at the measured token counts."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(tokens)
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlabel(f"{op.tokens} (tokens per call)")


def _log_axes(ax: Any, op: OpPlot, tokens: list[int]) -> None:
    """Token axis, log ratio axis ticked at 1-2-3-5 with plain labels, the break-even line."""
    _token_axis(ax, op, tokens)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.grid(True, which="major", alpha=0.3)


def _clock_note(op: OpPlot, rows: list[Row]) -> str:
    """Which clock our times use in this run."""
    if op.clock is not None:
        return op.clock
    has_kernel = [int(r[op.tokens]) for r in rows if _first(r, "kernel_us") is not None]
    if not has_kernel:
        return "ours: graph time per op"
    if all(_first(r, "kernel_us") is not None for r in rows if _first(r, "ours_us")):
        return "ours: CUPTI kernel time"
    return (f"ours: CUPTI kernel time ({op.tokens} <= {max(has_kernel)}), "
            "graph time above")


def run_label(env: dict[str, Any]) -> str:
    """A run's date and card ("<date> UTC, H100 80GB HBM3") from its `env`."""
    card = str(env.get("device", "")).split(",")[0].removeprefix("NVIDIA ").strip()
    return ", ".join(x for x in (str(env.get("date", "")), card) if x)


def plot_headline(data: dict[str, dict[str, Any]], out: Path,
                  ops_read: tuple[OpPlot, ...] = OPS, filename: str = "speedup.png") -> Path:
    """`filename`: geomean speed-up over each peer by tokens, one panel per op of `ops_read`
    (speedup.png: kernel time; speedup_captured.png: captured graphs on both sides)."""
    ops = [op for op in ops_read if op.name in data]
    fig, axes = plt.subplots(1, len(ops), figsize=(5.2 * len(ops), 4.4), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=True):
        rows = data[op.name]["rows"]
        lines: list[tuple[Peer, dict[int, float]]] = []
        for peer in op.peers:
            per_shape = speedups(op, rows, peer)
            tokens = sorted({t for s in per_shape.values() for t in s})
            lines.append((peer, {t: geomean([s[t] for s in per_shape.values() if t in s])
                                 for t in tokens}))
        for peer, by_t in lines:
            if not by_t:
                continue
            ax.plot(list(by_t), list(by_t.values()), marker="o", label=f"vs {peer.label}")
            for t, y in by_t.items():  # the top line at t is labelled above, the others below
                top = all(y >= other.get(t, 0.0) for _, other in lines)
                ax.annotate(_ratio_text(y), (t, y), textcoords="offset points",
                            xytext=(0, 6 if top else -11), ha="center", fontsize=7)
        all_tokens = {t for _, by_t in lines for t in by_t}
        _log_axes(ax, op, sorted(all_tokens))
        ax.set_title(f"{op.title}\n{run_label(data[op.name]['env'])}", fontsize=10)
        ax.set_ylabel("speed-up (peer time / ours), geomean over shapes")
        ax.legend(fontsize=8, loc="best")
        ax.text(0.01, 0.01, _clock_note(op, rows), transform=ax.transAxes, fontsize=7,
                va="bottom")
    fig.suptitle("mojo-gemm: speed-up over the peers (> 1: ours faster; card and date per panel)")
    fig.tight_layout()
    path = out / filename
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_op(op: OpPlot, run: dict[str, Any], out: Path) -> Path:
    """<name>_speedup.png: speed-up over each peer per shape, one panel per peer."""
    rows = run["rows"]
    peers = [p for p in op.peers if speedups(op, rows, p)]
    fig, axes = plt.subplots(1, max(len(peers), 1), figsize=(5.2 * max(len(peers), 1), 5.6),
                             squeeze=False)
    for ax, peer in zip(axes[0], peers, strict=False):
        per_shape = speedups(op, rows, peer)
        for shape, by_t in sorted(per_shape.items()):
            tokens = sorted(by_t)
            ax.plot(tokens, [by_t[t] for t in tokens], marker="o", ms=3, label=shape)
        _log_axes(ax, op, sorted({t for s in per_shape.values() for t in s}))
        ax.set_title(f"vs {peer.label}", fontsize=10)
        ax.set_ylabel("speed-up (peer time / ours)")
        ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    fig.suptitle(f"{op.title}: {run_label(run['env'])}; {_clock_note(op, rows)}",
                 fontsize=10)
    fig.tight_layout()
    path = out / f"{op.name}_speedup.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_bandwidth(data: dict[str, dict[str, Any]], out: Path) -> Path:
    """bandwidth.png: weight bytes / our time per shape at <= 64 tokens, with the roofline."""
    ops = [op for op in OPS if op.name in data]
    fig, axes = plt.subplots(1, len(ops), figsize=(5.2 * len(ops), 5.4), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=True):
        rows = [r for r in data[op.name]["rows"] if int(r[op.tokens]) <= BANDWIDTH_MAX_TOKENS]
        series: dict[str, dict[int, float]] = {}
        for r in rows:
            ours, nbytes = op.ours_us(r), op.bytes_of(r)
            if ours is not None and nbytes is not None:
                series.setdefault(op.shape(r), {})[int(r[op.tokens])] = nbytes / ours / 1e6
        for shape, by_t in sorted(series.items()):
            tokens = sorted(by_t)
            ax.plot(tokens, [by_t[t] for t in tokens], marker="o", ms=3, label=shape)
        ax.axhline(H200_TBPS, color="black", lw=1.0, ls="--")
        ax.text(1, H200_TBPS, f" {H200_TBPS} TB/s (device copy)", va="bottom", fontsize=8)
        _token_axis(ax, op, sorted({t for by_t in series.values() for t in by_t}))
        ax.set_ylim(0, H200_TBPS * 1.15)
        ax.set_ylabel("weight bytes / time (TB/s)")
        ax.set_title(f"{op.title}\n{run_label(data[op.name]['env'])}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.16))
        ax.text(0.01, 0.99, _clock_note(op, rows), transform=ax.transAxes, fontsize=7,
                va="top")
    fig.suptitle("Weight-streaming rate against the 4.24 TB/s roofline (decode-sized calls)")
    fig.tight_layout()
    path = out / "bandwidth.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def main() -> None:
    """Loads the JSON that exists and writes the PNGs."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--out", type=Path, default=IMG_DIR)
    args = parser.parse_args()
    data = {op.name: run for op in OPS if (run := load(args.results, op.name)) is not None}
    if not data:
        raise SystemExit(f"no benchmark JSON under {args.results}")
    args.out.mkdir(parents=True, exist_ok=True)
    written = [plot_headline(data, args.out),
               plot_headline(data, args.out, CAPTURED, "speedup_captured.png"),
               plot_bandwidth(data, args.out)]
    written += [plot_op(op, data[op.name], args.out) for op in OPS if op.name in data]
    for p in written:
        print(p)


if __name__ == "__main__":
    main()

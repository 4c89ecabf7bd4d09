"""benchmarks/harness.py on the CPU: RESULTS.md keeps only the latest run of a benchmark, the
latest JSON is written, and the captured-time helper captures, replays and releases in order;
bench_int4_matmul's shape set, time plan, ratios and bars on made-up rows (no GPU, no MAX)."""

from __future__ import annotations

import json
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_int4_matmul as bench  # imports MAX and torch only inside its GPU functions
import harness  # benchmarks/ is not a package: found through sys.path

RESULTS = """# Benchmark results

intro

## a: 1

old a

## b: 2

old b
### kept inside b

## a (hand-written): 3

hand notes

## b: 4

older b
"""


def test_replace_section_replaces_first_and_drops_older_runs() -> None:
    """The first `## b:` section becomes the new one, the later `## b:` goes, the rest stays."""
    out = harness.replace_section(RESULTS, "b", "## b: 9\n\nnew b\n")
    assert out.count("## b:") == 1
    assert "old b" not in out and "older b" not in out and "kept inside b" not in out
    assert out.index("## a: 1") < out.index("## b: 9") < out.index("## a (hand-written): 3")
    assert "intro" in out and "old a" in out and "hand notes" in out


def test_replace_section_appends_a_new_benchmark() -> None:
    """Without a section of that name the new one goes at the end; nothing else changes."""
    out = harness.replace_section(RESULTS, "c", "## c: 9\n\nnew c")
    assert out.startswith(RESULTS) and out.rstrip().endswith("## c: 9\n\nnew c")


def test_record_replaces_in_place_and_writes_latest_json(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Two records of one benchmark leave one section (the latest) and its JSON."""
    md = tmp_path / "RESULTS.md"
    md.write_text(RESULTS)
    monkeypatch.setattr(harness, "RESULTS_MD", md)
    monkeypatch.setattr(harness, "OUT_DIR", tmp_path / "out")
    monkeypatch.setattr(harness, "LATEST_DIR", tmp_path / "results")
    for value in (1.5, 2.5):
        harness.record("b", [{"x": value}], ["x"], method="m", notes_md="bar: x met")
    text = md.read_text()
    assert text.count("## b:") == 1 and "| 2.5 |" in text and "| 1.5 |" not in text
    assert "bar: x met" in text and "hand notes" in text
    assert json.loads((tmp_path / "results" / "b.json").read_text())["rows"] == [{"x": 2.5}]
    assert len(list((tmp_path / "out").glob("b-*.json"))) >= 1


class _Out:
    """A stand-in output Buffer (weak-referenceable, to see when the harness drops it)."""


class _FakeModel:
    """Records the capture API calls `time_max_replay` makes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.output: weakref.ref[_Out] | None = None
        self.output_alive_at_release: bool | None = None

    def capture(self, key: int, *args: Any) -> list[_Out]:
        """One output, watched through a weak reference."""
        out = _Out()
        self.output = weakref.ref(out)
        self.calls.append(("capture", key))
        return [out]

    def replay(self, key: int, *args: Any) -> None:
        """Recorded only."""
        self.calls.append(("replay", key))

    def release_captured_graph(self, key: int) -> None:
        """Notes whether the capture's output was still referenced."""
        assert self.output is not None
        self.output_alive_at_release = self.output() is not None
        self.calls.append(("release", key))


class _FakeDevice:
    """A device whose synchronize does nothing."""

    def synchronize(self) -> None:
        """Nothing to wait for."""


def test_time_max_replay_captures_once_replays_and_releases() -> None:
    """One capture with a fresh key, >= REPLAY_REPS replays of it, outputs dropped, released."""
    model = _FakeModel()
    for _ in range(2):
        harness.time_max_replay(model, [object()], 16, _FakeDevice())
    keys = [k for op, k in model.calls if op == "capture"]
    assert len(keys) == 2 and keys[0] != keys[1]
    first = [op for op, k in model.calls if k == keys[0]]
    assert first[0] == "capture" and first[-1] == "release"
    assert first.count("replay") >= harness.REPLAY_REPS
    assert model.output_alive_at_release is False


def test_try_us_keeps_the_row_on_failure() -> None:
    """A raising timing gives None (printed), a working one µs."""

    def broken() -> float:
        raise RuntimeError("capture failed")

    assert harness.try_us("x", broken) is None
    assert harness.try_us("x", lambda s: s, 2e-6) == pytest.approx(2.0)


def test_int4_public_shapes_derive_from_the_model_configs() -> None:
    """The public set is 4 layers per model of MODELS, the Llama-3 ones equal LAYERS, and every
    shape fits our symbolic-N, K graph unpadded (N % 64 == 0, K % 128 == 0)."""
    assert len(bench.PUBLIC_LAYERS) == 4 * len(bench.MODELS) == 28
    assert {k: bench.PUBLIC_LAYERS[k] for k in bench.LAYERS} == bench.LAYERS
    assert bench.PUBLIC_LAYERS["405B.qkv"] == (18432, 16384)  # (128 + 2 * 8) * 128
    assert bench.PUBLIC_LAYERS["27B.o"] == (4608, 4096)  # Gemma-2: heads * head_dim != hidden
    assert all(n % 64 == 0 and k % 128 == 0 for n, k in bench.PUBLIC_LAYERS.values())


def test_int4_layer_and_m_selection() -> None:
    """--layers takes names and model prefixes, --m sorts; unknown names stop the run."""
    got = bench.select_layers("public", "3B,405B.o")
    assert list(got) == ["3B.qkv", "3B.o", "3B.gate_up", "3B.down", "405B.o"]
    assert bench.select_layers("llama", None) == bench.LAYERS
    with pytest.raises(SystemExit):
        bench.select_layers("llama", "405B")
    assert bench.parse_m("4096, 1,16") == (1, 16, 4096)
    assert bench.parse_m("") == bench.M_VALUES


def test_int4_plan_drops_in_order() -> None:
    """A big budget keeps everything; a small one drops MAX's kernel, then the captured big-M
    rows, then torch int4 at big M, and says the run does not fit."""
    kw: dict[str, Any] = {"humming": True, "torch_part": True, "max_layers": 8}
    full = bench.plan(bench.LAYERS, bench.M_VALUES, 1e6, **kw)
    assert full["dropped"] == [] and full["fits"] and full["max_builtin"]
    tiny = bench.plan(bench.PUBLIC_LAYERS, bench.M_VALUES, 10.0, **kw)
    assert [d.split()[0] for d in tiny["dropped"]] == ["MAX's", "captured", "torch"]
    assert not (tiny["fits"] or tiny["max_builtin"] or tiny["graph_big_m"])
    assert tiny["estimate_s"]["total"] < full["estimate_s"]["total"] + 1e6


def _rows(ratio: float, skip: str | None = None) -> list[dict[str, Any]]:
    rows = []
    for name in bench.PUBLIC_LAYERS:
        for m in bench.M_VALUES:
            r: dict[str, Any] = {"layer": name, "M": m, "kernel_us": 10.0,
                                 "humming_us": 10.0 * ratio, "cublas_us": 10.0 * ratio}
            if name in bench.LAYERS:
                r.update(replay_us=10.0, cublas_graph_us=25.0)
            if name == skip:
                r["humming_fail"] = "check: rel err 0.5 > 0.01"
            bench.add_ratios(r)
            rows.append(r)
    return rows


def test_int4_bars_and_summary() -> None:
    """Issue 19's bars are met only with every public layer, a failed humming check removes
    its ratio; issue 18's bars stay over the 8 Llama layers."""
    lines = bench.bar_lines_19(_rows(1.2))
    assert len(lines) == 8 and all(line.endswith(" met") for line in lines)
    lines = bench.bar_lines_19(_rows(1.07))
    assert [line.endswith(" met") for line in lines] == [False, False, True, True, True, True,
                                                         True, True]
    failed = _rows(1.2, skip="405B.down")
    assert "405B.down" not in [r["layer"] for r in failed if r.get("x_humming_kernel")]
    assert bench.bar_lines_19(failed)[0].endswith("missed, only 27 of 28 layers")
    assert bench.bar_lines(failed) == [
        f"bar: int4 M={m} geomean x_cublas_replay (cublas_graph_us / replay_us) over the Llama "
        f"layers 2.50 >= 2.0 met" for m in (1, 16)]
    summary = bench.summarize(failed, (1,), bench.PUBLIC_LAYERS)["M=1"]
    assert summary["n_x_humming_kernel"] == 27
    assert summary["geomean_x_humming_kernel"] == pytest.approx(1.2)


@pytest.mark.parametrize(("device", "bandwidth"), [
    ("NVIDIA H200, 580.159.04", 4.24e12),
    ("NVIDIA H100 80GB HBM3, 580.159.04", 4.24e12 * 3.35 / 4.8),
])
def test_card_rates_follow_the_card(monkeypatch, device: str, bandwidth: float) -> None:
    # floors and bandwidth bars use the rates of the card the run is on (an H100 is lent too)
    harness.card_rates.cache_clear()
    monkeypatch.setattr(harness, "environment", lambda: {"device": device})
    try:
        assert harness.card_rates() == (pytest.approx(bandwidth), harness.H200_BF16_FLOPS)
    finally:
        harness.card_rates.cache_clear()


def test_decoder_ops_of_traced_kernels() -> None:
    """bench_decoder's per-op table: mangled Mojo kernel names map to their op by module path,
    MAX's and vendor kernels by their names; rows without a trace are left out."""
    import bench_decoder

    op = bench_decoder.kernel_op
    assert op("mojo_kernels_grouped_gemm_kern6A6A6A6A_290b31125ead763a") == "grouped"
    assert op("mojo_kernels_int4_gemm_kernels6A6A6A6A_290852efec2653d0") == "int4"
    assert op("mojo_kernels_k_cache_matmul_ke6A6A6A6A_95a373a593b88f20") == "fp8 K/V"
    assert op("mojo_kernels_moe_route_kernels6A6A6A6A_fffd215740fc9407") == "router"
    assert op("sm90_mha_depth128_bfloat16_bfloat16_nqh16_nkvh16_c721537d") == "attention"
    assert op("mha_splitk_reduce_bfloat16_bfloat16_b2696d45") == "attention"
    assert op("rms_norm_fused_residual_gpu_block_float32_False_0025385b") == "norm"
    assert op("gather_r2_w8_b256_gs_False_57d63c86") == "gather"
    assert op("mogg_foreach_r2_w8_b256_gs_False_64a6c1a2") == "elementwise"
    assert op("gemv_kernel_float32_float32_float32_False_dd83c35c") == "vendor gemm"
    assert op("algorithm_gpu_rowwise__WarpKe6A6A6A6A6A6A_ba190ec89eb8d074") == "other"
    rows = [
        {"model": "ours", "phase": "decode", "batch": 1, "context": 1024, "tokens": 1,
         "crit_by_op": {"grouped": 50.0, "attention": 10.25}},
        {"model": "ours", "phase": "prefill", "batch": 8, "context": 0, "tokens": 512},
    ]
    table = bench_decoder.op_table(rows).splitlines()
    assert table[0] == "| model | phase | batch | context | tokens | grouped | attention |"
    assert table[2] == "| ours | decode | 1 | 1024 | 1 | 50.0 | 10.2 |"
    assert len(table) == 3
    assert bench_decoder.op_table(rows[1:]) == ""

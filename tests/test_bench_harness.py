"""benchmarks/harness.py on the CPU: RESULTS.md keeps only the latest run of a benchmark, the
latest JSON is written, and the captured-time helper captures, replays and releases in order."""

from __future__ import annotations

import json
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
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

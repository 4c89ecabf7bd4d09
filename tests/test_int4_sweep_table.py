"""scripts/int4_sweep_table.py on made-up sweep records (no GPU, no MAX): the derived table
finds a rule planted in the timings, keys it only by M range and derived quantities, and the
leave-one-model-out loss tells a rule that generalizes from a table that memorizes; plus the
built-in shape include of benchmarks/mojo/int4_sweep.mojo is in sync with bench_int4_matmul."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import int4_sweep_table as tbl  # scripts/ is not a package: found through sys.path

ROOT = Path(__file__).resolve().parents[1]

MODELS = ["A", "B", "C", "D", "E"]
BASE_BANDS = [48, 64, 128, 448]  # every model has layers on both sides of the planted threshold
KS = [4096, 8192, 14336, 5120]
K_SCALE = [1.0, 1.5, 2.0, 3.0, 4.0]  # per model: its K lie in other half-octave buckets

M1 = [("CFG_M8", s) for s in (1, 2, 4)] + [("CFG_M8_NARROW", s) for s in (1, 2, 4)]
M64 = [("WG_CFG_64N", s) for s in (1, 2, 4)] + [("WG_CFG_64W", s) for s in (1, 2, 4)]
DERIVED = {  # the keys the loader reads besides the timing: bm, bk, warp_k of each config
    "CFG_M8": (8, 128, 2), "CFG_M8_NARROW": (8, 64, 4),
    "WG_CFG_64N": (64, 64, 1), "WG_CFG_64W": (64, 64, 1),
}


def planted(m: int, bands: int) -> tuple[str, int]:
    """The fastest candidate of the synthetic data: narrow tiles and a large split below 100
    bands, wide tiles and split 2 above."""
    if m == 1:
        return ("CFG_M8_NARROW", 4) if bands < 100 else ("CFG_M8", 2)
    return ("WG_CFG_64N", 4) if bands < 100 else ("WG_CFG_64W", 2)


def rec(layer, model, n, k, m, cfg, split, us, *, kernel=None, **kw):
    bm, bk, wk = DERIVED.get(cfg, (64, 64, 1))
    kernel = kernel or ("wgmma" if cfg.startswith("WG") else "mma")
    r = {"layer": layer, "model": model, "N": n, "K": k, "M": m, "config": cfg, "split": split,
         "kernel": kernel, "is_dispatch": False, "is_rule": False, "ok": True, "rel_err": 1e-3,
         "us": us, "bm": bm, "bk": bk, "warp_k": wk, "bands": -(-n // 64)}
    r.update(kw)
    return r


def synthetic(pick=planted, seed=0) -> list[dict]:
    """Records of 5 models x 4 layers x M in {1, 64}; `pick(m, bands)` is the fastest candidate
    (a layer's bands are about the same in every model, its K steps are not), every other one
    5..40 % slower; the rule's choice is split 1 of the first config, the dispatch 20 % over
    the best."""
    rng = random.Random(seed)
    out = []
    for mi, model in enumerate(MODELS):
        for li, (bands, k) in enumerate(zip(BASE_BANDS, KS, strict=True)):
            n = (bands + mi) * 64
            k = int(k * K_SCALE[mi]) // 128 * 128
            layer = f"{model}.l{li}"
            for m, cands in ((1, M1), (64, M64)):
                best = pick(m, bands + mi)
                base = n * k / 2 / 3e6
                for c in cands:
                    us = base * (1.0 if c == best else 1.05 + 0.35 * rng.random())
                    out.append(rec(layer, model, n, k, m, c[0], c[1], us, is_rule=c == cands[0]))
                out.append(rec(layer, model, n, k, m, "dispatch", cands[0][1], base * 1.2,
                               kernel="dispatch", choice=f"{cands[0][0]}/s1"))
    return out


def write(tmp_path: Path, records: list[dict], extra: str = "") -> Path:
    p = tmp_path / "int4_sweep.json"
    p.write_text(extra + "".join(json.dumps(r) + "\n" for r in records))
    return p


def test_table_recovers_planted_rule(tmp_path):
    items = tbl.load([write(tmp_path, synthetic())])
    assert len(items) == len(MODELS) * len(BASE_BANDS) * 2
    t = tbl.select(items)
    for it in items:
        assert t.choice(it) == planted(it.m, it.bands), it.layer
        assert t.ratio(it) == 1.0
    # every held-out model is predicted from the others without loss
    assert all(v == 1.0 for v in tbl.lomo(items, t.gran).values())
    # the dispatch record is 20 % over the best, the rule's choice too or worse
    assert abs(tbl.loss(items, tbl._dispatch_ratio) - 1.2) < 1e-9
    assert tbl.loss(items, lambda it: it.ratio(it.rule)) > 1.04


def test_snippet_is_keyed_by_derived_quantities_only(tmp_path):
    items = tbl.load([write(tmp_path, synthetic())])
    src = tbl.snippet(tbl.select(items), ["int4_sweep.json"])
    assert "def tuned_choice(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:" in src
    assert "def tuned_wgmma(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:" in src
    assert "return (1, 4)" in src  # CFG_M8_NARROW split 4 (tuned_choice variant 1)
    assert "return (0, 2)" in src  # CFG_M8 split 2
    assert "return (WG_VAR_64N, 4)" in src and "return (WG_VAR_64W, 2)" in src
    # never a comparison of N or K themselves, only of M, bands and ksteps
    code = "\n".join(line.split("#")[0] for line in re.sub(r'"""[^"]*"""', "", src).splitlines())
    assert not re.search(r"\b(n|kp)\s*(==|!=|<|>)", code)
    compared = set(re.findall(r"\b(\w+)\s*(?:==|>=|<=|<|>)\s*\d", code))
    assert compared <= {"m", "bands", "ksteps"}, compared
    # each return sits under an M-range test
    assert src.count("    if m ") >= 2


def test_lomo_exposes_a_table_that_memorizes(tmp_path):
    rng = random.Random(7)
    table: dict[tuple[int, int], tuple[str, int]] = {}

    def noise(m: int, bands: int) -> tuple[str, int]:  # best candidate unrelated to any feature
        return table.setdefault((m, bands), rng.choice(M1 if m == 1 else M64))

    items = tbl.load([write(tmp_path, synthetic(noise, seed=3))])
    fine = {mr: (("bands", "ksteps"), 2) for mr in {tbl.m_range(it.m) for it in items}}
    t = tbl.build(items, fine)  # one bucket per layer: in sample it knows every answer
    in_sample = tbl.loss(items, t.ratio)
    held_out = tbl.lomo_pooled(items, fine)
    assert in_sample < 1.01 and held_out > in_sample + 0.05, (in_sample, held_out)
    # the bucketing `select` picks does not lose more on held-out models than the finest
    chosen = tbl.select(items)
    assert tbl.lomo_pooled(items, chosen.gran) <= held_out + 1e-9


def test_unmeasured_or_too_short_choice_falls_back_to_the_rule(tmp_path):
    items = tbl.load([write(tmp_path, synthetic())])
    t = tbl.select(items)
    it = next(it for it in items if it.m == 1 and it.bands < 100)
    choice = t.choice(it)
    rule_ratio = it.ratio(it.rule)
    del it.us[choice]  # e.g. the launch failed its check on this layer
    assert t.ratio(it) == it.ratio(it.rule) != 1.0 or rule_ratio is None
    # an entry needs the K steps its split was measured with (128 of K per warp for PIPE_WARP)
    key = t.key(it)
    assert t.entries[key].min_ksteps == 2 * 4 * 4  # CFG_M8_NARROW: split 4 x warp_k 4
    it.k = 64 * 31
    assert t.choice(it) is None


def test_load_skips_logs_and_failed_launches(tmp_path):
    records = synthetic()
    failed = rec("A.l0", "A", records[0]["N"], records[0]["K"], 1, "CFG_M8", 8, None, ok=False,
                 error="cluster launch failed")
    p = write(tmp_path, [*records, failed], extra="== A.l0 N= 3072\n  warning: text\n")
    items = tbl.load([p])
    it = next(it for it in items if it.layer == "A.l0" and it.m == 1)
    assert ("CFG_M8", 8) not in it.us
    # M <= 16: the dispatch's rule as the script mirrors it, not the sweep's is_rule record
    assert it.dispatch_us is not None and it.rule == tbl.small_m_rule(it) == ("CFG_M8_K8", 1)
    wide = next(it for it in items if it.layer == "A.l0" and it.m == 64)
    assert wide.rule == ("WG_CFG_64N", 1)


def test_main_writes_report_and_snippet(tmp_path, capsys):
    p = write(tmp_path, synthetic())
    out = tmp_path / "tuned.mojo"
    assert tbl.main([str(p), "--snippet", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(a) best candidate" in text and "(c) geomean" in text and "held-out" in text
    assert out.read_text().startswith("# Generated by scripts/int4_sweep_table.py")


def test_sweep_shapes_include_in_sync():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "int4_sweep_shapes.py"), "--check"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dispatch_table_is_the_committed_sweeps_output(tmp_path):
    """tuning_sm90.mojo's `tuned_wgmma` / `tuned_choice` are exactly what the script derives
    from the committed sweep, and nothing in the file compares N or K values."""
    sweep = ROOT / "benchmarks" / "results" / "int4_sweep.json.gz"
    out = tmp_path / "tuned.mojo"
    assert tbl.main([str(sweep), "--snippet", str(out)]) == 0
    generated = out.read_text()
    tuning = (ROOT / "mojo_kernels" / "int4_gemm" / "tuning_sm90.mojo").read_text()
    start = "def tuned_wgmma("
    assert tuning[tuning.index(start):] == generated[generated.index(start):]
    code = "\n".join(line.split("#")[0] for line in re.sub(r'"""[^"]*"""', "", tuning).splitlines())
    assert not re.search(r"\b(n|kp|k|N|K)\s*(==|!=|<|>)", code)


def test_k8_rule_split_mirrors_the_dispatch():
    """dispatch.choose_split_k for the 8-K-part configs: double the split while twice the
    bands still run as one wave and every warp keeps >= 512 of K."""
    assert tbl.k8_rule_split(64, 14336) == 2  # 128 CTAs, 896 of K per warp at split 2
    assert tbl.k8_rule_split(64, 4096) == 1  # split 2 would leave 256 of K per warp
    assert tbl.k8_rule_split(96, 14336) == 1  # 192 CTAs would be two waves
    assert tbl.k8_rule_split(30, 65536) == 4  # 120 CTAs in clusters of 4 fit one wave


def test_rule_split_is_a_candidate_of_the_table(tmp_path):
    """(CFG_M16_K8, 0) stands for the split the rule derives per layer, so a bucket whose
    layers want different splits can take "the rule's split" (a table entry of split 0); where
    the rule itself picks that launch, the table needs no entry."""
    out = []
    for model, (bands, k) in zip(MODELS, [(64, 14336), (64, 4096), (70, 14336), (66, 4608),
                                          (80, 16384)], strict=True):
        n = bands * 64
        best = tbl.k8_rule_split(bands, k)
        for s in (1, 2, 4):
            us = 10.0 if s == best else 13.0
            out.append(rec(f"{model}.l0", model, n, k, 16, "CFG_M16_K8", s, us,
                           bm=16, bk=64, warp_k=8))
            out.append(rec(f"{model}.l0", model, n, k, 16, "CFG_M16", s, 12.0, bm=16, bk=128,
                           warp_k=2))
    items = tbl.load([write(tmp_path, out)])
    assert all(it.us[("CFG_M16_K8", 0)] == 10.0 for it in items)
    assert all(it.rule == ("CFG_M16_K8", tbl.k8_rule_split(it.bands, it.k)) for it in items)
    assert tbl.select(items).entries == {}
    t = tbl.build(items, {(9, 16): (("bands",), 1)})
    assert {e.cand for e in t.entries.values()} == {("CFG_M16_K8", 0)}
    assert "return (2, 0)" in tbl.snippet(t, ["int4_sweep.json"])

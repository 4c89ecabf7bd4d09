#!/usr/bin/env python3
"""Turns the int4 sweep (benchmarks/mojo/int4_sweep.mojo, JSON lines) into a dispatch table keyed
only by M range and derived quantities of the problem, never by N or K values (issue 19).

    python scripts/int4_sweep_table.py benchmarks/results/int4_sweep.json.gz [more.json ...] \
        [--snippet tuned.mojo]

(a) Per (layer, M): the fastest checked candidate, the dispatch (its own entry point, timed
    as the "dispatch" record) and the rule without pins (`is_rule`), with their gap to the best.
(b) Per M range of the dispatch (<= 8, 9..16, 17..32, 33..64, 65..128, 129..256, > 256; every
    measured M falls in one), a table over buckets of derived quantities: bands = ceil(N / 64)
    and K steps = K / 64, each bucketed by octave or half octave, or neither (one choice for the
    whole range). Per bucket the candidate (config, split) with the best geomean over the
    bucket's (layer, M) items of us / best us, among the candidates measured on all of them.
    The bucketing of each M range is the one with the lowest leave-one-model-out loss (ties
    go to the coarser). Written as a Mojo snippet replacing tuning_sm90.mojo's `tuned_choice`
    and `tuned_wgmma` (same signatures and codes; (-1, 0) where the table has no entry, so the
    dispatch's rules decide there).
(c) Leave-one-model-out: the table built without a model's layers, applied to them (no entry,
    or a choice not measured on the layer: the rule's choice), as geomean us / best us per
    held-out model and M range, next to the same for the dispatch, the rule and the table
    built on everything (in-sample).

Losses are geomeans of us / best us over (layer, M) items: 1.000 = always the fastest candidate.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

M_RANGES: list[tuple[int, int]] = [
    (1, 8), (9, 16), (17, 32), (33, 64), (65, 128), (129, 256), (257, 1 << 30),
]
"""The dispatch's M ranges (tuning_sm90 / dispatch.mojo): the table's outermost key."""

GRANULARITIES: list[tuple[tuple[str, ...], int]] = [
    ((), 1),
    (("bands",), 1), (("ksteps",), 1), (("bands", "ksteps"), 1),
    (("bands",), 2), (("ksteps",), 2), (("bands", "ksteps"), 2),
]
"""Bucketings tried per M range, coarse to fine: (features, buckets per octave)."""

MMA_VARIANT = {
    # tuned_choice's variant codes per M range (tuning_sm90.tuned_choice docstring)
    "CFG_M8": 0, "CFG_M8_NARROW": 1, "CFG_M16": 0, "CFG_M16_NARROW": 1, "CFG_M16_K8": 2,
    "CFG_M8_K8": 2,
    "CFG_M32": 1,
}
WG_VARIANT = {
    "WG_CFG_64": "WG_VAR_64", "WG_CFG_64W": "WG_VAR_64W", "WG_CFG_128": "WG_VAR_128",
    "WG_CFG_64N": "WG_VAR_64N", "WG_CFG_128K": "WG_VAR_128K",
}

Cand = tuple[str, int]  # (config name, split)


def m_range(m: int) -> tuple[int, int]:
    for lo, hi in M_RANGES:
        if lo <= m <= hi:
            return (lo, hi)
    raise ValueError(f"M={m} outside every range")


def edges(per_octave: int) -> list[int]:
    """Integer lower bounds of the buckets: bucket b holds x with edges[b] <= x < edges[b + 1]
    (2^(b / per_octave) rounded up; the snippet compares against these same integers)."""
    return [math.ceil(2 ** (b / per_octave) - 1e-9) for b in range(0, 26 * per_octave)]


def bucket(x: int, per_octave: int) -> int:
    e = edges(per_octave)
    b = 0
    while b + 1 < len(e) and e[b + 1] <= x:
        b += 1
    return b


def geomean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


@dataclass
class Item:
    """One (layer, M): the checked candidates' µs and what the dispatch and the rule chose."""

    layer: str
    model: str
    n: int
    k: int
    m: int
    us: dict[Cand, float] = field(default_factory=dict)
    min_ksteps: dict[Cand, int] = field(default_factory=dict)
    dispatch_us: float | None = None
    dispatch_choice: str = ""
    rule: Cand | None = None
    gpu: str = ""  # the card the record was measured on (the sweep's "gpu" field)

    @property
    def bands(self) -> int:
        return -(-self.n // 64)

    @property
    def ksteps(self) -> int:
        return self.k // 64

    @property
    def best(self) -> tuple[Cand, float]:
        c = min(self.us, key=lambda c: (self.us[c], c))
        return c, self.us[c]

    def feature(self, name: str) -> int:
        return self.bands if name == "bands" else self.ksteps

    def ratio(self, c: Cand | None) -> float | None:
        """us of candidate c / best us, or None if c was not measured here."""
        if c is None or c not in self.us:
            return None
        return self.us[c] / self.best[1]

    def fallback_ratio(self) -> float | None:
        """What a table without an entry gets: the rule's choice (else the dispatch)."""
        r = self.ratio(self.rule)
        if r is None and self.dispatch_us is not None:
            r = self.dispatch_us / self.best[1]
        return r


def min_ksteps(rec: dict) -> int:
    """Fewest K steps (of 64) a problem needs for this launch: the sweep's own validity rule
    (PIPE_WARP: 128 of K per warp; PIPE_CTA and wgmma: 4 stages per CTA / warp-k part)."""
    split, wk, bk = rec["split"], rec.get("warp_k", 1), rec.get("bk", 64)
    if rec["kernel"] == "mma" and rec.get("bm", 32) <= 16:
        return 2 * split * wk
    if rec["kernel"] == "mma":
        return 4 * split * bk // 64
    return 4 * split * wk


K8_CONFIGS = ("CFG_M8_K8", "CFG_M16_K8")
"""The one-band x 8-K-part configs, whose split the dispatch's rule derives (`choose_split_k`)."""
K8_MIN_K_PER_WARP = 512
"""dispatch.K8_MIN_K_PER_WARP."""
SM90_SMS = 132


def cluster_wave_cap(split: int) -> int:
    """config.cluster_wave_cap(split, 1): CTAs of clusters of `split` that run as one wave."""
    return {1: SM90_SMS, 2: SM90_SMS, 3: 96, 4: 120, 5: 80, 6: 96}.get(split, 0)


def k8_rule_split(bands: int, k: int) -> int:
    """dispatch.choose_split_k for the 8-K-part configs (one CTA per band and SM)."""
    s = 1
    while s < 8 and bands * 2 * s <= cluster_wave_cap(2 * s) and k // (16 * s) >= K8_MIN_K_PER_WARP:
        s *= 2
    return s


def two_band_rule_split(bands: int, k: int) -> int:
    """dispatch.choose_split_k for CFG_M8 / CFG_M16 (two bands x 2 K parts of 128 per CTA, two
    CTAs per SM): the smallest power of two giving >= 96 CTAs, each keeping >= 4 stages."""
    ctas, stages, s = -(-bands // 2), k // 128, 1
    while s < 8 and ctas * s < 96 and stages // (2 * s) >= 4:
        s *= 2
    return s


def small_m_rule(it: Item) -> Cand:
    """dispatch.small_m_rule and the split `choose_split_k` gives its config (M <= 16): the
    8-K-part config up to two waves of one-band CTAs, else the two-band config."""
    base = "CFG_M8" if it.m <= 8 else "CFG_M16"
    if it.bands <= 2 * SM90_SMS and it.k >= 8 * 128:
        return (base + "_K8", k8_rule_split(it.bands, it.k))
    return (base, two_band_rule_split(it.bands, it.k))


def add_rule_splits(it: Item) -> None:
    """Candidate (config, 0) = the config at the split the rule derives for this item (a table
    entry with split 0 leaves the split to `choose_split_k`), where that split was measured."""
    for cfg in K8_CONFIGS:
        c = (cfg, k8_rule_split(it.bands, it.k))
        if c in it.us:
            it.us[(cfg, 0)] = it.us[c]
            it.min_ksteps[(cfg, 0)] = 2 * 8  # as `min_ksteps` at split 1: 128 of K per warp


def load(paths: Iterable[Path]) -> list[Item]:
    """Items from sweep JSON lines (other lines, e.g. a captured stdout, are skipped)."""
    items: dict[tuple[str, int, int, int], Item] = {}
    for p in paths:
        path = Path(p)
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" \
            else path.read_text()
        for line in text.splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            key = (rec["layer"], rec["N"], rec["K"], rec["M"])
            it = items.get(key) or Item(rec["layer"], rec["model"], rec["N"], rec["K"], rec["M"])
            items[key] = it
            it.gpu = rec.get("gpu", it.gpu)
            ok = rec.get("ok") and rec.get("us") is not None
            if rec["kernel"] == "dispatch":
                it.dispatch_choice = rec.get("choice", "")
                if ok:
                    it.dispatch_us = rec["us"]
                continue
            c = (rec["config"], rec["split"])
            if rec.get("is_rule"):
                it.rule = c
            if ok:
                it.us[c] = min(rec["us"], it.us.get(c, math.inf))
                it.min_ksteps[c] = min_ksteps(rec)
    for it in items.values():
        add_rule_splits(it)
        if it.m <= 16:  # the dispatch's rule as it is now, whichever rule the sweep ran with
            it.rule = small_m_rule(it)
    return [it for it in items.values() if it.us]


# ---- the table ----------------------------------------------------------------------------------

BucketKey = tuple[tuple[int, int], tuple[int, ...]]


@dataclass
class Entry:
    cand: Cand
    score: float  # geomean us / best us over the bucket's items
    items: int
    min_ksteps: int


@dataclass
class Table:
    gran: dict[tuple[int, int], tuple[tuple[str, ...], int]]  # per M range
    entries: dict[BucketKey, Entry]

    def key(self, it: Item) -> BucketKey | None:
        mr = m_range(it.m)
        if mr not in self.gran:
            return None
        feats, per = self.gran[mr]
        return (mr, tuple(bucket(it.feature(f), per) for f in feats))

    def choice(self, it: Item) -> Cand | None:
        k = self.key(it)
        e = self.entries.get(k) if k is not None else None
        if e is None or it.ksteps < e.min_ksteps:
            return None
        return e.cand

    def ratio(self, it: Item) -> float | None:
        r = it.ratio(self.choice(it))
        return r if r is not None else it.fallback_ratio()


def build(items: list[Item], gran: dict[tuple[int, int], tuple[tuple[str, ...], int]]) -> Table:
    t = Table(gran, {})
    groups: dict[BucketKey, list[Item]] = defaultdict(list)
    for it in items:
        k = t.key(it)
        if k is not None:
            groups[k].append(it)
    for k, its in groups.items():
        common = set.intersection(*(set(it.us) for it in its))
        if not common:
            continue
        scored = sorted((geomean(it.us[c] / it.best[1] for it in its), c) for c in common)
        score, c = scored[0]
        need = max(it.min_ksteps[c] for it in its)
        t.entries[k] = Entry(c, score, len(its), need)
    return t


def loss(items: list[Item], f: Callable[[Item], float | None]) -> float:
    return geomean(r for r in (f(it) for it in items) if r is not None)


def lomo(items: list[Item], gran: dict) -> dict[str, float]:
    """Per held-out model: geomean us / best of the table built on the other models."""
    out = {}
    for model in sorted({it.model for it in items}):
        train = [it for it in items if it.model != model]
        test = [it for it in items if it.model == model]
        t = build(train, gran)
        out[model] = loss(test, t.ratio)
    return out


def lomo_pooled(items: list[Item], gran: dict) -> float:
    ratios = []
    for model in {it.model for it in items}:
        t = build([it for it in items if it.model != model], gran)
        ratios += [r for it in items if it.model == model if (r := t.ratio(it)) is not None]
    return geomean(ratios)


def select(items: list[Item]) -> Table:
    """Per M range the bucketing with the lowest pooled leave-one-model-out loss, or no entries
    at all (the dispatch's rule decides) where the rule's own loss is as low; then the table of
    all items with those bucketings."""
    gran = {}
    for mr in sorted({m_range(it.m) for it in items}):
        its = [it for it in items if m_range(it.m) == mr]
        best = None
        for g in GRANULARITIES:
            score = lomo_pooled(its, {mr: g}) if len({it.model for it in its}) > 1 else 1.0
            if best is None or score < best[0] - 1e-9:
                best = (score, g)
        if best[0] < loss(its, Item.fallback_ratio) - 1e-9:
            gran[mr] = best[1]
    return build(items, gran)


# ---- the Mojo snippet ---------------------------------------------------------------------------


def _range_cond(mr: tuple[int, int]) -> str:
    lo, hi = mr
    if hi >= 1 << 29:
        return f"m >= {lo}"
    return f"m <= {hi}" if lo == 1 else f"m >= {lo} and m <= {hi}"


def _bucket_cond(
    feats: tuple[str, ...], per: int, lo: tuple[int, ...], hi: tuple[int, ...]
) -> list[str]:
    """Conditions for buckets lo[i]..hi[i] (inclusive) of feature i."""
    e = edges(per)
    return [f"{f} >= {e[a]} and {f} < {e[b + 1]}" for f, a, b in zip(feats, lo, hi, strict=True)]


def _merged(t: Table) -> list[tuple[tuple[int, int], tuple[int, ...], tuple[int, ...], Entry]]:
    """The entries as (M range, first bucket, last bucket, entry), where a one-feature bucketing
    joins neighbouring buckets with the same choice (score: the worse, items: summed)."""
    out: list = []
    for (mr, b), e in sorted(t.entries.items()):
        if out and len(b) == 1 and out[-1][0] == mr and out[-1][2][0] + 1 == b[0] \
                and out[-1][3].cand == e.cand:
            prev = out[-1][3]
            joined = Entry(e.cand, max(prev.score, e.score), prev.items + e.items,
                           max(prev.min_ksteps, e.min_ksteps))
            out[-1] = (mr, out[-1][1], b, joined)
        else:
            out.append((mr, b, b, e))
    return out


def snippet(t: Table, sources: list[str]) -> str:
    """tuned_choice / tuned_wgmma as Mojo source (tuning_sm90.mojo also needs
    `from std.math import ceildiv`)."""
    mma: dict[tuple[int, int], list[str]] = defaultdict(list)
    wg: dict[tuple[int, int], list[str]] = defaultdict(list)
    for mr, lo, hi, e in _merged(t):
        feats, per = t.gran[mr]
        conds = [*_bucket_cond(feats, per, lo, hi), f"ksteps >= {e.min_ksteps}"]
        cfg, split = e.cand
        how = "the rule's split" if split == 0 else f"split {split}"
        note = f"  # {cfg} {how}: {e.score:.3f} x best over {e.items} item(s)"
        if cfg in WG_VARIANT:
            wg[mr].append(f"        if {' and '.join(conds)}:{note}\n"
                          f"            return ({WG_VARIANT[cfg]}, {split})")
        elif cfg in MMA_VARIANT and (mr[1] <= 32 or cfg == "CFG_M32"):
            mma[mr].append(f"        if {' and '.join(conds)}:{note}\n"
                           f"            return ({MMA_VARIANT[cfg]}, {split})")
        # anything else (no such candidate is swept) stays with the rules

    def body(rows: dict[tuple[int, int], list[str]]) -> str:
        # no entries: no locals (Mojo warns about unused ones)
        out = ["    var bands = ceildiv(n, 64)", "    var ksteps = kp // 64"] if rows else []
        for mr in sorted(rows):
            out.append(f"    if {_range_cond(mr)}:")
            out.extend(rows[mr])
        out.append("    return (-1, 0)")
        return "\n".join(out)

    grans = ", ".join(
        f"{_range_cond(mr)}: {'+'.join(f) or 'one choice'}"
        + (f" ({'octave' if per == 1 else f'1/{per} octave'} buckets)" if f else "")
        for mr, (f, per) in sorted(t.gran.items()))
    src = ", ".join(sources)
    return f'''# Generated by scripts/int4_sweep_table.py from {src}.
# Keys: M range, bands = ceil(N / 64), ksteps = K / 64 (bucketed: {grans}).
# tuning_sm90.mojo needs `from std.math import ceildiv` for these.


def tuned_wgmma(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:
    """(wgmma variant, split_k) measured best per M range and bucket of derived quantities
    (scripts/int4_sweep_table.py over the SM90 sweep of benchmarks/mojo/int4_sweep.mojo), or
    (-1, 0): then `wgmma_rule` decides."""
{body(wg)}


def tuned_choice(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:
    """(variant, split_k) of the mma.sync kernels, measured best per M range and bucket of
    derived quantities (as `tuned_wgmma`), or (-1, 0): then the band rule and `choose_split_k`
    decide (as they do for a split of 0). variant: M <= 16: 0 = CFG_M8 / CFG_M16, 1 = the
    *_NARROW config, 2 = CFG_M8_K8 / CFG_M16_K8; 17..64: 1 = CFG_M32 (this keeps the dispatch on
    mma.sync)."""
{body(mma)}
'''


# ---- report -------------------------------------------------------------------------------------


def _fmt(r: float | None) -> str:
    return "   -  " if r is None else f"{(r - 1) * 100:5.1f}%"


def _dispatch_ratio(it: Item) -> float | None:
    return None if it.dispatch_us is None else it.dispatch_us / it.best[1]


def report(items: list[Item], t: Table, out=None) -> None:
    p = lambda *a: print(*a, file=out or sys.stdout)  # noqa: E731
    p("(a) best candidate vs the dispatch and the rule (gap = us / best us - 1)")
    p(f"{'layer':16} {'M':>5}  {'best':22} {'best_us':>9}  {'dispatch':22} {'gap':>6}"
      f"  {'rule':22} {'gap':>6}  {'table':22} {'gap':>6}")
    for it in sorted(items, key=lambda it: (it.model, it.layer, it.m)):
        c, us = it.best
        d = _dispatch_ratio(it)
        rule = f"{it.rule[0]}/s{it.rule[1]}" if it.rule else "-"
        tc = t.choice(it)
        table = f"{tc[0]}/s{tc[1]}" if tc else "(rule)"
        p(f"{it.layer:16} {it.m:5}  {c[0] + '/s' + str(c[1]):22} {us:9.2f}  {it.dispatch_choice:22}"
          f" {_fmt(d)}  {rule:22} {_fmt(it.ratio(it.rule))}  {table:22} {_fmt(t.ratio(it))}")
    p("")
    p("(b) table: per M range the bucketing chosen by leave-one-model-out loss")
    for mr, (f, per) in sorted(t.gran.items()):
        n = sum(1 for e in _merged(t) if e[0] == mr)
        p(f"  {_range_cond(mr):18} {'+'.join(f) or 'one choice':13} per octave {per}: {n} entries")
    for mr in sorted({m_range(it.m) for it in items} - set(t.gran)):
        p(f"  {_range_cond(mr):18} no entries: the rule's loss is as low")
    p("")
    p("(c) geomean us / best us (1.000 = always the fastest candidate)")
    models = sorted({it.model for it in items})
    mrs = sorted({m_range(it.m) for it in items})
    p(f"  {'held-out model':16} {'M range':18} {'items':>5} {'dispatch':>9} {'rule':>7}"
      f" {'in-sample':>10} {'held-out':>9}")
    pooled: list[float] = []
    for model in models:
        train = [it for it in items if it.model != model]
        held = build(train, t.gran)
        for mr in mrs:
            test = [it for it in items if it.model == model and m_range(it.m) == mr]
            if not test:
                continue
            d = loss(test, _dispatch_ratio)
            p(f"  {model:16} {_range_cond(mr):18} {len(test):5} {d:9.3f}"
              f" {loss(test, lambda it: it.ratio(it.rule)):7.3f} {loss(test, t.ratio):10.3f}"
              f" {loss(test, held.ratio):9.3f}")
            pooled += [r for it in test if (r := held.ratio(it)) is not None]
    d_all = loss(items, _dispatch_ratio)
    p(f"  {'all':16} {'all':18} {len(items):5} {d_all:9.3f}"
      f" {loss(items, lambda it: it.ratio(it.rule)):7.3f} {loss(items, t.ratio):10.3f}"
      f" {geomean(pooled):9.3f}")


def cards(items: list[Item]) -> str:
    """Which card each M was measured on, e.g. "H100 at M 1, 16; H200 at M 64, 128"."""
    by_gpu: dict[str, set[int]] = {}
    for it in items:
        by_gpu.setdefault(it.gpu or "an unnamed card", set()).add(it.m)
    return "; ".join(
        f"{g} at M {', '.join(map(str, sorted(ms)))}" for g, ms in sorted(by_gpu.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="int4_sweep.json (JSON lines)")
    ap.add_argument("--snippet", type=Path, help="write the Mojo snippet here (default: print it)")
    args = ap.parse_args(argv)
    items = load(args.files)
    if not items:
        print("int4_sweep_table: no measured items in", *args.files)
        return 1
    t = select(items)
    report(items, t)
    text = snippet(t, [f.name for f in args.files] + [cards(items)])
    if args.snippet:
        args.snippet.write_text(text)
        print(f"\nwrote {args.snippet}")
    else:
        print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

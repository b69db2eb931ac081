"""`flopwatch detect` on the Turing Change Point Dataset: F1 and cover against its annotations.

    python -m bench.tcpd --data PATH [--json out/bench/tcpd.json] [--param NAME=VALUE ...]

PATH is a checkout of https://github.com/alan-turing-institute/TCPD (or any folder holding
its `annotations.json` and the datasets' `<name>.json` files; a few datasets are fetched by
their own scripts there and are simply absent without them). The data are not part of this
repository. Series: the univariate ones TCPDBench reports, i.e. without `quality_control_*`
(synthetic, for checking annotators) and `uk_coal_employ` (missing values), as far as
present. They are split by a fixed rule into half A (even positions in alphabetical order)
and half B (odd); finite mode's choices were compared on half A only.

Rows: zero (no change), river's PageHinkley with its defaults, binary segmentation
(`binseg`, below), `binseg-published` (TCPDBench's default binseg run, its per-series
scores), the engine's defaults, offset-free settings, and `flopwatch detect --finite`.

The metrics follow van den Burg & Williams (2020), "An evaluation of change point detection
algorithms": the start of the series counts as a change point for predictions and every
annotator alike; a prediction within `margin` (5) samples of an annotated change is a true
positive (each matched at most once); precision is against the union of the annotators'
changes, recall is averaged over annotators, F1 is their harmonic mean. Cover is the
annotators' average of the segmentation covering metric. "zero" is the same scoring for a
method that reports no change: the floor any detector should clear.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monitor.cli import detector_param
from monitor.detect.univariate import detect_series

MARGIN = 5
EXCLUDED = ("quality_control_", "uk_coal_employ")  # left out of TCPDBench's tables
BINSEG_MAX_CPS = 5  # TCPDBench's default Q for binseg
# TCPDBench's default binseg (R changepoint, MBIC penalty, Q = 5): per-series (F1, cover), from
# github.com/alan-turing-institute/TCPDBench analysis/output/scores/default_{f1,cover}_scores.json.
BINSEG_PUBLISHED: dict[str, tuple[float, float]] = {
    "bank": (0.4, 0.5094664371772806),
    "bitcoin": (0.42573099415204685, 0.7544258508359084),
    "brent_spot": (0.48343373493975905, 0.6267941377908149),
    "businv": (0.3703703703703703, 0.5616385346323081),
    "centralia": (0.9090909090909091, 0.5635978835978837),
    "children_per_woman": (0.6175115207373272, 0.7982556272643626),
    "co2_canada": (0.6905689789555729, 0.6080954444081101),
    "construction": (0.7090909090909091, 0.4662169703155342),
    "debt_ireland": (0.7603305785123966, 0.6346153846153847),
    "gdp_argentina": (0.888888888888889, 0.6674763588023808),
    "gdp_croatia": (0.5833333333333333, 0.6053921568627451),
    "gdp_iran": (0.4915254237288136, 0.4773172527036974),
    "gdp_japan": (0.6153846153846154, 0.6538916256157635),
    "global_co2": (0.9285714285714286, 0.748224852071006),
    "homeruns": (0.8118811881188119, 0.6826141913243321),
    "iceland_tourism": (0.6428571428571429, 0.7638979209774363),
    "jfk_passengers": (0.7755102040816326, 0.8392664497512488),
    "lga_passengers": (0.43820224719101125, 0.45828866764869847),
    "measles": (0.9473684210526316, 0.9511852891971232),
    "nile": (1.0, 0.8800821917808218),
    "ozone": (0.6495726495726496, 0.6001481481481481),
    "rail_lines": (0.8461538461538461, 0.7863825363825364),
    "ratner_stock": (0.8235294117647058, 0.9127129495029589),
    "robocalls": (0.8, 0.641011386803242),
    "scanline_126007": (0.7385740402193783, 0.4641245857865578),
    "scanline_42049": (0.7134502923976608, 0.6314867217082936),
    "seatbelts": (0.6829268292682926, 0.796945892630244),
    "shanghai_license": (0.8679245283018869, 0.9196947071511531),
    "unemployment_nl": (0.8764044943820225, 0.669177886902036),
    "us_population": (0.6666666666666666, 0.3909313725490196),
    "usd_isk": (0.6565143824027072, 0.7347653721190944),
    "well_log": (0.5342019543973942, 0.6954264948476262),
}
# Offset-free settings for series far from zero (docs/detection.md, `flopwatch detect`).
OFFSET_FREE: dict[str, float] = {"min_rel_change": 0.0, "rel_floor": 2.0**-23}


def true_positives(truth: Iterable[int], found: Iterable[int], margin: int = MARGIN) -> set[int]:
    """Annotated changes with a prediction within `margin`, each prediction used once."""
    left = set(found)
    hit: set[int] = set()
    for tau in sorted(truth):
        near = sorted((abs(tau - x), x) for x in left if abs(tau - x) <= margin)
        if near:
            hit.add(tau)
            left.remove(near[0][1])
    return hit


def f1(annotations: Sequence[Sequence[int]], found: Iterable[int], margin: int = MARGIN) -> float:
    """F1 of `found` against several annotators (the series start counts for all)."""
    sets = [set(a) | {0} for a in annotations]
    pred = set(found) | {0}
    union = set().union(*sets)
    precision = len(true_positives(union, pred, margin)) / len(pred)
    recall = sum(len(true_positives(t, pred, margin)) / len(t) for t in sets) / len(sets)
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def segments(cps: Iterable[int], n: int) -> list[range]:
    """The partition of 0..n-1 that change points (first index of each segment) make."""
    bounds = sorted({c for c in cps if 0 < c < n} | {0, n})
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def _jaccard(a: range, b: range) -> float:
    inter = max(0, min(a.stop, b.stop) - max(a.start, b.start))
    return inter / (len(a) + len(b) - inter)


def cover(annotations: Sequence[Sequence[int]], found: Iterable[int], n: int) -> float:
    """Segmentation covering of the annotators' partitions by the predicted one, averaged."""
    pred = segments(found, n)
    total = 0.0
    for ann in annotations:
        truth = segments(ann, n)
        total += sum(len(r) * max(_jaccard(r, p) for p in pred) for r in truth) / n
    return total / len(annotations)


def binseg(values: Sequence[float | None], max_cps: int = BINSEG_MAX_CPS) -> list[int]:
    """Binary segmentation, L2 cost, BIC-like penalty: a split is kept while it lowers the
    squared error by more than 3 log(n) noise variances (MBIC's per-change term), the noise
    sd from the MAD of first differences; at most `max_cps`; missing samples dropped."""
    idx = [i for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    x = np.array([values[i] for i in idx], dtype=np.float64)
    n = x.size
    if n < 4:
        return []
    d = np.diff(x)
    sd = float(np.median(np.abs(d - np.median(d)))) * 1.4826 / math.sqrt(2.0)
    if sd <= 0:
        sd = float(np.std(d)) / math.sqrt(2.0)
    penalty = 3.0 * math.log(n) * max(sd * sd, 1e-300)
    cps: list[int] = []
    todo = [(0, n)]
    while todo and len(cps) < max_cps:
        best: tuple[float, int, int, int] | None = None
        for a, b in todo:
            if b - a < 4:
                continue
            y = x[a:b]
            cs = np.cumsum(y)
            k = np.arange(2, b - a - 1)  # both parts at least 2 samples
            left, right = cs[k - 1], cs[-1] - cs[k - 1]
            gain = left**2 / k + right**2 / (b - a - k) - cs[-1] ** 2 / (b - a)
            j = int(np.argmax(gain))
            if best is None or gain[j] > best[0]:
                best = (float(gain[j]), a, b, a + int(k[j]))
        if best is None or best[0] <= penalty:
            break
        _, a, b, at = best
        cps.append(at)
        todo.remove((a, b))
        todo += [(a, at), (at, b)]
    return sorted(idx[c] for c in cps)


def halves(names: Iterable[str]) -> dict[str, list[str]]:
    """The fixed split: A even, B odd positions in alphabetical order; and the pool."""
    ordered = sorted(names)
    return {"A": ordered[0::2], "B": ordered[1::2], "pool": ordered}


def load(data: Path) -> tuple[dict[str, list[float | None]], dict[str, list[list[int]]], list[str]]:
    """Univariate series by name, annotations by name, and the names skipped (multivariate
    or left out of TCPDBench's tables)."""
    notes = next(iter(sorted(data.rglob("annotations.json"))), None)
    if notes is None:
        raise SystemExit(f"bench/tcpd.py: error: no annotations.json under {data}")
    annotations = {
        name: [list(v) for v in by.values()] for name, by in json.loads(notes.read_text()).items()
    }
    series: dict[str, list[float | None]] = {}
    skipped = []
    for path in sorted(data.rglob("*.json")):
        name = path.stem
        if name not in annotations:
            continue
        doc = json.loads(path.read_text())
        if len(doc.get("series", [])) != 1 or name.startswith(EXCLUDED):
            skipped.append(name)
            continue
        series[name] = [None if v is None else float(v) for v in doc["series"][0]["raw"]]
    return series, annotations, skipped


def _methods(runs: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Each row's method: values -> found indices."""
    methods: dict[str, Any] = {
        "zero": lambda v: [],
        "page_hinkley": lambda v: detect_series(v, kind="page_hinkley"),
        "binseg": binseg,
    }
    for label, params in runs.items():
        methods[label] = lambda v, p=params: detect_series(v, params=p)
    methods["finite"] = lambda v: detect_series(v, finite=True)
    return methods


def _score_rows(
    series: dict[str, list[float | None]], annotations: dict[str, list[list[int]]],
    methods: dict[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    rows: list[dict[str, Any]] = []
    for name, values in series.items():
        ann, n = annotations[name], len(values)
        row: dict[str, Any] = {"dataset": name, "n": n,
                               "annotated": sorted({c for a in ann for c in a})}  # fmt: skip
        for label, method in methods.items():
            found = method(values)
            row[label] = {"f1": f1(ann, found), "cover": cover(ann, found, n), "found": found}
        if name in BINSEG_PUBLISHED:
            pf1, pcover = BINSEG_PUBLISHED[name]
            row["binseg-published"] = {"f1": pf1, "cover": pcover}
        rows.append(row)
    return rows


def _means(rows: list[dict[str, Any]], labels: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """Mean F1 and cover per half and label (a label only over rows that have it)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    by_name = {r["dataset"]: r for r in rows}
    for half, names in halves(by_name).items():
        out[half] = {}
        for lb in labels:
            have = [by_name[nm][lb] for nm in names if lb in by_name[nm]]
            if have:
                out[half][lb] = {m: sum(h[m] for h in have) / len(have) for m in ("f1", "cover")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a TCPD checkout (or its files)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--param", type=detector_param, action="append", default=[],
                    metavar="NAME=VALUE",
                    help="engine parameter for the 'given' row (repeatable)")  # fmt: skip
    args = ap.parse_args(argv)
    series, annotations, skipped = load(args.data)
    if not series:
        print(f"bench/tcpd.py: error: no univariate TCPD series under {args.data}", file=sys.stderr)
        return 2
    runs: dict[str, dict[str, float]] = {"defaults": {}, "offset-free": OFFSET_FREE}
    if args.param:
        runs["given"] = dict(args.param)
    started = time.perf_counter()
    methods = _methods(runs)
    rows = _score_rows(series, annotations, methods)
    labels = [*methods, "binseg-published"]
    print(f"{'dataset':20} {'n':>5}  " + "  ".join(f"{lb[:17]:>17}" for lb in labels))
    print(f"{'':20} {'':>5}  " + "  ".join(f"{'F1':>8} {'cover':>8}" for _ in labels))

    def cells(r: dict[str, Any]) -> str:
        return "  ".join(
            f"{r[lb]['f1']:8.3f} {r[lb]['cover']:8.3f}" if lb in r else f"{'—':>17}"
            for lb in labels
        )

    for r in rows:
        print(f"{r['dataset']:20} {r['n']:5d}  {cells(r)}")
    mean = _means(rows, labels)
    for half, names in halves(series).items():
        print(f"{'mean ' + half:20} {len(names):5d}  {cells(mean[half])}")
    if skipped:
        print(f"skipped (more than one series, or not in TCPDBench's tables): {', '.join(skipped)}")
    absent = sorted(set(BINSEG_PUBLISHED) - set(series))
    if absent:
        print(f"absent here (fetched by their own scripts): {', '.join(absent)}")
    seconds = time.perf_counter() - started
    print(f"{len(rows)} series in {seconds:.1f} s; half A: {', '.join(halves(series)['A'])}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"mean": mean, "rows": rows, "skipped": skipped, "absent": absent,
               "margin": MARGIN, "runs": runs, "seconds": seconds}  # fmt: skip
        args.json.write_text(json.dumps(out, indent=2, allow_nan=False) + "\n")
    return 0 if all(math.isfinite(v["f1"]) for v in mean["pool"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

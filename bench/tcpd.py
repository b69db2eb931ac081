"""`flopwatch detect` on the Turing Change Point Dataset: F1 and cover against its annotations.

    python -m bench.tcpd --data PATH [--json out/bench/tcpd.json] [--param NAME=VALUE ...]

PATH is a checkout of https://github.com/alan-turing-institute/TCPD (or any folder holding
its `annotations.json` and the datasets' `<name>.json` files; a few datasets are fetched by
their own scripts there and are simply absent without them). The data are not part of this
repository. Univariate series only: the engine watches one number per stream.

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

from monitor.cli import detector_param
from monitor.detect.univariate import detect_series

MARGIN = 5
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


def load(data: Path) -> tuple[dict[str, list[float | None]], dict[str, list[list[int]]], list[str]]:
    """Univariate series by name, annotations by name, and the names skipped (multivariate)."""
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
        if len(doc.get("series", [])) != 1:
            skipped.append(name)
            continue
        series[name] = [None if v is None else float(v) for v in doc["series"][0]["raw"]]
    return series, annotations, skipped


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
    rows: list[dict[str, Any]] = []
    for name, values in series.items():
        ann, n = annotations[name], len(values)
        row: dict[str, Any] = {"dataset": name, "n": n,
                               "annotated": sorted({c for a in ann for c in a})}  # fmt: skip
        row["zero"] = {"f1": f1(ann, []), "cover": cover(ann, [], n), "found": []}
        for label, params in runs.items():
            found = detect_series(values, params=params)
            row[label] = {"f1": f1(ann, found), "cover": cover(ann, found, n), "found": found}
        rows.append(row)
    labels = ["zero", *runs]
    print(f"{'dataset':20} {'n':>5}  " + "  ".join(f"{lb:>17}" for lb in labels))
    print(f"{'':20} {'':>5}  " + "  ".join(f"{'F1':>8} {'cover':>8}" for _ in labels))
    for r in rows:
        cells = "  ".join(f"{r[lb]['f1']:8.3f} {r[lb]['cover']:8.3f}" for lb in labels)
        print(f"{r['dataset']:20} {r['n']:5d}  {cells}")
    mean = {lb: {m: sum(r[lb][m] for r in rows) / len(rows) for m in ("f1", "cover")}
            for lb in labels}  # fmt: skip
    cells = "  ".join(f"{mean[lb]['f1']:8.3f} {mean[lb]['cover']:8.3f}" for lb in labels)
    print(f"{'mean':20} {len(rows):5d}  {cells}")
    if skipped:
        print(f"skipped (more than one series): {', '.join(skipped)}")
    seconds = time.perf_counter() - started
    print(f"{len(rows)} series in {seconds:.1f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"mean": mean, "rows": rows, "skipped": skipped, "margin": MARGIN,
               "runs": runs, "seconds": seconds}  # fmt: skip
        args.json.write_text(json.dumps(out, indent=2, allow_nan=False) + "\n")
    return 0 if all(math.isfinite(mean[lb]["f1"]) for lb in labels) else 1


if __name__ == "__main__":
    raise SystemExit(main())

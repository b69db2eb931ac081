"""Bank scores on ideal innovations: what a per-stream noise model could buy.

    python -m bench.scores --json out/bench/scores.json [--streams 20000] [--windows 2000]

Known level and scale (no baseline estimation, no AR), so only the per-window
score differs: the engine's clipped, capped linear bank; a bank of Student-t3
likelihood ratios (optionally scaled down); and the wider bounds a light-tailed
cell could use. Noise is in robust (Huber proposal-2, clip 2.5) sigma units, as
the engine sees it; shifts are in true standard deviations. False alarms count
first alarms per stream, so they read about twice the engine's own figures; use
them to compare rows, not against the budget. Results: docs/detection.md.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np

from monitor.detect.bank import clipped_second_moment

F32 = np.ndarray
Score = Callable[[F32], list[F32]]


@cache
def huber_scale(nu: int, c: float = 2.5) -> float:
    """Huber proposal-2 scale (clip `c`) of a unit Student-t with `nu` degrees of freedom."""
    kappa = clipped_second_moment(c)
    norm = math.exp(math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2)) / math.sqrt(nu * math.pi)
    s = 1.0
    for _ in range(60):  # fixed point of E[min((T/s)², c²)] = kappa
        a = c * s
        t = np.linspace(0.0, a, 20001)
        f = norm * (1.0 + t * t / nu) ** (-(nu + 1) / 2)
        inside = 2.0 * float(np.trapezoid(f, t))
        second = 2.0 * float(np.trapezoid(t * t * f, t))
        s = math.sqrt((second + a * a * (1.0 - inside)) / kappa)
    return s


def lin(shifts: tuple[float, ...], clip: float, cap: float) -> Score:
    """The engine's members: min(±delta * clip(z) - delta²/2, cap)."""

    def score(z: F32) -> list[F32]:
        zc = np.clip(z, -clip, clip)
        out = []
        for d in shifts:
            out += [np.minimum(d * zc - d * d / 2, cap), np.minimum(-d * zc - d * d / 2, cap)]
        return out

    return score


def t3(shifts: tuple[float, ...], factor: float) -> Score:
    """Student-t3 log-likelihood ratios for shifts in robust sigmas, times `factor`."""
    s = huber_scale(3)

    def score(z: F32) -> list[F32]:
        u = z * s
        base = np.log1p(u * u / 3)
        return [
            factor * 2.0 * (base - np.log1p((u - sign * d * s) ** 2 / 3))
            for d in shifts
            for sign in (1.0, -1.0)
        ]

    return score


def noise(kind: str, n: int, rng: np.random.Generator) -> tuple[F32, float]:
    """Innovations in robust sigma units, and one true standard deviation in those units."""
    if kind == "gauss":
        return rng.standard_normal(n).astype(np.float32), 1.0
    nu = int(kind[1:])
    s = huber_scale(nu)
    return (rng.standard_t(nu, n) / s).astype(np.float32), float(np.sqrt(nu / (nu - 2)) / s)


def run(kind: str, shift: float, n: int, windows: int, score: Score, h: float = 11.0) -> float:
    """First-alarm count on null streams (shift 0), else the median delay in windows."""
    rng = np.random.default_rng(1)
    stats: np.ndarray | None = None
    first = np.full(n, -1)
    for t in range(windows):
        e, sd = noise(kind, n, rng)
        steps = score(e + shift * sd)
        if stats is None:
            stats = np.zeros((len(steps), n), np.float32)
        for j, a in enumerate(steps):
            stats[j] = np.maximum(stats[j] + a, 0.0)
        hit = (stats.max(axis=0) > h) & (first < 0)
        first[hit] = t
        stats[:, hit] = 0.0
        if shift and bool((first >= 0).all()):
            break
    if shift:
        return float(np.median(first + 1))
    return float((first >= 0).sum())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--streams", type=int, default=20000)
    ap.add_argument("--windows", type=int, default=2000)
    args = ap.parse_args(argv)
    banks: dict[str, Score] = {
        "engine (clip 2.5, cap 2.5)": lin((0.5, 1.0, 2.0), 2.5, 2.5),
        "light bounds (clip 4.5, cap 5.4)": lin((0.5, 1.0, 2.0), 4.5, 5.4),
        "t3 likelihood, 0.5-4": t3((0.5, 1.0, 2.0, 4.0), 1.0),
        "t3 likelihood x 0.9": t3((0.5, 1.0, 2.0, 4.0), 0.9),
    }
    per = args.streams * args.windows / 1e5
    rows = []
    print(f"{'bank':34} {'noise':6} {'FA/1e5':>7} {'1sd':>5} {'2sd':>5} {'3sd':>5}")
    for name, score in banks.items():
        for kind in ("gauss", "t3", "t5", "t10"):
            fa = run(kind, 0.0, args.streams, args.windows, score) / per
            d = [run(kind, s, 4000, 400, score) for s in (1.0, 2.0, 3.0)]
            print(f"{name:34} {kind:6} {fa:7.3f} {d[0]:5.0f} {d[1]:5.0f} {d[2]:5.0f}", flush=True)
            rows.append({"bank": name, "noise": kind, "false_alarms_per_1e5": fa,
                         "median_delay_1sd": d[0], "median_delay_2sd": d[1],
                         "median_delay_3sd": d[2]})  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

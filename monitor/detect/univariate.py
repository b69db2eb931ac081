"""`flopwatch detect`: change points of one series, one number per line, with the fleet engine.

Sample ``i`` is treated as the window ``[i, i+1)``, so its event time is
``i + 1`` and an onset (the end of the last window before a shift) is the
index of the first sample after it. An empty line is a missing window.

With `finite` the input is read to its end first and judged by
`monitor.detect.finite` instead: still one online pass, with burn-in and threshold
sized to the series' length.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from monitor.detect.base import Detector
from monitor.detect.factory import DEFAULT_KIND, make_detector
from monitor.detect.finite import FiniteSeries
from monitor.errors import ParseError

_ROW = np.zeros(1, dtype=np.int64)


# The engine keeps recent samples as float32: a larger magnitude would be stored as inf.
_MAX_ABS = float(np.finfo(np.float32).max)


def parse_line(lineno: int, line: str) -> float:
    """One input line as a value; NaN for an empty line (or 'nan'): a missing window."""
    text = line.strip()
    if not text:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        raise ParseError(lineno, text) from None
    if math.isinf(value):
        raise ParseError(lineno, text)
    if abs(value) > _MAX_ABS:
        raise ParseError(lineno, text, f"expected a number within ±{_MAX_ABS:.3g}")
    return value


@dataclass(frozen=True, slots=True)
class Found:
    """One change point of a series: indices are 0-based sample numbers."""

    onset: int  # first sample of the new level
    detected: int  # the sample whose arrival completed the detection
    before: float  # level before the change
    after: float  # level since the onset
    score: float  # confidence, in units of the decision threshold (>= 1)

    def json(self) -> str:
        """One JSON object on one line."""
        return json.dumps(
            {"onset": self.onset, "detected": self.detected, "before": self.before,
             "after": self.after, "score": round(self.score, 6)}
        )  # fmt: skip


class SeriesDetector:
    """Feeds one series sample by sample; yields onset indices as they are detected."""

    def __init__(
        self, kind: str = DEFAULT_KIND, params: Mapping[str, float | int] | None = None
    ) -> None:
        self.det: Detector = make_detector(kind, 1, params)
        self.i = 0

    def push(self, value: float | None) -> list[int]:
        """Feed sample `self.i`; the onset indices this completes (usually none)."""
        return [found.onset for found in self.push_found(value)]

    def push_found(self, value: float | None) -> list[Found]:
        """Feed sample `self.i`; the change points this completes, with their details."""
        x = math.nan if value is None else float(value)
        self.i += 1
        hits = self.det.update(_ROW, np.array([float(self.i)]), np.array([[x]]))
        return [
            Found(min(max(round(float(t)), 0), self.i - 1), self.i - 1, float(b), float(a),
                  float(sc))
            for t, b, a, sc in zip(hits.onset_ts, hits.before, hits.after, hits.score,
                                   strict=True)
        ]  # fmt: skip


def finite_found(values: Sequence[float | None]) -> list[Found]:
    """The change points of a whole series in finite mode, in order of detection."""
    fs = FiniteSeries(len(values))
    return [Found(*hit) for v in values for hit in fs.push(v)]


def detect_series(
    values: Sequence[float | None],
    kind: str = DEFAULT_KIND,
    params: Mapping[str, float | int] | None = None,
    *,
    finite: bool = False,
) -> list[int]:
    """0-based indices of the estimated change points (first sample of each new level);
    `finite` sizes burn-in and threshold to the series (`kind` and `params` unused)."""
    if finite:
        return [f.onset for f in finite_found(values)]
    sd = SeriesDetector(kind, params)
    out: list[int] = []
    for v in values:
        out.extend(sd.push(v))
    return out


def main_stdin(
    stdin: Iterable[str],
    stdout: TextIO,
    kind: str = DEFAULT_KIND,
    params: Mapping[str, float | int] | None = None,
    stderr: TextIO | None = None,
    details: bool = False,
    finite: bool = False,
) -> int:
    """Stream stdin to change-point indices on stdout (or JSON lines with `details`); 2 (one
    error line) on a bad line. `finite` reads stdin to its end first."""
    err = sys.stderr if stderr is None else stderr
    if finite:
        return _finite_stdin(stdin, stdout, err, details)
    sd = SeriesDetector(kind, params)
    for lineno, line in enumerate(stdin, start=1):
        try:
            value = parse_line(lineno, line)
        except ParseError as exc:
            err.write(f"flopwatch detect: error: {exc}\n")
            return 2
        found = sd.push_found(value)
        if found:
            lines = (f.json() if details else str(f.onset) for f in found)
            stdout.write("".join(f"{line}\n" for line in lines))
            stdout.flush()  # a pipe consumer sees change points as they happen
    stdout.flush()
    return 0


def _finite_stdin(stdin: Iterable[str], stdout: TextIO, err: TextIO, details: bool) -> int:
    """Finite mode: the whole input parsed first (a bad line prints nothing else)."""
    values: list[float | None] = []
    for lineno, line in enumerate(stdin, start=1):
        try:
            values.append(parse_line(lineno, line))
        except ParseError as exc:
            err.write(f"flopwatch detect: error: {exc}\n")
            return 2
    found = finite_found(values)
    stdout.write("".join(f"{f.json() if details else f.onset}\n" for f in found))
    stdout.flush()
    return 0

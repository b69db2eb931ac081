"""A one-line progress bar on a terminal (records, rate, ETA); silent when not a TTY.

Long commands (`replay`, `sim`, `report`, `ingest`) draw it on stderr, so CI logs and
pipes get nothing extra: the bar exists only where a person watches it.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO

_WIDTH = 24


def _clock(seconds: float) -> str:
    s = max(int(seconds + 0.5), 0)
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


class Progress:
    """Redraws at most every `interval_s`; `done` counts towards `total` (any unit), `count`
    is what the rate is of (records)."""

    def __init__(
        self,
        label: str,
        total: float | None,
        unit: str = "records",
        stream: TextIO | None = None,
        interval_s: float = 0.2,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(isatty and isatty())
        self._t0 = time.monotonic()
        self._last = -float("inf")
        self._drawn = False
        self._done = 0.0
        self._count = 0

    def update(self, done: float, count: int | None = None, force: bool = False) -> None:
        """Progress so far: `done` of `total`, and `count` records (default: `done`)."""
        self._done = done
        self._count = int(done if count is None else count)
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        self.stream.write("\r" + self.line(now - self._t0) + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def line(self, elapsed: float) -> str:
        """The bar's text after `elapsed` seconds."""
        rate = self._count / elapsed if elapsed > 0 else 0.0
        text = f"{self.label} {self._count:,} {self.unit} {rate:,.0f}/s"
        if self.total:
            frac = min(max(self._done / self.total, 0.0), 1.0)
            fill = round(frac * _WIDTH)
            eta = elapsed * (1 - frac) / frac if frac > 0 else float("nan")
            eta_text = _clock(eta) if math.isfinite(eta) else "?"  # none before any progress
            text = (
                f"{self.label} [{'#' * fill}{'.' * (_WIDTH - fill)}] {frac:4.0%} "
                f"{self._count:,} {self.unit} {rate:,.0f}/s ETA {eta_text}"
            )
        return text

    def close(self) -> None:
        """Clear the bar, so the command's own summary line follows on a clean line."""
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

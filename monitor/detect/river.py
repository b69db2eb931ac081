"""River's drift detectors (ADWIN, Page-Hinkley, KSWIN) behind the `Detector` interface.

One river object per (stream, metric) cell, updated in a Python loop: these are
baselines for the benchmark and for low-rate use, not the fleet hot path.
Onsets: ADWIN's cut leaves `width` post-change samples in its window and
KSWIN keeps its last `stat_size` samples, so the onset is the time of the
sample before those; Page-Hinkley keeps no change-time estimate, so its onset
is the previous sample's time. `before` / `after` are the means of the
samples before / since that onset (back to the previous detection).
"""

from __future__ import annotations

import inspect
import pickle
from collections import deque
from typing import Any, ClassVar

import numpy as np
from river import drift

from monitor.arrays import F64, I64
from monitor.detect import _blob
from monitor.detect.base import Detections

_RIVER: dict[str, Any] = {
    "adwin": drift.ADWIN,
    "page_hinkley": drift.PageHinkley,
    "kswin": drift.KSWIN,
}


def river_params(kind: str) -> tuple[str, ...]:
    """Names of the river constructor parameters a kind accepts."""
    sig = inspect.signature(_RIVER[kind].__init__)
    return tuple(p for p in sig.parameters if p != "self")


class RiverDetector:
    """One river drift detector per cell; `history` samples per cell kept for levels/onsets."""

    KINDS: ClassVar[tuple[str, ...]] = tuple(_RIVER)

    def __init__(
        self,
        kind: str,
        n_metrics: int,
        *,
        history: int = 512,
        min_rel_change: float = 0.03,
        abs_floor: float = 1e-9,
        capacity: int = 64,
        **params: Any,
    ) -> None:
        if kind not in _RIVER:
            raise ValueError(f"unknown river detector {kind!r}; valid: {', '.join(_RIVER)}")
        unknown = sorted(set(params) - set(river_params(kind)))
        if unknown:
            raise ValueError(
                f"unknown {kind} parameter(s) {unknown}; valid: {', '.join(river_params(kind))}"
            )
        if n_metrics < 1 or history < 2:
            raise ValueError("n_metrics >= 1 and history >= 2 required")
        self.kind = kind
        self.n_metrics = int(n_metrics)
        self.history = int(history)
        self.min_rel_change, self.abs_floor = float(min_rel_change), float(abs_floor)
        self.river_params = dict(params)
        if kind == "kswin" and "seed" not in self.river_params:
            self.river_params["seed"] = 0  # KSWIN samples at random: fix it for replayability
        self._cells: list[Any] = []
        self._hist: list[deque[tuple[float, float]] | None] = []
        self._grow(max(int(capacity), 1))

    @property
    def capacity(self) -> int:
        """Number of stream slots (rows) currently allocated."""
        return len(self._cells) // self.n_metrics

    def _grow(self, need_rows: int) -> None:
        have = self.capacity
        if need_rows <= have:
            return
        extra = (max(need_rows, 2 * have) - have) * self.n_metrics
        self._cells.extend([None] * extra)
        self._hist.extend([None] * extra)

    def forget(self, rows: I64) -> None:
        """Reset expired streams' slots so a new stream can reuse them."""
        for r in np.asarray(rows, dtype=np.int64).tolist():
            if 0 <= r < self.capacity:
                for c in range(r * self.n_metrics, (r + 1) * self.n_metrics):
                    self._cells[c] = None
                    self._hist[c] = None

    def _onset_back(self, det: Any) -> int:
        """How many of the newest samples the detector attributes to the new level."""
        if self.kind == "adwin":
            return int(det.width)
        if self.kind == "kswin":
            return int(det.stat_size)
        return 1

    def update(self, rows: I64, ts: F64, values: F64, groups: I64 | None = None) -> Detections:
        """Feed one wave (each row at most once); NaN cells are left untouched.

        `groups` is accepted for the seam's sake: river's detectors have no AR state to
        warm-start."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return Detections.empty()
        if int(rows.min()) < 0:
            raise ValueError("row ids must be >= 0")
        k = self.n_metrics
        values = np.asarray(values, dtype=np.float64).reshape(rows.size, k)
        ts = np.asarray(ts, dtype=np.float64)
        self._grow(int(rows.max()) + 1)
        wi, ci = np.nonzero(np.isfinite(values))
        out: list[tuple[int, int, float, float, float, float]] = []
        cls = _RIVER[self.kind]
        for i, c in zip(wi.tolist(), ci.tolist(), strict=True):
            cell = int(rows[i]) * k + c
            det = self._cells[cell]
            hist = self._hist[cell]
            if det is None or hist is None:
                det = cls(**self.river_params)
                hist = deque(maxlen=self.history)
                self._cells[cell], self._hist[cell] = det, hist
            x, t = float(values[i, c]), float(ts[i])
            hist.append((t, x))
            det.update(x)
            if not det.drift_detected:
                continue
            back = min(max(self._onset_back(det), 1), len(hist))
            samples = list(hist)
            post, pre = samples[-back:], samples[:-back]
            onset = pre[-1][0] if pre else post[0][0]
            after = float(np.mean([v for _, v in post]))
            before = float(np.mean([v for _, v in pre])) if pre else after
            hist.clear()
            hist.extend(post)  # the new level's samples are the next baseline
            scale = max(abs(before), self.abs_floor)
            if abs(after - before) >= self.min_rel_change * scale:
                out.append((int(rows[i]), c, t, onset, before, after))
        if not out:
            return Detections.empty()
        cols = list(zip(*out, strict=True))
        n = len(out)
        return Detections(
            rows=np.array(cols[0], dtype=np.int64),
            cols=np.array(cols[1], dtype=np.int64),
            detected_ts=np.array(cols[2], dtype=np.float64),
            onset_ts=np.array(cols[3], dtype=np.float64),
            before=np.array(cols[4], dtype=np.float64),
            after=np.array(cols[5], dtype=np.float64),
            score=np.ones(n),  # river's detectors are binary: exactly at threshold
        )

    def snapshot(self) -> bytes:
        """State as bytes; river objects are pickled, so restore only blobs you wrote."""
        payload = pickle.dumps((self._cells, self._hist), protocol=5)
        params = {
            "n_metrics": self.n_metrics, "history": self.history,
            "min_rel_change": self.min_rel_change, "abs_floor": self.abs_floor,
            "river": self.river_params,
        }  # fmt: skip
        return _blob.pack(self.kind, params, {"pickle": np.frombuffer(payload, dtype=np.uint8)})

    @classmethod
    def restore(cls, blob: bytes) -> RiverDetector:
        """Rebuild from `snapshot` bytes (a trusted checkpoint); future outputs are identical."""
        kind = _blob.kind_of(blob)
        if kind not in _RIVER:
            raise ValueError(f"not a river detector checkpoint (kind {kind!r})")
        params, arrays = _blob.unpack(blob, kind)
        det = cls(
            kind, int(params["n_metrics"]), history=int(params["history"]),
            min_rel_change=float(params["min_rel_change"]), abs_floor=float(params["abs_floor"]),
            capacity=1, **params["river"],
        )  # fmt: skip
        # Our own checkpoint (the daemon's state topic), never untrusted input.
        det._cells, det._hist = pickle.loads(arrays["pickle"].tobytes())  # noqa: S301
        return det

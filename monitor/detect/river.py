"""River's drift detectors (ADWIN, Page-Hinkley, KSWIN) behind the `Detector` interface.

One river object per (stream, metric) cell, updated in a Python loop: these are
baselines for the benchmark and for low-rate use, not the fleet hot path.
Onsets: ADWIN's cut leaves `width` post-change samples in its window and
KSWIN keeps its last `stat_size` samples, so the onset is the time of the
sample before those; Page-Hinkley keeps no change-time estimate, so its onset
is the previous sample's time. `before` / `after` are the means of the
samples before / since that onset (back to the previous detection).
A checkpoint holds each cell's recent samples, not river's objects: restore
rebuilds those by replaying the samples (`RiverDetector.restore`).
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar, Self

import numpy as np
from river import drift

from monitor.arrays import F64, I64
from monitor.detect import _blob
from monitor.detect.base import Detections, StateShapeError, keyword_types


class RiverDetector:
    """One river drift detector per cell; `history` samples per cell kept for levels/onsets.

    A kind is a subclass naming its river class (`model`).
    """

    kind: ClassVar[str]
    model: ClassVar[Any]
    # River keywords a kind sets unless given.
    _preset: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        n_metrics: int,
        *,
        history: int = 512,
        min_rel_change: float = 0.03,
        abs_floor: float = 1e-9,
        capacity: int = 64,
        **params: Any,
    ) -> None:
        valid = keyword_types(self.model, keyword_only=False)
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise ValueError(
                f"unknown {self.kind} parameter(s) {unknown}; valid: {', '.join(valid)}"
            )
        if n_metrics < 1 or history < 2:
            raise ValueError("n_metrics >= 1 and history >= 2 required")
        self.n_metrics = int(n_metrics)
        self.history = int(history)
        self.min_rel_change, self.abs_floor = float(min_rel_change), float(abs_floor)
        # Every river keyword, defaults included, so equal settings compare equal.
        defaults = {n: p.default for n, p in inspect.signature(self.model).parameters.items()}
        self.river_params = defaults | self._preset | params
        self._cells: list[Any] = []
        self._hist: list[deque[tuple[float, float]] | None] = []
        self._grow(max(int(capacity), 1))

    @classmethod
    def param_types(cls) -> dict[str, type]:
        """This class's keywords (`capacity` included), then the river class's."""
        return keyword_types(cls) | keyword_types(cls.model, keyword_only=False)

    def params(self) -> dict[str, Any]:
        """Constructor keywords that rebuild this detector (`capacity` aside)."""
        own = {"history": self.history, "min_rel_change": self.min_rel_change}
        return own | {"abs_floor": self.abs_floor} | self.river_params

    def drain_stats(self) -> dict[str, int]:
        """No alarm outcomes are counted: {}."""
        return {}

    def drain_warm_starts(self) -> dict[str, int]:
        """No warm starts: {}."""
        return {}

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
        cls = self.model
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
        """Parameters and each live cell's recent samples (its last `history`), as arrays."""
        live = [(c, hist) for c, hist in enumerate(self._hist) if hist is not None]
        samples = np.array([s for _, hist in live for s in hist], dtype=np.float64).reshape(-1, 2)
        arrays = {
            "cells": np.array([c for c, _ in live], dtype=np.int64),
            "lens": np.array([len(hist) for _, hist in live], dtype=np.int64),
            "t": samples[:, 0],
            "x": samples[:, 1],
        }
        params = self.params() | {"n_metrics": self.n_metrics, "rows": self.capacity}
        return _blob.pack(self.kind, params, arrays)

    @classmethod
    def restore(cls, blob: bytes, params: Mapping[str, Any] | None = None) -> Self:
        """Rebuild from `snapshot` bytes, each cell's river object from fresh by replaying
        the cell's last `history` samples.

        A river object's state is rebuilt from those samples only, so after a cell's
        first `history` samples or its last detection it can differ from an uninterrupted
        run's (river's objects are not serialised: no pickle). River objects are built
        with their parameters: `params` other than the checkpoint's raise
        `StateShapeError`.
        """
        saved, arrays = _blob.unpack(blob, cls.kind)
        n_metrics, rows = int(saved.pop("n_metrics")), int(saved.pop("rows"))
        if params is not None and dict(params) != saved:
            raise StateShapeError(
                f"a {cls.kind} checkpoint carries over only to its own parameters"
            )
        det = cls(n_metrics, capacity=rows, **saved)
        ends = np.cumsum(arrays["lens"]).tolist()
        t, x = arrays["t"].tolist(), arrays["x"].tolist()
        for cell, lo, hi in zip(arrays["cells"].tolist(), [0, *ends[:-1]], ends, strict=True):
            model = cls.model(**det.river_params)
            for value in x[lo:hi]:
                model.update(value)
            det._cells[cell] = model
            det._hist[cell] = deque(zip(t[lo:hi], x[lo:hi], strict=True), maxlen=det.history)
        return det


class Adwin(RiverDetector):
    """River's ADWIN per cell."""

    kind = "adwin"
    model = drift.ADWIN

    def _onset_back(self, det: Any) -> int:
        return int(det.width)  # the cut leaves the post-change samples in the window


class PageHinkley(RiverDetector):
    """River's Page-Hinkley test per cell."""

    kind = "page_hinkley"
    model = drift.PageHinkley


class Kswin(RiverDetector):
    """River's KSWIN per cell."""

    kind = "kswin"
    model = drift.KSWIN
    _preset: ClassVar[dict[str, Any]] = {"seed": 0}  # it samples at random: replayable

    def _onset_back(self, det: Any) -> int:
        return int(det.stat_size)  # its newest `stat_size` samples are the tested ones

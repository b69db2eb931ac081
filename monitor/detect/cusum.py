"""The simple CUSUM kind: vectorised two-sided CUSUM with a robust (median/MAD) burn-in
baseline.

Every (stream, metric) cell runs its own CUSUM, but all cells of a wave update
in a handful of numpy operations. The onset estimate is the end of the last
window before the alarming run left zero: the classic CUSUM change-time
estimate, which attribution needs to order stages in time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import numpy as np

from monitor.arrays import F64, I64
from monitor.detect import _blob
from monitor.detect.base import Detections, StateShapeError, keyword_types

_MAD_TO_SIGMA = 1.4826


class Cusum:
    """Two-sided CUSUM per cell; k and h are in robust-sigma units."""

    kind: ClassVar[str] = "cusum"

    def __init__(
        self,
        n_metrics: int,
        *,
        burn_in: int = 20,
        k: float = 0.5,
        h: float = 8.0,
        clip: float = 4.0,
        rel_floor: float = 0.01,
        min_rel_change: float = 0.03,
        capacity: int = 1024,
    ) -> None:
        if burn_in < 3 or k < 0 or h <= 0 or clip <= 0:
            raise ValueError("burn_in >= 3, k >= 0, h > 0 and clip > 0 are required")
        self.n_metrics = int(n_metrics)
        self.burn_in = int(burn_in)
        self.k, self.h, self.clip = float(k), float(h), float(clip)
        self.rel_floor, self.min_rel_change = float(rel_floor), float(min_rel_change)
        self._cap = 0
        self._arrays: dict[str, np.ndarray] = {}
        self._grow(max(capacity, 1))

    # -- state ---------------------------------------------------------------
    _FIELDS: ClassVar[dict[str, type[np.generic]]] = {
        "n": np.int32, "mu": np.float64, "sd": np.float64, "last_ts": np.float64,
        "s_hi": np.float64, "s_lo": np.float64, "t0_hi": np.float64, "t0_lo": np.float64,
        "sum_hi": np.float64, "sum_lo": np.float64, "cnt_hi": np.int32, "cnt_lo": np.int32,
    }  # fmt: skip

    def _grow(self, need: int) -> None:
        if need <= self._cap:
            return
        cap = max(need, 2 * self._cap)
        k = self.n_metrics
        new: dict[str, np.ndarray] = {
            name: np.zeros((cap, k), dtype=dt) for name, dt in self._FIELDS.items()
        }
        new["buf"] = np.zeros((cap, k, self.burn_in), dtype=np.float32)
        for name, old in self._arrays.items():
            new[name][: self._cap] = old
        self._arrays, self._cap = new, cap

    @property
    def capacity(self) -> int:
        """Number of stream slots currently allocated."""
        return self._cap

    def forget(self, rows: I64) -> None:
        """Reset expired streams' slots so a new stream can reuse them."""
        rows = rows[rows < self._cap]
        for arr in self._arrays.values():
            arr[rows] = 0

    @classmethod
    def param_types(cls) -> dict[str, type]:
        """The constructor's keywords (`capacity` included) and their types."""
        return keyword_types(cls)

    def params(self) -> dict[str, Any]:
        """Constructor keywords that rebuild this detector (`capacity` aside)."""
        return {name: getattr(self, name) for name in self.param_types() if name != "capacity"}

    def drain_stats(self) -> dict[str, int]:
        """No alarm outcomes are counted: {}."""
        return {}

    def drain_warm_starts(self) -> dict[str, int]:
        """No warm starts: {}."""
        return {}

    def snapshot(self) -> bytes:
        """All state and parameters as deterministic bytes."""
        return _blob.pack(self.kind, self.params() | {"n_metrics": self.n_metrics}, self._arrays)

    @classmethod
    def restore(cls, blob: bytes, params: Mapping[str, Any] | None = None) -> Self:
        """Rebuild a detector from `snapshot` bytes; future outputs are identical.

        Every parameter is baked into the state (the burn-in buffer, sums in units of the
        old scale), so `params` other than the checkpoint's raise `StateShapeError`.
        """
        saved, arrays = _blob.unpack(blob, cls.kind)
        n_metrics = int(saved.pop("n_metrics"))
        if params is not None and dict(params) != saved:
            raise StateShapeError("a cusum checkpoint carries over only to its own parameters")
        det = cls(n_metrics, capacity=1, **saved)
        det._arrays = {name: arrays[name] for name in (*cls._FIELDS, "buf")}
        det._cap = det._arrays["n"].shape[0]
        return det

    # -- hot path --------------------------------------------------------------
    def update(self, rows: I64, ts: F64, values: F64, groups: I64 | None = None) -> Detections:
        """Feed one wave (each row at most once); NaN cells are skipped; no warm starts."""
        if rows.size == 0:
            return Detections.empty()
        self._grow(int(rows.max()) + 1)
        a = self._arrays
        wi, c = np.nonzero(np.isfinite(values))
        r, x, t = rows[wi], values[wi, c], ts[wi]
        n = a["n"][r, c]
        prev_ts = a["last_ts"][r, c]
        a["last_ts"][r, c] = t

        burning = n < self.burn_in
        if burning.any():
            rb, cb, nb = r[burning], c[burning], n[burning]
            a["buf"][rb, cb, nb] = x[burning]
            a["n"][rb, cb] = nb + 1
            full = nb + 1 == self.burn_in
            if full.any():
                self._baseline(rb[full], cb[full])
        act = ~burning
        if not act.any():
            return Detections.empty()
        r, c, x, t, prev_ts = r[act], c[act], x[act], t[act], prev_ts[act]
        mu, sd = a["mu"][r, c], a["sd"][r, c]
        z = np.clip((x - mu) / sd, -self.clip, self.clip)

        s_hi = self._side(r, c, x, prev_ts, np.maximum(0.0, a["s_hi"][r, c] + z - self.k), "hi")
        s_lo = self._side(r, c, x, prev_ts, np.maximum(0.0, a["s_lo"][r, c] - z - self.k), "lo")

        hit_hi, hit_lo = s_hi > self.h, s_lo > self.h
        hit = hit_hi | hit_lo
        if not hit.any():
            return Detections.empty()
        up = hit_hi[hit] & (s_hi[hit] >= s_lo[hit])
        rh, ch = r[hit], c[hit]
        after = np.where(
            up,
            a["sum_hi"][rh, ch] / np.maximum(a["cnt_hi"][rh, ch], 1),
            a["sum_lo"][rh, ch] / np.maximum(a["cnt_lo"][rh, ch], 1),
        )
        onset = np.where(up, a["t0_hi"][rh, ch], a["t0_lo"][rh, ch])
        score = np.maximum(s_hi[hit], s_lo[hit]) / self.h
        before = mu[hit]
        big = np.abs(after - before) >= self.min_rel_change * np.maximum(np.abs(before), 1e-12)
        # Every alarm re-baselines; only a material shift is reported, a tiny but
        # significant one just moves the baseline (a fleet pages on effect size).
        for name in ("n", "s_hi", "s_lo", "sum_hi", "sum_lo", "cnt_hi", "cnt_lo"):
            a[name][rh, ch] = 0
        return Detections(
            rows=rh[big].astype(np.int64),
            cols=ch[big].astype(np.int64),
            detected_ts=t[hit][big],
            onset_ts=onset[big],
            before=before[big],
            after=after[big],
            score=score[big],
        )

    def _side(self, r: I64, c: I64, x: F64, prev_ts: F64, s: F64, side: str) -> F64:
        """Store one side's new sum, tracking where its current run began and its mean."""
        a = self._arrays
        was_zero = a["s_" + side][r, c] <= 0.0
        running = s > 0.0
        start = was_zero & running
        a["t0_" + side][r, c] = np.where(start, prev_ts, a["t0_" + side][r, c])
        a["sum_" + side][r, c] = np.where(
            running, np.where(start, 0.0, a["sum_" + side][r, c]) + x, 0.0
        )
        a["cnt_" + side][r, c] = np.where(
            running, np.where(start, 0, a["cnt_" + side][r, c]) + 1, 0
        )
        a["s_" + side][r, c] = s
        return s

    def _baseline(self, r: I64, c: I64) -> None:
        buf = self._arrays["buf"][r, c].astype(np.float64)
        med = np.median(buf, axis=1)
        mad = np.median(np.abs(buf - med[:, None]), axis=1) * _MAD_TO_SIGMA
        floor = np.maximum(self.rel_floor * np.abs(med), 1e-9)
        self._arrays["mu"][r, c] = med
        self._arrays["sd"][r, c] = np.maximum(mad, floor)

"""The default engine: a bank of one-sided CUSUMs behind a robust, lagged front-end.

Per (stream, metric) cell, vectorised over all cells of a wave:

1. **Burn-in.** The first `burn_in` samples give a median level, an AR(1)
   coefficient and a Huber (proposal 2) scale of the AR innovations.
2. **Front-end.** Each sample becomes a standardised innovation
   ``z = (d - phi * d_prev) / sigma`` with ``d = x - level``, clipped at
   ±`clip`, and shrunk by ``n / (n + youth)`` while the baseline is young.
   Pre-whitening removes AR(1) autocorrelation; clipping bounds what a single
   window can add (no single- or double-window outlier can alarm); the Huber
   scale makes the clipped innovations have unit second moment under
   heavy-tailed noise, so one threshold holds across noise shapes.
3. **Bank.** One-sided CUSUMs in log-likelihood-ratio units for a geometric
   grid of shift sizes ``delta`` (in sigma), up and down:
   ``S = max(0, S ± delta*z - delta²/2)``. The largest statistic over the bank
   approximates the GLR for a shift of unknown size; an alarm is ``S > h``.
4. **Lagged baseline.** Each cell keeps a ring of its last `history` samples.
   The level, scale and AR coefficient adapt slowly (windows of
   `baseline_window`, `scale_window`, `ar_window` samples) from the sample
   leaving the ring, i.e. `history` samples late, so a fresh shift is not
   absorbed before it is detected.
5. **On alarm.** The onset is the maximum-likelihood split of the ring against
   the known baseline; `after` is the median since onset. The cell re-baselines
   on the post-onset samples (burning in the rest). Alarms whose effect is below
   `min_rel_change` of the level re-baseline silently.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from monitor.detect import _blob
from monitor.detect.base import F64, I64, Detections

F32 = npt.NDArray[np.float32]
_MAD_TO_SIGMA = 1.4826
_N_MAX = 1 << 30  # saturating sample counter


def clipped_second_moment(c: float) -> float:
    """E[min(Z², c²)] for a standard normal Z: the Huber proposal-2 consistency constant."""
    tail = math.erfc(c / math.sqrt(2.0))  # P(|Z| > c)
    pdf = math.exp(-0.5 * c * c) / math.sqrt(2.0 * math.pi)
    return (1.0 - tail) - 2.0 * c * pdf + c * c * tail


class BankCusum:
    """Bank of one-sided CUSUMs with a robust, lagged, AR(1)-whitened front-end.

    `h` is the decision threshold in log-likelihood-ratio units; shift sizes and
    `clip` are in robust innovation sigmas.
    """

    kind: ClassVar[str] = "bank"

    # Per-cell scalar state (flat over cells = row * K + col).
    _SCALARS: ClassVar[dict[str, type[np.generic]]] = {
        "n": np.int32,  # samples since (re)start, drives burn-in and youth
        "nb": np.int32,  # samples folded into the lagged baseline (saturating)
        "pos": np.int32,  # next ring slot
        "mu": np.float64,  # baseline level
        "s2": np.float64,  # EW clipped second moment of the innovations
        "c0": np.float64,  # EW lag-0 autocovariance of baseline deviations
        "c1": np.float64,  # EW lag-1 autocovariance
        "phi": np.float64,  # AR(1) coefficient in use
        "dprev": np.float64,  # previous (clipped) deviation, for whitening
        "lprev": np.float64,  # previous lagged deviation, for the AR estimate
    }

    def __init__(
        self,
        n_metrics: int,
        *,
        h: float = 14.0,
        min_shift: float = 0.5,
        max_shift: float = 3.0,
        n_shifts: int = 4,
        burn_in: int = 32,
        history: int = 32,
        clip: float = 3.0,
        youth: float = 8.0,
        baseline_window: int = 512,
        scale_window: int = 1024,
        ar_window: int = 1024,
        ar_max: float = 0.8,
        rel_floor: float = 1e-3,
        abs_floor: float = 1e-9,
        min_rel_change: float = 0.03,
        capacity: int = 1024,
    ) -> None:
        if n_metrics < 1:
            raise ValueError("n_metrics must be >= 1")
        if not (h > 0 and clip > 0 and 0 < min_shift <= max_shift and n_shifts >= 1):
            raise ValueError("h > 0, clip > 0, 0 < min_shift <= max_shift, n_shifts >= 1 required")
        if not 3 <= burn_in <= history:
            raise ValueError("3 <= burn_in <= history required")
        if min(baseline_window, scale_window, ar_window) < 1 or not 0 <= ar_max < 1:
            raise ValueError("windows >= 1 and 0 <= ar_max < 1 required")
        if youth < 0 or rel_floor < 0 or abs_floor <= 0 or min_rel_change < 0:
            raise ValueError("youth, rel_floor, min_rel_change >= 0 and abs_floor > 0 required")
        self.n_metrics = int(n_metrics)
        self.h = float(h)
        self.min_shift, self.max_shift, self.n_shifts = float(min_shift), float(max_shift), int(n_shifts)
        self.burn_in, self.history = int(burn_in), int(history)
        self.clip, self.youth = float(clip), float(youth)
        self.baseline_window, self.scale_window = int(baseline_window), int(scale_window)
        self.ar_window, self.ar_max = int(ar_window), float(ar_max)
        self.rel_floor, self.abs_floor = float(rel_floor), float(abs_floor)
        self.min_rel_change = float(min_rel_change)
        if n_shifts == 1:
            self.shifts = np.array([min_shift])
        else:
            self.shifts = np.geomspace(min_shift, max_shift, n_shifts)
        self._kappa = clipped_second_moment(self.clip)
        self._nb_max = max(baseline_window, scale_window, ar_window)
        self._cap = 0  # rows
        self._s: dict[str, np.ndarray] = {}
        self._bank = np.zeros((2 * self.n_shifts, 0), dtype=np.float32)
        self._ring = np.zeros((0, self.history), dtype=np.float32)
        self._tring = np.zeros((0, self.history), dtype=np.float64)
        self._grow(max(int(capacity), 1))

    # -- parameters and state ------------------------------------------------
    def params(self) -> dict[str, Any]:
        """Constructor keyword arguments that rebuild this detector (capacity aside)."""
        return {
            "h": self.h, "min_shift": self.min_shift, "max_shift": self.max_shift,
            "n_shifts": self.n_shifts, "burn_in": self.burn_in, "history": self.history,
            "clip": self.clip, "youth": self.youth, "baseline_window": self.baseline_window,
            "scale_window": self.scale_window, "ar_window": self.ar_window,
            "ar_max": self.ar_max, "rel_floor": self.rel_floor, "abs_floor": self.abs_floor,
            "min_rel_change": self.min_rel_change,
        }  # fmt: skip

    @property
    def capacity(self) -> int:
        """Number of stream slots (rows) currently allocated."""
        return self._cap

    @classmethod
    def state_bytes_per_cell(cls, n_shifts: int = 4, history: int = 32) -> int:
        """Bytes of state one (stream, metric) cell occupies."""
        scalars = sum(np.dtype(t).itemsize for t in cls._SCALARS.values())
        return scalars + 2 * n_shifts * 4 + history * (4 + 8)

    def _grow(self, need_rows: int) -> None:
        if need_rows <= self._cap:
            return
        cap = max(need_rows, 2 * self._cap)
        old_cells, cells = self._cap * self.n_metrics, cap * self.n_metrics
        s: dict[str, np.ndarray] = {}
        for name, dt in self._SCALARS.items():
            arr = np.zeros(cells, dtype=dt)
            if old_cells:
                arr[:old_cells] = self._s[name]
            s[name] = arr
        bank = np.zeros((2 * self.n_shifts, cells), dtype=np.float32)
        bank[:, :old_cells] = self._bank
        ring = np.full((cells, self.history), np.nan, dtype=np.float32)
        ring[:old_cells] = self._ring
        tring = np.full((cells, self.history), np.nan, dtype=np.float64)
        tring[:old_cells] = self._tring
        self._s, self._bank, self._ring, self._tring, self._cap = s, bank, ring, tring, cap

    def forget(self, rows: I64) -> None:
        """Reset expired streams' slots so a new stream can reuse them."""
        rows = np.asarray(rows, dtype=np.int64)
        rows = rows[(rows >= 0) & (rows < self._cap)]
        if rows.size == 0:
            return
        cells = (rows[:, None] * self.n_metrics + np.arange(self.n_metrics)).ravel()
        for arr in self._s.values():
            arr[cells] = 0
        self._bank[:, cells] = 0.0
        self._ring[cells] = np.nan
        self._tring[cells] = np.nan

    def snapshot(self) -> bytes:
        """All state and parameters as deterministic bytes."""
        arrays: dict[str, np.ndarray] = dict(self._s)
        arrays["bank"], arrays["ring"], arrays["tring"] = self._bank, self._ring, self._tring
        params = self.params() | {"n_metrics": self.n_metrics, "rows": self._cap}
        return _blob.pack(self.kind, params, arrays)

    @classmethod
    def restore(cls, blob: bytes) -> BankCusum:
        """Rebuild a detector from `snapshot` bytes; future outputs are identical."""
        params, arrays = _blob.unpack(blob, cls.kind)
        n_metrics, rows = int(params.pop("n_metrics")), int(params.pop("rows"))
        det = cls(n_metrics, capacity=1, **params)
        det._s = {name: arrays[name] for name in cls._SCALARS}
        det._bank, det._ring, det._tring = arrays["bank"], arrays["ring"], arrays["tring"]
        det._cap = rows
        return det

    # -- hot path ----------------------------------------------------------------
    def update(self, rows: I64, ts: F64, values: F64) -> Detections:
        """Feed one wave (each row at most once); NaN cells are left untouched."""
        rows = np.asarray(rows, dtype=np.int64)
        n = rows.size
        if n == 0:
            return Detections.empty()
        k = self.n_metrics
        ts = np.asarray(ts, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64).reshape(n, k)
        lo = int(rows[0])
        if lo < 0 or int(rows.min()) < 0:
            raise ValueError("row ids must be >= 0")
        self._grow(int(rows.max()) + 1)
        fin = np.isfinite(values)
        contiguous = int(rows[-1]) - lo + 1 == n and (n == 1 or bool(np.all(np.diff(rows) == 1)))
        if contiguous and bool(fin.all()):
            # The common dense wave: every stream reported. Slices, no gathers.
            sel: slice | I64 = slice(lo * k, (lo + n) * k)
            x = values.reshape(-1)
            t = ts if k == 1 else np.repeat(ts, k)
        else:
            cells = rows[:, None] * k + np.arange(k)
            sel = cells[fin]
            x = values[fin]
            t = np.broadcast_to(ts[:, None], (n, k))[fin]
            if sel.size == 0:
                return Detections.empty()
        return self._step(sel, x, t)

    def _step(self, sel: slice | I64, x: F64, t: F64) -> Detections:
        s, hist = self._s, self.history
        if isinstance(sel, slice):
            cells = None
            n_old = s["n"][sel]
            pos = s["pos"][sel]
            base = np.arange(sel.start, sel.stop, dtype=np.int64) * hist
        else:
            cells = sel
            n_old = s["n"][cells]
            pos = s["pos"][cells]
            base = cells * hist
        # Ring: read the sample leaving it (the lagged baseline's input), write the new one.
        slot = base + pos
        ring_flat, tring_flat = self._ring.reshape(-1), self._tring.reshape(-1)
        xl = ring_flat[slot].astype(np.float64)
        ring_flat[slot] = x
        tring_flat[slot] = t
        pos = pos + 1
        pos[pos == hist] = 0
        n_new = np.minimum(n_old + 1, _N_MAX).astype(np.int32)
        s["pos"][sel] = pos
        s["n"][sel] = n_new

        burning = n_new <= self.burn_in
        if not burning.any():
            return self._active(sel, x, t, xl, n_new)
        all_cells = np.arange(sel.start, sel.stop, dtype=np.int64) if cells is None else cells
        done = n_new == self.burn_in
        if done.any():
            self._baseline(all_cells[done], fresh=True)
        act = ~burning
        if not act.any():
            return Detections.empty()
        return self._active(all_cells[act], x[act], t[act], xl[act], n_new[act])

    def _active(self, sel: slice | I64, x: F64, t: F64, xl: F64, n: npt.NDArray[np.int32]) -> Detections:
        s, c = self._s, self.clip
        mu, s2, phi = s["mu"][sel], s["s2"][sel], s["phi"][sel]
        sig = np.sqrt(s2 * (1.0 / self._kappa))
        np.maximum(sig, np.maximum(self.rel_floor * np.abs(mu), self.abs_floor), out=sig)
        # Level-scale bound for clipping deviations: the stationary AR(1) sd.
        sx = sig / np.sqrt(1.0 - phi * phi)
        d = x - mu
        e = d - phi * s["dprev"][sel]
        z = e / sig
        np.clip(z, -c, c, out=z)
        if self.youth > 0:
            nf = n.astype(np.float64)
            z *= nf / (nf + self.youth)
        s["dprev"][sel] = np.clip(d, -c * sx, c * sx)

        # Bank update, float32: the statistics need no more precision.
        z32 = z.astype(np.float32)
        bank = self._bank[:, sel]
        stat = np.zeros(z32.shape, dtype=np.float32)
        for j, dj in enumerate(self.shifts):
            a = z32 * np.float32(dj)
            half = np.float32(0.5 * dj * dj)
            up = bank[2 * j]
            up += a
            up -= half
            np.maximum(up, 0.0, out=up)
            dn = bank[2 * j + 1]
            dn -= a
            dn -= half
            np.maximum(dn, 0.0, out=dn)
            np.maximum(stat, up, out=stat)
            np.maximum(stat, dn, out=stat)
        self._bank[:, sel] = bank

        # Lagged baseline: fold in the sample that just left the ring, if any.
        w = np.isfinite(xl)
        nb = s["nb"][sel]
        cnt = np.minimum(nb + w, self._nb_max)
        cntf = np.maximum(cnt, 1).astype(np.float64)
        wf = w.astype(np.float64)
        dl = np.where(w, xl - mu, 0.0)
        np.clip(dl, -c * sx, c * sx, out=dl)
        lprev = s["lprev"][sel]
        a_b = wf / np.minimum(cntf, self.baseline_window)
        s["mu"][sel] = mu + a_b * dl
        el = dl - phi * lprev
        a_s = wf / np.minimum(cntf, self.scale_window)
        bound = c * sig
        s["s2"][sel] = s2 + a_s * (np.minimum(el * el, bound * bound) - s2)
        a_p = wf / np.minimum(cntf, self.ar_window)
        c0 = s["c0"][sel]
        c0 = c0 + a_p * (dl * dl - c0)
        c1 = s["c1"][sel]
        c1 = c1 + a_p * (dl * lprev - c1)
        s["c0"][sel], s["c1"][sel] = c0, c1
        s["phi"][sel] = np.clip(c1 / np.maximum(c0, 1e-300), 0.0, self.ar_max)
        s["lprev"][sel] = np.where(w, dl, lprev)
        s["nb"][sel] = cnt

        hit = stat > np.float32(self.h)
        if not hit.any():
            return Detections.empty()
        idx = np.flatnonzero(hit)
        cells = (np.arange(sel.start, sel.stop, dtype=np.int64) if isinstance(sel, slice) else sel)[idx]
        return self._alarm(cells, t[idx], stat[idx].astype(np.float64))

    # -- rare paths: alarms and baselines --------------------------------------------
    def _chrono(self, cells: I64) -> tuple[F64, F64]:
        """Ring values and times of `cells`, oldest first."""
        order = (self._s["pos"][cells, None] + np.arange(self.history)) % self.history
        vals = np.take_along_axis(self._ring[cells], order, axis=1).astype(np.float64)
        times = np.take_along_axis(self._tring[cells], order, axis=1)
        return vals, times

    def _alarm(self, cells: I64, t: F64, stat: F64) -> Detections:
        s, k = self._s, self.n_metrics
        vals, times = self._chrono(cells)
        mu = s["mu"][cells]
        fin = np.isfinite(vals)
        d = np.where(fin, vals - mu[:, None], 0.0)
        # Direction: the side of the bank that fired.
        bank = self._bank[:, cells]
        up = bank[0::2].max(axis=0) >= bank[1::2].max(axis=0)
        sign = np.where(up, 1.0, -1.0)
        # Onset: maximum-likelihood split against the known baseline level,
        # argmax over suffixes of (signed suffix sum)_+² / suffix count.
        suf = np.cumsum((d * sign[:, None])[:, ::-1], axis=1)[:, ::-1]
        cnt = np.cumsum(fin[:, ::-1], axis=1)[:, ::-1]
        gain = np.where(fin & (suf > 0), suf * suf / np.maximum(cnt, 1), -1.0)
        first = gain.argmax(axis=1)  # first post-change slot
        rix = np.arange(cells.size)
        prev = np.maximum(first - 1, 0)
        onset = np.where(first > 0, times[rix, prev], times[rix, first])
        onset = np.where(np.isfinite(onset), onset, times[rix, first])
        post = fin & (np.arange(self.history) >= first[:, None])
        after = np.nanmedian(np.where(post, vals, np.nan), axis=1)
        before = mu
        scale = np.maximum(np.abs(before), self.abs_floor)
        big = np.abs(after - before) >= self.min_rel_change * scale

        # Re-baseline every alarming cell on its post-onset samples; drop the rest.
        self._bank[:, cells] = 0.0
        ring = np.where(post, vals, np.nan).astype(np.float32)
        pos = s["pos"][cells]
        # Write back in ring order (chronological index i lives at slot (pos + i) % H).
        slots = (pos[:, None] + np.arange(self.history)) % self.history
        rows_ring = self._ring[cells]
        np.put_along_axis(rows_ring, slots, ring, axis=1)
        self._ring[cells] = rows_ring
        k_post = post.sum(axis=1).astype(np.int32)
        s["n"][cells] = k_post
        ready = k_post >= self.burn_in
        if ready.any():
            self._baseline(cells[ready], fresh=False)

        return Detections(
            rows=(cells[big] // k).astype(np.int64),
            cols=(cells[big] % k).astype(np.int64),
            detected_ts=t[big],
            onset_ts=onset[big],
            before=before[big],
            after=after[big],
            score=stat[big] / self.h,
        )

    def _baseline(self, cells: I64, *, fresh: bool) -> None:
        """(Re)set the level from the ring's samples; a fresh cell also gets scale and AR."""
        s, c = self._s, self.clip
        vals, _ = self._chrono(cells)
        fin = np.isfinite(vals)
        mu = np.nanmedian(vals, axis=1)
        d = vals - mu[:, None]
        last = np.take_along_axis(
            d, (self.history - 1 - np.argmax(fin[:, ::-1], axis=1))[:, None], axis=1
        )[:, 0]
        if fresh:
            mad = np.nanmedian(np.abs(d), axis=1) * _MAD_TO_SIGMA
            mean_abs = np.nanmean(np.abs(d), axis=1) * math.sqrt(math.pi / 2.0)
            floor = np.maximum(self.rel_floor * np.abs(mu), self.abs_floor)
            sx = np.maximum(np.maximum(mad, mean_abs), floor)
            dc = np.clip(d, -c * sx[:, None], c * sx[:, None])
            both = fin[:, 1:] & fin[:, :-1]
            lag1 = np.where(both, dc[:, 1:] * dc[:, :-1], 0.0).sum(axis=1)
            lag0 = np.where(fin, dc * dc, 0.0).sum(axis=1)
            phi = np.clip(lag1 / np.maximum(lag0, 1e-300), 0.0, self.ar_max)
            e = np.where(both, dc[:, 1:] - phi[:, None] * dc[:, :-1], np.nan)
            sig = np.maximum(sx * np.sqrt(1.0 - phi * phi), floor)
            for _ in range(3):  # Huber proposal 2 fixed point on the innovations
                bound = (c * sig)[:, None]
                m2 = np.nanmean(np.minimum(e * e, bound * bound), axis=1)
                sig = np.maximum(np.sqrt(m2 / self._kappa), floor)
            s["s2"][cells] = sig * sig * self._kappa
            s["phi"][cells] = phi
            nvar = sx * sx
            s["c0"][cells] = nvar
            s["c1"][cells] = phi * nvar
            s["lprev"][cells] = 0.0
        phi_now = s["phi"][cells]
        sig_now = np.sqrt(s["s2"][cells] / self._kappa)
        sx_now = np.maximum(sig_now / np.sqrt(1.0 - phi_now * phi_now), self.abs_floor)
        s["mu"][cells] = mu
        s["dprev"][cells] = np.clip(np.nan_to_num(last), -c * sx_now, c * sx_now)
        s["nb"][cells] = fin.sum(axis=1).astype(np.int32)
        s["n"][cells] = np.maximum(s["n"][cells], self.burn_in)
        # Samples already counted in the baseline must not be folded in again later.
        self._ring[cells] = np.nan
        self._bank[:, cells] = 0.0

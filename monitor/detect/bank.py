"""The default engine: a bank of one-sided CUSUMs behind a robust, lagged front-end.

Per (stream, metric) cell, vectorised over all cells of a wave (docs/detection.md
has the full account and the parameters' effects, docs/tuning.md the table):

1. Burn-in: the first `burn_in` samples give a median level, an AR(1) coefficient
   and a Huber (proposal 2) scale of the AR innovations, or a family member's
   estimates (`bank_warm`).
2. Front-end: each sample becomes an AR(1)-whitened innovation in sigmas, clipped
   at `clip`; with the opt-in MA term, ARMA(1,1) cells also undo the MA part. The
   AR coefficient in use is an upper confidence bound, because under-whitening
   pages and over-whitening only slows. The innovations are deflated by their
   long-run variance ratio (persistence the whitening left in) and, while the
   baseline is young, shrunk.
3. Bank: one-sided CUSUMs in log-likelihood-ratio units for a geometric grid of
   shift sizes, up and down; `step_cap` bounds what one window adds, so single- or
   double-window outliers cannot alarm. A member votes only once its level rests
   on enough samples for its shift size. The jump rule alarms on a run of windows
   far beyond the level's spread, long before the capped steps add up to `h`.
4. Lagged baseline: level, scale and AR estimates learn from the sample leaving
   the ring of the last `history` samples, so a fresh shift is not absorbed before
   it alarms.
5. Alarm: the onset is the maximum-likelihood split of the ring against the
   level; the spread veto drops alarms made by a burst of spread rather than a
   shift of level; alarms below `min_rel_change` re-baseline silently. The cell
   re-baselines on its post-onset samples.

Hot-path arrays are float32 where the statistics need no more; a wave's cells are
views for a contiguous block of rows and gathered copies otherwise (`_Cells`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple, Self

import numpy as np
import numpy.typing as npt

from monitor.arrays import F32, F64, I32, I64
from monitor.detect import bank_alarm, bank_ring, bank_state
from monitor.detect.bank_alarm import ALARM_OUTCOMES
from monitor.detect.bank_params import STATE_SHAPE, BankParams, param_types
from monitor.detect.bank_times import TimeRings
from monitor.detect.bank_warm import WarmStarts, unbiased_lag1
from monitor.detect.base import Detections

_MAD_TO_SIGMA = 1.4826
_N_MAX = 1 << 30  # saturating sample counter
_EPS32 = np.float32(1e-12)
_LRV_CALM_RUN = 64  # the long-run variance learns only while the smallest member's run is shorter
_JUMP_AFTER = 128  # samples in the scale estimate before the jump rule may fire
_DZ_FINITE = np.float32(1e6)  # deviations are kept to this many sigmas: finite in float32
# The time ring holds float32 seconds since the detector's epoch (half the bytes of
# epoch seconds in float64, which float32 could not hold to the second), once per stream
# where its cells agree (`bank_times`). Within 2^20 s (12 days) of the epoch a time is
# exact to 1/8 s; past that the epoch moves forward.
_T_SPAN = float(1 << 20)


def clipped_second_moment(c: float) -> float:
    """E[min(Z², c²)] for a standard normal Z: the Huber proposal-2 consistency constant."""
    tail = math.erfc(c / math.sqrt(2.0))  # P(|Z| > c)
    pdf = math.exp(-0.5 * c * c) / math.sqrt(2.0 * math.pi)
    return (1.0 - tail) - 2.0 * c * pdf + c * c * tail


def _get(arr: np.ndarray, sel: slice | I64) -> np.ndarray:
    """The last-axis selection of `arr`: a view for a slice, a fast gather (copy) else."""
    if isinstance(sel, slice):
        return arr[..., sel]
    return np.take(arr, sel, axis=-1)


def _cells_of(sel: slice | I64) -> I64:
    """Cell ids selected by a contiguous slice or an index array."""
    if isinstance(sel, slice):
        return np.arange(sel.start, sel.stop, dtype=np.int64)
    return sel


_Mask = npt.NDArray[np.bool_]


def _jump_steps(m: F32, jr: F32, jm: F32, phi: F32, j32: np.float32, up: _Mask, down: _Mask) -> F32:
    """The jump rule's signed runs after this window: runs beyond the bound (`up`, `down`)
    extend by one where the window is no mere decay of the last one, else restart at one;
    every other run is 0. Windows beyond the bound are rare: only those are touched."""
    new = np.zeros(m.size, dtype=np.float32)
    for side, at in ((1.0, np.flatnonzero(up)), (-1.0, np.flatnonzero(down))):
        if not at.size:
            continue
        sgn = np.float32(side)
        p_at, run = phi[at], jr[at] * sgn
        # The innovation of this window in marginal sigmas, towards the run's side.
        fresh = (m[at] - p_at * jm[at]) * sgn
        grows = (run > 0) & (fresh > j32 * (np.float32(1.0) - p_at) * np.float32(0.5))
        new[at] = np.where(grows, run + np.float32(1.0), np.float32(1.0)) * sgn
    return new


class _Cells:
    """One wave's cells of the per-cell state, by name: views into it for a contiguous
    block of cells, gathered copies for scattered cells, which `scatter` writes back
    once (those marked `changed`)."""

    __slots__ = (
        "_dirty", "_got", "_s", "burn", "dense", "na_min", "nb_min", "ns_min", "sel", "size",
        "split",
    )  # fmt: skip

    def __init__(
        self, s: dict[str, np.ndarray], sel: slice | I64, size: int, burn: I64 | None, split: bool
    ) -> None:
        self._s, self.sel, self.size = s, sel, size
        self.burn = burn  # positions of the cells riding along (burning in or absent)
        self.split = split  # whether the AR count `na` is kept apart from `ns`
        self.dense = isinstance(sel, slice)
        self._got: dict[str, np.ndarray] = {}
        self._dirty: dict[str, None] = {}
        # The counts as the wave found them (the stages advance them).
        self.ns_min = int(self["ns"].min())
        self.na_min = int(self["na"].min()) if split else self.ns_min
        self.nb_min = int(self["nb"].min())

    def __getitem__(self, name: str) -> np.ndarray:
        got = self._got.get(name)
        if got is None:
            got = self._got[name] = _get(self._s[name], self.sel)
        return got

    def na(self) -> np.ndarray:
        """The AR count: the scale's own (`ns`) until a cell borrowed."""
        return self["na"] if self.split else self["ns"]

    def put(self, name: str, arr: np.ndarray) -> None:
        """Store `arr` as the cells' `name` now (the caller may reuse `arr` afterwards)."""
        self._s[name][self.sel] = arr
        self._got.pop(name, None)

    def changed(self, *names: str) -> None:
        """Mark arrays modified in place, for `scatter`."""
        if not self.dense:
            self._dirty.update(dict.fromkeys(names))

    def scatter(self) -> None:
        """Write the gathered arrays marked `changed` back (views need nothing)."""
        for name in self._dirty:
            self._s[name][self.sel] = self._got[name]


class _Arma(NamedTuple):
    """The MA(1) term in one wave: every cell's theta (None with the term off), the
    ARMA(1,1) cells (theta > 0; None if there are none) and their theta."""

    theta: F32 | None
    at: I64 | None
    th_at: F32 | None


class _Rates(NamedTuple):
    """Weights of one wave's lagged samples in the slow estimates."""

    a_s: F32 | float  # the scale's
    a_p: F32 | float  # the AR and long-run variance estimates'
    inv32: F32 | np.float32 | None  # 1 / min(na, ar_window), for the AR bias (None: ns_sat)
    pad: F32 | np.float32 | None  # ar_margin / sqrt(min(na, ar_window)) (None: ns_sat)
    ar_sat: bool  # every AR count at its window
    ns_sat: bool  # every count at its window and every cell with a lagged sample


class BankCusum:
    """Bank of one-sided CUSUMs with a robust, lagged, AR(1)-whitened front-end.

    `h` is the decision threshold in log-likelihood-ratio units; shift sizes,
    `clip` and `step_cap` are in robust innovation sigmas / LLR units.
    """

    kind: ClassVar[str] = "bank"
    # A checkpoint carries over to new parameters only where these match (`BankParams`).
    STATE_SHAPE: ClassVar[tuple[str, ...]] = STATE_SHAPE

    def __init__(self, n_metrics: int, *, capacity: int = 1024, **params: Any) -> None:
        """A bank for `n_metrics` columns; `params` are `BankParams` fields by name."""
        if n_metrics < 1:
            raise ValueError("n_metrics must be >= 1")
        self.n_metrics = int(n_metrics)
        self.cfg = BankParams(**params)
        self._derive()
        # Whether any cell's AR count differs from its scale count (a warm start borrowed):
        # until then the hot path reads and updates one count.
        self._split = False
        self._warm = WarmStarts()
        self._buf32: dict[str, F32] = {}
        self._cap = 0  # rows allocated
        self._rows = 0  # rows handed out (`bank_state.grow`); the rest are untouched zeros
        self._s: dict[str, np.ndarray] = {}
        self._bank = np.zeros((2 * self.cfg.n_shifts, 0), dtype=np.float32)
        self._run = np.zeros((2, 0), dtype=np.float32)
        self._ring = np.zeros((self.cfg.history, 0), dtype=bank_ring.RING_DTYPE)
        self._times = TimeRings(self.cfg.history, self.n_metrics, bank_state.zeros)
        self._t0 = math.nan  # epoch of the time ring: set by the first wave
        # What became of alarms since the last `drain_stats` (process counters, not state).
        self._stats = dict.fromkeys(ALARM_OUTCOMES, 0)
        bank_state.reserve(self, max(int(capacity), 1))

    def _derive(self) -> None:
        """The shift grid, constants and per-count tables the parameters imply."""
        p = self.cfg
        self._ma_rmax = p.ma_max / (1.0 + p.ma_max**2)  # lag-1 |rho| of w at ma_max
        if p.n_shifts == 1:
            self.shifts = np.array([p.min_shift])
        else:
            self.shifts = np.geomspace(p.min_shift, p.max_shift, p.n_shifts)
        self._mature_at = np.ceil(p.maturity / self.shifts**2).astype(np.int64)
        self._kappa = clipped_second_moment(p.clip)
        self._dclip = p.clip * (1.0 + p.ar_max)  # bound on raw deviations, sigma units
        self._ns_max = max(p.scale_window, p.ar_window)
        self._youth_until = math.ceil(32.0 * p.youth)  # the shrink is < 3% from here on
        # 1 / count up to the longest window: the level's count runs to baseline_window.
        longest = max(self._ns_max, p.baseline_window)
        cnt = np.maximum(np.arange(longest + 1, dtype=np.float64), 1.0)
        self._inv_n32 = (1.0 / cnt).astype(np.float32)
        self._ar_pad32 = (p.ar_margin / np.sqrt(cnt)).astype(np.float32)
        self._ar2_pad32 = (p.ar2_margin / np.sqrt(cnt)).astype(np.float32)
        # Long-run variance ratio: `lv` over its white-noise value kappa / (2L - 1) (the
        # variance of an EW mean of window L), and that ratio's noise margin at n samples
        # (about L-sample blocks carry one value each: standard error sqrt(2L / n)).
        lw = max(p.lrv_window, 1)
        self._lrv_unit = (2.0 * lw - 1.0) / self._kappa
        self._lrv_pad32 = (p.lrv_margin * np.sqrt(2.0 * lw / cnt)).astype(np.float32)
        # Tables by the scale / AR count ns (0..ns_max, saturating), min(ns, window) baked in:
        # every index is in range, so the cheapest take (mode="wrap", intp indices) serves.
        k_ar = np.minimum(np.arange(self._ns_max + 1), p.ar_window)
        k_sc = np.minimum(np.arange(self._ns_max + 1), p.scale_window)
        self._ns_inv_ar32 = self._inv_n32[k_ar]
        self._ns_inv_scale32 = self._inv_n32[k_sc]
        self._ns_pad_ar32 = self._ar_pad32[k_ar]
        self._ns_pad_ar2_32 = self._ar2_pad32[k_ar]
        self._ns_pad_lrv32 = self._lrv_pad32[k_ar]
        ages = np.maximum(np.arange(self._youth_until + 1, dtype=np.float64), 1.0)
        self._youth_u = np.clip(1.0 - p.youth / ages, 0.0, 1.0).astype(np.float32)
        self._youth_u[-1] = 1.0

    # -- parameters and state ------------------------------------------------
    @classmethod
    def param_types(cls) -> dict[str, type]:
        """The constructor's keywords (`BankParams` fields, then `capacity`) and their types."""
        return param_types() | {"capacity": int}

    def params(self) -> dict[str, Any]:
        """Constructor keyword arguments that rebuild this detector (capacity aside)."""
        return self.cfg.as_dict()

    @property
    def h(self) -> float:
        """The decision threshold: the parameter a deployment retunes."""
        return self.cfg.h

    def drain_stats(self) -> dict[str, int]:
        """Alarms by outcome (`ALARM_OUTCOMES`) since the last call; the counts restart."""
        out, self._stats = self._stats, dict.fromkeys(ALARM_OUTCOMES, 0)
        return out

    def ar_counts(self) -> npt.NDArray[np.int32]:
        """Per cell, the samples behind the AR estimates (own plus a warm start's credit)."""
        return self._s["na"] if self._split else self._s["ns"]

    def drain_warm_starts(self) -> dict[str, int]:
        """Streams started since the last call, by `bank_warm.WARM_OUTCOMES`; the counts restart."""
        return self._warm.drain()

    @property
    def capacity(self) -> int:
        """Number of stream slots (rows) currently allocated."""
        return self._cap

    def state_bytes_per_cell(self) -> int:
        """Bytes of state one (stream, metric) cell occupies."""
        return bank_state.bytes_per_cell(self)

    def forget(self, rows: I64) -> None:
        """Reset expired streams' slots so a new stream can reuse them."""
        bank_state.forget(self, rows)

    def copy_rows(self, src: I64, dst: I64) -> None:
        """Streams `dst` go on from the whole state of streams `src` (`bank_state`)."""
        bank_state.copy_rows(self, src, dst)

    def snapshot(self) -> bytes:
        """All state and parameters as deterministic bytes (the rows in use only)."""
        return bank_state.snapshot(self)

    @classmethod
    def restore(cls, blob: bytes, params: Mapping[str, Any] | None = None) -> Self:
        """Rebuild a detector from `snapshot` bytes; future outputs are identical.

        `params` (the keys of `params()`) replaces the checkpoint's parameters: the state
        carries on under them. It must keep `STATE_SHAPE` as it was (`StateShapeError` else).
        """
        return bank_state.restore(cls, blob, params)

    def _epoch(self, ts: F64) -> F64:
        """Wave times relative to the time ring's epoch (moving the epoch when they run far)."""
        if not math.isfinite(self._t0):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # no finite time yet
                top = float(np.nanmax(ts))
            if not math.isfinite(top):
                return ts
            self._t0 = float(math.floor(top))
        rel = ts - self._t0
        top = float(rel.max())  # NaN when any time is NaN: then check the finite ones
        if not top <= _T_SPAN:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                top = float(np.nanmax(rel))
            if top > _T_SPAN:
                shift = math.floor(top)
                # Once per 12 days of stream time: re-express the ring in the new epoch.
                self._times.shift(shift, self._rows)
                self._t0 += shift
                rel = ts - self._t0
        return rel

    # -- hot path ----------------------------------------------------------------
    def update(self, rows: I64, ts: F64, values: F64, groups: I64 | None = None) -> Detections:
        """Feed one wave (each row at most once); NaN cells are left untouched.

        `groups` (optional, >= 0, one per row) names each stream's family, e.g. its
        (pool, model, layer): a stream that finishes burn-in starts its AR and long-run
        variance estimates from mature streams of its family (`warm_start`).
        """
        rows = np.asarray(rows, dtype=np.int64)
        n = rows.size
        if n == 0:
            return Detections.empty()
        if groups is not None and self.cfg.warm_start > 0:
            self._warm.families = self._warm.checked(rows, groups)
            try:
                out = self._update(rows, ts, values)
            finally:
                self._warm.families = None
        else:
            out = self._update(rows, ts, values)
        if self._warm.credit.size:
            self._warm.review(self)
        return out

    def _update(self, rows: I64, ts: F64, values: F64) -> Detections:
        n = rows.size
        k = self.n_metrics
        ts = self._epoch(np.asarray(ts, dtype=np.float64))
        values = np.asarray(values, dtype=np.float64).reshape(n, k)
        if int(rows.min()) < 0:
            raise ValueError("row ids must be >= 0")
        top = int(rows.max()) + 1
        bank_state.grow(self, top)
        ascending = n == 1 or bool(np.all(np.diff(rows) > 0))
        if not ascending and top <= 4 * n + 1024:
            # Arrival order is arbitrary; a counting sort (rows are unique within a wave)
            # costs far less than the gather path it avoids.
            slot = np.full(top, -1, dtype=np.int64)
            slot[rows] = np.arange(n)
            if top == n and int(slot.min()) >= 0:
                # Every row of 0..n-1 once (every stream reported): the slots are the
                # order itself, and the sorted ids are 0..n-1 (no mask to build and apply).
                rows = np.arange(n, dtype=np.int64)
                ts, values = np.take(ts, slot), np.take(values, slot, axis=0)
                ascending = True
            else:
                present = slot >= 0
                order = slot[present]
                if order.size == n:
                    # The sorted ids are where the slots are set (no gather); `take`
                    # gathers the rest faster than fancy indexing.
                    rows = np.flatnonzero(present)
                    ts, values = np.take(ts, order), np.take(values, order, axis=0)
                    ascending = True
        fin = np.isfinite(values)
        if ascending:
            lo, hi = int(rows[0]), int(rows[-1]) + 1
            span = (hi - lo) * k
            sel = slice(lo * k, hi * k)
            if span == n * k and bool(fin.all()):
                # The dense wave: every stream of a block reported. Views, no gathers.
                return self._step(sel, values.reshape(-1), ts if k == 1 else np.repeat(ts, k))
            if np.count_nonzero(fin) * 2 >= span:
                # Mostly dense (sorted rows, some cells missing): run the whole block as
                # views and leave the absent cells' state exactly as it was.
                if span == n * k:
                    # Every row of the block reported: the values are already in place.
                    x = values.reshape(-1)
                    t = np.repeat(ts, k)
                    absent = np.flatnonzero(np.isnan(x))
                    t[absent] = np.nan  # as in the scatter below: a missing cell has no time
                else:
                    pos = ((rows - lo)[:, None] * k + np.arange(k)).reshape(-1)
                    x = np.full(span, np.nan)
                    x[pos] = values.reshape(-1)
                    t = np.full(span, np.nan)
                    t[pos] = np.repeat(ts, k)
                    absent = np.flatnonzero(np.isnan(x))
                return self._step(sel, x, t, absent)
        cells = (rows[:, None] * k + np.arange(k))[fin]
        if cells.size == 0:
            return Detections.empty()
        return self._step(cells, values[fin], np.broadcast_to(ts[:, None], (n, k))[fin])

    def _buf(self, name: str, size: int, fill: float) -> F32:
        """A constant float32 array: numpy's array-array ufuncs beat array-scalar ones."""
        buf = self._buf32.get(name)
        if buf is None or buf.size < size:
            buf = np.full(max(size, 1024), fill, dtype=np.float32)
            self._buf32[name] = buf
        return buf[:size]

    def _step(self, sel: slice | I64, x: F64, t: F64, absent: I64 | None = None) -> Detections:
        """Ring bookkeeping and burn-in for one wave's cells; the rest in `_active`.

        `absent` (positions within a slice) are cells not in the wave: they ride along
        like burning cells, and their count, ring slot and ring position stay as they are.
        """
        s = self._s
        dense = isinstance(sel, slice)
        holes = absent if dense and absent is not None and absent.size else None
        here = None  # mask of the cells present, when some are absent
        n_new = _get(s["n"], sel)
        if holes is None:
            n_new = n_new + 1
        else:
            here = np.ones(x.size, dtype=np.bool_)
            here[holes] = False
            n_new = n_new + here
        if int(n_new.max()) > _N_MAX:
            np.minimum(n_new, _N_MAX, out=n_new)
        s["n"][sel] = n_new
        xl = self._ring_step(sel, x, t, holes, here, int(n_new.min()) <= 1)
        burn = holes
        relearn = None
        if int(n_new.min()) <= self.cfg.burn_in:
            # Cells still burning in ride along with z = 0 and no baseline update, so the
            # wave keeps its fast layout; those completing burn-in get their baseline now.
            burning = n_new <= self.cfg.burn_in
            if burn is not None:
                burning[burn] = False
            done = np.flatnonzero(burning & (n_new == self.cfg.burn_in))
            if done.size:
                self._baseline(_cells_of(sel)[done])
            burning_at = np.flatnonzero(burning)
            if self.cfg.jump > 0 and burning_at.size:
                # Cells re-learning their level after an alarm keep their scale: the jump
                # rule can watch them meanwhile (`_relearning_jumps`).
                known = _get(s["ns"], sel)[burning_at] >= _JUMP_AFTER
                relearn = burning_at[known] if known.any() else None
            # Disjoint from the absent cells (masked above), so a plain concatenation.
            burn = burning_at if burn is None else np.concatenate([burn, burning_at])
        return self._active(sel, x, t, xl, n_new, burn, relearn)

    def _ring_step(
        self,
        sel: slice | I64,
        x: F64,
        t: F64,
        holes: I64 | None,
        here: _Mask | None,
        first: bool,
    ) -> F64:
        """Write the wave's samples into the ring; the samples they replace (NaN where a
        slot was empty). Absent cells (`holes`, with `here` their complement) keep their
        slot, and their ring position stays. `first`: some cell may take its first sample
        (only those are unanchored)."""
        s, hist = self._s, self.cfg.history
        dense = isinstance(sel, slice)
        if first:
            self._anchor_first(sel, x)
        a, u = _get(s["ra"], sel), _get(s["rs"], sel)
        d = bank_ring.offsets(x, a, u)
        if bank_ring.beyond_reach(d):
            self._refit(_cells_of(sel), x, d)
            a, u = _get(s["ra"], sel), _get(s["rs"], sel)
            d = bank_ring.offsets(x, a, u)
        pos = _get(s["pos"], sel)
        self._take_times(sel, pos, t, here)
        p0 = int(pos[0])
        if dense and bool((pos == p0).all()):
            # Cells in lockstep: the ring slot is one row slice.
            row = self._ring[p0, sel]
            xl = bank_ring.decode(row, a, u)
            keep = None if holes is None else row[holes]
            row[...] = d
            pos[...] = (p0 + 1) % hist
            if keep is not None:
                row[holes] = keep
                pos[holes] = p0
        else:
            # Slots scattered over the ring's rows (cells that missed windows fell behind):
            # nearly every slot is a cache line of its own, so this is the wave's costliest
            # step. Touch each slot once, and cast before scattering (a casting scatter is
            # slower).
            ring = self._ring.reshape(-1)
            flat = pos * np.int64(self._ring.shape[1])
            flat += _cells_of(sel)
            if here is None:
                xl = bank_ring.decode(np.take(ring, flat), a, u)
                ring[flat] = d.astype(bank_ring.RING_DTYPE)
                pos += 1
            else:
                # Absent cells' slots are neither written nor even read.
                at = np.flatnonzero(here)
                flat = np.take(flat, at)
                xl = np.full(x.size, np.nan)
                xl[at] = bank_ring.decode(np.take(ring, flat), np.take(a, at), np.take(u, at))
                ring[flat] = np.take(d, at).astype(bank_ring.RING_DTYPE)
                pos += here
            pos *= pos != hist  # wrap around
            if not dense:
                s["pos"][sel] = pos
        return xl

    def _anchor_first(self, sel: slice | I64, x: F64) -> None:
        """Anchor the ring of each cell taking its first sample on that sample."""
        u = _get(self._s["rs"], sel)
        at = np.flatnonzero((u == 0) & np.isfinite(x))
        if at.size:
            cells = _cells_of(sel)[at]
            self._s["ra"][cells] = x[at]
            self._s["rs"][cells] = bank_ring.unit_for(np.abs(x[at]))

    def _refit(self, cells: I64, x: F64, d: F64) -> None:
        """Widen the unit of cells whose sample is beyond their ring's reach, keeping their
        anchor: samples at the anchor (a metric that sat at exactly 0) stay exact, and the
        baseline re-anchors the cell on its new level (`_level`)."""
        with np.errstate(invalid="ignore"):
            far = np.flatnonzero(np.abs(d) >= bank_ring.REACH)
        cells, xf = cells[far], x[far]
        s = self._s
        anchor, unit = s["ra"][cells], s["rs"][cells]
        vals = bank_ring.decode(self._ring[:, cells], anchor, unit)
        wider = bank_ring.unit_for_ring(np.vstack([vals, xf]), anchor, 0.0)
        s["rs"][cells] = wider
        self._ring[:, cells] = bank_ring.encode(vals, anchor, wider)

    def _take_times(self, sel: slice | I64, pos: I32, t: F64, here: _Mask | None) -> None:
        """The wave's times into the time rings (`TimeRings.take`), by row: which cells of
        each row are present, their ring positions before the wave, the row's time."""
        k = self.n_metrics
        if isinstance(sel, slice):
            rows = np.arange(sel.start // k, sel.stop // k, dtype=np.int64)
            cpos = pos.reshape(-1, k)
            if here is None:
                self._times.take(rows, None, cpos, t[::k])
                return
            present = here.reshape(-1, k)
            first = np.argmax(present, axis=1)  # a present cell's time is its row's
            self._times.take(rows, present, cpos, t.reshape(-1, k)[np.arange(rows.size), first])
            return
        # Gathered cells: the present ones only, a row's next to each other, in row order.
        r = sel // k
        starts = np.flatnonzero(np.concatenate([[True], r[1:] != r[:-1]]))
        rows = r[starts]
        if starts.size * k == sel.size:
            self._times.take(rows, None, pos.reshape(-1, k), t[starts])
            return
        present = np.zeros((starts.size, k), dtype=np.bool_)
        present[np.repeat(np.arange(starts.size), np.diff(np.append(starts, sel.size))),
                sel % k] = True  # fmt: skip
        cpos = self._s["pos"][rows[:, None] * k + np.arange(k)]
        self._times.take(rows, present, cpos, t[starts])

    def _active(
        self,
        sel: slice | I64,
        x: F64,
        t: F64,
        xl: F64,
        n: I32,
        burn: I64 | None,
        relearn: I64 | None = None,
    ) -> Detections:
        """Front-end, bank and lagged baseline for one wave's cells; then its alarms.

        `relearn`: positions of cells re-learning their level after an alarm."""
        v = _Cells(self._s, sel, x.size, burn, self._split)
        arma = self._arma_cells(v)
        dz, marg = self._deviations(v, x, arma)
        jumped = self._jump_runs(v, dz, marg) if self.cfg.jump > 0 else None
        z = self._innovations(v, dz, arma)
        self._deflate(v, z, n, arma)
        bank, run, fire, idle = self._bank_step(v, z)
        self._lagged_update(v, xl, marg, run, idle, arma)
        v.scatter()
        if relearn is not None:
            jumped = self._relearning_jumps(sel, x, marg, relearn, jumped)
        if jumped is None and not fire:
            return Detections.empty()
        stat = bank.max(axis=0)
        h32 = np.float32(self.cfg.h)
        hit = stat > h32
        if jumped is not None:
            hit |= jumped
            np.maximum(stat, h32, out=stat, where=jumped)
        idx = np.flatnonzero(hit)
        return bank_alarm.alarm(self, _cells_of(sel)[idx], t[idx], stat[idx].astype(np.float64))

    # -- front-end: deviations, the jump rule, whitened innovations ------------------
    def _arma_cells(self, v: _Cells) -> _Arma:
        """The MA(1) term's coefficients and the ARMA(1,1) cells among `v` (theta > 0:
        rare outside slow signals under noise, so the MA term's work touches only them)."""
        if self.cfg.ma_max == 0:
            return _Arma(None, None, None)
        theta = v["theta"]
        at = np.flatnonzero(theta > 0)
        if at.size == 0:
            return _Arma(theta, None, None)
        return _Arma(theta, at, theta[at])

    def _deviations(self, v: _Cells, x: F64, arma: _Arma) -> tuple[F32, F32]:
        """Each cell's deviation from its level in innovation sigmas (0 for cells riding
        along), and the factor from innovation sigmas to the level's marginal sigmas."""
        dz64 = x - v["mu"]
        dz64 /= v["sig"]
        if v.burn is not None:
            dz64[v.burn] = 0.0
        dz = dz64.astype(np.float32)
        marg = v["phi"] * v["phi"]  # sqrt(1 - phi²), in place
        np.subtract(np.float32(1.0), marg, out=marg)
        np.sqrt(marg, out=marg)
        if arma.at is not None:
            # phi is the slow part's root there, so the level's marginal sd is sqrt(c0)
            # innovation sigmas, not 1 / sqrt(1 - phi²) (for phi 0.97 that would put the
            # jump rule's bound at 25 sigmas and leave the slow estimates' bound open).
            c0_at = v["c0"][arma.at]
            marg[arma.at] = np.float32(1.0) / np.sqrt(np.maximum(c0_at, _EPS32))
        return dz, marg

    def _jump_runs(self, v: _Cells, dz: F32, marg: F32) -> npt.NDArray[np.bool_] | None:
        """Count consecutive windows beyond `jump` marginal sigmas on one side; the mask of
        cells whose run reached `jump_windows` (None when none did).

        A step of many sigmas is obvious long before the bank's capped steps add up to h.
        `jump_windows` windows in a row beyond `jump` sigmas of the level's own spread is
        rare under any tail the front-end admits, so the rule is safe without a threshold
        of its own. Under autocorrelation one huge innovation also stays beyond the bound
        for a few windows, decaying as phi^k; a run only grows when its window is not that
        decay: it must exceed phi times the previous deviation by half of what a step at
        the bound would add, jump*(1-phi)/2.
        """
        jr, jm, phi, ns = v["jr"], v["jm"], v["phi"], v["ns"]
        m = marg * dz
        j32 = np.float32(self.cfg.jump)
        new = _jump_steps(m, jr, jm, phi, j32, m > j32, m < -j32)
        if v.ns_min < _JUMP_AFTER:
            new *= ns >= _JUMP_AFTER  # a scale from a few dozen samples can be far too small
        if v.burn is not None:
            new[v.burn], m[v.burn] = jr[v.burn], jm[v.burn]
        v.put("jr", new)
        v.put("jm", m)
        np.abs(new, out=new)
        reached = new >= np.float32(self.cfg.jump_windows)
        return reached if bool(reached.any()) else None

    def _relearning_jumps(
        self, sel: slice | I64, x: F64, marg: F32, at: I64, jumped: _Mask | None
    ) -> _Mask | None:
        """The jump rule for cells re-learning their level after an alarm (`at`: positions
        in the wave), against the median of the samples they have since and the level
        before the alarm: `jumped` with those whose run reached `jump_windows` added (their
        level set to that median).

        A re-baseline waits `burn_in` samples for a level, but the scale and AR it keeps
        are still the cell's: a run of windows far beyond every sample since the alarm is a
        change whatever the exact level. Without it a cell is blind for minutes after each
        alarm: a cooling fault that began soon after a burst's end heated its die by 40 °C
        unseen until the re-baseline was done, and was dated from then.
        """
        s = self._s
        cells = _cells_of(sel)[at]
        scale = marg[at] / s["sig"][cells]
        j32 = np.float32(self.cfg.jump)
        # Beyond the level before the alarm too (still `mu` while re-learning): the way
        # back from a transient that alarmed (a burst's end, a shock's decay) is no change.
        # Only those are worth a median of their samples.
        was = (scale * (x[at] - s["mu"][cells])).astype(np.float32)
        far = np.flatnonzero(np.abs(was) > j32)
        m = np.zeros(cells.size, dtype=np.float32)
        level = np.full(cells.size, np.nan)
        if far.size:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # no samples yet: NaN
                level[far] = np.nanmedian(self._chrono_values(cells[far]), axis=1)
            m[far] = np.nan_to_num(scale[far] * (x[at][far] - level[far]), nan=0.0)
        jr, jm, phi = s["jr"][cells], s["jm"][cells], s["phi"][cells]
        up, down = (m > j32) & (was > j32), (m < -j32) & (was < -j32)
        new = _jump_steps(m, jr, jm, phi, j32, up, down)
        s["jr"][cells] = new
        s["jm"][cells] = m
        reached = np.abs(new) >= np.float32(self.cfg.jump_windows)
        if not reached.any():
            return jumped
        s["mu"][cells[reached]] = level[reached]
        out = np.zeros(x.size, dtype=np.bool_) if jumped is None else jumped
        out[at[reached]] = True
        return out

    def _innovations(self, v: _Cells, dz: F32, arma: _Arma) -> F32:
        """The whitened, clipped innovations z; the deviations become `dprev`.

        The pair (d, d_prev) is bounded together: where either is beyond `dclip` sigmas,
        both are scaled down by the same factor, so the innovation keeps its sign and
        proportion. Clipping each alone would turn a shock's decay (d_prev 20, d 10 under
        phi 0.5: innovation 0) into windows of (1 - phi) * dclip, which page on heavy-tailed
        shocks. The bound itself keeps an under-estimated phi on a slow metric from turning
        a long excursion into a run of large innovations.
        """
        dprev, burn = v["dprev"], v.burn
        np.clip(dz, -_DZ_FINITE, _DZ_FINITE, out=dz)  # finite: no inf - inf below
        z: F32 = v["phi"] * dprev
        np.subtract(dz, z, out=z)
        shrink = np.abs(dz)
        np.maximum(shrink, np.abs(dprev), out=shrink)
        bound = self._buf("dclip", v.size, self._dclip)
        np.maximum(shrink, bound, out=shrink)
        np.divide(bound, shrink, out=shrink)  # dclip / max(|d|, |d_prev|, dclip)
        z *= shrink
        if arma.theta is not None:
            # A slow signal under measurement noise (an ARMA(1,1)): w = d - phi d_prev
            # still carries the noise's MA(1) part, u = w + theta u_prev does not. Where
            # theta is 0, u is w: a cell that turns ARMA starts its recursion from its
            # last w. Cells riding along keep their state.
            u_at = self._ma_recursion(v, "uprev", z, arma, burn)
            if arma.at is not None and u_at is not None:
                z[arma.at] = u_at
        np.clip(z, -self.cfg.clip, self.cfg.clip, out=z)
        if burn is not None:
            z[burn] = 0.0
            dz[burn] = dprev[burn]  # cells riding along keep their whitening state
        dprev[...] = dz
        v.changed("dprev")
        return z

    def _ma_recursion(
        self, v: _Cells, name: str, w: F32, arma: _Arma, keep: I64 | None
    ) -> F32 | None:
        """Advance the MA state `name`: u = w + theta u_prev in the ARMA cells, u = w
        elsewhere, bounded at dclip; cells at `keep` keep theirs. The ARMA cells' u in its
        own sigmas (u sqrt(1 + theta²): its variance is w's / (1 + theta²)), or None when
        there are none."""
        prev = v[name]
        u_at = None
        if arma.at is not None and arma.th_at is not None:
            u_at = arma.th_at * prev[arma.at]
            u_at += w[arma.at]
            np.clip(u_at, -self._dclip, self._dclip, out=u_at)
        kept = None if keep is None else prev[keep]
        np.clip(w, -self._dclip, self._dclip, out=prev)
        if arma.at is not None and u_at is not None and arma.th_at is not None:
            prev[arma.at] = u_at
            u_at = u_at * np.sqrt(arma.th_at * arma.th_at + np.float32(1.0))
        if keep is not None and kept is not None:
            prev[keep] = kept
        v.changed(name)
        return u_at

    def _deflate(self, v: _Cells, z: F32, n: I32, arma: _Arma) -> None:
        """Shrink young cells' evidence, and deflate z by the innovations' long-run
        variance ratio (less its noise), in place."""
        if self.cfg.youth > 0 and int(n.min()) < self._youth_until:
            # A young baseline is uncertain: shrink the evidence until it matures.
            z *= np.take(self._youth_u, n, mode="clip")
        if self.cfg.lrv_window == 0:
            return
        # Persistence the whitening left in (a slow wander under measurement noise:
        # small lag-1, long memory) makes sums of z spread wider than sqrt(count).
        f = v["lv"] * np.float32(self._lrv_unit)
        if v.na_min >= self._ns_max:
            padl: F32 | np.float32 = self._lrv_pad32[self.cfg.ar_window]
        else:
            padl = np.take(self._ns_pad_lrv32, v.na().astype(np.intp), mode="wrap")
        if arma.at is not None:
            # ARMA cells are deflated by the point estimate: their long-run variance
            # learns at all times, and what the MA term leaves is real.
            f_at = f[arma.at]
        f -= padl
        if arma.at is not None:
            f[arma.at] = f_at
        np.maximum(f, np.float32(1.0), out=f)
        np.sqrt(f, out=f)
        z /= f

    # -- the bank -------------------------------------------------------------------
    def _bank_step(self, v: _Cells, z: F32) -> tuple[F32, F32, bool, _Mask | None]:
        """Advance every member's statistics by z (float32: they need no more precision).

        Returns the statistics and run lengths of `v`'s cells, whether any statistic
        crossed h, and the mask of cells riding along (None when there are none).
        """
        sel, size, burn, c = v.sel, v.size, v.burn, self.cfg.clip
        zeros = self._buf("zero", size, 0.0)
        nb = v["nb"]
        bank, run = _get(self._bank, sel), _get(self._run, sel)
        fire = False
        h32 = np.float32(self.cfg.h)
        live: F32 | None = None
        idle: _Mask | None = None
        if burn is not None:
            # Cells riding along (z = 0 there) get half = 0 too, so their steps are +0 and
            # their statistics stay as they were: one product per member instead of two
            # writes through `burn`.
            live = np.ones(size, dtype=np.float32)
            live[burn] = 0.0
            idle = live == 0.0
        for j, dj in enumerate(self.shifts):
            half32 = np.float32(0.5 * dj * dj)
            half = half32 if live is None else live * half32
            up, dn = bank[2 * j], bank[2 * j + 1]
            dz_j = z * np.float32(dj)
            a_up = dz_j - half  # delta*z - delta²/2: one window's log-likelihood ratio
            a_dn = dz_j
            a_dn += half  # delta*z + delta²/2 = -(the down side's LLR)
            if dj * c - half32 > self.cfg.step_cap:
                # Huber's censored likelihood ratio: no window adds more than step_cap,
                # so a run of heavy-tailed outliers needs more windows to alarm.
                np.minimum(a_up, self._buf("cap", size, self.cfg.step_cap), out=a_up)
                np.maximum(a_dn, self._buf("ncap", size, -self.cfg.step_cap), out=a_dn)
            up += a_up
            np.maximum(up, zeros, out=up)
            dn -= a_dn
            np.maximum(dn, zeros, out=dn)
            if v.nb_min < self._mature_at[j]:
                ripe = nb >= self._mature_at[j]
                up *= ripe
                dn *= ripe
            if j == 0:
                # Run lengths of the smallest member: the onset of a shift too slow for the ring.
                if live is None or idle is None:
                    run += np.float32(1.0)
                    run[0] *= up > 0
                    run[1] *= dn > 0
                else:
                    run += live  # riding cells: + 0, then * True
                    run[0] *= (up > 0) | idle
                    run[1] *= (dn > 0) | idle
            fire = fire or bool(up.max() > h32) or bool(dn.max() > h32)
        if not v.dense:
            for j in range(bank.shape[0]):
                self._bank[j][sel] = bank[j]
            self._run[0][sel], self._run[1][sel] = run[0], run[1]
        return bank, run, fire, idle

    # -- lagged baseline: level, scale, AR and long-run variance ----------------------
    def _lagged_update(
        self, v: _Cells, xl: F64, marg: F32, run: F32, idle: _Mask | None, arma: _Arma
    ) -> None:
        """Fold the sample that just left the ring (if any) into the slow estimates."""
        rl, w, off = self._lagged_deviations(v, xl, marg)
        a_b = self._level_rate(v, w, off is None)
        rates = self._rates(v, w, off is None)
        mu, sig, phi, lprev = v["mu"], v["sig"], v["phi"], v["lprev"]
        step = sig * rl
        step *= a_b
        mu += step
        el = phi * lprev  # the lagged innovation
        np.subtract(rl, el, out=el)
        if self.cfg.lrv_window > 0:
            self._long_run_variance(v, el, run, w, off, rates.a_p, arma)
        self._scale(v, el, rates.a_s)
        est, at = self._ar(v, rl, rates, idle)
        if arma.theta is not None:
            self._ma_theta(v, est, at, arma, idle)
        lprev2 = v["lprev2"]
        keep = None if off is None else lprev[off]
        if self.cfg.ar2_margin > 0:
            keep2 = None if off is None else lprev2[off]
            lprev2[...] = lprev
            if keep2 is not None:
                lprev2[off] = keep2
        lprev[...] = rl
        if keep is not None:
            lprev[off] = keep
        v.changed("mu", "sig", "phi", "c0", "c1", "lprev")
        if self.cfg.ar2_margin > 0:
            v.changed("c2", "lprev2")

    def _lagged_deviations(self, v: _Cells, xl: F64, marg: F32) -> tuple[F32, _Mask, I64 | None]:
        """The lagged samples' deviations in sigmas (0 where there is none), which cells
        have one, and the positions of those without (None: all have one)."""
        w = np.isfinite(xl)
        if v.burn is not None:
            w[v.burn] = False
        # Positions, not a mask: writes through a scattered boolean mask are slow.
        off = None if bool(w.all()) else np.flatnonzero(~w)
        rl64 = xl - v["mu"]
        if off is not None:
            rl64[off] = 0.0
        rl64 /= v["sig"]
        rl = rl64.astype(np.float32)
        np.clip(rl, -self._dclip, self._dclip, out=rl)
        # The slow estimates also see each deviation bounded at `clip` marginal sigmas
        # (the burn-in's bound): one additive outlier then adds clip² to the lag-0
        # covariance, not (front-end bound)², and pulls phi down far less. A phi biased
        # low under-whitens, and under-whitening pages.
        lim = np.float32(self.cfg.clip) / marg
        np.minimum(rl, lim, out=rl)
        np.negative(lim, out=lim)
        np.maximum(rl, lim, out=rl)
        return rl, w, off

    def _level_rate(self, v: _Cells, w: _Mask, all_w: bool) -> F32 | float:
        """The level's weight for the lagged sample: 1 / count up to `baseline_window`."""
        nb, bw = v["nb"], self.cfg.baseline_window
        if all_w and v.nb_min >= bw:
            return 1.0 / bw
        if v.nb_min >= bw:
            # Every level already rests on its window: one weight, masked, no lookups.
            if int(nb.max()) > bw:
                nb[...] = bw
                v.changed("nb")
            a_b: F32 = w * self._inv_n32[bw]
            return a_b
        np.add(nb, w, out=nb)
        np.minimum(nb, bw, out=nb)
        v.changed("nb")
        # 1 / count: a running mean until the window (nb <= baseline_window: in range).
        ab = np.take(self._inv_n32, nb.astype(np.intp), mode="wrap")
        if not all_w:
            ab *= w
        return ab

    def _rates(self, v: _Cells, w: _Mask, all_w: bool) -> _Rates:
        """Weights of the lagged sample in the scale and in the AR and long-run variance
        estimates, by their counts: ns for the scale, na for the others (na runs ahead of
        ns in a cell that started from its family's estimates)."""
        ns, na, ns_max = v["ns"], v.na(), self._ns_max
        sw, aw = self.cfg.scale_window, self.cfg.ar_window
        ar_sat = v.na_min >= ns_max
        sat = v.ns_min >= ns_max and ar_sat
        if all_w and sat:
            return _Rates(1.0 / sw, 1.0 / aw, None, None, ar_sat, ns_sat=True)
        if sat:
            # Saturated but for absent cells: the same weights as below, without lookups.
            if int(ns.max()) > ns_max:
                ns[...] = ns_max
                v.changed("ns")
            inv32: F32 | np.float32 = self._inv_n32[aw]
            pad: F32 | np.float32 = self._ar_pad32[aw]
            return _Rates(w * self._inv_n32[sw], w * inv32, inv32, pad, ar_sat, ns_sat=False)
        np.add(ns, w, out=ns)
        np.minimum(ns, ns_max, out=ns)
        v.changed("ns")
        if v.split:
            np.add(na, w, out=na)
            np.minimum(na, ns_max, out=na)
            v.changed("na")
        nai = na.astype(np.intp)
        inv32 = np.take(self._ns_inv_ar32, nai, mode="wrap")  # 1 / min(na, ar_window)
        pad = np.take(self._ns_pad_ar32, nai, mode="wrap")
        a_p = inv32 if all_w else inv32 * w
        same = not v.split or bool(np.array_equal(ns, na))
        if (sw == aw or int(ns.max()) <= min(sw, aw)) and same:
            a_s: F32 = a_p  # min(ns, scale_window) == min(na, ar_window): the same weights
        else:
            a_s = np.take(self._ns_inv_scale32, ns.astype(np.intp), mode="wrap")
            if not all_w:
                a_s *= w
        return _Rates(a_s, a_p, inv32, pad, ar_sat, ns_sat=False)

    def _long_run_variance(
        self,
        v: _Cells,
        el: F32,
        run: F32,
        w: _Mask,
        off: I64 | None,
        a_p: F32 | float,
        arma: _Arma,
    ) -> None:
        """Update `lm`, the EW mean of the lagged innovations over `lrv_window`, and `lv`,
        its mean square: their long-run variance. Lagged, so a fresh shift does not
        inflate it before it alarms. It learns only while no shift is building up: a
        shift the bank has not called within `history` windows (slow, or vetoed) reaches
        the lagged samples, and its mean would read as persistence and deflate its own
        evidence."""
        c = self.cfg.clip
        lm, lv = v["lm"], v["lv"]
        # 1.0 where it learns, 0.0 else (a product and a plain add beat a masked add).
        calm = np.maximum(run[0], run[1])
        np.less_equal(calm, np.float32(_LRV_CALM_RUN), out=calm, casting="unsafe")
        if arma.at is not None:
            # ARMA cells always learn: their innovations keep more slow power than an
            # AR(1)'s, so runs past the calm bound are common there, and a long-run
            # variance that stopped learning would let it page.
            calm[arma.at] = 1.0
        if off is not None:
            calm *= w
        e = np.clip(el, -c, c)
        if arma.theta is not None:
            # The same recursion on the lagged innovations (their long-run variance is the
            # ARMA innovations' in ARMA cells). Cells without a lagged sample keep theirs.
            ul = self._ma_recursion(v, "ulprev", el, arma, off)
            if arma.at is not None and ul is not None:
                e[arma.at] = np.clip(ul, -c, c)
        e -= lm
        e *= calm
        e *= np.float32(1.0 / self.cfg.lrv_window)
        lm += e
        np.multiply(lm, lm, out=e)
        e -= lv
        e *= a_p
        e *= calm
        lv += e
        v.changed("lm", "lv")

    def _scale(self, v: _Cells, el: F32, a_s: F32 | float) -> None:
        """Scale: stochastic approximation to the Huber proposal-2 fixed point
        E[min(e², c²)] = kappa, multiplicative so sigma stays positive; then the floors.
        Squares `el` in place."""
        c, mu, sig = self.cfg.clip, v["mu"], v["sig"]
        el *= el
        np.minimum(el, self._buf("c2", v.size, c * c), out=el)
        el *= np.float32(0.5 / self._kappa)
        el -= np.float32(0.5)
        el *= a_s
        el += np.float32(1.0)
        sig *= el
        rel, absf = self.cfg.rel_floor, self.cfg.abs_floor
        fmax = max(rel * max(abs(float(mu.max())), abs(float(mu.min()))), absf)
        if fmax >= float(sig.min()):
            floor = np.abs(mu)
            floor *= rel
            np.maximum(floor, absf, out=floor)
            np.maximum(sig, floor, out=sig)

    def _ar(self, v: _Cells, rl: F32, r: _Rates, idle: _Mask | None) -> tuple[F32, I64 | None]:
        """EW lag-0/1/2 autocovariances of the lagged deviations and the AR coefficient in
        use: a bias-corrected upper confidence bound (over-whitening costs a little power,
        under-whitening costs false pages). Returns it and, with the MA term on, the cells
        that are ARMA(1,1) now (None otherwise)."""
        c0: F32 = v["c0"]
        c1: F32 = v["c1"]
        c2, phi = v["c2"], v["phi"]
        tmp = rl * rl
        tmp -= c0
        tmp *= r.a_p
        c0 += tmp
        tmp = rl * v["lprev"]
        tmp -= c1
        tmp *= r.a_p
        c1 += tmp
        est: F32 = c1 / (c0 + _EPS32)
        lcb = self._lag2_bound(v, rl, est, r) if self.cfg.ar2_margin > 0 else None
        if r.ns_sat:
            inv = np.float32(1.0 / self.cfg.ar_window)
            est *= 1.0 + 3.0 * inv
            est += inv + np.float32(self.cfg.ar_margin) * np.sqrt(inv)
        else:
            assert r.inv32 is not None  # noqa: S101 - set unless ns_sat
            assert r.pad is not None  # noqa: S101 - set unless ns_sat
            est += (1.0 + 3.0 * est) * r.inv32
            est += r.pad
        at = None
        if lcb is not None:
            if self.cfg.ma_max > 0:
                # Where c2/c1's lower bound clearly beats the AR(1) bound, the cell is an
                # ARMA(1,1): whiten with c2/c1 itself and let the MA term undo what
                # that over-whitens (the bound alone under-whitens the slow part).
                at = np.flatnonzero(lcb > est)
                if idle is not None and at.size:
                    at = at[~idle[at]]  # burning and absent cells keep theirs
                if at.size:
                    ratio = c2[at] / np.maximum(c1[at], _EPS32)
                    lcb[at] = np.minimum(ratio, np.float32(1.0))
            np.maximum(est, lcb, out=est)
        np.clip(est, 0.0, self.cfg.ar_max, out=est)
        if v.burn is not None:
            est[v.burn] = phi[v.burn]  # recomputing could differ in the last bit: keep it
        phi[...] = est
        return est, at

    def _lag2_bound(self, v: _Cells, rl: F32, est: F32, r: _Rates) -> F32:
        """Update the lag-2 autocovariance; the lower confidence bound of c2/c1.

        A slow signal under measurement noise is an ARMA(1,1): its lag-1 autocorrelation
        understates phi, and whitening with it pages. phi is then c2/c1; its lower
        confidence bound, margin / (r1 sqrt n) below, only wins where it clearly exceeds
        the AR(1) bound.
        """
        c1, c2 = v["c1"], v["c2"]
        lcb: F32 = rl * v["lprev2"]
        lcb -= c2
        lcb *= r.a_p
        c2 += lcb
        np.divide(c2, np.maximum(c1, _EPS32), out=lcb)
        np.minimum(lcb, np.float32(1.0), out=lcb)  # c1 near 0 or below: no estimate
        # margin / sqrt(min(na, ar_window)), from a table like the AR(1) pad.
        pad2 = (
            self._ar2_pad32[self.cfg.ar_window]
            if r.ar_sat
            else np.take(self._ns_pad_ar2_32, v.na().astype(np.intp), mode="wrap")
        )
        r1 = np.maximum(est, np.float32(1e-3))
        np.divide(pad2, r1, out=r1)
        lcb -= r1
        return lcb

    def _ma_theta(
        self, v: _Cells, est: F32, at: I64 | None, arma: _Arma, idle: _Mask | None
    ) -> None:
        """The MA(1) coefficient where phi came from c2/c1 (a slow signal under noise):
        theta from the lag-1 autocorrelation rho of w = d - phi d_prev that c0, c1, c2
        imply (w = u - theta u_prev: theta / (1 + theta²) = -rho), at most ma_max; 0 in
        the other cells (riding ones keep theirs)."""
        theta = arma.theta
        assert theta is not None  # noqa: S101 - only called with the MA term on
        if at is None:
            at = np.empty(0, dtype=np.int64)
        if arma.at is not None:
            old = arma.at if idle is None else arma.at[~idle[arma.at]]
            theta[old] = 0.0
        if at.size:
            fa, a0, a1, a2 = est[at], v["c0"][at], v["c1"][at], v["c2"][at]
            p2 = fa * fa + np.float32(1.0)
            gw0 = a0 * p2 - np.float32(2.0) * fa * a1
            gw1 = a1 * p2 - fa * (a0 + a2)
            r = -gw1 / np.maximum(gw0, _EPS32)
            np.clip(r, np.float32(1e-6), np.float32(self._ma_rmax), out=r)
            t1 = np.float32(1.0) - np.sqrt(np.float32(1.0) - np.float32(4.0) * r * r)
            theta[at] = t1 / (np.float32(2.0) * r)
        if at.size or arma.at is not None:
            v.changed("theta")

    # -- baselines (alarms are in bank_alarm) -------------------------------------
    def _chrono(self, cells: I64) -> tuple[F64, F64]:
        """Ring values and times of `cells`, oldest first, one row per cell."""
        order = self._order(cells)
        vals = np.take_along_axis(self._ring_values(cells), order, axis=1)
        times = self._times.columns(cells, self._s["pos"][cells]).T
        return vals, np.take_along_axis(times, order, axis=1).astype(np.float64)

    def _order(self, cells: I64) -> I64:
        """Ring slots of `cells`, oldest first, one row per cell."""
        order: I64 = (self._s["pos"][cells, None] + np.arange(self.cfg.history)) % self.cfg.history
        return order

    def _chrono_values(self, cells: I64) -> F64:
        """Ring values of `cells`, oldest first, one row per cell (`_chrono` without times)."""
        return np.take_along_axis(self._ring_values(cells), self._order(cells), axis=1)

    def _ring_values(self, cells: I64) -> F64:
        """Ring samples of `cells` in slot order, one row per cell."""
        s = self._s
        return bank_ring.decode(self._ring[:, cells].T, s["ra"][cells, None], s["rs"][cells, None])

    def _baseline(self, cells: I64) -> None:
        """(Re)set the level from the ring's samples; a never-baselined cell also gets scale/AR."""
        fresh = self._s["ns"][cells] == 0
        if fresh.any():
            self._first_baseline(cells[fresh])
        self._level(cells)

    def _first_baseline(self, cells: I64) -> None:
        """Scale and AR(1) coefficient from the burn-in samples of never-baselined cells."""
        s, c = self._s, self.cfg.clip
        vals = self._chrono_values(cells)
        fin = np.isfinite(vals)
        count = fin.sum(axis=1).astype(np.float64)
        mu = np.nanmedian(vals, axis=1)
        d = vals - mu[:, None]
        mad = np.nanmedian(np.abs(d), axis=1) * _MAD_TO_SIGMA
        # MAD is 0 when most samples are equal (quantised metrics): fall back to the mean
        # absolute deviation, then to the floor, so the scale never collapses.
        mean_abs = np.nanmean(np.abs(d), axis=1) * math.sqrt(math.pi / 2.0)
        floor = np.maximum(self.cfg.rel_floor * np.abs(mu), self.cfg.abs_floor)
        sx = np.maximum(np.where(mad > 0, mad, mean_abs), floor)
        dc = np.clip(d / sx[:, None], -c, c)  # level-sigma units
        both = fin[:, 1:] & fin[:, :-1]
        lag1 = np.where(both, dc[:, 1:] * dc[:, :-1], 0.0).sum(axis=1)
        lag0 = np.where(fin, dc * dc, 0.0).sum(axis=1)
        est = np.clip(lag1 / np.maximum(lag0, 1e-12), -1.0, 1.0)
        est_bc = unbiased_lag1(est, count)
        phi = self._phi_bound(est_bc, count)
        donor = self._warm.donors(self, cells, est_bc, count)
        warm = donor >= 0
        if warm.any():
            # Whiten with the family's phi, so the scale is that of the innovations the
            # borrowed autocovariances are measured in.
            phi = np.where(warm, s["phi"][np.maximum(donor, 0)], phi)
        e = np.where(both, d[:, 1:] - phi[:, None] * d[:, :-1], np.nan)
        sig = np.maximum(sx * np.sqrt(np.maximum(1.0 - est * est, 0.0)), floor)
        for _ in range(3):  # Huber proposal-2 fixed point on the innovations
            bound = (c * sig)[:, None]
            m2 = np.nanmean(np.minimum(e * e, bound * bound), axis=1)
            sig = np.maximum(np.sqrt(m2 / self._kappa), floor)
        ratio2 = (sx / sig) ** 2
        s["sig"][cells] = sig
        s["phi"][cells] = phi
        s["c0"][cells] = ratio2
        s["c1"][cells] = est * ratio2
        s["c2"][cells] = est * est * ratio2  # as an AR(1): no lag-2 evidence yet
        s["lm"][cells] = 0.0
        s["lv"][cells] = 1.0 / self._lrv_unit if self.cfg.lrv_window > 0 else 0.0
        s["lprev"][cells] = 0.0
        s["lprev2"][cells] = 0.0
        s["ns"][cells] = count.astype(np.int32)
        if self._split:  # else the AR count is `ns` (`bank_state.idle`)
            s["na"][cells] = count.astype(np.int32)
        if warm.any():
            self._warm.borrow(self, cells[warm], donor[warm])

    def _phi_bound(self, est_bc: F64, count: F64) -> F64:
        """The AR coefficient in use from a bias-corrected lag-1 estimate on `count` samples:
        its upper confidence bound (under-whitening pages), within [0, ar_max]."""
        return np.clip(est_bc + self.cfg.ar_margin / np.sqrt(count), 0.0, self.cfg.ar_max)

    def _level(self, cells: I64) -> None:
        """Level = median of the ring's samples; start the lagged updates from there."""
        s = self._s
        vals = self._chrono_values(cells)
        fin = np.isfinite(vals)
        mu = np.nanmedian(vals, axis=1)
        newest = self.cfg.history - 1 - np.argmax(fin[:, ::-1], axis=1)
        last = vals[np.arange(cells.size), newest] - mu
        s["mu"][cells] = mu
        s["dprev"][cells] = np.clip(last / s["sig"][cells], -_DZ_FINITE, _DZ_FINITE)
        if self.cfg.ma_max > 0:  # else unread (`bank_state.idle`)
            s["uprev"][cells] = 0.0
            s["ulprev"][cells] = 0.0
        s["nb"][cells] = fin.sum(axis=1).astype(np.int32)
        s["n"][cells] = np.maximum(s["n"][cells], self.cfg.burn_in)
        # Samples already counted in the level must not be folded in again later.
        self._ring[:, cells] = np.nan
        # The ring's next samples lie about the level: anchor it there.
        s["ra"][cells] = np.nan_to_num(mu)
        s["rs"][cells] = bank_ring.unit_holding(np.nan_to_num(mu), s["sig"][cells], 0.0)
        self._bank[:, cells] = 0.0
        self._run[:, cells] = 0.0
        s["jr"][cells] = 0.0
        s["jm"][cells] = 0.0

"""What load each pool ran at, lately: whether a change was already put to the test.

A change is a cause only if the regression showed once the change met the load it
shows at. A pool that served, after the change and before the onset, at least the
onset's offered load for `LEAD_WINDOWS` windows without regressing has put the change
to that test and passed: a driver updated three hours before a NIC failed is not what
failed. A regression that shows only under burst load is still blamed on the change
before it when no burst came between the two (the calm windows are no test).

Per pool: one bin a minute of the pool's recent windows, each with the most offered
load (request rate) seen in it and how many windows it held, for the advisor's
look-back. Training pools report no request rate; every window of theirs is a test.
Per serving pool, model and layer type, each minute also keeps the pool aggregate's
per-layer efficiency at that minute's peak load, so that a burst can be compared with
earlier bursts at that load (`earlier_level`) rather than with calm.
Per serving pool and model, each minute likewise keeps the pool's queue, latency and
failures at its peak load (`BACKLOG_LEVELS`): queueing grows with the offered load, so
what the pool showed at a higher load bounds what a lower one does (`backlog_bound`).
Per pool, the last `RECENT_S` of its windows' request rates, window by window: what
the offered load did right around an onset (`offered_ratio`), which a minute's peak is
too coarse for.
Not checkpointed: after a restart nothing counts as tested until the pool has run
again, so the advisor falls back to the plain look-back.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from monitor.arrays import F32
from monitor.indicators import DEFAULT_MIN_REL_CHANGE, MIN_REL_CHANGE

BIN_S = 60.0
# Loads within the request rate's reporting floor of each other are the same load: a pool
# whose rate drifts up a fraction of a percent an hour still ran at its onset's load.
SAME_LOAD = MIN_REL_CHANGE.get("req_rate", DEFAULT_MIN_REL_CHANGE)


# The per-layer efficiency columns kept per minute: what the load model normalises and
# bursts are compared on (`lifecycle._NORMALISED`).
EFFICIENCY = ("mfu", "stall_frac", "arith_intensity", "occupancy")
# The pool aggregate's queue, latency and failure columns kept per minute: what a backlog
# moves (`indicators.BACKLOG`), which the load drives and no load model normalises.
BACKLOG_LEVELS = ("queue_wait_ms", "queue_depth", "lat_p50_ms", "lat_p95_ms", "lat_p99_ms",
                  "error_rate")  # fmt: skip
# Fewer earlier minutes at a load than this: no comparison (one minute may be a burst's
# ragged edge).
MIN_EARLIER_MINUTES = 2

LevelKey = tuple[str | None, str | None, str]  # (pool, model, layer type)
# Windows kept one by one: a grouping window before an onset and a grouping window after.
RECENT_S = 900.0


class _LevelRing:
    """One key's minutes over the span: a slot per minute (minute number, peak load, the
    levels at it), overwritten as the minutes come round again; 12 bytes a minute and 4 a
    level, 9 kB for six hours of `EFFICIENCY`."""

    def __init__(self, minutes: int, columns: int) -> None:
        self.minute = np.full(minutes, -1, dtype=np.int64)
        self.load = np.full(minutes, -np.inf, dtype=np.float32)
        self.levels = np.full((minutes, columns), np.nan, dtype=np.float32)
        self.newest = -1

    def put(self, k: int, load: float, levels: tuple[float, ...]) -> None:
        """Minute `k`'s window at `load`, kept if it is the minute's highest so far."""
        i = k % self.minute.size
        if self.minute[i] != k:
            if self.minute[i] > k:
                return  # a minute older than the span: its slot went to a newer one
            self.minute[i], self.load[i], self.levels[i] = k, -np.inf, np.nan
        if load > self.load[i]:
            self.load[i], self.levels[i] = load, levels
        self.newest = max(self.newest, k)

    def at_load(self, col: int, lo: float, hi: float, before: int) -> F32:
        """Column `col`'s finite levels at minutes before `before` whose peak load lay in
        [lo, hi]."""
        lv = self.levels[:, col]
        keep = (self.minute >= 0) & (self.minute < before)
        keep &= (self.load >= lo) & (self.load <= hi) & np.isfinite(lv)
        out: F32 = lv[keep]
        return out

    def nearest_above(self, col: int, load: float, before: int, band: float) -> F32:
        """Column `col`'s finite levels at the lowest earlier load at or above `load`: the
        minutes before `before` whose peak load lay within `band` of the lowest such
        minute that has `MIN_EARLIER_MINUTES` within that band (empty: none has)."""
        lv = self.levels[:, col]
        keep = (self.minute >= 0) & (self.minute < before) & (self.load >= load)
        keep &= np.isfinite(lv)
        order = np.argsort(self.load[keep], kind="stable")
        loads, levels = self.load[keep][order], lv[keep][order]
        ends = np.searchsorted(loads, loads * np.float32(band), side="right")
        enough = np.flatnonzero(ends - np.arange(loads.size) >= MIN_EARLIER_MINUTES)
        if not enough.size:
            return np.empty(0, dtype=np.float32)
        i = int(enough[0])
        out: F32 = levels[i : ends[i]]
        return out

    def since(self, col: int, first: int, last: int) -> F32:
        """Column `col`'s finite levels at minutes `first` to `last`."""
        lv = self.levels[:, col]
        keep = (self.minute >= first) & (self.minute <= last) & np.isfinite(lv)
        out: F32 = lv[keep]
        return out


@dataclass
class PoolExposure:
    """Per pool, per minute: (highest request rate, windows seen); per (pool, model, layer)
    and minute: that minute's peak request rate and the efficiency at it; per (pool, model)
    and minute: the queue, latency and failures at it; pruned by age."""

    span_s: float = 6 * 3600.0
    _bins: dict[str | None, dict[int, list[float]]] = field(default_factory=dict)
    _levels: dict[LevelKey, _LevelRing] = field(default_factory=dict)
    _backlog: dict[tuple[str | None, str | None], _LevelRing] = field(default_factory=dict)
    # Per pool, per window start (whole seconds): each partition's request rate per device.
    _recent: dict[str | None, dict[int, list[float]]] = field(default_factory=dict)

    def observe(self, pool: str | None, ts: float, load: float) -> None:
        """One window of a pool at event time `ts`, with its request rate (NaN: none)."""
        b = self._bins.setdefault(pool, {}).setdefault(int(ts // BIN_S), [-math.inf, 0.0])
        b[0] = max(b[0], load)  # a NaN load never wins: b[0] stays a number
        b[1] += 1.0
        if math.isfinite(load):
            self._recent.setdefault(pool, {}).setdefault(round(ts), []).append(load)

    def offered_ratio(
        self, pool: str | None, onset_ts: float, lead_s: float, near_s: float, span_s: float
    ) -> float:
        """The pool's request rate per device at an onset (from its window to `near_s`
        after) over its rate in `span_s` before the cause's lead (`lead_s` before the
        onset: a cause leads by at most that): medians over windows, each window the
        median of its partitions' rates. An onset is dated to a window's edge, so a burst
        may begin a window after it. NaN when unknown (a training pool, or no window on
        either side)."""
        recent = self._recent.get(pool)
        if not recent:
            return math.nan
        start = onset_ts - lead_s
        at = [statistics.median(v) for t, v in recent.items() if onset_ts <= t <= onset_ts + near_s]
        before = [statistics.median(v) for t, v in recent.items() if start - span_s <= t < start]
        if not at or not before:
            return math.nan
        now, then = statistics.median(at), statistics.median(before)
        return now / then if then > 0 else math.nan

    def observe_levels(
        self, key: LevelKey, ts: float, load: float, levels: tuple[float, ...]
    ) -> None:
        """A pool-layer aggregate's window: its request rate per device and its `EFFICIENCY`
        levels. Each minute keeps the window of its highest load (one of any partition's)."""
        if not math.isfinite(load):
            return  # a training pool: no burst to compare
        ring = self._levels.get(key)
        if ring is None:
            ring = self._levels[key] = self._ring(len(EFFICIENCY))
        ring.put(int(ts // BIN_S), load, levels)

    def observe_backlog(
        self, key: tuple[str | None, str | None], ts: float, load: float,
        levels: tuple[float, ...],
    ) -> None:  # fmt: skip
        """A (pool, model) aggregate's window: its request rate per device and its
        `BACKLOG_LEVELS`. Each minute keeps the window of its highest load."""
        if not math.isfinite(load):
            return
        ring = self._backlog.get(key)
        if ring is None:
            ring = self._backlog[key] = self._ring(len(BACKLOG_LEVELS))
        ring.put(int(ts // BIN_S), load, levels)

    def backlog_bound(
        self, key: tuple[str | None, str | None], column: str, load: float, before_ts: float
    ) -> float | None:
        """The median `column` level of `key` over whole minutes before `before_ts` at the
        lowest load at or above this `load` the pool ran at (within `SAME_LOAD` of each
        other, and from `SAME_LOAD` below this one): at a higher load a queue is no
        shorter, so a longer queue now is not the load's. None with fewer than
        `MIN_EARLIER_MINUTES` such minutes."""
        ring = self._backlog.get(key)
        if ring is None or not math.isfinite(load) or load <= 0:
            return None
        found = ring.nearest_above(
            BACKLOG_LEVELS.index(column), load / (1.0 + SAME_LOAD), int(before_ts // BIN_S),
            1.0 + SAME_LOAD,
        )  # fmt: skip
        return float(np.median(found)) if found.size else None

    def backlog_since(
        self, key: tuple[str | None, str | None], column: str, from_ts: float, to_ts: float
    ) -> float | None:
        """The median `column` level of `key` over the minutes from `from_ts`'s to
        `to_ts`'s, each at its peak load (None: no such minute)."""
        ring = self._backlog.get(key)
        if ring is None:
            return None
        found = ring.since(BACKLOG_LEVELS.index(column), int(from_ts // BIN_S), int(to_ts // BIN_S))
        return float(np.median(found)) if found.size else None

    def _ring(self, columns: int) -> _LevelRing:
        return _LevelRing(max(1, math.ceil(self.span_s / BIN_S)), columns)

    def earlier_level(
        self, key: LevelKey, column: str, load: float, before_ts: float, band: float
    ) -> float | None:
        """The median `column` level of `key` over whole minutes before `before_ts` whose
        peak load was this `load` (from `SAME_LOAD` below it to `band` times it): what the
        pool did at such a burst before. None with fewer than `MIN_EARLIER_MINUTES`."""
        ring = self._levels.get(key)
        if ring is None or not math.isfinite(load) or load <= 0:
            return None
        found = ring.at_load(
            EFFICIENCY.index(column), load / (1.0 + SAME_LOAD), load * band,
            int(before_ts // BIN_S),
        )  # fmt: skip
        return float(np.median(found)) if found.size >= MIN_EARLIER_MINUTES else None

    def peak_load(self, pool: str | None, onset_ts: float, detected_ts: float) -> float:
        """The highest request rate per device from the onset's minute to the detection's
        (NaN: none reported)."""
        bins = self._bins.get(pool, {})
        at = [bins[k][0] for k in range(int(onset_ts // BIN_S), int(detected_ts // BIN_S) + 1)
              if k in bins]  # fmt: skip
        peak = max(at, default=math.nan)
        return peak if math.isfinite(peak) else math.nan

    def prune(self, now_ts: float) -> None:
        """Forget bins older than the span; pools (and level keys) left with none go too."""
        cut = int((now_ts - self.span_s) // BIN_S)
        _prune(self._bins, cut)
        _prune(self._recent, round(now_ts - RECENT_S))
        for key in [k for k, ring in self._levels.items() if ring.newest < cut]:
            del self._levels[key]
        for pm in [k for k, ring in self._backlog.items() if ring.newest < cut]:
            del self._backlog[pm]

    def novelty(self, pool: str | None, onset_ts: float, detected_ts: float,
                before_ts: float) -> float:  # fmt: skip
        """The peak request rate from the onset's minute to the detection's over the highest
        the pool ran at in whole minutes before `before_ts`: above 1, a load it never ran
        at in its look-back. 1.0 when unknown (no request rate, or nothing before)."""
        bins = self._bins.get(pool)
        if not bins:
            return 1.0
        peak = self.peak_load(pool, onset_ts, detected_ts)
        cut = int(before_ts // BIN_S)
        earlier = [b[0] for k, b in bins.items() if k < cut]
        if not earlier:
            return 1.0
        prior = max(earlier)
        if not (math.isfinite(peak) and math.isfinite(prior)) or prior <= 0:
            return 1.0
        return peak / prior

    def served_ratio(
        self, pool: str | None, onset_ts: float, detected_ts: float, span_s: float
    ) -> float:
        """The pool's median minute (its peak request rate per device) from the onset's
        minute to the detection's over its median minute in `span_s` before the onset:
        how much more work its devices served as the change began. 1.0 when unknown."""
        bins = self._bins.get(pool)
        if not bins:
            return 1.0
        first = int(onset_ts // BIN_S)
        after = [bins[k][0] for k in range(first, int(detected_ts // BIN_S) + 1) if k in bins]
        before = [bins[k][0] for k in range(int((onset_ts - span_s) // BIN_S), first) if k in bins]
        if not after or not before:
            return 1.0
        now, then = statistics.median(after), statistics.median(before)
        if not (math.isfinite(now) and math.isfinite(then)) or then <= 0:
            return 1.0
        return now / then

    def tested(self, pool: str | None, since_ts: float, onset_ts: float, detected_ts: float,
               window_s: float, windows: int) -> bool:  # fmt: skip
        """Whether the pool ran at least `windows` windows at the onset's load (within
        `SAME_LOAD`) after `since_ts` and clearly before `onset_ts` (the onset estimate's
        own uncertainty, two windows, left out). False when unknown: nothing observed, or
        after a restart."""
        bins = self._bins.get(pool)
        if not bins:
            return False
        # Whole bins only: a bin straddling the change or the onset is not clean.
        lo = int(since_ts // BIN_S) + 1
        hi = int((onset_ts - 2.0 * window_s) // BIN_S) - 1
        if hi < lo:
            return False
        at_onset = [bins[k][0] for k in range(int(onset_ts // BIN_S), int(detected_ts // BIN_S) + 1)
                    if k in bins]  # fmt: skip
        if not at_onset:
            return False
        # The onset minute's peak request rate; -inf where the pool reports none (a training
        # pool), and then every window is a test. Minutes are compared peak to peak, and a
        # minute within `SAME_LOAD` below it ran at that load.
        need = max(at_onset) / (1.0 + SAME_LOAD)
        count = 0.0
        for k in range(lo, hi + 1):
            b = bins.get(k)
            if b is not None and b[0] >= need:
                count += b[1]
                if count >= windows:
                    return True
        return False


def _prune(table: dict[str | None, dict[int, list[float]]], cut: int) -> None:
    """Drop minutes before `cut` from each key's bins, and keys left with none."""
    for key in list(table):
        bins = table[key]
        # Minutes arrive in order (late records aside): the old ones are at the front.
        old = []
        for k in bins:
            if k >= cut:
                break
            old.append(k)
        for k in old:
            del bins[k]
        if not bins:
            del table[key]

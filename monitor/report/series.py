"""The levels an incident page plots, kept from the pipeline's frames (pure, bounded).

Two kinds of history, both fed by `Pipeline.observer` with the matrices the detectors
read, so a plot shows exactly what was measured:

- per (pool, model, layer) aggregate (the pool's level; layer None for device metrics),
  always, for the last `windows` windows: the before-part of an incident that pages later;
- per watched incident, its listed devices' values of the headline metric, from the moment
  it is watched (the live daemon: its first page; a report: the whole recording).

Values are kept per window and reduced (median, 10th and 90th percentile) when read, since
one window's records may arrive in several batches.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from monitor.core.stream_table import Frame, StreamTable
from monitor.indicators import DEVICE_METRICS, LAYER_METRICS
from monitor.wire import Alert

_LAYER_COL = {m: i for i, m in enumerate(LAYER_METRICS)}
_DEVICE_COL = {m: i for i, m in enumerate(DEVICE_METRICS)}
PoolKey = tuple[str | None, str | None, str | None]  # (pool, model, layer); None: device level
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class Series:
    """One headline stream over time, reduced per window (NaN: nothing measured)."""

    metric: str
    layer: str | None
    ts: list[float]  # watched devices: window end times
    mid: list[float]  # median over the watched devices
    lo: list[float]  # 10th percentile
    hi: list[float]  # 90th percentile
    devices: int  # devices watched
    pool_ts: list[float]  # the pool's aggregate level
    pool: list[float]


def _trim(by_ts: OrderedDict[float, list[_V]], limit: int | None) -> None:
    """Keep the newest `limit` windows (None: all)."""
    if limit is not None and len(by_ts) > limit:
        for t in sorted(by_ts)[: len(by_ts) - limit]:
            del by_ts[t]


class _Windows:
    """Values per window time, the oldest dropped beyond `limit` windows (None: keep all)."""

    __slots__ = ("by_ts", "limit")

    def __init__(self, limit: int | None) -> None:
        self.by_ts: OrderedDict[float, list[float]] = OrderedDict()
        self.limit = limit

    def add(self, ts: Iterable[float], values: Iterable[float]) -> None:
        for t, v in zip(ts, values, strict=True):
            if math.isfinite(v):
                self.by_ts.setdefault(t, []).append(v)
        _trim(self.by_ts, self.limit)

    def reduced(self) -> tuple[list[float], list[float], list[float], list[float]]:
        ts = sorted(self.by_ts)
        q = [np.percentile(self.by_ts[t], (50, 10, 90)) for t in ts]
        return ts, [float(x[0]) for x in q], [float(x[1]) for x in q], [float(x[2]) for x in q]


@dataclass(slots=True)
class _Watch:
    devices: frozenset[str]
    metric: str
    layer: str | None
    windows: _Windows


def headline(alert: Alert) -> tuple[str, str | None]:
    """The (metric, layer) an alert is about: its layer for a layer metric, else None."""
    layer = alert.layers[0] if alert.metric in _LAYER_COL and alert.layers else None
    return alert.metric, layer


class SeriesKeeper:
    """Keeps the plotted history; `windows` bounds it per stream (None: unbounded)."""

    def __init__(
        self, windows: int | None = 180, max_watches: int = 256, max_pools: int = 4096
    ) -> None:
        self.windows = windows
        self.max_watches = max_watches
        self.max_pools = max_pools
        # Per pool key: per window, the aggregate rows (one per partition holding the pool).
        self._pools: OrderedDict[PoolKey, OrderedDict[float, list[list[float]]]] = OrderedDict()
        self._watches: OrderedDict[str, _Watch] = OrderedDict()
        self.tables: dict[int, StreamTable] = {}  # by partition: hosts' devices for the strip
        self.span: tuple[float, float] | None = None  # event times of the windows seen

    def watch(self, alert: Alert) -> None:
        """Follow the alert's listed devices on its headline metric (once per id)."""
        kept = self._watches.get(alert.id)
        if kept is not None:
            # A later record lists more devices as the incident widens: follow those too.
            if len(alert.scope.devices) > len(kept.devices):
                kept.devices = frozenset(alert.scope.devices)
            return
        metric, layer = headline(alert)
        self._watches[alert.id] = _Watch(
            frozenset(alert.scope.devices), metric, layer, _Windows(self.windows)
        )
        while len(self._watches) > self.max_watches:
            self._watches.popitem(last=False)

    def forget(self, alert_id: str) -> None:
        """Stop following an alert."""
        self._watches.pop(alert_id, None)

    def observe(self, partition: int, frame: Frame, table: StreamTable) -> None:
        """Take one partition's frame (`Pipeline.observer`)."""
        self.tables[partition] = table
        if frame.device_ts.size:
            lo, hi = float(frame.device_ts.min()), float(frame.device_ts.max())
            if self.span is not None:
                lo, hi = min(lo, self.span[0]), max(hi, self.span[1])
            self.span = (lo, hi)
        self._pool_levels(frame, table)
        for w in self._watches.values():
            self._watched(w, frame, table)

    def _pool_levels(self, frame: Frame, table: StreamTable) -> None:
        for rows, ts, values, device_level in (
            (frame.pool_layer_rows, frame.pool_layer_ts, frame.pool_layer_values, False),
            (frame.pool_device_rows, frame.pool_device_ts, frame.pool_device_values, True),
        ):
            # One entry per (group, window): a Python loop over groups, not over records.
            for gid in np.unique(rows).tolist():
                pool, model, layer, _hw = table.group_key(gid)
                key: PoolKey = (pool, model, None if device_level else layer)
                sel = rows == gid
                kept = self._pools.pop(key, None)
                if kept is None:
                    kept = OrderedDict()
                self._pools[key] = kept  # most recently seen last
                for t, row in zip(ts[sel].tolist(), values[sel].tolist(), strict=True):
                    kept.setdefault(t, []).append(row)
                _trim(kept, self.windows)
        # Pool-name churn must not grow it: the least recently seen pools go first.
        while len(self._pools) > self.max_pools:
            self._pools.popitem(last=False)

    def _watched(self, w: _Watch, frame: Frame, table: StreamTable) -> None:
        rows = []
        for name in w.devices:
            dev = table.devices.get(name)
            if dev is None:
                continue
            if w.layer is None:
                rows.append(dev.row)
            else:
                row = table.layer_index.get((dev.row, w.layer))
                if row is not None:
                    rows.append(row)
        if not rows:
            return
        if w.layer is None:
            sel = np.isin(frame.device_rows, rows)
            w.windows.add(
                frame.device_ts[sel].tolist(),
                frame.device_values[sel, _DEVICE_COL[w.metric]].tolist(),
            )
        else:
            sel = np.isin(frame.layer_rows, rows)
            w.windows.add(
                frame.layer_ts[sel].tolist(), frame.layer_values[sel, _LAYER_COL[w.metric]].tolist()
            )

    def series(self, alert: Alert) -> Series:
        """The alert's headline stream: its watched devices and its pool's level."""
        metric, layer = headline(alert)
        w = self._watches.get(alert.id)
        ts, mid, lo, hi = w.windows.reduced() if w is not None else ([], [], [], [])
        col = _LAYER_COL[metric] if layer is not None else _DEVICE_COL.get(metric)
        pool_ts: list[float] = []
        pool: list[float] = []
        kept = self._pools.get((alert.scope.pool, alert.scope.model, layer))
        if kept is not None and col is not None:
            for t in sorted(kept):
                vals = [row[col] for row in kept[t]]
                finite = [v for v in vals if math.isfinite(v)]
                if finite:
                    # Several partitions each aggregate their share of the pool.
                    pool_ts.append(t)
                    pool.append(float(np.median(finite)))
        n = len(w.devices) if w is not None else 0
        return Series(metric, layer, ts, mid, lo, hi, n, pool_ts, pool)

    def hosts(self, names: Iterable[str]) -> dict[str, list[str]]:
        """Every known device of each of these hosts, sorted (for the blast-radius strip)."""
        wanted = set(names)
        out: dict[str, list[str]] = {h: [] for h in wanted}
        for table in self.tables.values():
            for dev_name, dev in table.devices.items():
                if dev.host in wanted:
                    out[dev.host].append(dev_name)
        return {h: sorted(d) for h, d in out.items()}

"""The newest pool-aggregate level of each (pool, model, layer) group, for /metrics.

Kept per input partition beside its stream table and never checkpointed: it is a view of
the last window, refilled by the next one after a restart. `combine` merges the groups of
all partitions (and of all models) into one level per (pool, layer type), so the number
of series a dashboard sees is bounded by pools x layer types.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from monitor.arrays import F64, I64
from monitor.core.stream_table import DEVICE_GROUPS, Frame, StreamTable
from monitor.indicators import LAYER_METRICS

_MFU, _STALL = LAYER_METRICS.index("mfu"), LAYER_METRICS.index("stall_frac")


@dataclass(slots=True)
class GroupLevels:
    """Per group id: event time, MFU, stall fraction and devices of its newest window."""

    ts: F64 = field(default_factory=lambda: np.empty(0))
    values: F64 = field(default_factory=lambda: np.empty((0, 3)))  # mfu, stall, devices

    def update(self, frame: Frame) -> None:
        """Take each group's newest window in the batch, if newer than the one held."""
        rows, ts = frame.pool_layer_rows, frame.pool_layer_ts
        if not rows.size:
            return
        order = np.lexsort((ts, rows))
        last = order[np.r_[rows[order][1:] != rows[order][:-1], True]]
        self._grow(int(rows.max()) + 1)
        newer = last[~(self.ts[rows[last]] >= ts[last])]  # NaN (never seen) is older
        r, t = rows[newer], ts[newer]
        self.ts[r] = t
        self.values[r, 0] = frame.pool_layer_values[newer, _MFU]
        self.values[r, 1] = frame.pool_layer_values[newer, _STALL]
        self.values[r, 2] = frame.pool_layer_devices[newer]

    def forget(self, groups: I64) -> None:
        """Groups the table let go of (their ids may be reused)."""
        groups = groups[groups < self.ts.size]
        self.ts[groups] = np.nan

    def _grow(self, n: int) -> None:
        if n <= self.ts.size:
            return
        size = max(n, 2 * self.ts.size)
        self.ts = np.concatenate([self.ts, np.full(size - self.ts.size, np.nan)])
        self.values = np.concatenate([self.values, np.full((size - len(self.values), 3), np.nan)])


def combine(
    parts: Iterable[tuple[StreamTable, GroupLevels]],
) -> dict[tuple[str, str], tuple[float, float, int]]:
    """(pool, layer type) -> (MFU, stall fraction, devices) over partitions and models: the
    device-weighted mean of each group's newest level (a level that is NaN is left out)."""
    acc: dict[tuple[str, str], list[float]] = {}
    for table, levels in parts:
        for (pool, _model, layer, _hw), gid in table.groups.items():
            # a device-level group (`DEVICE_GROUPS`), not a layer aggregate
            if layer in DEVICE_GROUPS or gid >= levels.ts.size or np.isnan(levels.ts[gid]):
                continue
            mfu, stall, n = levels.values[gid].tolist()
            a = acc.setdefault((pool or "", layer), [0.0, 0.0, 0.0, 0.0, 0.0])
            if n > 0 and not math.isnan(mfu):
                a[0] += n * mfu
                a[1] += n
            if n > 0 and not math.isnan(stall):
                a[2] += n * stall
                a[3] += n
            a[4] += n
    return {key: (a[0] / a[1] if a[1] else np.nan, a[2] / a[3] if a[3] else np.nan, int(a[4]))
            for key, a in sorted(acc.items())}  # fmt: skip

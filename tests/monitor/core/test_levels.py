"""GroupLevels: each group's newest pool-aggregate window, for the /metrics gauges."""

from __future__ import annotations

import numpy as np

from monitor.core.levels import GroupLevels
from monitor.core.stream_table import Frame
from monitor.indicators import LAYER_METRICS

MFU = LAYER_METRICS.index("mfu")


def frame(groups: list[int], ts: list[float], mfu: list[float], devices: list[int]) -> Frame:
    """A frame with one aggregate row per (group, ts) and `devices` devices behind each."""
    values = np.full((len(groups), len(LAYER_METRICS)), 0.1)
    values[:, MFU] = mfu
    empty = np.empty(0)
    return Frame(
        layer_rows=np.arange(sum(devices)), layer_ts=np.repeat(ts, devices),
        layer_values=np.zeros((sum(devices), len(LAYER_METRICS))),
        device_rows=np.empty(0, dtype=np.int64), device_ts=empty,
        device_values=np.empty((0, 1)), kernel_changes=[],
        layer_group=np.repeat(groups, devices).astype(np.int64),
        pool_layer_rows=np.array(groups, dtype=np.int64), pool_layer_ts=np.array(ts),
        pool_layer_values=values, pool_layer_devices=np.array(devices, dtype=np.float64),
    )  # fmt: skip


def test_newest_window_wins_within_and_across_batches() -> None:
    """Two windows of a group in one batch: the later one, with its own device count; an
    older window arriving later does not replace it."""
    lv = GroupLevels()
    lv.update(frame([3, 3, 1], [20.0, 30.0, 20.0], [0.4, 0.3, 0.5], [2, 5, 1]))
    assert lv.ts[3] == 30.0
    assert lv.values[3].tolist() == [0.3, 0.1, 5.0]
    assert lv.values[1].tolist() == [0.5, 0.1, 1.0]
    assert np.isnan(lv.ts[[0, 2]]).all()  # never seen
    lv.update(frame([3], [25.0], [0.9], [7]))
    assert lv.values[3].tolist() == [0.3, 0.1, 5.0]


def test_a_forgotten_group_id_starts_afresh() -> None:
    """A released id, reused by a new group, takes the new group's first window even when
    it is older than the old group's last."""
    lv = GroupLevels()
    lv.update(frame([0], [100.0], [0.4], [2]))
    lv.forget(np.array([0, 7], dtype=np.int64))  # 7: never held, ignored
    lv.update(frame([0], [50.0], [0.2], [1]))
    assert lv.values[0].tolist() == [0.2, 0.1, 1.0]

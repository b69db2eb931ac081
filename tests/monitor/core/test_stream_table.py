"""Stream table: rows, groups, load features and pool aggregates from decoded records."""

from __future__ import annotations

import json

import numpy as np
from factories import PEAK, T0, window

from monitor.core.stream_table import Frame, StreamTable
from monitor.hardware import Catalog
from monitor.indicators import DEVICE_METRICS, LAYER_METRICS
from monitor.wire import Codec


def _recs(*dicts):
    c = Codec()
    return [c.decode_window(json.dumps(d).encode()) for d in dicts]


def test_pool_aggregate_weights_by_busy_time() -> None:
    """Pool MFU = sum(flops/peak) / sum(busy_s): a busier device weighs more than a mean would."""
    a = window("n0/gpu0", T0, mfu=0.6, ingress={"batch": 32, "req_rate": 100})
    b = window("n0/gpu1", T0, mfu=0.3)
    b["layers"][0]["busy_s"] = 2.0
    b["layers"][0]["flops"] = 0.3 * 2.0 * PEAK
    frame, rej = StreamTable(Catalog()).build(_recs(a, b))
    assert rej == []
    mfu = LAYER_METRICS.index("mfu")
    attn = frame.layer_group[0]
    row = np.flatnonzero(frame.pool_layer_rows == attn)[0]
    assert np.isclose(frame.pool_layer_values[row, mfu], (0.6 * 6 + 0.3 * 2) / 8)
    assert np.allclose(frame.layer_values[:, mfu][[0, 2]], [0.6, 0.3])
    assert frame.pool_layer_ts[row] == T0
    # Load features ride along per row; missing ingress is NaN, not zero.
    assert frame.layer_load[0].tolist() == [32.0, 100.0]
    assert np.isnan(frame.layer_load[2]).all()
    dev = np.flatnonzero(frame.pool_device_rows == frame.device_group[0])[0]
    assert frame.pool_device_values[dev, DEVICE_METRICS.index("clock_mhz")] == 1755.0


def test_groups_split_by_pool_model_and_layer() -> None:
    """Same layer in two pools, or two models in one pool, are different groups."""
    recs = _recs(window("a/0", T0, pool="p1"), window("b/0", T0, pool="p2"),
                 window("c/0", T0, pool="p1", model="other@2"))  # fmt: skip
    table = StreamTable(Catalog())
    frame, _ = table.build(recs)
    assert len(set(frame.device_group.tolist())) == 3
    assert len(set(frame.layer_group.tolist())) == 6
    assert table.group_keys[frame.layer_group[0]] == ("p1", "m@1", "attention")


def test_waves_put_each_row_once_per_wave_in_time_order() -> None:
    """Several windows of one device in a batch are split into ordered waves."""
    rows = np.array([3, 1, 3, 3, 1], dtype=np.int64)
    waves = Frame.waves(rows)
    assert [rows[w].tolist() for w in waves] == [[3, 1], [3, 1], [3]]
    assert [w.tolist() for w in waves] == [[0, 1], [2, 4], [3]]


def test_expiry_frees_rows_for_reuse() -> None:
    """Silent devices expire after the TTL; their rows are reused by new devices."""
    table = StreamTable(Catalog(), ttl_s=100.0)
    table.build(_recs(window("old/0", T0)))
    dev_rows, layer_rows = table.expire(T0 + 500.0)
    assert dev_rows.tolist() == [0]
    assert sorted(layer_rows.tolist()) == [0, 1]
    frame, _ = table.build(_recs(window("new/0", T0 + 510.0)))
    assert sorted(frame.layer_rows.tolist()) == [0, 1]
    assert "old/0" not in table.devices

"""Stream table: rows, groups, load features and pool aggregates from decoded records."""

from __future__ import annotations

import json

import msgspec
import numpy as np
from factories import PEAK, T0, keys_by_row, window

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
    # Load features ride along per row; missing ingress is NaN, not zero. The third is
    # the device's busy fraction: its layers' busy seconds over the window.
    busy_a = sum(layer["busy_s"] for layer in a["layers"]) / a["window_s"]
    busy_b = sum(layer["busy_s"] for layer in b["layers"]) / b["window_s"]
    assert frame.layer_load[0].tolist() == [32.0, 100.0, busy_a]
    assert np.isnan(frame.layer_load[2][:2]).all()
    assert frame.layer_load[2][2] == busy_b < busy_a
    dev = np.flatnonzero(frame.pool_device_rows == frame.device_group[0])[0]
    assert frame.pool_device_values[dev, DEVICE_METRICS.index("clock_mhz")] == 1755.0


def test_failed_requests_are_a_share_of_the_windows_requests() -> None:
    """`slo.errors` is a count: the device column is failures per request of the window,
    bounded by 1 when the exporter's rate leaves the failed requests out, and unknown
    without a request rate."""
    a = window("n0/gpu0", T0, ingress={"req_rate": 50.0}, slo={"errors": 5.0})
    b = window("n0/gpu1", T0, ingress={"req_rate": 0.1}, slo={"errors": 4.0})
    c = window("n0/gpu2", T0, slo={"errors": 5.0})
    d = window("n0/gpu3", T0, ingress={"req_rate": 50.0}, slo={"errors": 0.0})
    frame, rej = StreamTable(Catalog()).build(_recs(a, b, c, d))
    assert rej == []
    col = frame.device_values[:, DEVICE_METRICS.index("error_rate")]
    assert col[0] == 5.0 / 500.0
    assert col[1] == 1.0
    assert np.isnan(col[2])
    assert col[3] == 0.0


def test_groups_split_by_pool_model_layer_and_hardware() -> None:
    """Same layer in two pools, two models in one pool, or two hardware kinds in one pool
    are different groups: a pool aggregate is over one population."""
    recs = _recs(window("a/0", T0, pool="p1"), window("b/0", T0, pool="p2"),
                 window("c/0", T0, pool="p1", model="other@2"),
                 window("d/0", T0, pool="p1", hw="a100-sxm"))  # fmt: skip
    table = StreamTable(Catalog())
    frame, _ = table.build(recs)
    assert len(set(frame.device_group.tolist())) == 4
    assert len(set(frame.layer_group.tolist())) == 8
    assert table.group_keys[frame.layer_group[0]] == ("p1", "m@1", "attention", "h100-sxm")
    assert table.group_keys[frame.device_group[3]] == ("p1", "m@1", "", "a100-sxm")
    assert sorted(table.gids_of("p1", "m@1", "attention")) == sorted(
        frame.layer_group[[0, 6]].tolist()
    )


def test_a_mixed_pool_aggregate_stays_flat_when_the_work_shifts_between_hardware() -> None:
    """Each hardware kind's pool MFU is its own level: more busy time on the slower kind
    does not move either aggregate."""

    def batch(ts: float, a100_busy: float) -> list:
        h = window("h/0", ts, mfu=0.5)
        a = window("a/0", ts, mfu=0.3, hw="a100-sxm")
        for la in a["layers"]:
            la["flops"] *= a100_busy / la["busy_s"]  # the same efficiency, more work
            la["busy_s"] = a100_busy
        return _recs(h, a)

    table = StreamTable(Catalog())
    mfu = LAYER_METRICS.index("mfu")
    levels = []
    for ts, busy in ((T0, 1.0), (T0 + 10, 8.0)):
        frame, _ = table.build(batch(ts, busy))
        attn = frame.layer_group[[0, 2]]
        levels.append([float(frame.pool_layer_values[frame.pool_layer_rows == g, mfu][0])
                       for g in attn.tolist()])  # fmt: skip
    assert np.allclose(levels[0], levels[1], rtol=1e-6)


def test_waves_put_each_row_once_per_wave_in_time_order() -> None:
    """Several windows of one device in a batch are split into ordered waves."""
    rows = np.array([3, 1, 3, 3, 1], dtype=np.int64)
    waves = Frame.waves(rows)
    assert [rows[w].tolist() for w in waves] == [[3, 1], [3, 1], [3]]
    assert [w.tolist() for w in waves] == [[0, 1], [2, 4], [3]]


def test_expiry_frees_rows_for_reuse() -> None:
    """Silent devices expire after the TTL, and so do their groups; their rows and group ids
    are reused by new devices and groups."""
    table = StreamTable(Catalog(), ttl_s=100.0)
    table.build(_recs(window("old/0", T0, pool="gone")))
    released = table.expire(T0 + 500.0)
    assert released.device_rows.tolist() == [0]
    assert sorted(released.layer_rows.tolist()) == [0, 1]
    assert sorted(released.groups.tolist()) == [0, 1, 2]  # (gone, m@1) device, attention, mlp
    assert table.groups == {}
    frame, _ = table.build(_recs(window("new/0", T0 + 510.0, pool="here")))
    assert sorted(frame.layer_rows.tolist()) == [0, 1]
    assert sorted(frame.layer_group.tolist() + frame.device_group.tolist()) == [0, 1, 2]
    assert "old/0" not in table.devices
    assert {k[0] for k in table.group_keys} == {"here"}


def test_groups_of_a_pool_renamed_away_expire_while_its_devices_live_on() -> None:
    """Pool-name churn: the same devices under a new pool name every window. Groups nobody
    reports into any more expire after the TTL, so the group count stays bounded."""
    table = StreamTable(Catalog(), ttl_s=100.0)
    counts = []
    for w in range(60):
        ts = T0 + 10.0 * w
        table.build(_recs(*(window(f"n/{d}", ts, pool=f"p{w}") for d in range(4))))
        counts.append((len(table.groups), len(table.group_keys)))
        table.expire(ts)
    assert len(table.devices) == 4
    # Live: the pool names of the last TTL (12 windows, the 12th due at the next expiry)
    # x 3 groups each, and the ids stop growing there: they are reused.
    assert max(n for n, _ in counts) == 12 * 3
    assert max(k for _, k in counts) == 12 * 3


def _seen(table: StreamTable, names: list[str]) -> list[float]:
    return [table.devices[n].last_ts for n in names]


def test_at_the_device_cap_the_least_recently_seen_device_is_evicted() -> None:
    """A new device at the cap evicts the device seen longest ago (not the oldest one
    registered): its row and layer rows are released for reuse, and it comes back as new."""
    table = StreamTable(Catalog(), max_devices=3)
    table.build(_recs(window("a/0", T0), window("b/0", T0 + 1), window("c/0", T0 + 2)))
    table.build(_recs(window("a/0", T0 + 10)))  # a seen again: b is now the LRU
    assert not table.take_evicted()
    a_row, b_row = table.devices["a/0"].row, table.devices["b/0"].row
    frame, rej = table.build(_recs(window("d/0", T0 + 20)))
    assert rej == []
    assert set(table.devices) == {"a/0", "c/0", "d/0"}
    released = table.take_evicted()
    assert released.device_rows.tolist() == [b_row]
    assert sorted(released.layer_rows.tolist()) == sorted(frame.layer_rows.tolist())
    assert released.groups.size == 0
    assert table.devices["d/0"].row == b_row  # reused at once: reset before detecting
    assert table.devices["a/0"].row == a_row
    assert not table.take_evicted()  # taken once


def test_the_layer_stream_cap_evicts_the_least_recently_seen_layer_streams() -> None:
    """One device sending a new layer type every window cannot grow the table: at the cap
    its oldest layer streams go, not other devices."""
    table = StreamTable(Catalog(), max_streams=6)
    table.build(_recs(window("steady/0", T0)))
    for w in range(1, 20):
        rec = window("junk/0", T0 + 10.0 * w)
        rec["layers"] = [dict(rec["layers"][1], type=f"junk{w}")]
        steady = window("steady/0", T0 + 10.0 * w)
        table.build(_recs(rec, steady))
        assert len(table.layer_index) <= 6
    junk_row = table.devices["junk/0"].row
    kept = sorted(t for (row, t) in table.layer_index if row == junk_row)
    assert kept == ["junk16", "junk17", "junk18", "junk19"]  # the cap less steady's two
    steady_row = table.devices["steady/0"].row
    assert sorted(t for (row, t) in table.layer_index if row == steady_row) == ["attention", "mlp"]


def test_the_group_cap_evicts_the_least_recently_updated_groups() -> None:
    """Groups beyond `max_groups` evict the least recently updated ones (here: pools that
    went quiet), well before their TTL."""
    table = StreamTable(Catalog(), max_groups=6)
    table.build(_recs(window("a/0", T0, pool="quiet"), window("b/0", T0, pool="busy")))
    table.build(_recs(window("b/0", T0 + 10, pool="busy")))
    table.build(_recs(window("c/0", T0 + 20, pool="new")))
    assert {k[0] for k in table.groups} == {"busy", "new"}
    assert table.take_evicted().groups.size == 3
    assert len(table.groups) == 6


def test_a_batch_with_more_new_devices_than_the_cap_dead_letters_the_rest() -> None:
    """When every tracked device is in the batch, nothing can be evicted: new devices beyond
    the cap are rejected with a capacity reason, the first ones in event order kept."""
    table = StreamTable(Catalog(), max_devices=2)
    recs = _recs(window("c/0", T0 + 2), window("a/0", T0), window("b/0", T0 + 1))
    _, rej = table.build(recs)
    assert set(table.devices) == {"a/0", "b/0"}
    assert [(r.index, r.kind) for r in rej] == [(0, "capacity")]
    assert "limits.max_devices=2" in rej[0].reason


def test_snapshot_after_eviction_restores_the_same_table() -> None:
    """After evictions and group expiry, a restored table equals the original (free lists,
    per-row times) and goes on to build the same frames and evict the same streams."""
    table = StreamTable(Catalog(), ttl_s=100.0, max_devices=3, max_groups=6)
    for w in range(12):
        names = [f"d{(w + k) % 5}/0" for k in range(2)]
        recs = _recs(*(window(n, T0 + 10.0 * w, pool=f"p{w % 3}") for n in names))
        table.build(recs)
        table.take_evicted()
    table.expire(T0 + 200.0)
    back = StreamTable.restore(table.snapshot(), Catalog(), max_devices=3, max_groups=6)
    for name in ("devices", "device_names", "free_device_rows", "free_layer_rows",
                 "groups", "group_keys", "free_groups"):  # fmt: skip
        assert getattr(back, name) == getattr(table, name), name
    assert keys_by_row(back.layer_index) == keys_by_row(table.layer_index)
    assert back.layer_index.end == table.layer_index.end
    for name in ("device_seen", "layer_seen", "group_seen"):
        n = (table.layer_index.end if name.startswith("layer") else
             len(table.group_keys if name == "group_seen" else table.device_names))  # fmt: skip
        assert np.array_equal(getattr(back, name)[:n], getattr(table, name)[:n], equal_nan=True)
    nxt = _recs(*(window(f"e{k}/0", T0 + 300.0, pool="q") for k in range(2)))
    f1, _ = table.build(nxt)
    f2, _ = back.build(nxt)
    assert f1.layer_rows.tolist() == f2.layer_rows.tolist()
    assert f1.layer_group.tolist() == f2.layer_group.tolist()
    e1, e2 = table.take_evicted(), back.take_evicted()
    assert e1.device_rows.tolist() == e2.device_rows.tolist()
    assert e1.groups.tolist() == e2.groups.tolist()


def _list_index(fields: list, table: StreamTable) -> list:
    """Checkpoint fields with the (device, type) index as the lists written before the grid
    (`layer_index` entries, `layer_keys` per row) and without the grid's columns."""
    fields[3] = [[d, layer, r] for (d, layer), r in table.layer_index.items()]
    fields[4] = [None if k is None else list(k) for k in keys_by_row(table.layer_index)]
    return fields[:14]


def test_a_checkpoint_with_the_index_as_lists_restores_the_same_table() -> None:
    """A checkpoint written before the grid index (lists of keys) restores the same rows,
    free rows included, and goes on to build the same frames."""
    table = StreamTable(Catalog(), ttl_s=100.0, max_devices=3)
    for w in range(8):
        names = [f"d{(w + k) % 5}/0" for k in range(2)]
        table.build(_recs(*(window(n, T0 + 10.0 * w) for n in names)))
        table.take_evicted()
    table.expire(T0 + 150.0)
    fields = msgspec.msgpack.decode(table.snapshot())
    assert fields[3:5] == [[], []]  # the new format leaves the lists empty
    back = StreamTable.restore(msgspec.msgpack.encode(_list_index(fields, table)), Catalog(),
                               max_devices=3)  # fmt: skip
    assert keys_by_row(back.layer_index) == keys_by_row(table.layer_index)
    assert back.free_layer_rows == table.free_layer_rows
    nxt = _recs(*(window(f"e{k}/0", T0 + 300.0) for k in range(2)))
    f1, _ = table.build(nxt)
    f2, _ = back.build(nxt)
    assert f1.layer_rows.tolist() == f2.layer_rows.tolist()


def test_a_checkpoint_from_before_group_expiry_restores_with_fallback_times() -> None:
    """A table checkpoint without per-row times (older format) restores: layer streams take
    their device's last time, groups the partition's newest, so nothing expires early."""
    table = StreamTable(Catalog(), ttl_s=100.0)
    table.build(_recs(window("a/0", T0), window("b/0", T0 + 50, pool="other")))
    fields = _list_index(msgspec.msgpack.decode(table.snapshot()), table)
    old = msgspec.msgpack.encode(fields[:10])
    back = StreamTable.restore(old, Catalog())
    a_rows = [r for (dev, _), r in back.layer_index.items() if dev == back.devices["a/0"].row]
    assert back.layer_seen[a_rows].tolist() == [T0, T0]
    assert back.group_seen[list(back.groups.values())].tolist() == [T0 + 50] * 6
    assert back.expire(T0 + 120).groups.size == 0  # a's pool lives on: b's time, not a's


def test_a_new_model_versions_device_group_follows_the_pools_current_one() -> None:
    """Same pool and hardware, another model: the device-level group it follows is the most
    recently seen; layer groups and other hardware follow nothing."""
    table = StreamTable(Catalog())
    table.build(_recs(window("a/0", T0, model="m@1"),
                      window("b/0", T0, model="m@1", hw="a100-sxm")))  # fmt: skip
    table.take_created()
    frame, _ = table.build(_recs(window("a/0", T0 + 10, model="m@2")))
    created = table.take_created()
    dev_new = int(frame.device_group[0])
    assert dev_new in created
    old = table.predecessor(dev_new)
    assert old is not None
    assert table.group_key(old) == ("train-a", "m@1", "", "h100-sxm")
    assert table.predecessor(int(frame.layer_group[0])) is None
    assert table.take_created() == []

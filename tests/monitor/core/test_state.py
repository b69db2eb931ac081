"""Partition state and checkpoint payloads: versioned, pickle-free, and the hand-over."""

from __future__ import annotations

import msgspec
import pytest
from factories import fleet, keys_by_row

from monitor.config import Settings
from monitor.core.correlator import Incident
from monitor.core.excursions import Excursions
from monitor.core.lifecycle import AlertState
from monitor.core.pipeline import Pipeline
from monitor.core.state import (
    STATE_VERSION,
    IncidentsSnapshot,
    PartitionSnapshot,
    decode,
    encode,
    incident_records,
    incidents_of,
)
from monitor.core.stream_table import StreamTable
from monitor.errors import StateVersionError


def _run(batches, settings: Settings | None = None):
    p = Pipeline(settings or Settings())
    alerts = [a for b in batches for a in p.process(b).alerts]
    return p, alerts, None


def test_stream_table_round_trips_with_its_orders() -> None:
    """A restored table has the same registry, in the same dict orders (row reuse after
    expiry follows them, so replay after a restore stays identical)."""
    p, _, _ = _run(fleet(20, devices=12))
    table = p.partitions[0].table
    table.expire(table.devices[next(iter(table.devices))].last_ts + table.ttl_s + 1)
    back = StreamTable.restore(table.snapshot(), p.catalog)
    for name in ("devices", "device_names", "last_kernel", "free_device_rows",
                 "free_layer_rows", "unknown_hw", "groups", "group_keys", "ttl_s"):  # fmt: skip
        assert getattr(back, name) == getattr(table, name), name
    assert list(back.layer_index.items()) == list(table.layer_index.items())
    assert keys_by_row(back.layer_index) == keys_by_row(table.layer_index)


def test_incidents_round_trip_with_fleet_children_and_alert_state() -> None:
    """Parent and children come back linked, in list order; alert state survives too."""
    parent = Incident("a", "m", 1.0, 2.0, 10.0, alert_id="fw-1", pool_size=8)
    child = Incident("b", "m", 1.0, 2.0, 10.0, pool_size=4)
    child.parent, parent.children = parent, [child]
    other = Incident("c", "m", 5.0, 6.0, 10.0, status="resolved", resolved_ts=9.0)
    alerts = {"fw-1": AlertState(devices=3, severity="page", bad_loads=[32.0], recovered={"d"})}
    blob = encode(IncidentsSnapshot(STATE_VERSION, incident_records([child, parent, other]),
                                    [], [], alerts))  # fmt: skip
    snap = decode(blob, IncidentsSnapshot)
    back_child, back_parent, back_other = incidents_of(snap.incidents)
    assert back_parent.children == [back_child]
    assert back_child.parent is back_parent
    assert back_other.parent is None
    assert back_other.status == "resolved"
    assert (back_parent.alert_id, back_parent.pool_size, back_child.pool) == ("fw-1", 8, "b")
    assert snap.alerts == alerts


def test_a_checkpoint_of_another_state_version_is_refused() -> None:
    """A payload written by another version is never guessed at: StateVersionError."""
    p, _, _ = _run(fleet(12, devices=8))
    blob = p.snapshot_partition(0)
    raw = msgspec.msgpack.decode(blob)
    raw["v"] = STATE_VERSION + 1
    with pytest.raises(StateVersionError, match="state version"):
        Pipeline(Settings()).restore_partition(0, msgspec.msgpack.encode(raw))
    assert decode(blob, PartitionSnapshot).v == STATE_VERSION
    with pytest.raises(StateVersionError):
        Pipeline(Settings()).restore_incidents(msgspec.msgpack.encode({"v": 0}))


def test_a_revoked_partition_takes_its_open_incident_to_the_next_owner() -> None:
    """Hand-over: the old owner drops the incident and names its alert for the sinks to
    forget; the partition's checkpoint carries it; the new owner re-sends it at its first
    batch, and then resolves it when the fix lands."""
    bad, good = fleet(72, regress_at=45, change_at=44), fleet(140)
    old, alerts, _ = _run(bad[:70])
    (aid,) = {a.id for a in alerts if a.status == "firing"}
    # The factory spreads devices over partitions 0-3; the lowest one owns the incident.
    blobs = {p: old.snapshot_partition(p) for p in range(4)}
    assert [old.hand_over(p) for p in (1, 2, 3)] == [[], [], []]
    assert old.hand_over(0) == [aid]
    assert old.handed_over == [aid]
    assert not old.correlator.incidents
    assert old.keep_incidents_of(set()) == []  # nothing left to hand over

    new = Pipeline(Settings())
    for p, blob in blobs.items():
        new.restore_partition(p, blob)
    # Every member reads every change event; the Kafka source re-reads them at start and
    # sends them with its first batch.
    first = new.process([m for b in bad for m in b if m.topic == "flopwatch.changes"])
    assert [(a.id, a.status, a.suggestion.change_id) for a in first.alerts] == [
        (aid, "firing", "chg-1")
    ]
    assert not new.process(bad[70]).alerts  # said once
    later = [a for b in bad[71:] + good[72:] for a in new.process(b).alerts]
    assert [(a.id, a.status) for a in later][-1] == (aid, "resolved")


def test_restored_incidents_of_other_partitions_are_handed_over() -> None:
    """A member's incidents checkpoint may hold incidents another member owns now."""
    p, alerts, _ = _run(fleet(70, regress_at=45, change_at=44))
    (aid,) = {a.id for a in alerts if a.status == "firing"}
    assert p.keep_incidents_of({0}) == []
    assert p.keep_incidents_of({1, 2}) == [aid]
    assert not p.correlator.incidents


def test_excursions_travel_with_the_partition_and_old_checkpoints_read_none() -> None:
    """The levels streams left at a step the good way (`core.excursions`) come back with
    their partition; a payload written before they were kept restores with none."""
    p, _, _ = _run(fleet(20, devices=8))
    st = p.partitions[0]
    st.excursions = Excursions.restore([("layer", 3, 1, 1.03, 397.0, 36_600.0, 1000.0)])
    q = Pipeline(Settings())
    q.restore_partition(0, p.snapshot_partition(0))
    assert q.partitions[0].excursions.snapshot() == [("layer", 3, 1, 1.03, 397.0, 36_600.0, 1000.0)]
    snap = decode(p.snapshot_partition(0), PartitionSnapshot)
    old = msgspec.msgpack.encode(
        {f: getattr(snap, f) for f in snap.__struct_fields__ if f != "excursions"}
    )
    r = Pipeline(Settings())
    r.restore_partition(0, old)
    assert len(r.partitions[0].excursions) == 0

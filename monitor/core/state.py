"""Per-partition state, and the versioned bytes that carry it through checkpoints.

A partition's state is its stream table, one detector and one load adjuster per
stream kind, and the open incidents it owns (an incident is owned by the lowest
partition among its regressions', so its next owner restores it with that
partition). The member-wide state is the incidents with the evidence waiting for
one and the known change events. Both are msgspec structs in msgpack with a
`STATE_VERSION`: no pickle, so a state record can only ever be data, and a
checkpoint of another version is refused with `StateVersionError` (its partition
then starts fresh, and the checkpointer counts it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from monitor.config import Settings
from monitor.core.correlator import ChangePoint, Incident, IncidentStatus
from monitor.core.excursions import Excursions
from monitor.core.levels import GroupLevels
from monitor.core.lifecycle import AlertState
from monitor.core.load import LoadAdjuster
from monitor.core.stream_table import STREAM_KINDS, StreamTable
from monitor.detect import Detector, make_detector, restore_configured
from monitor.errors import StateVersionError
from monitor.hardware import Catalog
from monitor.wire import ChangeEvent

STATE_VERSION = 2  # 2: stream-table groups keyed by hardware too


@dataclass
class PartitionState:
    """Everything that belongs to one input partition: streams and their detectors."""

    table: StreamTable
    detectors: dict[str, Detector]  # by stream kind (`STREAM_KINDS`)
    adjusters: dict[str, LoadAdjuster | None]  # by stream kind; None: load-blind
    expired_at: float = 0.0
    excursions: Excursions = field(default_factory=Excursions)
    # Not checkpointed: a view of the newest window for /metrics, refilled by the next one.
    levels: GroupLevels = field(default_factory=GroupLevels)


def new_partition(settings: Settings, catalog: Catalog) -> PartitionState:
    """Fresh state for a partition: the configured detector and adjuster per stream kind."""
    d = settings.detector
    return PartitionState(
        _table(settings, catalog),
        {k.name: make_detector(d.kind, len(k.columns), d.engine_params()) for k in STREAM_KINDS},
        _adjusters(settings),
    )


def _table(settings: Settings, catalog: Catalog, blob: bytes | None = None) -> StreamTable:
    """A fresh stream table, or one restored from a checkpoint, under the configured TTL and
    caps."""
    lim, ttl_s = settings.limits, settings.detector.stream_ttl_s
    if blob is None:
        return StreamTable(catalog, ttl_s, lim.max_devices, lim.max_streams, lim.max_groups)
    return StreamTable.restore(blob, catalog, ttl_s, lim.max_devices, lim.max_streams,
                               lim.max_groups)  # fmt: skip


def _adjusters(settings: Settings) -> dict[str, LoadAdjuster | None]:
    """A fresh load adjuster per stream kind, or None for each when load-blind."""
    d = settings.detector
    return {
        k.name: LoadAdjuster(k.columns, d.load_forget, d.load_min_support) if d.load_aware else None
        for k in STREAM_KINDS
    }


# -- incidents as data -------------------------------------------------------------------
class IncidentRecord(msgspec.Struct, frozen=True):
    """One incident as stored; `children` index into the list it is stored in."""

    pool: str | None
    model: str | None
    anchor_ts: float
    detected_ts: float
    window_s: float
    group_window_s: float
    points: list[ChangePoint]
    evidence: list[ChangePoint]
    load: list[ChangePoint]
    status: IncidentStatus
    resolved_ts: float
    alert_id: str | None
    metric: str | None
    pool_size: int
    children: list[int]


def incident_records(incidents: list[Incident]) -> list[IncidentRecord]:
    """Incidents as records in their order, fleet children not among them appended; a
    parent lists its children by index."""
    flat = list(incidents)
    index = {id(inc): i for i, inc in enumerate(flat)}
    for child in (c for i in incidents for c in i.children):
        if id(child) not in index:
            index[id(child)] = len(flat)
            flat.append(child)
    return [
        IncidentRecord(
            i.pool,
            i.model,
            i.anchor_ts,
            i.detected_ts,
            i.window_s,
            i.group_window_s,
            i.points,
            i.evidence,
            i.load,
            i.status,
            i.resolved_ts,
            i.alert_id,
            i.metric,
            i.pool_size,
            [index[id(c)] for c in i.children],
        )
        for i in flat
    ]


def incidents_of(records: list[IncidentRecord]) -> list[Incident]:
    """Incidents back from `incident_records`, parents and children linked again."""
    out = [
        Incident(
            r.pool,
            r.model,
            r.anchor_ts,
            r.detected_ts,
            r.window_s,
            r.group_window_s,
            points=list(r.points),
            evidence=list(r.evidence),
            load=list(r.load),
            status=r.status,
            resolved_ts=r.resolved_ts,
            alert_id=r.alert_id,
            metric=r.metric,
            pool_size=r.pool_size,
        )
        for r in records
    ]
    for inc, r in zip(out, records, strict=True):
        inc.children = [out[c] for c in r.children]
        for child in inc.children:
            child.parent = inc
    return out


def owner_partition(inc: Incident) -> int:
    """The partition whose checkpoint carries an incident: the lowest of its regressions'."""
    parts = [p.partition for m in (inc, *inc.children) for p in m.points]
    return min(parts, default=0)


def incident_key(inc: Incident) -> tuple[object, ...]:
    """What identifies an incident across checkpoints: its alert id once it paged."""
    if inc.alert_id is not None:
        return ("alert", inc.alert_id)
    return (inc.pool, inc.model, inc.anchor_ts, inc.primary_metric)


# -- checkpoint payloads ------------------------------------------------------------------
class _Version(msgspec.Struct):
    v: int


class PartitionSnapshot(msgspec.Struct, frozen=True):
    """One input partition's checkpoint payload."""

    v: int
    table: bytes
    detectors: dict[str, bytes]
    adjusters: dict[str, dict[int, bytes]]
    expired_at: float
    partition_ts: float | None
    incidents: list[IncidentRecord]  # the open incidents this partition owns
    alerts: dict[str, AlertState]  # their alert state, by alert id
    # Each load-normalised stream's level left at its last step the good way
    # (`core.excursions`); absent from checkpoints written before it was kept.
    excursions: list[tuple[str, int, int, float, float, float, float]] = []


class IncidentsSnapshot(msgspec.Struct, frozen=True):
    """The member-wide checkpoint payload: incidents, waiting evidence, change events."""

    v: int
    incidents: list[IncidentRecord]
    recent: list[ChangePoint]
    changes: list[ChangeEvent]
    alerts: dict[str, AlertState]


class PoolPage(msgspec.Struct, frozen=True):
    """A replica's own alert (pool, host or device scope) as the fleet stage keeps it: to
    name it on the fleet alert, and to resolve the fleet alert when its pools are fixed."""

    id: str
    status: str  # firing | resolved
    ts: float
    pool: str | None
    model: str | None
    metric: str
    onset_ts: float


class FleetSnapshot(msgspec.Struct, frozen=True):
    """The fleet stage's checkpoint payload (`core.fleet`), stored with the change-point
    partition it reads."""

    v: int
    incidents: list[IncidentRecord]
    recent: list[ChangePoint]
    alerts: dict[str, AlertState]
    partition_ts: dict[int, float]  # per input partition of the replicas: event time reached
    pools: dict[int, list[tuple[str | None, str | None, int]]]  # ... its (pool, model, devices)
    hosts: dict[str, int]
    pages: list[PoolPage]
    named: dict[str, dict[str, str]]  # fleet alert id -> pool -> the pool alert it names


_encoder = msgspec.msgpack.Encoder()


def encode(payload: PartitionSnapshot | IncidentsSnapshot | FleetSnapshot) -> bytes:
    """Checkpoint bytes of a payload."""
    return _encoder.encode(payload)


_P = TypeVar("_P", PartitionSnapshot, IncidentsSnapshot, FleetSnapshot)


def decode(blob: bytes, kind: type[_P]) -> _P:
    """A payload back from `encode`; StateVersionError when another version wrote it."""
    v = msgspec.msgpack.decode(blob, type=_Version).v
    if v != STATE_VERSION:
        raise StateVersionError(f"checkpoint state version {v}, this build reads {STATE_VERSION}")
    return msgspec.msgpack.decode(blob, type=kind)


def snapshot_partition(
    st: PartitionState,
    partition_ts: float | None,
    owned: list[Incident],
    alerts: dict[str, AlertState],
) -> bytes:
    """One partition's state, with the incidents it owns and their alert state, as bytes."""
    return encode(
        PartitionSnapshot(
            STATE_VERSION,
            st.table.snapshot(),
            {k: d.snapshot() for k, d in st.detectors.items()},
            {k: a.snapshot() for k, a in st.adjusters.items() if a is not None},
            st.expired_at,
            partition_ts,
            incident_records(owned),
            {i.alert_id: alerts[i.alert_id] for i in owned if i.alert_id in alerts},
            st.excursions.snapshot(),
        )
    )


def restore_partition(
    blob: bytes, settings: Settings, catalog: Catalog
) -> tuple[PartitionState, PartitionSnapshot, dict[str, str]]:
    """A partition's state from its checkpoint under the configured detector and windows.

    Also the payload (for its incidents, alerts and watermark) and how each stream kind's
    detector came back: kept, retuned or reset (`detect.restore_configured`).
    """
    outcomes: dict[str, str] = {}
    snap = decode(blob, PartitionSnapshot)
    d = settings.detector
    detectors: dict[str, Detector] = {}
    adjusters = _adjusters(settings)
    for kind in STREAM_KINDS:
        detectors[kind.name], outcomes[kind.name] = restore_configured(
            snap.detectors[kind.name], d.kind, len(kind.columns), d.engine_params()
        )
        adjuster = adjusters[kind.name]
        if adjuster is not None and kind.name in snap.adjusters:
            adjuster.restore(snap.adjusters[kind.name])
    table = _table(settings, catalog, snap.table)
    st = PartitionState(
        table, detectors, adjusters, snap.expired_at, Excursions.restore(snap.excursions)
    )
    return st, snap, outcomes

"""The monitor's pure core: raw messages in; alerts, dead letters and counters out.

source → decode/validate → stream table → detectors → correlator → advisor →
alert lifecycle. No I/O and no clock: time is the records' event time, so a
recording replays to byte-identical alerts. Detector state is kept per input
partition (a device's records always land in one partition) so it can be
checkpointed and handed over per partition.
"""

from __future__ import annotations

import pickle
from collections import Counter
from dataclasses import dataclass

import numpy as np

from monitor import detect
from monitor.arrays import F64, I64
from monitor.config import Settings
from monitor.core.advisor import Advisor
from monitor.core.correlator import AGGREGATE, ChangePoint, Correlator, Incident
from monitor.core.lifecycle import AlertLifecycle
from monitor.core.load import LoadAdjuster
from monitor.core.stream_table import Frame, StreamTable
from monitor.core.types import DeadLetter, NormView, Output, RawMessage
from monitor.detect.base import Detections, Detector
from monitor.errors import DecodeError
from monitor.hardware import Catalog, HardwareSpec
from monitor.indicators import DEVICE_METRICS, LAYER_METRICS, STAGE_OF, material_floors
from monitor.wire import Alert, Codec, WindowRecord


def catalog_from(settings: Settings) -> Catalog:
    """The hardware catalog with config entries merged in."""
    return Catalog(
        {
            k: HardwareSpec(
                peak_flops={d.lower(): v for d, v in e.peak_flops.items()},
                hbm_bytes_per_s=e.hbm_bytes_per_s,
                source=e.source,
                max_clock_mhz=e.max_clock_mhz,
            )
            for k, e in settings.hardware.items()
        }
    )


def make_detector(settings: Settings, n_metrics: int) -> Detector:
    """The configured detector for a matrix of `n_metrics` columns (ValueError if misconfigured)."""
    d = settings.detector
    return detect.make_detector(d.kind, n_metrics, d.engine_params())


@dataclass
class PartitionState:
    """Everything that belongs to one input partition: streams and their detectors."""

    table: StreamTable
    layer_detector: Detector
    device_detector: Detector
    layer_load: LoadAdjuster | None = None
    device_load: LoadAdjuster | None = None
    # Per (pool, model, layer) aggregates of this partition's devices: a pool-wide shift
    # too small for any one device's detector is one clear signal here.
    pool_layer_detector: Detector | None = None
    pool_device_detector: Detector | None = None
    pool_layer_load: LoadAdjuster | None = None
    pool_device_load: LoadAdjuster | None = None
    expired_at: float = 0.0


class Pipeline:
    """Processes batches of raw messages in event time; deterministic for a given input."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.catalog = catalog_from(settings)
        self.codec = Codec()
        self.partitions: dict[int, PartitionState] = {}
        self.correlator = Correlator(settings.alerts.group_window_s)
        self.advisor = Advisor(lookback_s=settings.alerts.change_lookback_s)
        # Restored incidents whose pages the next batch sends again (`lifecycle.restate`).
        self._to_restate: list[Incident] = []
        self.handed_over: list[str] = []  # alert ids of incidents given up in a rebalance
        self.lifecycle = AlertLifecycle(settings.alerts, self.advisor)
        self.counters: Counter[str] = Counter()
        # Per stream kind: what the detectors' alarms became, and the change points by
        # metric and materiality, so a noisy metric shows on /metrics before it pages.
        self.alarm_counts: Counter[tuple[str, str]] = Counter()
        self.warm_counts: Counter[tuple[str, str]] = Counter()  # (stream kind, outcome)
        self.point_counts: Counter[tuple[str, str, bool]] = Counter()
        d = settings.detector
        # Reporting floors per metric column (absolute, relative), defaults overridden.
        self._floors = {
            True: material_floors(LAYER_METRICS, d.material_rel, d.material_abs),
            False: material_floors(DEVICE_METRICS, d.material_rel, d.material_abs),
        }
        self.unknown_hw: list[tuple[str, str | None, str | None]] = []
        self.partition_ts: dict[int, float] = {}

    def _partition(self, p: int) -> PartitionState:
        st = self.partitions.get(p)
        if st is None:
            d = self.settings.detector

            def adjuster(columns: tuple[str, ...]) -> LoadAdjuster | None:
                return (
                    LoadAdjuster(columns, d.load_forget, d.load_min_support)
                    if d.load_aware
                    else None
                )

            st = PartitionState(
                StreamTable(self.catalog, ttl_s=d.stream_ttl_s),
                make_detector(self.settings, len(LAYER_METRICS)),
                make_detector(self.settings, len(DEVICE_METRICS)),
                adjuster(LAYER_METRICS),
                adjuster(DEVICE_METRICS),
                make_detector(self.settings, len(LAYER_METRICS)),
                make_detector(self.settings, len(DEVICE_METRICS)),
                adjuster(LAYER_METRICS),
                adjuster(DEVICE_METRICS),
            )
            self.partitions[p] = st
        return st

    def process(self, batch: list[RawMessage]) -> Output:
        """Decode, detect, correlate and advise over one batch; returns alerts and dead letters."""
        out = Output()
        samples: dict[int, list[tuple[RawMessage, WindowRecord]]] = {}
        changes_topic = self.settings.kafka.topics.changes
        for msg in batch:
            try:
                if msg.topic == changes_topic:
                    self.advisor.add_change(self.codec.decode_change(msg.value))
                    self.counters["changes_in"] += 1
                else:
                    rec = self.codec.decode_window(msg.value)
                    samples.setdefault(msg.partition, []).append((msg, rec))
            except DecodeError as exc:
                out.dead.append(DeadLetter(msg, exc.reason))
                self.counters["records_rejected"] += 1
        points: list[ChangePoint] = []
        views: list[NormView] = []
        for part, items in sorted(samples.items()):
            st = self._partition(part)
            frame, rejected = st.table.build([rec for _, rec in items])
            view = NormView(part, frame, frame.layer_values.copy(), frame.device_values.copy())
            views.append(view)
            for rej in rejected:
                self.counters[f"records_{rej.kind}"] += 1
                if rej.kind == "late":
                    out.dead.append(DeadLetter(items[rej.index][0], rej.reason))
            self.counters["records_in"] += len(items) - len(rejected)
            self.unknown_hw.extend(st.table.newly_unknown)
            st.table.newly_unknown.clear()
            points.extend(self._detect(st, view))
            if frame.device_ts.size:
                part_ts = max(self.partition_ts.get(part, 0.0), float(frame.device_ts.max()))
                self.partition_ts[part] = part_ts
                if part_ts - st.expired_at > st.table.ttl_s / 4:
                    dev_rows, layer_rows = st.table.expire(part_ts)
                    st.device_detector.forget(dev_rows)
                    st.layer_detector.forget(layer_rows)
                    st.expired_at = part_ts
        if self._to_restate and self.partition_ts:
            # The first batch after a restore: send what is still firing once more.
            again = self.lifecycle.restate(self._to_restate, self.watermark(), self.pool_counts())
            self._to_restate = []
            out.alerts.extend(again)
        if not samples:
            self.counters["alerts_out"] += len(out.alerts)
            return out
        now = self.watermark()
        counts = self.pool_counts() if points or self.correlator.incidents else {}
        self.correlator.add(points, now, counts)
        open_incidents = [i for i in self.correlator.incidents if i.status == "open"]
        if open_incidents:
            out.alerts.extend(self.lifecycle.due(open_incidents, now, counts, self.host_sizes()))
            out.alerts.extend(self.lifecycle.observe(open_incidents, views, counts))
            self._hold_load_models(out.alerts)
        self.correlator.drop_resolved(now, keep_s=4 * self.settings.alerts.group_window_s)
        self.advisor.prune(now)
        self.counters["alerts_out"] += len(out.alerts)
        return out

    def _hold_load_models(self, alerts: list[Alert]) -> None:
        """Freeze the load models of groups with a paged incident; thaw them on resolve.

        Otherwise the expectation slowly learns the regressed level as "normal for this
        load", the ratio drifts back to 1 and the incident looks fixed when it is not.
        """
        for alert in alerts:
            inc = next((i for i in self.correlator.incidents if i.alert_id == alert.id), None)
            if inc is None:
                continue
            by_part: dict[int, set[int]] = {}
            for p in (q for member in (inc, *inc.children) for q in member.primary_points()):
                st = self.partitions.get(p.partition)
                gid = st.table.groups.get((p.pool, p.model, p.layer or "")) if st else None
                if gid is not None:
                    by_part.setdefault(p.partition, set()).add(gid)
            for part, gids in by_part.items():
                st = self.partitions[part]
                arr = np.array(sorted(gids), dtype=np.int64)
                for adjuster in _adjusters(st).values():
                    if adjuster is not None:
                        adjuster.hold(arr, hold=alert.status == "firing")

    # -- checkpoints --------------------------------------------------------------------
    def snapshot_partition(self, partition: int) -> bytes:
        """One input partition's state (streams, detectors, load models) as bytes.

        Restoring it and then feeding the records after the last one processed gives
        the same detections as never having stopped (resume *after* the last offset).
        """
        st = self._partition(partition)
        return pickle.dumps(
            {
                "table": st.table.snapshot(),
                "layer": st.layer_detector.snapshot(),
                "device": st.device_detector.snapshot(),
                "pool_layer": _snap(st.pool_layer_detector),
                "pool_device": _snap(st.pool_device_detector),
                **{
                    key: adjuster.snapshot() if adjuster else None
                    for key, adjuster in _adjusters(st).items()
                },
                "expired_at": st.expired_at,
                "partition_ts": self.partition_ts.get(partition),
                # The open incidents this partition owns travel with it to its next owner.
                "incidents": self._owned(partition),
            },
            protocol=pickle.HIGHEST_PROTOCOL,
        )

    def restore_partition(self, partition: int, blob: bytes) -> dict[str, str]:
        """Take over a partition from its checkpoint (trusted: our own state topic).

        The detectors come back under the configured kind and parameters (a raised `h`
        applies after a restart); returns each one's outcome, kept, retuned or reset
        (`detect.restore_configured`).
        """
        state = pickle.loads(blob)  # noqa: S301 - written by this process family only
        st = self._partition(partition)
        d = self.settings.detector
        st.table = StreamTable.restore(state["table"], self.catalog, ttl_s=d.stream_ttl_s)
        outcomes: dict[str, str] = {}

        def configured(key: str, n_metrics: int) -> Detector:
            det, outcomes[key] = detect.restore_configured(
                state[key], d.kind, n_metrics, d.engine_params()
            )
            self.counters[f"detector_restore_{outcomes[key]}"] += 1
            return det

        st.layer_detector = configured("layer", len(LAYER_METRICS))
        st.device_detector = configured("device", len(DEVICE_METRICS))
        # Pool detectors: in checkpoints written before they existed, fresh ones (as built).
        if state["pool_layer"] is not None:
            st.pool_layer_detector = configured("pool_layer", len(LAYER_METRICS))
        if state["pool_device"] is not None:
            st.pool_device_detector = configured("pool_device", len(DEVICE_METRICS))
        for key, adjuster in _adjusters(st).items():
            if adjuster is not None and state[key] is not None:
                adjuster.restore(state[key])
        st.expired_at = state["expired_at"]
        if state["partition_ts"] is not None:
            self.partition_ts[partition] = state["partition_ts"]
        self._adopt(state.get("incidents", []))
        return outcomes

    def _owned(self, partition: int) -> list[Incident]:
        """Open top-level incidents owned by this partition (their lowest point partition)."""
        return [
            i
            for i in self.correlator.incidents
            if i.status == "open" and i.parent is None and owner_partition(i) == partition
        ]

    def _adopt(self, incidents: list[Incident]) -> None:
        """Take over incidents from a partition checkpoint (a rebalance or a restart); the
        first batch then sends those that paged once more (`lifecycle.restate`)."""
        known = {incident_key(i) for i in self.correlator.incidents}
        for inc in incidents:
            if incident_key(inc) in known:
                continue
            for member in (inc, *inc.children):  # fleet children are listed on their own
                member.group_window_s = self.settings.alerts.group_window_s
                self.correlator.incidents.append(member)
            self._to_restate.append(inc)

    def keep_incidents_of(self, partitions: set[int]) -> list[str]:
        """Hand over every open incident owned by a partition outside `partitions` (after a
        restore: a member's incidents checkpoint can hold another member's)."""
        owners = {owner_partition(i) for i in self.correlator.incidents if i.parent is None}
        return [aid for p in sorted(owners - partitions) for aid in self.hand_over(p)]

    def hand_over(self, partition: int) -> list[str]:
        """Drop the incidents a revoked partition owns (its next owner restores them from the
        partition's checkpoint); returns the alert ids the sinks must stop keeping alive."""
        gone = self._owned(partition)
        ids = {id(m) for i in gone for m in (i, *i.children)}
        self.correlator.incidents = [i for i in self.correlator.incidents if id(i) not in ids]
        self._to_restate = [i for i in self._to_restate if id(i) not in ids]
        out = [i.alert_id for i in gone if i.alert_id is not None]
        self.handed_over.extend(out)
        return out

    def snapshot_incidents(self) -> bytes:
        """Incidents, recent evidence and known change events (the cross-partition state)."""
        return pickle.dumps(
            {"correlator": self.correlator, "advisor": self.advisor},
            protocol=pickle.HIGHEST_PROTOCOL,
        )

    def restore_incidents(self, blob: bytes) -> None:
        """Restore what `snapshot_incidents` saved."""
        state = pickle.loads(blob)  # noqa: S301 - written by this process family only
        adopted = self.correlator.incidents  # from partition checkpoints restored just before
        self.correlator = state["correlator"]
        self.correlator.fill_missing_fields()
        known = {incident_key(i) for i in self.correlator.incidents}
        self.correlator.incidents.extend(i for i in adopted if incident_key(i) not in known)
        self.advisor = state["advisor"]
        self.lifecycle.advisor = self.advisor
        # The configured windows win over the checkpoint's (as for the detectors).
        self.correlator.group_window_s = self.settings.alerts.group_window_s
        self.advisor.lookback_s = self.settings.alerts.change_lookback_s
        self._to_restate = list(self.correlator.incidents)

    def watermark(self) -> float:
        """Event time every active partition has reached (partitions lagging > max_skew ignored).

        Consumers drain partitions unevenly; waiting for the slowest one keeps an
        incident from paging before the devices of other partitions had their say.
        """
        if not self.partition_ts:
            return 0.0
        high = max(self.partition_ts.values())
        skew = self.settings.alerts.max_skew_s
        return min(t for t in self.partition_ts.values() if t >= high - skew)

    def host_sizes(self) -> dict[str | None, int]:
        """Known devices per host over all partitions."""
        c: Counter[str | None] = Counter()
        for st in self.partitions.values():
            c.update(d.host for d in st.table.devices.values())
        return dict(c)

    def pool_counts(self) -> dict[tuple[str | None, str | None], int]:
        """Known devices per (pool, model) over all partitions."""
        c: Counter[tuple[str | None, str | None]] = Counter()
        for st in self.partitions.values():
            c.update((d.pool, d.model) for d in st.table.devices.values())
        return dict(c)

    def _detect(self, st: PartitionState, view: NormView) -> list[ChangePoint]:
        """Run the detectors wave by wave; fills `view`'s normalised matrices on the way."""
        found: list[ChangePoint] = []
        frame = view.frame
        sides: list[
            tuple[str, I64, F64, F64, I64, F64, Detector, LoadAdjuster | None, F64 | None]
        ] = [
            ("layer", frame.layer_rows, frame.layer_ts, frame.layer_values, frame.layer_group,
             frame.layer_load, st.layer_detector, st.layer_load, view.layer_norm),
            ("device", frame.device_rows, frame.device_ts, frame.device_values,
             frame.device_group, frame.device_load, st.device_detector, st.device_load,
             view.device_norm),
        ]  # fmt: skip
        if st.pool_layer_detector is not None and st.pool_device_detector is not None:
            sides += [
                ("pool_layer", frame.pool_layer_rows, frame.pool_layer_ts,
                 frame.pool_layer_values, frame.pool_layer_rows, frame.pool_layer_load,
                 st.pool_layer_detector, st.pool_layer_load, None),
                ("pool_device", frame.pool_device_rows, frame.pool_device_ts,
                 frame.pool_device_values, frame.pool_device_rows, frame.pool_device_load,
                 st.pool_device_detector, st.pool_device_load, None),
            ]  # fmt: skip
        for kind, rows, ts, values, groups, load, detector, adjuster, norm in sides:
            for wave in Frame.waves(rows):
                vals = values[wave]
                scale = None
                if adjuster is not None:
                    withheld = adjuster.extrapolated
                    vals, scale = adjuster.adjust(groups[wave], load[wave], vals)
                    self.counters["load_extrapolated"] += adjuster.extrapolated - withheld
                    if norm is not None:
                        norm[wave] = vals
                # Families for warm starts: (pool, model, layer) for device streams; a pool
                # aggregate is its family's only stream.
                fam = None if kind.startswith("pool") else groups[wave]
                det = detector.update(rows[wave], ts[wave], vals, fam)
                if not len(det):
                    continue
                levels = det if scale is None else _rescale(det, rows[wave], scale)
                found.extend(self._points(st.table, levels, det, view.partition, kind))
            for method, counts in (("drain_stats", self.alarm_counts),
                                   ("drain_warm_starts", self.warm_counts)):  # fmt: skip
                drain = getattr(detector, method, None)
                if drain is not None:
                    for outcome, n in drain().items():
                        if n:
                            counts[kind, outcome] += n
        if frame.kernel_changes:
            self.point_counts["layer", "kernel", True] += len(frame.kernel_changes)
        for row, k_ts, _old, _new in frame.kernel_changes:
            name, layer_type = st.table.device_of_layer_row(row)
            dev = st.table.devices[name]
            found.append(ChangePoint(
                name, dev.host, dev.pool, dev.model, layer_type, "kernel", "lowering",
                onset_ts=k_ts - dev.window_s, detected_ts=k_ts, before=0.0, after=1.0, score=1.0,
                window_s=dev.window_s, row=row, partition=view.partition,
            ))  # fmt: skip
        self.counters["change_points"] += len(found)
        return found

    def _points(
        self, table: StreamTable, det: Detections, norm: Detections, partition: int, kind: str
    ) -> list[ChangePoint]:
        """Change points with metadata; `det` in metric units, `norm` in the detector's."""
        layer = kind in ("layer", "pool_layer")
        names = LAYER_METRICS if layer else DEVICE_METRICS
        floor_abs, floor_rel = self._floors[layer]
        floor, rel = floor_abs[det.cols], floor_rel[det.cols]
        shift = np.abs(det.after - det.before)
        material = (shift >= floor) & (shift >= rel * np.abs(det.before))
        self.counters["change_points_immaterial"] += int((~material).sum())
        for col, mat in zip(det.cols.tolist(), material.tolist(), strict=True):
            self.point_counts[kind, names[col], mat] += 1
        out: list[ChangePoint] = []
        window_s = next(iter(table.devices.values())).window_s if table.devices else 10.0
        for i in np.flatnonzero(material):
            row = int(det.rows[i])
            if kind.startswith("pool"):
                pool, model, group_layer = table.group_keys[row]
                metric = names[int(det.cols[i])]
                out.append(ChangePoint(
                    device=AGGREGATE + (pool or ""), host=None, pool=pool, model=model,
                    layer=group_layer or None, metric=metric, stage=STAGE_OF[metric],
                    onset_ts=float(det.onset_ts[i]), detected_ts=float(det.detected_ts[i]),
                    before=float(det.before[i]), after=float(det.after[i]),
                    score=float(np.round(det.score[i], 6)), window_s=window_s, row=row,
                    partition=partition, norm_before=float(norm.before[i]),
                    norm_after=float(norm.after[i]),
                ))  # fmt: skip
                continue
            if layer:
                name, layer_type = table.device_of_layer_row(row)
            else:
                maybe = table.device_names[row]
                if maybe is None:
                    continue
                name, layer_type = maybe, None
            dev = table.devices[name]
            metric = names[int(det.cols[i])]
            out.append(ChangePoint(
                device=name, host=dev.host, pool=dev.pool, model=dev.model, layer=layer_type,
                metric=metric, stage=STAGE_OF[metric], onset_ts=float(det.onset_ts[i]),
                detected_ts=float(det.detected_ts[i]), before=float(det.before[i]),
                after=float(det.after[i]), score=float(np.round(det.score[i], 6)),
                window_s=dev.window_s, row=row, partition=partition,
                norm_before=float(norm.before[i]), norm_after=float(norm.after[i]),
            ))  # fmt: skip
        return out


def _rescale(det: Detections, wave_rows: I64, expected: F64) -> Detections:
    """Ratios back to levels at the current load, so alerts speak in MFU, not ratios."""
    order = np.argsort(wave_rows)
    pos = order[np.searchsorted(wave_rows[order], det.rows)]
    k = expected[pos, det.cols]
    k = np.where(np.isfinite(k), k, 1.0)
    return Detections(det.rows, det.cols, det.detected_ts, det.onset_ts, det.before * k,
                      det.after * k, det.score)  # fmt: skip


def owner_partition(inc: Incident) -> int:
    """The partition whose checkpoint carries an incident: the lowest of its regressions'
    (evidence restored from checkpoints of before 2026-11-30 may lack its partition)."""
    parts = [p.partition for m in (inc, *inc.children) for p in m.points]
    return min(parts, default=0)


def incident_key(inc: Incident) -> tuple[object, ...]:
    """What identifies an incident across checkpoints: its alert id once it paged."""
    if inc.alert_id is not None:
        return ("alert", inc.alert_id)
    return (inc.pool, inc.model, inc.anchor_ts, inc.primary_metric)


def _adjusters(st: PartitionState) -> dict[str, LoadAdjuster | None]:
    return {
        "layer_load": st.layer_load,
        "device_load": st.device_load,
        "pool_layer_load": st.pool_layer_load,
        "pool_device_load": st.pool_device_load,
    }


def _snap(det: Detector | None) -> bytes | None:
    return None if det is None else det.snapshot()

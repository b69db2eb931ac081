"""The monitor's pure core: raw messages in; alerts, dead letters and counters out.

source → decode/validate → stream table → detectors → correlator → advisor →
alert lifecycle. No I/O and no clock: time is the records' event time, so a
recording replays to byte-identical alerts. Detector state is kept per input
partition (a device's records always land in one partition) so it can be
checkpointed and handed over per partition (`core.state`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from monitor.arrays import F64, I64
from monitor.config import Settings, catalog_from
from monitor.core.advisor import Advisor
from monitor.core.correlator import AGGREGATE, SERVED_RISE, ChangePoint, Correlator, Incident
from monitor.core.coverage import stage_of
from monitor.core.exposure import BACKLOG_LEVELS, EFFICIENCY
from monitor.core.fleet import REPORT_VERSION, FleetStage, Report, encode_report, page_of
from monitor.core.lifecycle import AlertLifecycle, AlertState
from monitor.core.load import LOAD_SENSITIVE, back_to_expected
from monitor.core.state import (
    STATE_VERSION,
    IncidentsSnapshot,
    PartitionState,
    decode,
    encode,
    incident_key,
    incident_records,
    incidents_of,
    new_partition,
    owner_partition,
    restore_partition,
    snapshot_partition,
)
from monitor.core.stream_table import (
    DEVICE_GROUPS,
    STREAM_KINDS,
    Frame,
    Released,
    StreamKind,
    StreamTable,
)
from monitor.core.types import DeadLetter, NormView, Output, RawMessage
from monitor.detect import Detections, Detector
from monitor.errors import DecodeError
from monitor.indicators import (
    BAD_DIRECTION,
    COMPLEMENT,
    DEVICE_METRICS,
    LAYER_METRICS,
    STAGE_OF,
    material_floors,
)
from monitor.wire import Alert, Codec, WindowRecord


@dataclass
class PipelineStats:
    """Counters read at scrape time (`daemon.prometheus`) and by the commands' summaries."""

    records_in: int = 0  # window records used
    records_duplicate: int = 0
    records_late: int = 0
    records_rejected: int = 0  # failed to decode
    records_future: int = 0  # dated beyond the wall clock (`limits.max_future_s`)
    internal_errors: int = 0  # bugs caught at a record or a batch (`Pipeline.errors`)
    records_capacity: int = 0  # new streams beyond a partition's caps, none left to evict
    changes_in: int = 0
    alerts_out: int = 0
    load_extrapolated: int = 0  # samples withheld: load outside the load model's data
    detector_restores: Counter[str] = field(default_factory=Counter)  # kept | retuned | reset
    # Per stream kind: what the detectors' alarms became, how new streams started, and the
    # change points by metric and materiality, so a noisy metric shows before it pages.
    alarms: Counter[tuple[str, str]] = field(default_factory=Counter)
    warm_starts: Counter[tuple[str, str]] = field(default_factory=Counter)
    points: Counter[tuple[str, str, bool]] = field(default_factory=Counter)
    # Devices, layer streams and groups let go of, by kind: evicted at a cap (`limits`),
    # expired after `detector.stream_ttl_s` of silence.
    streams_evicted: Counter[str] = field(default_factory=Counter)
    streams_expired: Counter[str] = field(default_factory=Counter)

    def totals(self) -> dict[str, int]:
        """The plain counts, for a summary log line."""
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}


class Pipeline:
    """Processes batches of raw messages in event time; deterministic for a given input."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.catalog = catalog_from(settings)
        lim = settings.limits
        self.codec = Codec(lim.max_record_bytes, lim.max_layers)
        self.partitions: dict[int, PartitionState] = {}
        self.partition_ts: dict[int, float] = {}  # event time each partition has reached
        self.correlator = Correlator(settings.alerts.group_window_s)
        self.advisor = Advisor(lookback_s=settings.alerts.change_lookback_s)
        # With the fleet stage (`kafka.fleet_stage`) pools are linked into fleet alerts there,
        # over every replica's change points, never here on this replica's share.
        fleet_stage = settings.kafka.fleet_stage
        self.lifecycle = AlertLifecycle(settings.alerts, self.advisor,
                                        fleet="off" if fleet_stage else "link")  # fmt: skip
        self.correlator.new_cause = self.advisor.new_cause
        # Runs on whichever member the change-point partition is assigned to (idle elsewhere).
        self.fleet = FleetStage(settings, self.advisor) if fleet_stage else None
        # Restored incidents whose pages the next batch sends again (`lifecycle.restate`).
        self._to_restate: list[Incident] = []
        self.handed_over: list[str] = []  # alert ids of incidents given up in a rebalance
        # Alert ids of incidents restored from a checkpoint: while the records processed
        # before the restart are read again, their alerts were sent already.
        self._restored_ids: set[str] = set()
        self.stats = PipelineStats()
        d = settings.detector
        # Reporting floors per metric column (absolute, relative), defaults overridden.
        self._floors = {
            cols: material_floors(cols, d.material_rel, d.material_abs)
            for cols in (LAYER_METRICS, DEVICE_METRICS)
        }
        self.unknown_hw: list[tuple[str, str | None, str | None]] = []
        # Exceptions caught so that one record cannot stop the daemon; the runner logs them.
        self.errors: list[Exception] = []
        # Called with each partition's frame once its records are in (the incident pages'
        # plots, `monitor.report.series`); it only reads, and its failure costs no record.
        self.observer: Callable[[int, Frame, StreamTable], None] | None = None

    def _partition(self, p: int) -> PartitionState:
        st = self.partitions.get(p)
        if st is None:
            st = self.partitions[p] = new_partition(self.settings, self.catalog)
        return st

    def process(
        self, batch: list[RawMessage], wall_ts: float | None = None, *, replaying: bool = False
    ) -> Output:
        """Decode, detect, correlate and advise over one batch; returns alerts and dead letters.

        `wall_ts` (live sources only; replays run in event time alone): window records
        dated more than `limits.max_future_s` after it are dead-lettered as `future`, so one
        clock gone wrong can neither expire every stream of its partition nor page from
        the future.

        `replaying`: the batch re-reads records processed before a restart; the restored
        pages are re-sent only once that is over, so an incident the replay resolves is
        not fired again first.
        """
        out = Output()
        reports: list[RawMessage] = []
        changes_before = self.stats.changes_in
        samples = self._decode(batch, out, wall_ts, reports)
        # A change event can arrive after the windows it explains (the changes topic is
        # read beside the samples): an open page's rollback must not wait for more samples.
        news = self.stats.changes_in > changes_before and any(
            i.status == "open" for i in self.correlator.incidents
        )
        points: list[ChangePoint] = []
        views: list[NormView] = []
        for part, items in sorted(samples.items()):
            self._ingest(part, items, out, points, views)
        try:
            if self._to_restate and self.partition_ts and not replaying:
                # The first batch after a restore: send what is still firing once more.
                again = self.lifecycle.restate(
                    self._to_restate, self.watermark(), self.pool_counts()
                )
                self._to_restate = []
                out.alerts.extend(again)
            if samples or news:
                self._correlate(points, views, out)
        except Exception as exc:  # noqa: BLE001 - a bug must not stop the daemon
            # Not one record's fault (the records are in): this batch's change points are
            # lost, the next batch correlates afresh. Counted and logged by the runner.
            self.stats.internal_errors += 1
            self.errors.append(exc)
        if replaying and self._restored_ids:
            # Sent before the restart (their records precede the committed offset); the
            # restated record after the re-read brings the sinks up to date.
            # A resolve goes out again (harmless twice; lost if new records in the batch
            # brought it).
            out.alerts = [
                a for a in out.alerts if a.id not in self._restored_ids or a.status == "resolved"
            ]
        elif not replaying:
            self._restored_ids.clear()
        if self.fleet is not None:
            self._fleet(samples, points, reports, out, replaying)
        self.stats.alerts_out += len(out.alerts)
        return out

    def _fleet(
        self, samples: dict[int, list[tuple[RawMessage, WindowRecord]]],
        points: list[ChangePoint], reports: list[RawMessage], out: Output, replaying: bool,
    ) -> None:  # fmt: skip
        """This batch's report for the fleet stage; the reports read, through the stage."""
        assert self.fleet is not None  # noqa: S101 - only called with the stage on
        try:
            if samples:
                out.reports = [encode_report(r) for r in self._reports(samples, points, out.alerts)]
            if reports:
                alerts, dead = self.fleet.add(reports, replaying=replaying)
                out.alerts.extend(alerts)
                out.dead.extend(dead)
        except Exception as exc:  # noqa: BLE001 - a bug must not stop the daemon
            self.stats.internal_errors += 1
            self.errors.append(exc)

    def _reports(
        self, samples: dict[int, list[tuple[RawMessage, WindowRecord]]],
        points: list[ChangePoint], alerts: list[Alert],
    ) -> list[Report]:  # fmt: skip
        """What the fleet stage needs of this batch: its change points, the event time and
        (pool, model) devices of the partitions it read, its hosts' sizes, its alerts. The
        points go `REPORT_POINTS` to a report, so that one stays well under the broker's
        message size; the first report carries the rest."""
        parts = sorted(p for p in samples if p in self.partition_ts)
        pools = {}
        for p in parts:
            c = Counter((d.pool, d.model) for d in self.partitions[p].table.devices.values())
            pools[p] = [(pool, model, n) for (pool, model), n in c.items()]
        hosts: dict[str, int] = {}
        wanted = {p.host for p in points if p.host}
        if wanted:
            for st in self.partitions.values():
                for d in st.table.devices.values():
                    if d.host in wanted:
                        hosts[d.host] = hosts.get(d.host, 0) + 1
        first = Report(
            REPORT_VERSION, {p: self.partition_ts[p] for p in parts}, pools, hosts,
            points[:REPORT_POINTS], [page_of(a) for a in alerts if a.scope.level != "fleet"],
        )  # fmt: skip
        more = [Report(REPORT_VERSION, {}, {}, {}, points[i : i + REPORT_POINTS], [])
                for i in range(REPORT_POINTS, len(points), REPORT_POINTS)]  # fmt: skip
        return [first, *more]

    def snapshot_fleet(self) -> bytes | None:
        """The fleet stage's state, or None when this member holds none."""
        if self.fleet is None or self.fleet.partition is None:
            return None
        return self.fleet.snapshot()

    def restore_fleet(self, partition: int, blob: bytes) -> None:
        """Take the fleet stage over from its checkpoint (StateVersionError: another
        version's); its firing alerts are sent again with the next batch."""
        assert self.fleet is not None  # noqa: S101 - only with the stage on
        self.fleet.restore(blob, partition)

    def forget_fleet(self) -> list[str]:
        """Drop the fleet stage's state (its partition went to another member); returns the
        fleet alert ids the sinks must stop keeping alive."""
        if self.fleet is None:
            return []
        ids = self.fleet.forget()
        self.handed_over.extend(ids)
        return ids

    def alert_states(self) -> dict[str, AlertState]:
        """The alert state of every paged incident held here, the fleet stage's included
        (the runner keeps the sinks' delivery state in them)."""
        if self.fleet is None:
            return self.lifecycle.states
        return {**self.lifecycle.states, **self.fleet.lifecycle.states}

    def _ingest(
        self, part: int, items: list[tuple[RawMessage, WindowRecord]], out: Output,
        points: list[ChangePoint], views: list[NormView],
    ) -> None:  # fmt: skip
        """One partition's records through the stream table and detectors.

        A failure there is a bug, not bad input (decode validated the records), but one
        record must never stop the daemon: the partition's batch is rewound and split in
        halves until the records that fail are alone; those are dead-lettered as
        `internal` with the error (kept, to replay after a fix) and the others go on.
        """
        st = self._partition(part)
        before = {rec.device: st.table.devices[rec.device].last_ts
                  for _, rec in items if rec.device in st.table.devices}  # fmt: skip
        try:
            found, view, dead, counts = self._ingest_once(part, st, items)
        except Exception as exc:  # noqa: BLE001 - isolated below, reported by the runner
            for _, rec in items:  # rewind: the records may be taken again
                dev = st.table.devices.get(rec.device)
                if dev is not None:
                    dev.last_ts = before.get(rec.device, np.nan)
            if len(items) == 1:
                msg = items[0][0]
                out.dead.append(DeadLetter(msg, f"internal: {type(exc).__name__}: {exc}"[:1024]))
                self.stats.internal_errors += 1
                self.errors.append(exc)
                return
            mid = len(items) // 2
            self._ingest(part, items[:mid], out, points, views)
            self._ingest(part, items[mid:], out, points, views)
            return
        points.extend(found)
        views.append(view)
        out.dead.extend(dead)
        if self.observer is not None:
            try:
                self.observer(part, view.frame, st.table)
            except Exception as exc:  # noqa: BLE001 - a view must never cost the records
                self.stats.internal_errors += 1
                self.errors.append(exc)
        late, duplicate, capacity = counts
        self.stats.records_late += late
        self.stats.records_duplicate += duplicate
        self.stats.records_capacity += capacity
        self.stats.records_in += len(items) - late - duplicate - capacity

    def _ingest_once(
        self, part: int, st: PartitionState, items: list[tuple[RawMessage, WindowRecord]]
    ) -> tuple[list[ChangePoint], NormView, list[DeadLetter], tuple[int, int, int]]:
        """Build, detect and expire; what it found, to be kept only if it all went well.
        Counts: (late, duplicate, over capacity) records."""
        frame, rejected = st.table.build([rec for _, rec in items])
        self._inherit(st)
        self._release(st, st.table.take_evicted(), self.stats.streams_evicted)
        st.levels.update(frame)
        self._expose(st.table, frame)
        view = NormView(part, frame, {k.name: k.view(frame)[2].copy() for k in _DEVICE_KINDS})
        dead = [DeadLetter(items[r.index][0], r.reason) for r in rejected if r.kind != "duplicate"]
        late = sum(r.kind == "late" for r in rejected)
        duplicate = sum(r.kind == "duplicate" for r in rejected)
        self.unknown_hw.extend(st.table.newly_unknown)
        st.table.newly_unknown.clear()
        found = self._detect(st, view)
        self._expire(part, st, frame)
        return found, view, dead, (late, duplicate, len(rejected) - late - duplicate)

    def _expose(self, table: StreamTable, frame: Frame) -> None:
        """Each pool's windows and request rate, its queue and latency at its minutes' peak
        load, and each serving pool layer's efficiency at them, for the advisor and the
        lifecycle (`core.exposure`); loops
        over (pool group, window) aggregates, not over records."""
        rate = frame.pool_device_load[:, 1].tolist()
        backlog = frame.pool_device_values[:, _BACKLOG_COLS].tolist()
        for gid, ts, load, lv in zip(frame.pool_device_rows.tolist(),
                                     frame.pool_device_ts.tolist(), rate, backlog,
                                     strict=True):  # fmt: skip
            pool, model = table.group_key(gid)[:2]
            self.advisor.exposure.observe(pool, ts, load)
            self.advisor.exposure.observe_backlog((pool, model), ts, load, tuple(lv))
        # Per-layer efficiency at each minute's peak load, of pools that report a request
        # rate (training pools have no bursts to compare).
        layer_rate = frame.pool_layer_load[:, 1]
        served = np.flatnonzero(np.isfinite(layer_rate))
        if not served.size:
            return
        levels = frame.pool_layer_values[np.ix_(served, _EFFICIENCY_COLS)].tolist()
        for gid, ts, load, lv in zip(frame.pool_layer_rows[served].tolist(),
                                     frame.pool_layer_ts[served].tolist(),
                                     layer_rate[served].tolist(), levels, strict=True):  # fmt: skip
            pool, model, layer, _hw = table.group_key(gid)
            self.advisor.exposure.observe_levels((pool, model, layer), ts, load, tuple(lv))

    def _decode(
        self, batch: list[RawMessage], out: Output, wall_ts: float | None,
        reports: list[RawMessage],
    ) -> dict[int, list[tuple[RawMessage, WindowRecord]]]:  # fmt: skip
        """Window records by input partition; change events go to the advisor, the fleet
        stage's reports (with `kafka.fleet_stage`) to `reports`."""
        samples: dict[int, list[tuple[RawMessage, WindowRecord]]] = {}
        changes_topic = self.settings.kafka.topics.changes
        points_topic = self.settings.kafka.topics.change_points if self.fleet else None
        limit = self.settings.limits.max_future_s
        # Window records are decoded as one batch (its checks across layers run over all of
        # them at once); dead letters still go out in message order.
        windows = iter(self.codec.decode_windows(
            [m.value for m in batch if m.topic not in (changes_topic, points_topic)]))  # fmt: skip
        for msg in batch:
            if msg.topic == points_topic:
                reports.append(msg)
                continue
            if msg.topic == changes_topic:
                try:
                    self.advisor.add_change(self.codec.decode_change(msg.value))
                except DecodeError as exc:
                    out.dead.append(DeadLetter(msg, exc.reason))
                    self.stats.records_rejected += 1
                    continue
                self.stats.changes_in += 1
                continue
            rec = next(windows)
            if isinstance(rec, DecodeError):
                out.dead.append(DeadLetter(msg, rec.reason))
                self.stats.records_rejected += 1
                continue
            if msg.key is not None and msg.key not in self._keys_of(rec):
                # On another device's partition it would pass for a new device there: wrong
                # pool sizes, scopes and severities. Keys are devices (pools when repartitioned).
                reason = (f"key: {msg.key[:64].decode(errors='replace')!r} is not the record's "
                          f"device {rec.device!r}")  # fmt: skip
                out.dead.append(DeadLetter(msg, reason))
                self.stats.records_rejected += 1
                continue
            if wall_ts is not None and rec.ts > wall_ts + limit:
                reason = (f"future: ts={rec.ts:.0f} is {rec.ts - wall_ts:.0f}s ahead of the wall "
                          f"clock (limits.max_future_s={limit:g})")  # fmt: skip
                out.dead.append(DeadLetter(msg, reason))
                self.stats.records_future += 1
                continue
            samples.setdefault(msg.partition, []).append((msg, rec))
        return samples

    def _keys_of(self, rec: WindowRecord) -> tuple[bytes, ...]:
        """The keys a window record may carry: its device, or its pool on the by-pool copy."""
        device = rec.device.encode()
        if self.settings.kafka.repartition and rec.pool:
            return (device, rec.pool.encode())
        return (device,)

    def _expire(self, part: int, st: PartitionState, frame: Frame) -> None:
        """Advance the partition's event time; expire silent streams now and then."""
        if not frame.device_ts.size:
            return
        part_ts = max(self.partition_ts.get(part, 0.0), float(frame.device_ts.max()))
        self.partition_ts[part] = part_ts
        if part_ts - st.expired_at > st.table.ttl_s / 4:
            self._release(st, st.table.expire(part_ts), self.stats.streams_expired)
            st.expired_at = part_ts

    @staticmethod
    def _inherit(st: PartitionState) -> None:
        """A new model version's device-level groups start from the load response its
        pool's previous version learned on the same hardware: how device MFU, power,
        queueing and latency follow load is the serving system's (batching, saturation),
        and a deploy keeps it until its own windows say otherwise. Started blank, it is
        fitted to a few windows at one load and misreads the next load change (a burst
        ending right after a no-op deploy read as a 20 % device-MFU drop). Per-layer
        efficiency is the model's own: a new version's is learned afresh.

        The pool's device-level aggregate goes on from its predecessor's detector too, as
        each device's own streams do across a deploy: started blank, it would spend its
        burn-in on the deploy's first windows, and a release that fails requests (one or
        two a window per device, which a device's detector finds late) would show on no
        aggregate."""
        pairs = [(old, new) for new in st.table.take_created()
                 if (old := st.table.predecessor(new)) is not None]  # fmt: skip
        if not pairs:
            return
        src = np.array([a for a, _ in pairs], dtype=np.int64)
        dst = np.array([b for _, b in pairs], dtype=np.int64)
        for adjuster in st.adjusters.values():
            if adjuster is not None:
                adjuster.inherit(src, dst)
        copy_rows = getattr(st.detectors[_POOL_DEVICE], "copy_rows", None)
        if copy_rows is not None:  # a detector kind that can carry a stream over
            copy_rows(src, dst)

    @staticmethod
    def _release(st: PartitionState, released: Released, counts: Counter[str]) -> None:
        """Reset the detector and load-model state of rows the table let go of (before
        they are reused), and count them by kind."""
        if not released:
            return
        for kind in STREAM_KINDS:
            st.detectors[kind.name].forget(released.rows_of(kind))
            st.excursions.forget(kind.name, released.rows_of(kind))
            adjuster = st.adjusters[kind.name]
            if adjuster is not None:  # load models are per group, saturation per stream
                adjuster.forget(released.groups)
                adjuster.forget_streams(released.rows_of(kind))
        st.levels.forget(released.groups)
        counts["device"] += released.device_rows.size
        counts["layer"] += released.layer_rows.size
        counts["group"] += released.groups.size

    def _correlate(self, points: list[ChangePoint], views: list[NormView], out: Output) -> None:
        """Change points into incidents, and the alerts that are due."""
        now = self.watermark()
        counts = self.pool_counts() if points or self.correlator.incidents else {}
        self.correlator.add(points, now, counts)
        self.lifecycle.note_steps(points, self.correlator.incidents)
        open_incidents = [i for i in self.correlator.incidents if i.status == "open"]
        if open_incidents:
            out.alerts.extend(self.lifecycle.due(open_incidents, now, counts, self.host_sizes()))
            out.alerts.extend(self.lifecycle.observe(open_incidents, views, counts, now))
            self._hold_load_models(out.alerts)
        self.correlator.drop_resolved(now, keep_s=4 * self.settings.alerts.group_window_s)
        self.lifecycle.keep({i.alert_id for i in self.correlator.incidents if i.alert_id})
        self.advisor.prune(now)

    def _hold_load_models(self, alerts: list[Alert]) -> None:
        """Freeze the load models of the metrics an incident regressed, in its groups, in
        every partition, while it fires; thaw them on resolve.

        The one deliberate feedback edge from alerts back to detection: otherwise the
        expectation slowly learns the regressed level as "normal for this load", the
        ratio drifts back to 1 and the incident looks fixed when it is not. Only the
        incident's own metrics hold: a frozen model judges against the time before the
        incident, and the group's other metrics, frozen with them, would go stale for as
        long as it fires (hours) and page on the load moving away from it.
        """
        for alert in alerts:
            inc = next((i for i in self.correlator.incidents if i.alert_id == alert.id), None)
            if inc is None:
                continue
            keys = _held_metrics(inc)
            if alert.status == "firing":
                self._hold(keys, hold=True)
                continue
            # A resolve thaws the whole group: a checkpoint from a version that froze every
            # column would otherwise keep the others frozen for good. What another incident
            # of the group still firing holds stays held: one incident's fix is not the
            # group's (an overload record resolving must not let the model learn another
            # incident's regressed level, or a change landing on it, as normal).
            self._hold(keys, hold=False)
            for other in self.correlator.incidents:
                if other is inc or not other.paging:
                    continue
                held = _held_metrics(other)
                self._hold({k: m for k, m in held.items() if k in keys}, hold=True)

    def _hold(self, keys: HeldMetrics, *, hold: bool) -> None:
        """Freeze (`hold`) these groups' models of these metrics, or thaw the groups whole."""
        # Every partition's copy of the group holds, not only those whose devices were
        # found so far: the pool's devices not yet found would otherwise learn the
        # regressed level as normal and never show it.
        for st in self.partitions.values():
            for (pool, model, layer), metrics in keys.items():
                # A device-level metric: both device-level families of its pool
                # (per-layer and `all`-only devices) hold, whichever its device is in.
                gids = [st.table.gids_of(pool, model, lay)
                        for lay in ((layer,) if layer else DEVICE_GROUPS)]  # fmt: skip
                arr = np.array(sorted(set().union(*gids)), dtype=np.int64)
                for adjuster in st.adjusters.values():
                    if adjuster is not None:
                        adjuster.hold(arr, hold=hold, metrics=metrics if hold else None)

    # -- checkpoints and hand-over (the payloads: `core.state`) -------------------------
    def snapshot_partition(self, partition: int) -> bytes:
        """One input partition's state (streams, detectors, load models) as bytes, with the
        open incidents it owns, which travel with it to its next owner.

        Restoring it and then feeding the records after the last one processed gives
        the same detections as never having stopped (resume *after* the last offset).
        """
        return snapshot_partition(
            self._partition(partition), self.partition_ts.get(partition),
            self._owned(partition), self.lifecycle.states,
        )  # fmt: skip

    def restore_partition(self, partition: int, blob: bytes) -> dict[str, str]:
        """Take over a partition from its checkpoint (StateVersionError: another version's).

        The detectors come back under the configured kind and parameters (a raised `h`
        applies after a restart); returns each one's outcome, kept, retuned or reset.
        """
        st, snap, outcomes = restore_partition(blob, self.settings, self.catalog)
        self.partitions[partition] = st
        self.stats.detector_restores.update(outcomes.values())
        if snap.partition_ts is not None:
            self.partition_ts[partition] = snap.partition_ts
        self._adopt(incidents_of(snap.incidents), snap.alerts)
        return outcomes

    def forget_partition(self, partition: int) -> list[str]:
        """Drop a partition this member no longer holds, and the incidents it owns."""
        ids = self.hand_over(partition)
        self.partitions.pop(partition, None)
        self.partition_ts.pop(partition, None)
        return ids

    def _owned(self, partition: int) -> list[Incident]:
        """Open top-level incidents owned by this partition (their lowest point partition)."""
        return [
            i
            for i in self.correlator.incidents
            if i.status == "open" and i.parent is None and owner_partition(i) == partition
        ]

    def _adopt(self, incidents: list[Incident], alerts: dict[str, AlertState]) -> None:
        """Take over incidents from a checkpoint (a rebalance or a restart); the first
        batch then sends those that paged once more (`lifecycle.restate`)."""
        known = {incident_key(i) for i in self.correlator.incidents}
        for inc in incidents:
            if inc.parent is not None or incident_key(inc) in known:
                continue
            for member in (inc, *inc.children):  # fleet children are listed on their own
                member.group_window_s = self.settings.alerts.group_window_s
                self.correlator.incidents.append(member)
            if inc.alert_id is not None and inc.alert_id in alerts:
                self.lifecycle.states[inc.alert_id] = alerts[inc.alert_id]
            if inc.alert_id is not None:
                self._restored_ids.add(inc.alert_id)
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
        self.lifecycle.forget(set(out))
        self.handed_over.extend(out)
        return out

    def snapshot_incidents(self) -> bytes:
        """Incidents, recent evidence and known change events (the cross-partition state)."""
        return encode(
            IncidentsSnapshot(
                STATE_VERSION,
                incident_records(self.correlator.incidents),
                self.correlator.recent,
                self.advisor.changes,
                self.lifecycle.states,
            )
        )

    def restore_incidents(self, blob: bytes) -> None:
        """Restore what `snapshot_incidents` saved, under the configured windows."""
        snap = decode(blob, IncidentsSnapshot)
        adopted = self.correlator.incidents  # from partition checkpoints restored just before
        self.correlator = Correlator(self.settings.alerts.group_window_s)
        self.correlator.new_cause = self.advisor.new_cause
        self.correlator.incidents = incidents_of(snap.incidents)
        self.correlator.recent = list(snap.recent)
        known = {incident_key(i) for i in self.correlator.incidents}
        self.correlator.incidents.extend(i for i in adopted if incident_key(i) not in known)
        self.advisor.restore(list(snap.changes))
        self.lifecycle.states = {**self.lifecycle.states, **snap.alerts}
        self._to_restate = list(self.correlator.incidents)
        self._restored_ids |= {i.alert_id for i in self._to_restate if i.alert_id is not None}

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
        for kind in STREAM_KINDS:
            found.extend(self._detect_kind(st, view, kind))
        frame = view.frame
        if frame.kernel_changes:
            self.stats.points["layer", "kernel", True] += len(frame.kernel_changes)
        for row, k_ts, _old, _new in frame.kernel_changes:
            name, layer_type = st.table.device_of_layer_row(row)
            dev = st.table.devices[name]
            found.append(ChangePoint(
                name, dev.host, dev.pool, dev.model, layer_type, "kernel", "lowering",
                onset_ts=k_ts - dev.window_s, detected_ts=k_ts, before=0.0, after=1.0, score=1.0,
                window_s=dev.window_s, row=row, partition=view.partition,
            ))  # fmt: skip
        return found

    def _detect_kind(
        self, st: PartitionState, view: NormView, kind: StreamKind
    ) -> list[ChangePoint]:
        """One stream kind's waves through its load adjuster and detector."""
        found: list[ChangePoint] = []
        rows, ts, values, groups, load = kind.view(view.frame)
        detector, adjuster = st.detectors[kind.name], st.adjusters[kind.name]
        norm = view.norm.get(kind.name)
        for wave in Frame.waves(rows):
            vals = values[wave]
            scale = None
            if adjuster is not None:
                withheld = adjuster.extrapolated
                vals, scale = adjuster.adjust(groups[wave], load[wave], vals, rows[wave])
                self.stats.load_extrapolated += adjuster.extrapolated - withheld
                if norm is not None:
                    norm[wave] = vals
            # Families for warm starts: (pool, model, layer) for device streams; a pool
            # aggregate is its family's only stream.
            fam = None if kind.aggregate else groups[wave]
            det = _update(detector, rows[wave], ts[wave], vals, fam, _COMPLEMENT_COLS[kind.columns])
            if not len(det):
                continue
            levels = det if scale is None else _rescale(det, rows[wave], scale)
            part, adjusted = view.partition, scale is not None
            since = None
            if adjusted:
                since = self._returns(st, kind, det, rows[wave], load[wave])
            found.extend(self._points(st.table, levels, det, part, kind, since=since))
        for outcome, n in detector.drain_stats().items():
            if n:
                self.stats.alarms[kind.name, outcome] += n
        for outcome, n in detector.drain_warm_starts().items():
            if n:
                self.stats.warm_starts[kind.name, outcome] += n
        return found

    def _returns(
        self, st: PartitionState, kind: StreamKind, norm: Detections, wave_rows: I64, load: F64
    ) -> F64:
        """Per detection of a load-normalised wave: the onset of the excursion it is the
        return from (`core.excursions`), NaN where it is none."""
        names = kind.columns
        sign = np.array(
            [BAD_DIRECTION.get(names[c], 0) if names[c] in LOAD_SENSITIVE else 0
             for c in norm.cols.tolist()], dtype=np.float64,
        )  # fmt: skip
        pos = _wave_pos(wave_rows, norm.rows)
        rel = self._floors[names][1][norm.cols]
        return st.excursions.returns(
            kind.name, norm.rows, norm.cols, norm.before, norm.after, sign, load[pos],
            norm.onset_ts, rel, SERVED_RISE,
        )  # fmt: skip

    def _points(
        self, table: StreamTable, det: Detections, norm: Detections, partition: int,
        kind: StreamKind, *, since: F64 | None = None,
    ) -> list[ChangePoint]:  # fmt: skip
        """Change points with metadata; `det` in metric units, `norm` in the detector's.

        `since` (load-normalised kinds): per detection, the onset of the excursion it
        returns from (NaN: none); such a return is no regression unless a change that
        could cause it landed during the excursion."""
        adjusted = since is not None
        names = kind.columns
        floor_abs, floor_rel = self._floors[names]
        floor, rel = floor_abs[det.cols], floor_rel[det.cols]
        shift = np.abs(det.after - det.before)
        complement = np.array([names[c] in COMPLEMENT for c in det.cols.tolist()], dtype=bool)
        base = np.where(complement, 1.0 - det.before, det.before)  # the error rate, for quality
        material = (shift >= floor) & (shift >= rel * np.abs(base))
        if adjusted:
            metrics = [names[c] for c in det.cols.tolist()]
            material &= ~back_to_expected(metrics, det.before, det.after, norm.after, rel)
        out: list[ChangePoint] = []
        window_s = next(iter(table.devices.values())).window_s if table.devices else 10.0
        first_bad = det.first_bad(0.0)  # the onset itself where not kept
        for i in np.flatnonzero(material):
            row = int(det.rows[i])
            metric = names[int(det.cols[i])]
            if kind.aggregate:
                pool, model, group_layer, _hw = table.group_key(row)
                device, host, layer, win = (
                    AGGREGATE + (pool or ""),
                    None,
                    None if group_layer in DEVICE_GROUPS else group_layer,
                    window_s,
                )
                fields = -1
                members = table.members(row, device_level=kind.columns != LAYER_METRICS)
            else:
                if kind.columns == LAYER_METRICS:
                    device, layer = table.device_of_layer_row(row)
                else:
                    maybe = table.device_names[row]
                    if maybe is None:
                        continue
                    device, layer = maybe, None
                dev = table.devices[device]
                pool, model, host, win = dev.pool, dev.model, dev.host, dev.window_s
                known = table.fields_of(device)
                fields = -1 if known is None else known
                members = 0
            p = ChangePoint(
                device=device, host=host, pool=pool, model=model, layer=layer, metric=metric,
                stage=stage_of(metric, layer, STAGE_OF[metric]), onset_ts=float(det.onset_ts[i]),
                detected_ts=float(det.detected_ts[i]), before=float(det.before[i]),
                after=float(det.after[i]), score=float(np.round(det.score[i], 6)),
                window_s=win, row=row, partition=partition,
                norm_before=float(norm.before[i]), norm_after=float(norm.after[i]),
                fields=fields, members=members,
                onset_late=max(float(det.onset_ts[i]), float(first_bad[i]) - win),
            )  # fmt: skip
            if p.onset_late > p.onset_ts + win:
                # Dated across a gap (windows unseen, or withheld: a saturated queue), the
                # shift began anywhere in it; a change that could cause it and landed in it
                # dates it, where the samples cannot.
                landed = self.advisor.last_landed_on(p, p.onset_ts, p.onset_late + win)
                if landed is not None:
                    p = replace(p, onset_ts=landed, onset_late=max(landed, p.onset_late))
            # A return to the level left when the load went away, unless a change that
            # could cause it landed since it went away.
            left = np.nan if since is None else float(since[i])
            if np.isfinite(left) and not self.advisor.landed_on(p, left, p.latest_onset + win):
                material[i] = False
                continue
            out.append(p)
        for col, mat in zip(det.cols.tolist(), material.tolist(), strict=True):
            self.stats.points[kind.name, names[col], mat] += 1
        return out


# Change points per fleet report: about 300 bytes each in msgpack, so a report stays near
# 300 kB, under Kafka's default 1 MiB `max.message.bytes`.
REPORT_POINTS = 1000
_DEVICE_KINDS = tuple(k for k in STREAM_KINDS if not k.aggregate)
_POOL_DEVICE = next(k.name for k in STREAM_KINDS if k.aggregate and k.columns == DEVICE_METRICS)
_EFFICIENCY_COLS = np.array([LAYER_METRICS.index(m) for m in EFFICIENCY], dtype=np.int64)
_BACKLOG_COLS = np.array([DEVICE_METRICS.index(m) for m in BACKLOG_LEVELS], dtype=np.int64)
# Per column set: the columns judged on their complement (`indicators.COMPLEMENT`).
_COMPLEMENT_COLS = {
    k.columns: np.array([i for i, m in enumerate(k.columns) if m in COMPLEMENT], dtype=np.int64)
    for k in STREAM_KINDS
}


# Load-model holds: by (pool, model, layer) group, the metrics held.
HeldMetrics = dict[tuple[str | None, str | None, str | None], set[str]]


def _held_metrics(inc: Incident) -> HeldMetrics:
    """The metrics an incident (with its fleet children) regressed, by (pool, model, layer)."""
    keys: HeldMetrics = {}
    for p in (q for m in (inc, *inc.children) for q in m.primary_points()):
        keys.setdefault((p.pool, p.model, p.layer), set()).add(p.metric)
    return keys


def _update(
    detector: Detector, rows: I64, ts: F64, vals: F64, fam: I64 | None, comp: I64
) -> Detections:
    """One wave through a detector, complement columns (`indicators.COMPLEMENT`) as their
    error rate: the detector's scale and effect floors are relative to the level, and 1 %
    of 0.999 would hide a tenfold error rate. Levels come back on the metric's scale."""
    if not comp.size:
        return detector.update(rows, ts, vals, fam)
    vals = vals.copy()
    vals[:, comp] = 1.0 - vals[:, comp]
    det = detector.update(rows, ts, vals, fam)
    flip = np.isin(det.cols, comp)
    if not flip.any():
        return det
    before = np.where(flip, 1.0 - det.before, det.before)
    after = np.where(flip, 1.0 - det.after, det.after)
    return replace(det, before=before, after=after)


def _wave_pos(wave_rows: I64, rows: I64) -> I64:
    """Each of `rows`' position in a wave (a wave's rows are unique)."""
    order = np.argsort(wave_rows)
    pos: I64 = order[np.searchsorted(wave_rows[order], rows)]
    return pos


def _rescale(det: Detections, wave_rows: I64, expected: F64) -> Detections:
    """Ratios back to levels at the current load, so alerts speak in MFU, not ratios."""
    k = expected[_wave_pos(wave_rows, det.rows), det.cols]
    k = np.where(np.isfinite(k), k, 1.0)
    return replace(det, before=det.before * k, after=det.after * k)

"""Prometheus metrics of the daemon itself, read from live objects at scrape time.

The hot path keeps plain counters (the pipeline's `stats`, the runner's
`rejected` / `sent`, the checkpointer's `stats`) and never calls into
prometheus_client; `DaemonCollector` turns them into samples when /metrics is
scraped. The registry is passed in, never the process-wide default, so tests and
embedded uses get their own.

(`monitor/indicators.py` is something else: the derived telemetry metrics, MFU and
friends, that the detectors watch.)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from monitor import __version__
from monitor.core.levels import combine
from monitor.daemon.runner import Runner, sink_name
from monitor.sinks.base import Sink
from monitor.sinks.queue import DeliveryQueue

if TYPE_CHECKING:
    from monitor.checkpoint import Checkpointer
    from monitor.core.pipeline import Pipeline
    from monitor.core.state import PartitionState
    from monitor.daemon.repartition import Repartitioner
    from monitor.sources.kafka import KafkaSource


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _by_stream_outcome(
    name: str, doc: str, counts: Mapping[tuple[str, str], int]
) -> CounterMetricFamily:
    """A counter labelled by stream kind and outcome, from (stream, outcome) counts."""
    family = CounterMetricFamily(name, doc, labels=["stream", "outcome"])
    for (stream, outcome), n in sorted(counts.items()):
        family.add_metric([stream, outcome], n)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _array_bytes(obj: object) -> int:
    """Bytes of the numpy arrays an object holds directly (its detector or model state)."""
    total = 0
    for v in getattr(obj, "__dict__", {}).values():
        if isinstance(v, np.ndarray):
            total += v.nbytes
        elif isinstance(v, list | tuple):
            total += sum(x.nbytes for x in v if isinstance(x, np.ndarray))
    return total


def _state_bytes(st: PartitionState) -> int:
    parts = (*st.detectors.values(), *st.adjusters.values())
    return sum(_array_bytes(p) for p in parts if p is not None)


class DaemonCollector(Collector):
    """Samples of the runner, pipeline, Kafka source and checkpointer, built per scrape."""

    def __init__(
        self,
        runner: Runner,
        source: KafkaSource | None = None,
        checkpointer: Checkpointer | None = None,
        ready: Callable[[], bool] | None = None,
        repartitioner: Repartitioner | None = None,
    ) -> None:
        self.runner = runner
        self.source = source
        self.checkpointer = checkpointer
        self.ready = ready
        self.repartitioner = repartitioner

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: names are checked per scrape, and collecting at registration
        would read state that does not exist yet."""
        return []

    def collect(self) -> Iterator[Metric]:
        """All flopwatch_* samples, from the objects' current state."""
        info = GaugeMetricFamily("flopwatch_build_info", "Version of this flopwatch.",
                                 labels=["version"])  # fmt: skip
        info.add_metric([__version__], 1.0)
        yield info
        if self.ready is not None:
            yield _gauge("flopwatch_ready", "1 once partitions are assigned, restored and polled.",
                         1.0 if self.ready() else 0.0)  # fmt: skip
        yield from self._pipeline(self.runner.pipeline)
        yield from self._runner()
        if self.source is not None:
            yield from self._kafka(self.source)
        if self.checkpointer is not None:
            yield from self._checkpoints(self.checkpointer)
        if self.repartitioner is not None:
            yield from self._repartition(self.repartitioner)

    def _repartition(self, rep: Repartitioner) -> Iterator[Metric]:
        records = CounterMetricFamily(
            "flopwatch_repartition_records_total",
            "Samples copied to the by-pool topic; keyed=false: the pool could not be read, "
            "the record kept its key (the decoder dead-letters it).",
            labels=["keyed"],
        )
        records.add_metric(["true"], rep.copied - rep.unkeyed)
        records.add_metric(["false"], rep.unkeyed)
        yield records
        lag = GaugeMetricFamily(
            "flopwatch_repartition_lag_records",
            "Samples not yet copied: the high watermark less the copy stage's position, per "
            "partition of the samples topic.",
            labels=["topic", "partition"],
        )
        for tp in sorted(rep.consumer.assignment()):
            high = rep.consumer.highwater(tp)
            if high is not None and tp in rep.delivered:
                lag.add_metric([tp.topic, str(tp.partition)], high - rep.delivered[tp])
        yield lag

    def _pipeline(self, p: Pipeline) -> Iterator[Metric]:
        c = p.stats
        records = CounterMetricFamily(
            "flopwatch_records_total",
            "Window records by outcome: accepted, duplicate and late (decoded but dropped), "
            "invalid (failed validation), future (dated beyond limits.max_future_s), capacity "
            "(new streams beyond a partition's caps, none left to evict).",
            labels=["outcome"],
        )
        for outcome, n in (("accepted", c.records_in), ("duplicate", c.records_duplicate),
                           ("late", c.records_late), ("invalid", c.records_rejected),
                           ("future", c.records_future),
                           ("capacity", c.records_capacity)):  # fmt: skip
            records.add_metric([outcome], n)
        yield records
        yield _counter("flopwatch_change_events_total", "Change events read.", c.changes_in)
        yield _counter("flopwatch_internal_errors_total", "Bugs caught at a record (dead-"
                       "lettered as internal) or a batch instead of stopping the daemon; logged.",
                       c.internal_errors)  # fmt: skip
        points = CounterMetricFamily(
            "flopwatch_change_points_total",
            "Change points found, by stream kind (layer, device, pool_layer, pool_device) and "
            "metric; material=false ones were below the metric's minimum shift.",
            labels=["stream", "metric", "material"],
        )
        for (stream, metric, material), n in sorted(c.points.items()):
            points.add_metric([stream, metric, "true" if material else "false"], n)
        yield points
        yield _by_stream_outcome(
            "flopwatch_detector_alarms_total",
            "Detector alarms by stream kind and outcome: reported (a change point), vetoed "
            "(a burst of spread, not a level shift) or below_min_change (re-baselined "
            "silently under detector.params.min_rel_change).",
            c.alarms,
        )
        yield _by_stream_outcome(
            "flopwatch_detector_warm_starts_total",
            "Streams that finished burn-in under detector.params.warm_start, by stream kind "
            "and outcome: borrowed (their family's AR estimates), own (they disagreed with "
            "their family), no_donor (too few mature streams in their family) or withdrawn "
            "(borrowers whose own samples later showed them more persistent).",
            c.warm_starts,
        )
        restores = CounterMetricFamily(
            "flopwatch_detector_restores_total",
            "Detectors restored from a checkpoint, by outcome: kept (written with the "
            "configured parameters), retuned (state kept, configured parameters applied) or "
            "reset (another kind or state shape: started fresh).",
            labels=["outcome"],
        )
        for outcome in ("kept", "retuned", "reset"):
            restores.add_metric([outcome], c.detector_restores[outcome])
        yield restores
        yield _counter(
            "flopwatch_load_extrapolated_total",
            "Samples withheld from detection because the load model had too little data at "
            "their load (e.g. a pool's first burst); see detector.load_min_support.",
            c.load_extrapolated,
        )
        yield _counter("flopwatch_alert_records_total", "Alert records produced (firing, "
                       "updates and resolutions).", c.alerts_out)  # fmt: skip

        incidents = GaugeMetricFamily(
            "flopwatch_incidents_open",
            "Open incidents; paged=false ones are not corroborated yet. scope is the scope of "
            "the last alert sent (empty before the first).",
            labels=["paged", "scope"],
        )
        sent = p.lifecycle.states
        open_by: Counter[tuple[str, str]] = Counter(
            ("true" if i.alert_id else "false",
             (a.level or "") if (a := sent.get(i.alert_id or "")) else "")
            for i in p.correlator.incidents
            if i.status == "open"
        )  # fmt: skip
        if p.fleet is not None:  # the fleet stage's alerts (on the member that runs it)
            open_by["true", "fleet"] += sum(i.paging for i in p.fleet.correlator.incidents)
        for (paged, scope), n in sorted(open_by.items()):
            incidents.add_metric([paged, scope], n)
        yield incidents
        yield from self._fleet_reports(p)

        streams = GaugeMetricFamily(
            "flopwatch_streams", "Streams tracked, by kind (device, layer, pool group).",
            labels=["kind"],
        )  # fmt: skip
        tables = [st.table for st in p.partitions.values()]
        streams.add_metric(["device"], sum(len(t.devices) for t in tables))
        streams.add_metric(["layer"], sum(len(t.layer_index) for t in tables))
        streams.add_metric(["group"], sum(len(t.groups) for t in tables))
        yield streams
        yield from self._stream_limits(p)
        yield from self._pool_levels(p)

        memory = GaugeMetricFamily(
            "flopwatch_detector_state_bytes",
            "Bytes of numpy state held by the detectors and load models, per input partition.",
            labels=["partition"],
        )
        event_time = GaugeMetricFamily(
            "flopwatch_partition_event_time_seconds",
            "Newest event time seen per input partition (Unix seconds).",
            labels=["partition"],
        )
        lag = GaugeMetricFamily(
            "flopwatch_partition_event_time_lag_seconds",
            "How far each partition's event time is behind the newest partition's.",
            labels=["partition"],
        )
        for part, st in sorted(p.partitions.items()):
            memory.add_metric([str(part)], _state_bytes(st))
        newest = max(p.partition_ts.values(), default=0.0)
        for part, ts in sorted(p.partition_ts.items()):
            event_time.add_metric([str(part)], ts)
            lag.add_metric([str(part)], newest - ts)
        yield memory
        yield event_time
        yield lag
        yield _gauge("flopwatch_watermark_seconds", "Event time all active partitions reached.",
                     p.watermark())  # fmt: skip

    @staticmethod
    def _pool_levels(p: Pipeline) -> Iterator[Metric]:
        """The newest pool-aggregate MFU and stall per (pool, layer type): one series per
        pair, however many devices, models and partitions are behind it."""
        labels = ["pool", "layer"]
        mfu = GaugeMetricFamily(
            "flopwatch_pool_mfu_ratio",
            "Newest window's MFU of a pool's layer type (sum of flops over peak / sum of busy "
            "seconds per input partition, averaged over partitions and models by devices).",
            labels=labels,
        )
        stall = GaugeMetricFamily(
            "flopwatch_pool_stall_ratio",
            "Newest window's memory-stall fraction of a pool's layer type (as the MFU gauge).",
            labels=labels,
        )
        devices = GaugeMetricFamily(
            "flopwatch_pool_devices",
            "Devices in the newest window behind the pool gauges, per pool and layer type.",
            labels=labels,
        )
        parts = ((st.table, st.levels) for st in p.partitions.values())
        for (pool, layer), (m, s, n) in combine(parts).items():
            if not math.isnan(m):
                mfu.add_metric([pool, layer], m)
            if not math.isnan(s):
                stall.add_metric([pool, layer], s)
            devices.add_metric([pool, layer], n)
        yield mfu
        yield stall
        yield devices

    @staticmethod
    def _fleet_reports(p: Pipeline) -> Iterator[Metric]:
        if p.fleet is None:
            return
        reports = CounterMetricFamily(
            "flopwatch_fleet_reports",
            "Change-point reports the fleet stage read (kafka.fleet_stage), by outcome; "
            "only the member holding the change-point partition reads any.",
            labels=["outcome"],
        )
        reports.add_metric(["taken"], p.fleet.reports)
        reports.add_metric(["rejected"], p.fleet.rejected)
        yield reports

    @staticmethod
    def _stream_limits(p: Pipeline) -> Iterator[Metric]:
        """Streams per partition against their caps, and what the caps and TTL let go of."""
        lim = p.settings.limits
        caps = GaugeMetricFamily(
            "flopwatch_streams_limit",
            "Cap on streams per input partition, by kind (limits.max_devices, max_streams, "
            "max_groups); at the cap the least recently seen are evicted.",
            labels=["kind"],
        )
        for kind, cap in (("device", lim.max_devices), ("layer", lim.max_streams),
                          ("group", lim.max_groups)):  # fmt: skip
            caps.add_metric([kind], cap)
        yield caps
        per_part = GaugeMetricFamily(
            "flopwatch_partition_streams",
            "Streams tracked per input partition, by kind (compare with flopwatch_streams_limit).",
            labels=["partition", "kind"],
        )
        for part, st in sorted(p.partitions.items()):
            t = st.table
            for kind, n in (("device", len(t.devices)), ("layer", len(t.layer_index)),
                            ("group", len(t.groups))):  # fmt: skip
                per_part.add_metric([str(part), kind], n)
        yield per_part
        for name, doc, counts in (
            ("flopwatch_streams_evicted_total", "Streams evicted at a partition's cap, by kind "
             "(a device's layer streams go with it; a device back later starts afresh).",
             p.stats.streams_evicted),
            ("flopwatch_streams_expired_total", "Streams and groups expired after "
             "detector.stream_ttl_s of silence, by kind.", p.stats.streams_expired),
        ):  # fmt: skip
            family = CounterMetricFamily(name, doc, labels=["kind"])
            for kind in ("device", "layer", "group"):
                family.add_metric([kind], counts[kind])
            yield family

    def _runner(self) -> Iterator[Metric]:
        r = self.runner
        dead = CounterMetricFamily(
            "flopwatch_dead_letters_total",
            "Rejected records sent to the dead-letter topic, by reason (field path or kind).",
            labels=["reason"],
        )
        for reason, n in sorted(r.rejected.items()):
            dead.add_metric([reason], n)
        yield dead
        sent = CounterMetricFamily("flopwatch_alerts_sent_total",
                                   "Alert records each sink took (the HTTP sinks: queued).",
                                   labels=["sink", "status"])  # fmt: skip
        for (sink, status), n in sorted(r.sent.items()):
            sent.add_metric([sink, status], n)
        yield sent
        errors = CounterMetricFamily("flopwatch_sink_errors_total",
                                     "Failed sends per sink (each is retried with back-off).",
                                     labels=["sink"])  # fmt: skip
        for sink, n in sorted(r.send_errors.items()):
            errors.add_metric([sink], n)
        yield errors
        failing = GaugeMetricFamily(
            "flopwatch_sink_failing_seconds",
            "How long each failing sink has failed (absent while it delivers); /readyz "
            "fails past sinks.retry_budget_s.",
            labels=["sink"],
        )
        for sink, secs in sorted(r.sink_failing().items()):
            failing.add_metric([sink], secs)
        yield failing
        unrendered = CounterMetricFamily(
            "flopwatch_alerts_unrendered_total",
            "Alert records a sink could not render (logged with the alert id and skipped).",
            labels=["sink"],
        )
        for s in r.sinks:
            failed = getattr(s, "failed_alerts", None)
            if isinstance(failed, int):
                unrendered.add_metric([sink_name(s)], failed)
        yield unrendered
        yield from _queues(r.sinks)
        firing = GaugeMetricFamily(
            "flopwatch_alerts_firing",
            "Alerts whose last record sent by this process was firing.",
            labels=["severity", "scope"],
        )
        for (severity, scope), n in sorted(Counter(r.firing.values()).items()):
            firing.add_metric([severity, scope], n)
        yield firing

    def _kafka(self, source: KafkaSource) -> Iterator[Metric]:
        consumer = source.consumer
        assigned = consumer.assignment()
        delivered = source.delivered()
        lag = GaugeMetricFamily(
            "flopwatch_consumer_lag_records",
            "Records between the broker's high watermark and what was delivered, per partition "
            "(absent until a fetch reported the high watermark; negative: the log was "
            "truncated or reset under the consumer).",
            labels=["topic", "partition"],
        )
        parts: Counter[str] = Counter(tp.topic for tp in assigned)
        for tp in sorted(assigned):
            high = consumer.highwater(tp)
            if high is not None and tp in delivered:
                # Not clamped: below zero the log was truncated or reset under the consumer.
                lag.add_metric([tp.topic, str(tp.partition)], high - delivered[tp])
        yield lag
        count = GaugeMetricFamily("flopwatch_assigned_partitions",
                                  "Partitions assigned to this member.",
                                  labels=["topic"])  # fmt: skip
        for topic, n in sorted(parts.items()):
            count.add_metric([topic], n)
        yield count

    def _checkpoints(self, cp: Checkpointer) -> Iterator[Metric]:
        s = cp.stats
        now = cp.clock()
        yield _counter("flopwatch_checkpoint_writes_total", "Checkpoints stored.", s.writes)
        yield _counter("flopwatch_checkpoint_write_failures_total",
                       "Checkpoint writes that failed (the previous one stays).",
                       s.write_failures)  # fmt: skip
        yield _counter("flopwatch_checkpoint_written_bytes_total",
                       "Compressed checkpoint bytes stored.", s.bytes_written)  # fmt: skip
        restores = CounterMetricFamily("flopwatch_checkpoint_restores_total",
                                       "State restored from checkpoints.",
                                       labels=["kind"])  # fmt: skip
        restores.add_metric(["partition"], s.restores)
        restores.add_metric(["incidents"], s.incident_restores)
        yield restores
        yield _counter("flopwatch_checkpoint_restore_failures_total",
                       "Checkpoints found but unusable (an older one or fresh state was used).",
                       s.restore_failures)  # fmt: skip
        yield _counter("flopwatch_checkpoint_version_mismatches_total",
                       "Checkpoints written by another state version, not restored (the "
                       "partition started fresh or from an older checkpoint).",
                       s.version_mismatches)  # fmt: skip
        yield _counter("flopwatch_checkpoint_corrupt_records_total",
                       "State-topic records skipped as corrupt or torn.",
                       cp.store.rejected)  # fmt: skip
        age = GaugeMetricFamily(
            "flopwatch_checkpoint_age_seconds",
            "Seconds since each partition's stored state was last current.",
            labels=["partition"],
        )
        size = GaugeMetricFamily("flopwatch_checkpoint_bytes",
                                 "Compressed size of each partition's newest checkpoint.",
                                 labels=["partition"])  # fmt: skip
        for part, at in sorted(s.saved_at.items()):
            age.add_metric([str(part)], max(0.0, now - at))
        for part, n in sorted(s.stored_bytes.items()):
            size.add_metric([str(part)], n)
        yield age
        yield size
        yield _gauge("flopwatch_checkpoint_write_duration_seconds",
                     "Wall time of the last checkpoint round.", s.last_write_s)  # fmt: skip
        yield _gauge("flopwatch_checkpoint_restore_duration_seconds",
                     "Wall time of the last restore.", s.last_restore_s)  # fmt: skip


def register_metrics(
    registry: CollectorRegistry,
    runner: Runner,
    source: KafkaSource | None = None,
    checkpointer: Checkpointer | None = None,
    ready: Callable[[], bool] | None = None,
    repartitioner: Repartitioner | None = None,
) -> CollectorRegistry:
    """Add the daemon's collector and the standard process metrics to `registry`."""
    registry.register(DaemonCollector(runner, source, checkpointer, ready, repartitioner))
    ProcessCollector(registry=registry)
    return registry


def _queues(sinks: Sequence[Sink]) -> Iterator[Metric]:
    """The HTTP sinks' delivery queues (an Alertmanager sink has one per instance)."""
    depth = GaugeMetricFamily("flopwatch_sink_queue_depth",
                              "Alert states queued for delivery, per sink.",
                              labels=["sink"])  # fmt: skip
    dropped = CounterMetricFamily("flopwatch_sink_dropped_total",
                                  "Firing states dropped from a full queue (sinks.*.queue_max; "
                                  "ends are never dropped).", labels=["sink"])  # fmt: skip
    rejected = CounterMetricFamily("flopwatch_sink_rejected_total",
                                   "Deliveries the receiver refused for good (HTTP 4xx but "
                                   "408/429), not retried.", labels=["sink"])  # fmt: skip
    for s in sinks:
        queues = [q for q in (getattr(s, "queue", None), *getattr(s, "queues", {}).values())
                  if isinstance(q, DeliveryQueue)]  # fmt: skip
        if not queues:
            continue
        name = sink_name(s)
        depth.add_metric([name], sum(len(q.items) for q in queues))
        dropped.add_metric([name], sum(q.dropped for q in queues))
        rejected.add_metric([name], sum(q.rejected for q in queues))
    yield depth
    yield dropped
    yield rejected

"""Daemon metrics: read from the live objects at scrape time, into an injected registry."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from factories import T0, ListSource, fleet, joining_fleet, msg, window
from prometheus_client import CollectorRegistry, generate_latest

from monitor.config import DetectorSettings, LimitSettings, Settings
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from monitor.daemon.prometheus import register_metrics
from monitor.daemon.runner import Runner
from monitor.sinks.memory import ListSink
from monitor.wire import Alert


class BrokenSink:
    """Fails its first two sends."""

    name = "broken"

    def __init__(self) -> None:
        self.failures = 2

    async def send(self, alerts: Sequence[Alert]) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("down")

    async def close(self) -> None:
        return None


NEGATIVE = json.dumps({"v": 1, "ts": 5.0, "window_s": 10, "device": "x",
                       "layers": [{"type": "mlp", "busy_s": -1}]}).encode()  # fmt: skip


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_counters_follow_records_dead_letters_and_alerts() -> None:
    """Known bad records show up by reason; good ones as accepted; alerts by sink and status."""
    batches = fleet(70, regress_at=40, change_at=39)
    batches[5] = [*batches[5], msg(b'{"v":1,"ts":'), msg(NEGATIVE), msg(NEGATIVE)]
    sink = ListSink()
    runner = Runner(ListSource(batches), Pipeline(Settings()), [sink])
    registry = register_metrics(CollectorRegistry(), runner, ready=lambda: True)
    assert _value(registry, "flopwatch_records_total", outcome="accepted") == 0
    assert _value(registry, "flopwatch_dead_letters_total", reason="layers[0].busy_s") is None

    await runner.run()

    assert _value(registry, "flopwatch_records_total", outcome="accepted") == 70 * 32
    assert _value(registry, "flopwatch_records_total", outcome="invalid") == 3
    assert _value(registry, "flopwatch_dead_letters_total", reason="layers[0].busy_s") == 2
    malformed = [s for m in registry.collect() if m.name == "flopwatch_dead_letters"
                 for s in m.samples if s.labels["reason"].startswith("malformed JSON")]  # fmt: skip
    assert [s.value for s in malformed] == [1]
    assert _value(registry, "flopwatch_change_events_total") == 1
    # The regressed layer's MFU fired as material change points, counted by stream and
    # metric, and every reported alarm became a change point.
    pipe = runner.pipeline
    assert (_value(registry, "flopwatch_change_points_total", stream="layer", metric="mfu",
                   material="true") or 0) > 0  # fmt: skip
    reported = sum(n for (_, outcome), n in pipe.stats.alarms.items() if outcome == "reported")
    assert reported == sum(n for key, n in pipe.stats.points.items() if key[1] != "kernel") > 0
    exported = [s.value for m in registry.collect() if m.name == "flopwatch_change_points"
                for s in m.samples if s.name.endswith("_total")]  # fmt: skip
    assert sum(exported) == sum(pipe.stats.points.values())
    for (stream, outcome), n in pipe.stats.alarms.items():
        assert _value(registry, "flopwatch_detector_alarms_total", stream=stream,
                      outcome=outcome) == n  # fmt: skip
    assert _value(registry, "flopwatch_streams", kind="device") == 32
    assert _value(registry, "flopwatch_streams", kind="layer") == 64
    assert _value(registry, "flopwatch_detector_state_bytes", partition="0") > 0
    firing = [a for a in sink.alerts if a.status == "firing"]
    assert firing
    assert _value(registry, "flopwatch_alerts_sent_total", sink="list", status="firing") == len(
        firing
    )
    last = firing[-1]
    assert _value(registry, "flopwatch_alerts_firing", severity=last.severity,
                  scope=last.scope.level) == 1  # fmt: skip
    assert _value(registry, "flopwatch_incidents_open", paged="true", scope=last.scope.level) == 1
    assert _value(registry, "flopwatch_watermark_seconds") == max(
        runner.pipeline.partition_ts.values()
    )
    assert _value(registry, "flopwatch_ready") == 1
    assert _value(registry, "flopwatch_checkpoint_writes_total") is None  # no checkpointer
    text = generate_latest(registry).decode()
    assert "# TYPE flopwatch_records_total counter" in text
    assert "process_cpu_seconds_total" in text


async def test_sink_errors_are_counted_per_sink() -> None:
    """A failing sink is retried (the batch waits) and its failures are counted by name."""
    runner = Runner(ListSource(fleet(70, regress_at=40, change_at=39)), Pipeline(Settings()),
                    [ListSink(), BrokenSink()], retry_s=0.001)  # fmt: skip
    registry = register_metrics(CollectorRegistry(), runner)
    await runner.run()
    assert _value(registry, "flopwatch_sink_errors_total", sink="broken") == 2
    assert _value(registry, "flopwatch_sink_errors_total", sink="list") is None
    assert _value(registry, "flopwatch_alerts_sent_total", sink="list", status="firing") == 1
    assert _value(registry, "flopwatch_alerts_sent_total", sink="broken", status="firing") == 1


def test_detector_restores_are_counted_by_outcome() -> None:
    """After a restart under a new `h`, /metrics says the state was kept and retuned."""
    first = Pipeline(Settings())
    for batch in fleet(40):
        first.process(batch)
    blobs = {p: first.snapshot_partition(p) for p in first.partitions}
    pipeline = Pipeline(Settings(detector=DetectorSettings(h=13.0)))
    for p, blob in blobs.items():
        pipeline.restore_partition(p, blob)
    registry = register_metrics(CollectorRegistry(), Runner(ListSource([]), pipeline, []))
    name = "flopwatch_detector_restores_total"
    assert _value(registry, name, outcome="retuned") == 4 * len(blobs)
    assert _value(registry, name, outcome="reset") == 0


async def test_warm_starts_are_counted_by_outcome() -> None:
    """`flopwatch_detector_warm_starts_total` shows what became of streams finishing
    burn-in under `warm_start`: joiners of a mature pool borrowed, the first devices did not."""
    settings = Settings(detector=DetectorSettings(params={"warm_start": 48}))
    runner = Runner(ListSource(joining_fleet()), Pipeline(settings), [ListSink()])
    registry = register_metrics(CollectorRegistry(), runner, ready=lambda: True)
    await runner.run()
    counts = runner.pipeline.stats.warm_starts
    assert counts["layer", "borrowed"] > 0
    assert counts["layer", "no_donor"] > 0
    for (stream, outcome), n in counts.items():
        assert _value(registry, "flopwatch_detector_warm_starts_total", stream=stream,
                      outcome=outcome) == n  # fmt: skip


async def test_streams_against_their_caps_and_evictions_are_exported() -> None:
    """Per partition, streams by kind next to their cap; devices evicted at the cap and a
    batch beyond it show as counters (a dead-lettered record as outcome=capacity)."""
    settings = Settings(limits=LimitSettings(max_devices=4, max_streams=6, max_groups=9))
    batches = [[msg(window(f"n/{w}-{d}", T0 + 10.0 * w), partition=1) for d in range(3)]
               for w in range(1, 5)]  # fmt: skip
    batches.append([msg(window(f"m/{d}", T0 + 60.0), partition=1) for d in range(5)])
    runner = Runner(ListSource(batches), Pipeline(settings), [ListSink()])
    registry = register_metrics(CollectorRegistry(), runner)
    assert _value(registry, "flopwatch_streams_evicted_total", kind="device") == 0
    await runner.run()
    assert _value(registry, "flopwatch_streams_limit", kind="device") == 4
    assert _value(registry, "flopwatch_streams_limit", kind="layer") == 6
    assert _value(registry, "flopwatch_streams_limit", kind="group") == 9
    # Every batch brings new devices; 6 layer streams hold 3 of them, so each evicts the
    # last batch's 3, and the last batch of 5 keeps 3: the other 2 are dead-lettered.
    assert _value(registry, "flopwatch_partition_streams", partition="1", kind="device") == 3
    assert _value(registry, "flopwatch_partition_streams", partition="1", kind="layer") == 6
    assert _value(registry, "flopwatch_streams_evicted_total", kind="device") == 4 * 3
    assert _value(registry, "flopwatch_streams_evicted_total", kind="layer") == 2 * 4 * 3
    assert _value(registry, "flopwatch_streams_expired_total", kind="device") == 0
    assert _value(registry, "flopwatch_records_total", outcome="capacity") == 2
    assert runner.pipeline.stats.streams_evicted["device"] == 4 * 3


async def test_pool_levels_combine_partitions_models_and_windows() -> None:
    """One series per (pool, layer type): the newest window of each partition's aggregate,
    averaged over partitions and models by their devices; a later window replaces it."""

    def batch(ts: float, a0: float) -> list[RawMessage]:
        return [
            *(msg(window(f"p0/gpu{d}", ts, mfu=a0, stall=0.2), partition=0) for d in range(3)),
            msg(window("p1/gpu0", ts, mfu=0.60, stall=0.4, model="m@2"), partition=1),
            *(msg(window(f"p1/gpu{d}", ts, pool="train-b", mfu=0.5), partition=1)
              for d in (1, 2)),
        ]  # fmt: skip

    runner = Runner(ListSource([batch(T0 + 10, 0.40), batch(T0 + 20, 0.30)]),
                    Pipeline(Settings()), [ListSink()])  # fmt: skip
    registry = register_metrics(CollectorRegistry(), runner)
    await runner.run()
    a = {"pool": "train-a", "layer": "attention"}
    assert _value(registry, "flopwatch_pool_mfu_ratio", **a) == pytest.approx(
        (3 * 0.30 + 0.60) / 4)  # fmt: skip
    assert _value(registry, "flopwatch_pool_stall_ratio", **a) == pytest.approx(
        (3 * 0.2 + 0.4) / 4)  # fmt: skip
    assert _value(registry, "flopwatch_pool_devices", **a) == 4
    b = {"pool": "train-b", "layer": "attention"}
    assert _value(registry, "flopwatch_pool_mfu_ratio", **b) == pytest.approx(0.5)
    assert _value(registry, "flopwatch_pool_devices", **b) == 2
    mlp = {"pool": "train-a", "layer": "mlp"}
    assert _value(registry, "flopwatch_pool_mfu_ratio", **mlp) == pytest.approx(0.6)
    text = generate_latest(registry).decode()
    assert text.count("flopwatch_pool_mfu_ratio{") == 4  # 2 pools x 2 layer types

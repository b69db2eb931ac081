"""Checkpoints on a real broker: stop and restart, crash and replay, hand-over on rebalance."""

from __future__ import annotations

import asyncio
import time

import pytest
from daemon_helpers import DEVICES, Daemon, fast_settings, until
from factories import fleet
from kafka_helpers import produce
from structlog.testing import capture_logs

from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics
from monitor.detect.bank import BankCusum
from monitor.sources.kafka import KafkaSource
from monitor.wire import Alert

pytestmark = pytest.mark.integration


async def committed_total(source: KafkaSource, topic: str) -> int:
    tps = [tp for tp in source.consumer.assignment() if tp.topic == topic]
    return sum([await source.consumer.committed(tp) or 0 for tp in tps])


def devices_by_partition(pipeline: Pipeline) -> dict[int, set[str]]:
    return {p: set(st.table.devices) for p, st in pipeline.partitions.items()}


def firing(alerts: list[Alert]) -> set[tuple[str, str | None]]:
    # Not the suggested change: a change event produced while a member runs comes through
    # another consumer, and whether it is fetched before the first page depends on how the
    # two interleave (at a start, the changes already on the topic are read first).
    return {(a.id, a.first_failing_stage) for a in alerts if a.status == "firing"}


async def test_restart_restores_detector_state_and_continues(broker: EmbeddedBroker) -> None:
    """Stop cleanly mid-stream; a second daemon restores, and the regression still pages.

    The regression starts 5 windows after the restart: with fresh detectors it
    is never detected (checked below), so the page proves history came back.
    """
    settings = fast_settings(broker)
    await ensure_topics(settings.kafka)
    batches = fleet(80, regress_at=45, change_at=44)
    cut = 40
    straight = Pipeline(Settings())
    expected = firing([a for b in batches for a in straight.process(b).alerts])
    assert expected
    tail_only = Pipeline(Settings())
    assert not [a for b in batches[cut:] for a in tail_only.process(b).alerts]

    first = await Daemon(settings).start()
    await produce(settings, batches[:cut])
    await until(lambda: first.records == cut * DEVICES, "the first half")
    await first.stop()
    before = devices_by_partition(first.pipeline)
    assert first.checkpointer.stats.writes >= len(before) == 4

    second = await Daemon(settings).start()
    await until(lambda: second.source.assignments > 0, "the assignment")
    assert devices_by_partition(second.pipeline) == before
    assert second.checkpointer.stats.restores == 4
    assert second.checkpointer.stats.incident_restores == 1
    assert second.records == 0

    await produce(settings, batches[cut:])
    await until(lambda: second.records == (80 - cut) * DEVICES, "the second half")
    await second.stop()
    assert second.pipeline.stats.records_duplicate == 0
    assert firing(second.sink.alerts) == expected
    assert not first.sink.alerts


async def test_restart_under_a_new_threshold_keeps_state_and_applies_it(
    broker: EmbeddedBroker,
) -> None:
    """Raise detector.h and restart: the streams' state comes back under the new threshold
    (it used to come back with the checkpoint's), and each partition says so in the log."""
    settings = fast_settings(broker)
    await ensure_topics(settings.kafka)
    first = await Daemon(settings).start()
    await produce(settings, fleet(40))
    await until(lambda: first.records == 40 * DEVICES, "the records")
    await first.stop()
    before = devices_by_partition(first.pipeline)

    detector = settings.detector.model_copy(update={"h": 13.0})
    with capture_logs() as logs:
        second = await Daemon(settings.model_copy(update={"detector": detector})).start()
        await until(lambda: second.source.assignments > 0, "the assignment")
    try:
        assert second.checkpointer.stats.restores == 4
        assert devices_by_partition(second.pipeline) == before
        # Four partitions, four detectors each (layer, device, pool layer, pool device).
        assert second.pipeline.stats.detector_restores["retuned"] == 16
        for st in second.pipeline.partitions.values():
            assert isinstance(st.detectors["layer"], BankCusum)
            assert st.detectors["layer"].h == 13.0
        warned = [e for e in logs if e["event"] == "detector settings differ from the checkpoint's"]
        assert len(warned) == 4
    finally:
        await second.stop()


async def test_crash_replays_records_after_the_checkpoint(broker: EmbeddedBroker) -> None:
    """Checkpoint, process and commit more, crash: the restart re-reads exactly the records
    after the checkpoint (it seeks back past the committed offset)."""
    settings = fast_settings(broker)
    await ensure_topics(settings.kafka)
    samples = settings.kafka.topics.samples
    batches = fleet(30)
    now = [0.0]
    first = await Daemon(settings, clock=lambda: now[0]).start()
    await produce(settings, batches[:20])
    await until(lambda: first.records == 20 * DEVICES, "20 windows")
    assert first.checkpointer.stats.writes == 0  # the interval has not passed
    now[0] = 1000.0  # the next batch is due for a checkpoint
    await produce(settings, batches[20:21])
    await until(lambda: first.checkpointer.stats.writes == 5, "the checkpoint")
    await produce(settings, batches[21:])
    await until(lambda: first.records == 30 * DEVICES, "30 windows")
    total = 30 * DEVICES
    deadline = time.monotonic() + 30
    while await committed_total(first.source, samples) < total:
        assert time.monotonic() < deadline, "commit did not reach the end"
        await asyncio.sleep(0.02)
    at_crash = devices_by_partition(first.pipeline)
    saved = first.checkpointer.saved_offsets()
    await first.crash()
    in_checkpoint = sum(saved.values())
    assert DEVICES * 20 <= in_checkpoint < total

    second = await Daemon(settings).start()
    await until(lambda: second.records == total - in_checkpoint, "the replay")
    await second.stop()
    assert second.records == total - in_checkpoint
    assert second.pipeline.stats.records_duplicate == 0
    assert devices_by_partition(second.pipeline) == at_crash
    positions = {tp.partition: o for tp, o in second.source.delivered().items()
                 if tp.topic == samples}  # fmt: skip
    assert sum(positions.values()) == total


async def test_rebalance_hands_partitions_over_with_their_state(broker: EmbeddedBroker) -> None:
    """A second member joins: the first checkpoints on revoke and keeps what it still owns;
    the newcomer restores the partitions it got, and no record is processed twice."""
    settings = fast_settings(broker)
    await ensure_topics(settings.kafka)
    samples = settings.kafka.topics.samples
    batches = fleet(30)
    a = await Daemon(settings).start()
    await produce(settings, batches[:20])
    await until(lambda: a.records == 20 * DEVICES, "20 windows on the first member")
    before = devices_by_partition(a.pipeline)
    assert set(before) == {0, 1, 2, 3}

    def owned(d: Daemon) -> set[int]:
        return {tp.partition for tp in d.source.delivered() if tp.topic == samples}

    b = await Daemon(settings).start()
    # Both members finished the same rebalance when their partitions split the topic.
    await until(lambda: owned(a) and owned(b) and owned(a) | owned(b) == {0, 1, 2, 3}
                and not owned(a) & owned(b), "the rebalance")  # fmt: skip
    mine, kept = owned(b), owned(a)
    assert set(a.pipeline.partitions) == kept  # handed-over state is dropped
    assert devices_by_partition(b.pipeline) == {p: before[p] for p in mine}
    assert b.checkpointer.stats.restores == len(mine)
    assert a.checkpointer.stats.writes >= len(before)

    await produce(settings, batches[20:])
    await until(lambda: a.records + b.records == 30 * DEVICES, "the last 10 windows")
    assert b.records > 0
    await b.stop()
    await a.stop()
    assert a.pipeline.stats.records_duplicate == 0
    assert b.pipeline.stats.records_duplicate == 0


async def test_restart_sends_what_still_fires_again(broker: EmbeddedBroker) -> None:
    """A page still firing at a restart is sent again from the restored state at the first
    batch: the new process's Alertmanager sink was never told of it, and Alertmanager
    resolves what nobody re-posts within its resolve_timeout, regression or not."""
    settings = fast_settings(broker)
    await ensure_topics(settings.kafka)
    batches = fleet(84, regress_at=45, change_at=44)
    first = await Daemon(settings).start()
    await produce(settings, batches[:80])
    await until(lambda: first.records == 80 * DEVICES, "the first 80 windows")
    await first.stop()
    last = {a.id: a for a in first.sink.alerts}
    assert last
    assert {a.status for a in last.values()} == {"firing"}

    second = await Daemon(settings).start()
    try:
        await produce(settings, batches[80:82])  # two more windows; nothing new happens
        await until(lambda: second.records == 2 * DEVICES, "two more windows")
        again = {a.id: a for a in second.sink.alerts}
        assert set(again) == set(last)

        def summary(a: Alert) -> tuple[str, str, str, str | None]:
            return a.status, a.severity, a.scope.level, a.suggestion.change_id

        assert {aid: summary(a) for aid, a in again.items()} == {
            aid: summary(a) for aid, a in last.items()
        }
    finally:
        await second.stop()

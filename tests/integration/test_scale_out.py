"""Several replicas in one consumer group: every member reads every change event."""

from __future__ import annotations

import pytest
from daemon_helpers import DEVICES, Daemon, fast_settings, until
from factories import fleet
from kafka_helpers import produce

from monitor.embedded import EmbeddedBroker, ensure_topics

pytestmark = pytest.mark.integration


def owned(d: Daemon, topic: str) -> set[int]:
    return {tp.partition for tp in d.source.delivered() if tp.topic == topic}


def knows(d: Daemon, change_id: str) -> bool:
    return change_id in {c.id for c in d.pipeline.advisor.changes}


async def test_two_members_both_suggest_the_rollback(broker: EmbeddedBroker) -> None:
    """Samples are keyed by device, so both members see part of the regressed pool; the
    change event (one partition) must reach both, or one member's pages lack the rollback."""
    settings = fast_settings(broker)
    await ensure_topics(settings.kafka)
    samples = settings.kafka.topics.samples
    a = await Daemon(settings).start()
    b = await Daemon(settings).start()
    await until(lambda: owned(a, samples) and owned(b, samples)
                and owned(a, samples) | owned(b, samples) == {0, 1, 2, 3}
                and not owned(a, samples) & owned(b, samples), "two members")  # fmt: skip
    try:
        await produce(settings, fleet(80, regress_at=45, change_at=44))
        await until(lambda: a.records + b.records == 80 * DEVICES, "every window")
        await until(lambda: knows(a, "chg-1") and knows(b, "chg-1"), "the change on both")
        # Each member saw some of the regressed devices (node-000 and node-001, spread
        # over the partitions by their keys) and paged for them, naming the change.
        for d in (a, b):
            assert {x.status for x in d.sink.alerts} >= {"firing"}
            last = {x.id: x for x in d.sink.alerts}
            assert {x.suggestion.change_id for x in last.values()} == {"chg-1"}
    finally:
        await b.stop()
        await a.stop()


async def test_a_change_produced_later_arrives_without_a_restart(broker: EmbeddedBroker) -> None:
    """A member started before its changes topic existed gets the events produced later."""
    settings = fast_settings(broker)
    t = settings.kafka.topics
    await ensure_topics(settings.kafka.model_copy(
        update={"topics": t.model_copy(update={"changes": t.samples})}))  # fmt: skip
    a = await Daemon(settings).start()
    try:
        windows = fleet(60, regress_at=45, change_at=44)
        await produce(settings, windows[:30])
        await until(lambda: a.records == 30 * DEVICES, "the first windows")
        assert not a.pipeline.advisor.changes
        await produce(settings, windows[30:])
        await until(lambda: a.records == 60 * DEVICES, "every window")
        await until(lambda: knows(a, "chg-1"), "the change produced while running")
        last = {x.id: x for x in a.sink.alerts}
        assert last
        assert {x.suggestion.change_id for x in last.values()} == {"chg-1"}
    finally:
        await a.stop()


async def test_changes_on_the_topic_are_read_before_the_first_batch(broker: EmbeddedBroker) -> None:
    """A member that starts behind a backlog knows the backlog's changes before any sample:
    its very first page names the change (no rollback-less page, then an update)."""
    settings = fast_settings(broker)
    await ensure_topics(settings.kafka)
    await produce(settings, fleet(80, regress_at=45, change_at=44))
    a = await Daemon(settings).start()
    try:
        await until(lambda: a.records == 80 * DEVICES, "the backlog")
        first = next(x for x in a.sink.alerts if x.status == "firing")
        assert first.suggestion.change_id == "chg-1"
        assert a.pipeline.counters["changes_in"] == 1
    finally:
        await a.stop()

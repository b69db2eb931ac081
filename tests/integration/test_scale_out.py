"""Several replicas in one consumer group: every member reads every change event."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import DEVICES, Daemon, fast_settings, until
from factories import fleet, msg
from kafka_helpers import isolated_settings, produce, run_process_until
from prometheus_client import CollectorRegistry

from monitor.config import Settings
from monitor.core.pipeline import owner_partition
from monitor.core.types import RawMessage
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics
from monitor.daemon.prometheus import register_metrics

pytestmark = pytest.mark.integration


def owned(d: Daemon, topic: str) -> set[int]:
    return {tp.partition for tp in d.source.delivered() if tp.topic == topic}


def knows(d: Daemon, change_id: str) -> bool:
    return change_id in {c.id for c in d.pipeline.advisor.changes}


async def split_between(a: Daemon, b: Daemon, topic: str) -> None:
    """Wait until the two members share the topic's four partitions."""
    await until(lambda: owned(a, topic) and owned(b, topic)
                and owned(a, topic) | owned(b, topic) == {0, 1, 2, 3}
                and not owned(a, topic) & owned(b, topic), "two members")  # fmt: skip


async def start_two(settings: Settings, topic: str) -> tuple[Daemon, Daemon]:
    """Two members of one group, started and sharing the topic's four partitions."""
    await ensure_topics(settings.kafka)
    a = await Daemon(settings).start()
    b = await Daemon(settings).start()
    await split_between(a, b, topic)
    return a, b


def repartitioned(broker: EmbeddedBroker) -> Settings:
    """Isolated, fast settings with `kafka.repartition` on."""
    s = fast_settings(broker)
    return s.model_copy(update={"kafka": s.kafka.model_copy(update={"repartition": True})})


async def test_two_members_both_suggest_the_rollback(broker: EmbeddedBroker) -> None:
    """Samples are keyed by device, so both members see part of the regressed pool; the
    change event (one partition) must reach both, or one member's pages lack the rollback."""
    settings = fast_settings(broker)
    samples = settings.kafka.topics.samples
    a, b = await start_two(settings, samples)
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
        assert a.pipeline.stats.changes_in == 1
    finally:
        await a.stop()


async def test_repartitioned_members_each_see_whole_pools(broker: EmbeddedBroker) -> None:
    """With `repartition`, a pool's records all reach one member: one consistent alert (the
    whole regressed pool, one severity) instead of one per member on its share."""
    settings = repartitioned(broker)
    by_pool = settings.kafka.topics.by_pool
    a, b = await start_two(settings, by_pool)
    try:
        # Bad bytes travel on under their own key and leave at decode, as without the stage.
        batches = fleet(100, regress_at=45, change_at=44)
        batches[10].append(msg(b'{"v":1,"ts":'))
        # One record larger than a whole produced batch (it goes alone in one): it has a
        # pool, so it is keyed, and then fails decoding downstream.
        big = b'{"pool":"train-a","pad":"' + b"x" * (600 * 1024) + b'"}'
        batches[20].append(msg(big))
        await produce(settings, batches[:90])
        await until(lambda: a.records + b.records == 90 * DEVICES, "90 windows")
        # The copy stage drains its partitions unevenly, so some devices run windows ahead
        # of others; ten more windows let the last growth update go out.
        await produce(settings, batches[90:])
        await until(lambda: a.records + b.records == 100 * DEVICES, "every window")
        assert a.rep is not None
        assert b.rep is not None
        assert a.rep.unkeyed + b.rep.unkeyed == 1
        await until(lambda: sum(d.pipeline.stats.records_rejected for d in (a, b)) == 2,
                    "the two bad records at decode")  # fmt: skip
        assert a.rep.copied + b.rep.copied == 100 * DEVICES + 2
        # What /metrics says about the copy stage: the records by keyed, nothing left behind.
        regs = [register_metrics(CollectorRegistry(), d.runner, d.source, None, None, d.rep)
                for d in (a, b)]  # fmt: skip
        keyed = [r.get_sample_value("flopwatch_repartition_records_total", {"keyed": k})
                 for r in regs for k in ("true", "false")]  # fmt: skip
        assert keyed[1] + keyed[3] == 1
        assert sum(keyed) == 100 * DEVICES + 2
        lags = [m.samples for r in regs for m in r.collect()
                if m.name == "flopwatch_repartition_lag_records"]  # fmt: skip
        assert sum(len(x) for x in lags) >= 1
        assert all(sample.value == 0 for x in lags for sample in x)

        def devices(d: Daemon, pool: str) -> set[str]:
            return {name for st in d.pipeline.partitions.values()
                    for name, dev in st.table.devices.items() if dev.pool == pool}  # fmt: skip

        for pool in ("train-a", "train-b"):
            seen = [devices(d, pool) for d in (a, b)]
            assert sorted(len(x) for x in seen) == [0, DEVICES // 2], pool
        owner, other = (a, b) if devices(a, "train-a") else (b, a)
        await until(lambda: knows(owner, "chg-1"), "the change")
        assert not [x for x in other.sink.alerts if x.status == "firing"]
        firing = [x for x in owner.sink.alerts if x.status == "firing"]
        assert len({x.id for x in firing}) == 1
        # It grows as devices join (a ticket on a few devices first); 55 windows after the
        # onset the last record is the page on the pool, with most of its 16 devices.
        last = firing[-1]
        assert (last.severity, last.scope.level) == ("page", "pool")
        assert len(last.scope.devices) > DEVICES // 4
        assert last.suggestion.change_id == "chg-1"
    finally:
        await b.stop()
        await a.stop()


def test_flopwatch_run_with_repartition(broker: EmbeddedBroker, tmp_path: Path) -> None:
    """`flopwatch run` with FLOPWATCH_KAFKA__REPARTITION: copies, detects, stops with 0."""
    s = isolated_settings(broker)
    kafka = s.kafka.model_copy(update={"repartition": True})
    t = kafka.topics
    asyncio.run(ensure_topics(kafka))
    out, log = tmp_path / "alerts.jsonl", tmp_path / "run.log"
    env = {**os.environ, "FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap,
           "FLOPWATCH_CHECKPOINT__KEY": "test-checkpoint-key",
           "FLOPWATCH_KAFKA__GROUP_ID": kafka.group_id, "FLOPWATCH_KAFKA__REPARTITION": "true",
           "FLOPWATCH_KAFKA__TOPICS__SAMPLES": t.samples, "FLOPWATCH_KAFKA__TOPICS__BY_POOL":
           t.by_pool, "FLOPWATCH_KAFKA__TOPICS__CHANGES": t.changes,
           "FLOPWATCH_KAFKA__TOPICS__ALERTS": t.alerts, "FLOPWATCH_KAFKA__TOPICS__DLQ": t.dlq,
           "FLOPWATCH_KAFKA__TOPICS__STATE": t.state, "FLOPWATCH_SINKS__CONSOLE": "false",
           "FLOPWATCH_SINKS__JSONL_PATH": str(out), "FLOPWATCH_LOG_FORMAT": "json",
           "FLOPWATCH_HTTP_PORT": "0"}  # fmt: skip

    def alerts() -> list[dict[str, Any]]:
        text = out.read_text() if out.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    code = run_process_until(
        env, log,
        lambda: asyncio.run(produce(s.model_copy(update={"kafka": kafka}),
                                    fleet(80, regress_at=45, change_at=44))),
        lambda: any(a["suggestion"]["change_id"] == "chg-1" for a in alerts()),
        "no alert naming the change",
    )  # fmt: skip
    assert code == 0, log.read_text()[-2000:]
    started = [json.loads(line) for line in log.read_text().splitlines()
               if '"event": "started"' in line]  # fmt: skip
    assert started[0]["repartition"] is True
    assert {a["scope"]["pool"] for a in alerts()} == {"train-a"}


async def test_a_leaving_member_hands_its_page_over(broker: EmbeddedBroker) -> None:
    """The member that paged leaves; the one that takes its partitions restores the open
    incident with them, sends it again (its own sinks never had it) and resolves it when the
    fix lands. Before, the incident stayed behind: nobody re-posted it, nobody resolved it."""
    settings = repartitioned(broker)
    by_pool = settings.kafka.topics.by_pool
    a, b = await start_two(settings, by_pool)
    bad, good = fleet(72, regress_at=45, change_at=44), fleet(140)
    try:
        await produce(settings, bad[:70])
        await until(lambda: a.records + b.records == 70 * DEVICES, "70 windows")
        await until(lambda: any(x.status == "firing" for x in a.sink.alerts + b.sink.alerts),
                    "the page")  # fmt: skip
        owner, heir = (a, b) if a.sink.alerts else (b, a)
        await owner.stop()
        # What the owner sent last, stop included (a batch in flight may have added the
        # rollback candidate to its page as it stopped).
        paged = owner.sink.alerts[-1]
        assert heir.rep is not None
        samples = settings.kafka.topics.samples
        # Both groups hand over: the heir's copy stage must own every samples partition
        # too, or half the devices' windows would run ahead of the others'.
        await until(lambda: owned(heir, by_pool) == {0, 1, 2, 3}
                    and {tp.partition for tp in heir.rep.consumer.assignment()
                         if tp.topic == samples} == {0, 1, 2, 3}, "the hand-over")  # fmt: skip
        await produce(settings, bad[70:72])
        await until(lambda: any(x.id == paged.id for x in heir.sink.alerts), "the page again")
        again = next(x for x in heir.sink.alerts if x.id == paged.id)
        assert (again.status, again.severity, again.scope.level, again.suggestion.change_id) == (
            "firing", paged.severity, paged.scope.level, paged.suggestion.change_id)  # fmt: skip
        await produce(settings, good[72:130])
        await until(lambda: owner.records + heir.records == 130 * DEVICES, "the fix")
        # The copy stage drains its samples partitions unevenly, so some devices' windows
        # run ahead of others' within a by-pool partition; recovery is judged on windows
        # newer than those already judged, so resolving can wait for the next window.
        await produce(settings, good[130:])
        await until(lambda: any(x.id == paged.id and x.status == "resolved"
                                for x in heir.sink.alerts), "the resolution")  # fmt: skip
    finally:
        for d in (a, b):
            if not d.task.done():
                await d.stop()


def _two_incidents(windows: int) -> list[list[RawMessage]]:
    """train-a regresses at window 45 (after chg-1), train-b at 60: two incidents, too far
    apart to be one fleet alert, on two by-pool partitions."""
    a = fleet(windows, regress_at=45, change_at=44, regress_pool="train-a")
    b = fleet(windows, regress_at=60, regress_pool="train-b")
    return [
        [m for m in ba if m.topic == "flopwatch.changes" or b"train-a" in m.value]
        + [m for m in bb if m.topic != "flopwatch.changes" and b"train-b" in m.value]
        for ba, bb in zip(a, b, strict=True)
    ]


async def test_a_joining_member_takes_over_the_incident_of_the_partition_it_gets(
    broker: EmbeddedBroker,
) -> None:
    """A live member that loses a partition in a rebalance gives up the incident that
    partition owns (its sinks stop keeping it alive); the member that gets the partition
    sends it again. With two pools on by-pool partitions of different parity and two
    members sharing four partitions round-robin, exactly one of the two incidents moves."""
    settings = repartitioned(broker)
    await ensure_topics(settings.kafka)
    by_pool = settings.kafka.topics.by_pool
    batches = _two_incidents(80)
    a = await Daemon(settings).start()
    b: Daemon | None = None
    try:
        await produce(settings, batches[:75])
        await until(lambda: a.records == 75 * DEVICES, "75 windows on one member")
        await until(lambda: len({x.id for x in a.sink.alerts}) == 2, "both pages")
        owners = {i.alert_id: owner_partition(i) for i in a.pipeline.correlator.incidents
                  if i.alert_id}  # fmt: skip
        assert len(owners) == 2
        assert len({p % 2 for p in owners.values()}) == 2, owners

        b = await Daemon(settings).start()
        await split_between(a, b, by_pool)
        moved = {aid for aid, p in owners.items() if p in owned(b, by_pool)}
        kept = set(owners) - moved
        assert len(moved) == len(kept) == 1
        await produce(settings, batches[75:])
        await until(lambda: a.records + b.records == 80 * DEVICES, "the last windows")
        await until(lambda: set(a.sink.forgotten) == moved, "the old owner lets go")
        await until(lambda: {x.id for x in b.sink.alerts} >= moved, "the new owner")
        assert {x.id for x in b.sink.alerts} == moved
        assert {i.alert_id for i in a.pipeline.correlator.incidents if i.alert_id} == kept
        assert {i.alert_id for i in b.pipeline.correlator.incidents if i.alert_id} == moved
        assert a.runner.firing.keys() == kept
    finally:
        if b is not None:
            await b.stop()
        await a.stop()

"""Two replicas holding different pools, one fleet-scope page (`kafka.fleet_stage`).

With `repartition` each replica sees whole pools and none the fleet; the fleet stage runs on
the member that owns the change-point partition, over every replica's change points, and
sends the one fleet-scope alert a single daemon holding the whole fleet would send.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer
from daemon_helpers import DEVICES, Daemon, fast_settings, until
from factories import fleet
from kafka_helpers import isolated_settings, produce, run_process_until
from prometheus_client import CollectorRegistry

from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics
from monitor.daemon.prometheus import register_metrics
from monitor.wire import Alert

pytestmark = pytest.mark.integration

WINDOWS = 90


def owned(d: Daemon, topic: str) -> set[int]:
    return {tp.partition for tp in d.source.delivered() if tp.topic == topic}


def fleet_settings(broker: EmbeddedBroker) -> Settings:
    """Isolated, fast settings with `repartition` and the fleet stage on."""
    s = fast_settings(broker)
    kafka = s.kafka.model_copy(update={"repartition": True, "fleet_stage": True})
    return s.model_copy(update={"kafka": kafka})


def rollout(pool: str) -> list[list[RawMessage]]:
    """A driver rolled out to the whole fleet at window 48 (its change event unscoped);
    MFU drops 15 % from window 49 on `pool` ("*": every pool)."""
    return fleet(WINDOWS, regress_at=49, change_at=48, regress_pool=pool, change_kind="driver",
                 change_scope={}, kernel_fallback=False)  # fmt: skip


def single_replica_ids(batches: list[list[RawMessage]]) -> dict[str, set[str]]:
    """Alert ids by scope level that one daemon holding the whole fleet sends (its pipeline
    over the same records, each pool on its own input partition as repartition puts it)."""
    pipeline = Pipeline(Settings())
    ids: dict[str, set[str]] = {}
    for batch in batches:
        moved = [m if m.topic == "flopwatch.changes"
                 else msgspec.structs.replace(m, partition=0 if b'"train-a"' in m.value else 1)
                 for m in batch]  # fmt: skip
        for a in pipeline.process(moved).alerts:
            ids.setdefault(a.scope.level, set()).add(a.id)
    return ids


async def read_alerts(settings: Settings) -> list[Alert]:
    """Every record on the alerts topic, read to its end."""
    c = AIOKafkaConsumer(settings.kafka.topics.alerts,
                         bootstrap_servers=settings.kafka.bootstrap_servers, group_id=None,
                         auto_offset_reset="earliest", enable_auto_commit=False)  # fmt: skip
    await c.start()
    try:
        out: list[Alert] = []
        await c.getmany(timeout_ms=500)  # the first fetch makes the assignment
        tps = list(c.assignment())
        await c.seek_to_beginning(*tps)
        end = await c.end_offsets(tps)
        left = set(tps)
        while left:
            for msgs in (await c.getmany(timeout_ms=500)).values():
                out.extend(msgspec.json.decode(m.value, type=Alert) for m in msgs)
            left = {tp for tp in left if await c.position(tp) < end[tp]}
        return out
    finally:
        await c.stop()


async def delivered(settings: Settings, *daemons: Daemon, within: float = 30.0) -> list[Alert]:
    """The alerts topic once it holds every alert record the daemons' pipelines produced."""
    deadline = time.monotonic() + within
    while True:
        alerts = await read_alerts(settings)
        made = sum(d.pipeline.stats.alerts_out for d in daemons)
        if len(alerts) == made:
            return alerts
        if time.monotonic() > deadline:
            pytest.fail(f"the alerts topic holds {len(alerts)} records of {made}")
        await asyncio.sleep(0.2)


async def start_pair(settings: Settings) -> tuple[Daemon, Daemon, Daemon]:
    """Two members sharing the by-pool partitions; returns them and the one running the
    fleet stage (the owner of the change-point partition)."""
    await ensure_topics(settings.kafka)
    a = await Daemon(settings).start()
    b = await Daemon(settings).start()
    points = settings.kafka.topics.change_points
    by_pool = settings.kafka.topics.by_pool
    await until(lambda: owned(a, by_pool) and owned(b, by_pool)
                and owned(a, by_pool) | owned(b, by_pool) == {0, 1, 2, 3}
                and not owned(a, by_pool) & owned(b, by_pool)
                and owned(a, points) | owned(b, points) == {0}, "two members")  # fmt: skip
    return a, b, (a if owned(a, points) else b)


def pools_of(d: Daemon) -> set[str | None]:
    return {dev.pool for st in d.pipeline.partitions.values() for dev in st.table.devices.values()}


def caught_up(stage: Daemon, *replicas: Daemon) -> bool:
    """The fleet stage holds every device of every pool incident the replicas paged."""
    fleet = stage.pipeline.fleet
    assert fleet is not None
    held: dict[str | None, set[str]] = {}
    for i in fleet.correlator.incidents:
        held.setdefault(i.pool, set()).update(i.devices)
    paged = [i for d in replicas for i in d.pipeline.correlator.incidents if i.alert_id]
    return all(i.devices <= held.get(i.pool, set()) for i in paged)


async def run_to_the_end(settings: Settings, a: Daemon, b: Daemon, stage: Daemon,
                         batches: list[list[RawMessage]]) -> list[Alert]:  # fmt: skip
    """Produce every window; wait until both replicas read them all and the fleet stage has
    what they found; returns the alerts topic once it holds every record produced."""
    await produce(settings, batches)
    await until(lambda: a.records + b.records == WINDOWS * DEVICES, "every window", within=60)
    # Each replica holds one pool whole.
    assert {frozenset(pools_of(a)), frozenset(pools_of(b))} == {
        frozenset({"train-a"}), frozenset({"train-b"})}  # fmt: skip
    last = max(m for m in (a.pipeline.watermark(), b.pipeline.watermark()))
    fleet = stage.pipeline.fleet
    assert fleet is not None
    await until(lambda: len(fleet.partition_ts) == 2 and min(fleet.partition_ts.values()) >= last
                and caught_up(stage, a, b), "the fleet stage caught up", within=60)  # fmt: skip
    return await delivered(settings, a, b)


async def test_two_replicas_with_different_pools_send_one_fleet_page(
    broker: EmbeddedBroker,
) -> None:
    """A rollout that drops MFU on every pool: each replica pages its pool at pool scope,
    and exactly one fleet-scope page reaches the alerts topic, under the id one daemon
    holding the whole fleet gives it, naming both pool pages."""
    settings = fleet_settings(broker)
    batches = rollout("*")
    want = single_replica_ids(batches)
    assert set(want) == {"fleet"}
    assert len(want["fleet"]) == 1
    a, b, stage = await start_pair(settings)
    try:
        alerts = await run_to_the_end(settings, a, b, stage, batches)
        fleet_ids = {x.id for x in alerts if x.scope.level == "fleet"}
        assert fleet_ids == want["fleet"]
        fleet_pages = [x for x in alerts if x.scope.level == "fleet"]
        assert {x.status for x in fleet_pages} == {"firing"}
        last = fleet_pages[-1]
        assert (last.severity, last.scope.pool) == ("page", None)
        assert "2 pools (train-a, train-b" in last.summary
        # It spans exactly the devices the replicas' pool incidents hold (the detectors'
        # stragglers vary with how the copy stage interleaves the devices); a record is
        # re-sent only on enough growth, so the last one may name a few fewer.
        fleet = stage.pipeline.fleet
        assert fleet is not None
        (inc,) = [i for i in fleet.correlator.incidents if i.alert_id is not None]
        held = {dev for d in (a, b) for i in d.pipeline.correlator.incidents if i.alert_id
                for dev in i.devices}  # fmt: skip
        assert inc.merged().devices >= held
        assert last.scope.device_count > DEVICES // 2
        assert set(last.scope.hosts) == {f"node-{i:03d}" for i in range(4)}
        assert last.suggestion.change_id == "chg-1"
        # Each replica paged its own pool, at pool scope; the fleet page names both.
        pool_pages = {x.scope.pool: x.id for x in alerts if x.scope.level == "pool"}
        assert set(pool_pages) == {"train-a", "train-b"}
        assert last.pool_alerts == sorted(pool_pages.values())
        for d in (a, b):
            own = {x.scope.pool for x in d.sink.alerts if x.scope.level == "pool"}
            assert own == pools_of(d)
        # The fleet page came from the member running the fleet stage alone.
        other = b if stage is a else a
        assert any(x.scope.level == "fleet" for x in stage.sink.alerts)
        assert not any(x.scope.level == "fleet" for x in other.sink.alerts)
        # What /metrics says there: the reports it read, its open fleet alert.
        reg = register_metrics(CollectorRegistry(), stage.runner, stage.source, None, None)
        assert reg.get_sample_value("flopwatch_fleet_reports_total", {"outcome": "taken"}) > 0
        assert reg.get_sample_value("flopwatch_fleet_reports_total",
                                    {"outcome": "rejected"}) == 0  # fmt: skip
        assert reg.get_sample_value("flopwatch_incidents_open",
                                    {"paged": "true", "scope": "fleet"}) == 1  # fmt: skip
    finally:
        await b.stop()
        await a.stop()


async def test_a_regression_on_one_pool_is_no_fleet_page(broker: EmbeddedBroker) -> None:
    """The same drop on train-a alone: its replica pages the pool, and the fleet stage, which
    read both replicas' reports to the end, sends nothing."""
    settings = fleet_settings(broker)
    batches = rollout("train-a")
    assert set(single_replica_ids(batches)) == {"pool"}
    a, b, stage = await start_pair(settings)
    try:
        alerts = await run_to_the_end(settings, a, b, stage, batches)
        # One alert, train-a's (host scope while few devices moved, then pool).
        assert len({x.id for x in alerts}) == 1
        assert {x.scope.pool for x in alerts} == {"train-a"}
        assert alerts[-1].scope.level == "pool"
        assert not [x for x in alerts if x.scope.level == "fleet"]
        fleet = stage.pipeline.fleet
        assert fleet is not None
        assert fleet.reports > 0
        assert fleet.rejected == 0
        # It saw the pool's incident, confirmed, and left it to the replica.
        assert {i.pool for i in fleet.correlator.incidents if i.status == "open"} >= {"train-a"}
        assert not [i for i in fleet.correlator.incidents if i.alert_id is not None]
    finally:
        await b.stop()
        await a.stop()


async def test_the_member_taking_the_change_point_partition_takes_the_fleet_page_over(
    broker: EmbeddedBroker,
) -> None:
    """The member running the fleet stage leaves: the other is assigned the change-point
    partition, restores the stage from the checkpoint stored with it, and sends the fleet
    page again (its own sinks never had it), under the same id and naming the same pools."""
    settings = fleet_settings(broker)
    batches = rollout("*")
    a, b, stage = await start_pair(settings)
    heir = b if stage is a else a
    try:
        await produce(settings, batches[:85])
        await until(lambda: any(x.scope.level == "fleet" for x in stage.sink.alerts),
                    "the fleet page", within=60)  # fmt: skip
        paged = next(x for x in stage.sink.alerts if x.scope.level == "fleet")
        assert not [x for x in heir.sink.alerts if x.scope.level == "fleet"]
        await stage.stop()
        points = settings.kafka.topics.change_points
        await until(lambda: owned(heir, points) == {0}
                    and owned(heir, settings.kafka.topics.by_pool) == {0, 1, 2, 3},
                    "the hand-over")  # fmt: skip
        fleet = heir.pipeline.fleet
        assert fleet is not None
        assert {i.alert_id for i in fleet.correlator.incidents if i.paging} == {paged.id}
        await produce(settings, batches[85:])
        await until(lambda: any(x.scope.level == "fleet" for x in heir.sink.alerts),
                    "the fleet page again", within=60)  # fmt: skip
        again = next(x for x in heir.sink.alerts if x.scope.level == "fleet")
        assert (again.id, again.status) == (paged.id, "firing")
        assert set(again.pool_alerts) >= set(paged.pool_alerts)
        assert heir.checkpointer.stats.incident_restores >= 1
    finally:
        for d in (a, b):
            if not d.task.done():
                await d.stop()


@pytest.mark.slow
def test_flopwatch_run_with_the_fleet_stage(broker: EmbeddedBroker, tmp_path: Path) -> None:
    """`flopwatch run` as a process, one replica holding both pools: it pages each pool at
    pool scope and, through its own change-point partition, the fleet alert under the
    single-daemon id; it stops with 0."""
    s = isolated_settings(broker)
    kafka = s.kafka.model_copy(update={"repartition": True, "fleet_stage": True})
    t = kafka.topics
    asyncio.run(ensure_topics(kafka))
    batches = rollout("*")
    (want,) = single_replica_ids(batches)["fleet"]
    out, log = tmp_path / "alerts.jsonl", tmp_path / "run.log"
    env = {**os.environ, "FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap,
           "FLOPWATCH_CHECKPOINT__KEY": "test-checkpoint-key",
           "FLOPWATCH_KAFKA__GROUP_ID": kafka.group_id, "FLOPWATCH_KAFKA__REPARTITION": "true",
           "FLOPWATCH_KAFKA__FLEET_STAGE": "true",
           "FLOPWATCH_KAFKA__TOPICS__CHANGE_POINTS": t.change_points,
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
        lambda: asyncio.run(produce(s.model_copy(update={"kafka": kafka}), batches)),
        lambda: any(a["scope"]["level"] == "fleet" and len(a.get("pool_alerts", [])) == 2
                    for a in alerts()),
        "no fleet alert naming both pool alerts",
    )  # fmt: skip
    assert code == 0, log.read_text()[-2000:]
    started = [json.loads(line) for line in log.read_text().splitlines()
               if '"event": "started"' in line]  # fmt: skip
    assert started[0]["fleet_stage"] is True
    got = alerts()
    assert {a["id"] for a in got if a["scope"]["level"] == "fleet"} == {want}
    pools = {a["scope"]["pool"]: a["id"] for a in got if a["scope"]["level"] == "pool"}
    assert set(pools) == {"train-a", "train-b"}
    last = [a for a in got if a["scope"]["level"] == "fleet"][-1]
    assert last["pool_alerts"] == sorted(pools.values())

"""The daemon on a real broker: samples in, alert and dead letters out, read back with kcat."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from conftest import Kcat
from factories import fleet, msg

from monitor.app import Runner
from monitor.config import KafkaSettings, Settings, Topics
from monitor.embedded import EmbeddedBroker, ensure_topics
from monitor.pipeline import Pipeline
from monitor.sinks.kafka import KafkaSink
from monitor.sources.kafka import KafkaSource

pytestmark = pytest.mark.integration


def _settings(broker: EmbeddedBroker) -> Settings:
    run = uuid.uuid4().hex[:8]
    topics = Topics(samples=f"s-{run}", changes=f"c-{run}", alerts=f"a-{run}", dlq=f"d-{run}",
                    state=f"st-{run}")  # fmt: skip
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, group_id=f"g-{run}", topics=topics,
                          poll_timeout_ms=300)  # fmt: skip
    return Settings(kafka=kafka)


def kcat_read(kcat: Kcat, bootstrap: str, topic: str) -> list[tuple[str, dict]]:
    """All (key, JSON value) pairs of a topic, read by kcat (-e: exit at end)."""
    out = kcat.run("-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q",
                   "-f", "%k\t%s\n")  # fmt: skip
    rows = []
    for line in out.stdout.splitlines():
        if line.strip():
            key, _, value = line.partition("\t")
            rows.append((key, json.loads(value)))
    return rows


async def _daemon(settings: Settings, produce) -> Pipeline:
    await ensure_topics(settings.kafka)
    source = KafkaSource(settings.kafka)
    sink = KafkaSink(settings.kafka)
    await source.start()
    await sink.start()
    done = asyncio.Event()
    pipeline = Pipeline(settings)
    runner = Runner(source, pipeline, [sink], dead_letters=sink.send_dead,
                    stop_when_idle=done.is_set)  # fmt: skip

    async def feed() -> None:
        await produce()
        done.set()

    try:
        await asyncio.wait_for(asyncio.gather(runner.run(), feed()), timeout=180)
    finally:
        await source.close()
        await sink.close()
    return pipeline


async def test_daemon_alerts_topic_and_dead_letters(broker: EmbeddedBroker, kcat: Kcat) -> None:
    """Regression on one pool -> one alert on the alerts topic; bad records -> DLQ with reason."""
    settings = _settings(broker)
    t = settings.kafka.topics

    async def produce() -> None:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
        await p.start()
        try:
            for i, batch in enumerate(fleet(80, regress_at=45, change_at=44)):
                for m in batch:
                    topic = t.changes if m.topic == "flopwatch.changes" else t.samples
                    await p.send(topic, key=m.key, value=m.value)
                if i == 10:
                    await p.send(t.samples, key=b"bad", value=b'{"v":1,"ts":')
                    await p.send(t.samples, key=b"neg", value=json.dumps(
                        {"v": 1, "ts": 5.0, "window_s": 10, "device": "x",
                         "layers": [{"type": "mlp", "busy_s": -1}]}).encode())  # fmt: skip
            await p.flush()
        finally:
            await p.stop()

    pipeline = await _daemon(settings, produce)
    assert pipeline.counters["records_in"] == 80 * 32

    alerts = kcat_read(kcat, broker.bootstrap, t.alerts)
    assert alerts, "no alert on the alerts topic"
    ids = {k for k, _ in alerts}
    assert len(ids) == 1
    key, a = alerts[0]
    assert key == a["id"]
    assert a["status"] == "firing"
    assert a["scope"]["pool"] == "train-a"
    assert a["layers"] == ["attention"]
    assert a["metric"] == "mfu"
    assert a["suggestion"]["change_id"] == "chg-1"
    assert all(d.startswith(("node-000", "node-001")) for d in a["scope"]["devices"])

    dead = kcat_read(kcat, broker.bootstrap, t.dlq)
    reasons = sorted(v["reason"] for _, v in dead)
    assert reasons[0].startswith("layers[0].busy_s: expected >= 0, got -1")
    assert reasons[1].startswith("malformed JSON")
    assert {v["value"] for _, v in dead} >= {'{"v":1,"ts":'}


def test_kcat_sees_what_aiokafka_produced(broker: EmbeddedBroker, kcat: Kcat) -> None:
    """Sanity of the harness: a record produced with aiokafka is read back by kcat."""
    topic = f"h-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        await ensure_topics(KafkaSettings(bootstrap_servers=broker.bootstrap,
                                          topics=Topics(samples=topic)))  # fmt: skip
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await p.start()
        await p.send_and_wait(topic, key=b"k", value=json.dumps(msg(b"{}").topic).encode())
        await p.stop()

    asyncio.run(go())
    assert kcat_read(kcat, broker.bootstrap, topic) == [("k", "flopwatch.samples")]

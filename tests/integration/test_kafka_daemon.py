"""The daemon on a real broker: samples in, alert and dead letters out, read back with kcat."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from conftest import Kcat
from factories import fleet, msg
from kafka_helpers import isolated_settings, kcat_read, run_daemon

from monitor.config import KafkaSettings, Topics
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics

pytestmark = pytest.mark.integration


async def test_daemon_alerts_topic_and_dead_letters(broker: EmbeddedBroker, kcat: Kcat) -> None:
    """Regression on one pool -> one alert on the alerts topic; bad records -> DLQ with reason."""
    settings = isolated_settings(broker)
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

    pipeline = await run_daemon(settings, produce)
    assert pipeline.stats.records_in == 80 * 32

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

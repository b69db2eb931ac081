"""Kafka sinks: alerts keyed by id, and the dead-letter topic with the rejection reason."""

from __future__ import annotations

import base64
from collections.abc import Sequence

import msgspec
from aiokafka import AIOKafkaProducer

from monitor.config import KafkaSettings
from monitor.core.types import DeadLetter
from monitor.kafka_client import client_kwargs
from monitor.sinks.jsonl import alert_line
from monitor.wire import Alert

_enc = msgspec.json.Encoder(order="deterministic")


def dead_letter_value(d: DeadLetter) -> bytes:
    """The DLQ envelope: reason, origin, and the original bytes (text when UTF-8)."""
    m = d.message
    try:
        value: str = m.value.decode()
        encoding = "utf-8"
    except UnicodeDecodeError:
        value, encoding = base64.b64encode(m.value).decode(), "base64"
    return _enc.encode({
        "v": 1, "reason": d.reason, "topic": m.topic, "partition": m.partition,
        "offset": m.offset, "key": m.key.decode(errors="replace") if m.key else None,
        "encoding": encoding, "value": value,
    })  # fmt: skip


class KafkaSink:
    """Produces alerts (key = alert id) and dead letters; `send` waits for broker acks."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka
        self.producer = AIOKafkaProducer(**client_kwargs(kafka), acks="all", linger_ms=5)

    async def start(self) -> None:
        """Connect."""
        await self.producer.start()

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Produce alerts and wait until the broker has them."""
        futs = [
            await self.producer.send(
                self.kafka.topics.alerts, key=a.id.encode(), value=alert_line(a).rstrip(b"\n")
            )
            for a in alerts
        ]
        for f in futs:
            await f

    async def send_dead(self, dead: Sequence[DeadLetter]) -> None:
        """Produce dead letters (key = original key) and wait for acks."""
        futs = [
            await self.producer.send(
                self.kafka.topics.dlq, key=d.message.key, value=dead_letter_value(d)
            )
            for d in dead
        ]
        for f in futs:
            await f

    async def close(self) -> None:
        """Flush and disconnect."""
        await self.producer.stop()

"""Kafka sinks: alerts keyed by id, and the dead-letter topic with the rejection reason."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence

import msgspec
from aiokafka import AIOKafkaProducer

from monitor.config import KafkaSettings
from monitor.core.fleet import FLEET_KEY
from monitor.core.types import DeadLetter
from monitor.kafka_client import client_kwargs
from monitor.sinks.jsonl import alert_line
from monitor.wire import Alert

_enc = msgspec.json.Encoder(order="deterministic")


def dead_letter_value(d: DeadLetter, max_bytes: int = 64 * 1024) -> bytes:
    """The DLQ envelope: reason, origin, and the original bytes (text when UTF-8).

    A record over `max_bytes` keeps its first `max_bytes` (the dead letter must fit the
    broker's message limit whatever came in), with its size and SHA-256 to find it by.
    """
    m = d.message
    raw = m.value[:max_bytes]
    try:
        value: str = raw.decode()
        encoding = "utf-8"
    except UnicodeDecodeError:
        value, encoding = base64.b64encode(raw).decode(), "base64"
    envelope: dict[str, object] = {
        "v": 1, "reason": d.reason[:1024], "topic": m.topic, "partition": m.partition,
        "offset": m.offset, "key": m.key[:1024].decode(errors="replace") if m.key else None,
        "encoding": encoding, "value": value,
    }  # fmt: skip
    if len(m.value) > max_bytes:
        envelope |= {"truncated": True, "value_bytes": len(m.value),
                     "value_sha256": hashlib.sha256(m.value).hexdigest()}  # fmt: skip
    return _enc.encode(envelope)


class KafkaSink:
    """Produces alerts (key = alert id) and dead letters; `send` waits for broker acks."""

    def __init__(self, kafka: KafkaSettings, max_dead_letter_bytes: int = 64 * 1024) -> None:
        self.kafka = kafka
        self.max_dead_letter_bytes = max_dead_letter_bytes
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

    async def send_report(self, report: bytes) -> None:
        """Produce one fleet-stage report (`core.fleet`) under the fleet's key; wait for acks."""
        await (await self.producer.send(self.kafka.topics.change_points, key=FLEET_KEY,
                                        value=report))  # fmt: skip

    async def send_dead(self, dead: Sequence[DeadLetter]) -> None:
        """Produce dead letters (key = original key) and wait for acks."""
        futs = [
            await self.producer.send(
                self.kafka.topics.dlq,
                key=d.message.key,
                value=dead_letter_value(d, self.max_dead_letter_bytes),
            )
            for d in dead
        ]
        for f in futs:
            await f

    async def close(self) -> None:
        """Flush and disconnect."""
        await self.producer.stop()

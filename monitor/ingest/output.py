"""Where ingested window records go: a `.jsonl`/`.jsonl.gz` recording, or the samples topic."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import msgspec

from monitor.config import KafkaSettings, Settings
from monitor.errors import IngestError, UsageError
from monitor.kafka_client import client_kwargs

_enc = msgspec.json.Encoder(order="deterministic")


def encode(record: dict[str, Any]) -> bytes:
    """One record as compact JSON."""
    return _enc.encode(record)


def open_out(path: Path) -> IO[bytes]:
    """Open a recording for writing; gzip by suffix."""
    if path.suffix == ".zst":
        raise UsageError(f"{path}: .zst output is not supported; use .jsonl or .jsonl.gz")
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "wb")  # type: ignore[return-value]
        return path.open("wb")
    except OSError as exc:
        raise IngestError(f"{path}: {exc.strerror or exc}") from None


def write_records(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Write records as JSONL (one per line)."""
    with open_out(path) as f:
        for rec in records:
            f.write(encode(rec) + b"\n")


def kafka_settings(base: KafkaSettings, bootstrap: str | None) -> KafkaSettings:
    """The configured Kafka settings with `--kafka HOST:PORT` on top."""
    servers = bootstrap or base.bootstrap_servers
    if not servers:
        raise UsageError(
            "no Kafka to produce to: pass --kafka HOST:PORT or set kafka.bootstrap_servers"
        )
    return base.model_copy(update={"bootstrap_servers": servers})


class Producer:
    """Produces window records to the samples topic, keyed by device (contract §1)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        from aiokafka import AIOKafkaProducer  # noqa: PLC0415 - only when producing

        self.topic = kafka.topics.samples
        self._producer = AIOKafkaProducer(**client_kwargs(kafka), acks="all", linger_ms=5)

    async def start(self) -> None:
        """Connect."""
        await self._producer.start()

    async def send(self, records: Sequence[dict[str, Any]]) -> None:
        """Produce and wait until the broker has every record."""
        futs = [
            await self._producer.send(self.topic, key=r["device"].encode(), value=encode(r))
            for r in records
        ]
        for f in futs:
            await f

    async def close(self) -> None:
        """Flush and disconnect."""
        await self._producer.stop()


async def produce(kafka: KafkaSettings, records: Sequence[dict[str, Any]]) -> None:
    """Produce a finite batch of records, then disconnect."""
    producer = Producer(kafka)
    await producer.start()
    try:
        await producer.send(records)
    finally:
        await producer.close()


def emit(args: argparse.Namespace, settings: Settings, records: Sequence[dict[str, Any]]) -> str:
    """Write or produce the records; returns where they went, for the summary line."""
    if args.kafka is not None:
        kafka = kafka_settings(settings.kafka, args.kafka)
        asyncio.run(produce(kafka, records))
        return f"topic {kafka.topics.samples} at {kafka.bootstrap_servers}"
    if args.out is not None:
        write_records(args.out, records)
        return str(args.out)
    for rec in records:
        sys.stdout.buffer.write(encode(rec) + b"\n")
    sys.stdout.flush()
    return "stdout"

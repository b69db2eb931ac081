"""`flopwatch record`: capture topics to a recording, sorted by event time."""

from __future__ import annotations

import argparse
import json
import sys
import time

from aiokafka import AIOKafkaConsumer

from monitor.config import Settings
from monitor.errors import UsageError
from monitor.kafka_client import client_kwargs
from monitor.sources.recording import RECORDING_SUFFIXES, create_recording


async def record(args: argparse.Namespace, settings: Settings) -> int:
    """Read the topics until idle (or `--max-records`) and write them as JSONL."""
    if not settings.kafka.bootstrap_servers:
        raise UsageError("no Kafka configured: set FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS")
    if not args.out.name.endswith(RECORDING_SUFFIXES):
        raise UsageError(f"--out must end in {', '.join(RECORDING_SUFFIXES)}, got {args.out.name}")
    topics = args.topic or [settings.kafka.topics.samples, settings.kafka.topics.changes]
    consumer = AIOKafkaConsumer(
        *topics, **client_kwargs(settings.kafka), group_id=None,
        auto_offset_reset="earliest", enable_auto_commit=False,
    )  # fmt: skip
    await consumer.start()
    try:
        rows = await _read(consumer, args.max_records, args.idle_timeout)
    finally:
        await consumer.stop()
    rows.sort(key=lambda r: (r[0], r[1]))
    if args.max_records is not None:
        rows = rows[: args.max_records]
    with create_recording(args.out) as f:
        for _, _, value in rows:
            f.write(value.rstrip(b"\n") + b"\n")
    print(f"recorded {len(rows)} records from {', '.join(topics)} to {args.out}", file=sys.stderr)
    return 0


async def _read(
    consumer: AIOKafkaConsumer, max_records: int | None, idle_timeout: float
) -> list[tuple[float, int, bytes]]:
    """(sort time, arrival, value) of every record until idle or `max_records`."""
    rows: list[tuple[float, int, bytes]] = []
    idle_since = time.monotonic()
    while max_records is None or len(rows) < max_records:
        got = await consumer.getmany(timeout_ms=200, max_records=5000)
        if not got:
            if time.monotonic() - idle_since > idle_timeout:
                break
            continue
        idle_since = time.monotonic()
        for msgs in got.values():
            for m in msgs:
                if m.value is not None:
                    rows.append((_sort_ts(m.value, m.timestamp), len(rows), m.value))
    return rows


def _sort_ts(value: bytes, broker_ms: int) -> float:
    """Event time where the record has one, else broker time."""
    try:
        return float(json.loads(value).get("ts", broker_ms / 1000))
    except (ValueError, AttributeError, TypeError):
        return broker_ms / 1000

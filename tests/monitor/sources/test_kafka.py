"""The Kafka source on the real broker: what it reads at start, and in what pieces."""

from __future__ import annotations

import json

import pytest
from aiokafka import AIOKafkaProducer
from factories import T0, msg, window
from kafka_helpers import isolated_settings

from monitor.daemon.embedded import EmbeddedBroker, ensure_topics
from monitor.sources.kafka import KafkaSource

pytestmark = pytest.mark.integration


async def test_a_long_changes_topic_arrives_in_batch_sized_pieces_before_samples(
    broker: EmbeddedBroker,
) -> None:
    """Every change event already on the topic is read at start, and handed over in pieces
    of at most `max_batch_records`, all before the first samples (the loop runs between)."""
    base = isolated_settings(broker)
    settings = base.model_copy(update={"kafka": base.kafka.model_copy(
        update={"max_batch_records": 500})})  # fmt: skip
    t = settings.kafka.topics
    await ensure_topics(settings.kafka)
    p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    await p.start()
    try:
        for i in range(1_800):
            ev = {"v": 1, "ts": T0 + i, "id": f"c{i}", "kind": "driver", "scope": {}}
            await p.send(t.changes, value=json.dumps(ev).encode())
        sample = msg(window("n0/gpu0", T0 + 2_000.0))
        await p.send(t.samples, key=sample.key, value=sample.value)
        await p.flush()
    finally:
        await p.stop()
    source = KafkaSource(settings.kafka)
    await source.start()
    sizes: list[tuple[int, int]] = []  # (changes, samples) per non-empty batch
    try:
        async for batch in source.batches():
            if batch:
                n_changes = sum(m.topic == t.changes for m in batch)
                sizes.append((n_changes, len(batch) - n_changes))
            if sum(s for _, s in sizes):
                break
    finally:
        await source.close()
    assert sum(c for c, _ in sizes) == 1_800
    assert max(c for c, _ in sizes) <= 500
    assert [s for _, s in sizes][:-1] == [0] * (len(sizes) - 1)  # samples come last

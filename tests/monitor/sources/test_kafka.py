"""The Kafka source on the real broker: what it reads at start, and in what pieces."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from daemon_helpers import Daemon, until
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


async def test_a_stalled_consumer_is_not_ready(broker: EmbeddedBroker) -> None:
    """Records waiting on the broker and nothing delivered for `stall_s`: not ready; once
    caught up (or delivering) it is ready again."""
    settings = isolated_settings(broker)
    source = KafkaSource(settings.kafka.model_copy(update={"stall_s": 30.0}))
    tp = TopicPartition(settings.kafka.topics.samples, 0)
    high = {tp: 100}
    source.consumer.assignment = lambda: set(high)  # type: ignore[method-assign]
    source.consumer.highwater = high.get  # type: ignore[method-assign]
    source.assignments, source.polled, source._next = 1, True, {tp: 40}
    try:
        assert source.ready
        source._progress_at -= 31.0
        assert source.stalled
        assert not source.ready
        source._next[tp] = 100  # caught up: nothing to deliver is no stall
        assert not source.stalled
        assert source.ready
    finally:
        await source.close()


async def test_a_broker_that_went_away_makes_the_daemon_unready() -> None:
    """/readyz answered 200 through a broker outage; now the metadata probe notices within
    a few probe intervals and readiness drops (a broker of its own: this one is stopped)."""
    own = EmbeddedBroker()
    await own.start()
    d: Daemon | None = None
    try:
        settings = isolated_settings(own)
        settings = settings.model_copy(update={"kafka": settings.kafka.model_copy(
            update={"probe_s": 0.3})})  # fmt: skip
        await ensure_topics(settings.kafka)
        d = await Daemon(settings).setup(http=True)
        await d.start()
        assert d.http is not None
        url = f"http://127.0.0.1:{d.http.port}/readyz"
        await until(lambda: d.source.ready, "ready")
        assert (await asyncio.to_thread(_status, url)) == 200
        await own.stop()
        await until(lambda: not d.source.ready, "unready after the broker stopped")
        assert (await asyncio.to_thread(_status, url)) == 503
        assert not d.source.broker_ok
    finally:
        if d is not None:  # the broker is gone, so leaving the group fails: close every part
            d.task.cancel()
            parts = [d.task, d.source.close(), d.checkpointer.close()]
            if d.http is not None:
                parts.append(d.http.close())
            for part in parts:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await part
        await own.stop()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback test URL
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code

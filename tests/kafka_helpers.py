"""Helpers for tests against the real broker: isolated topics, a daemon run, kcat reads."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiokafka import AIOKafkaProducer
from conftest import Kcat

from monitor.config import KafkaSettings, Settings, Topics
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics
from monitor.daemon.runner import Runner
from monitor.sinks.kafka import KafkaSink
from monitor.sources.kafka import KafkaSource


def isolated_settings(broker: EmbeddedBroker) -> Settings:
    """Settings with fresh topic names and group id, so tests never see each other's data."""
    run = uuid.uuid4().hex[:8]
    topics = Topics(samples=f"s-{run}", changes=f"c-{run}", alerts=f"a-{run}", dlq=f"d-{run}",
                    state=f"st-{run}", by_pool=f"bp-{run}",
                    change_points=f"cp-{run}")  # fmt: skip
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


async def run_daemon(settings: Settings, produce: Callable[[], Awaitable[None]]) -> Pipeline:
    """Run the daemon until `produce` is done and the source is idle; return its pipeline."""
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


async def produce(settings: Settings, batches: list[list[RawMessage]]) -> None:
    """Send the factory's batches to the settings' topics and wait for the acks."""
    t = settings.kafka.topics
    p = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, linger_ms=5)
    await p.start()
    try:
        for batch in batches:
            for m in batch:
                topic = t.changes if m.topic == "flopwatch.changes" else t.samples
                await p.send(topic, key=m.key, value=m.value)
        await p.flush()
    finally:
        await p.stop()


def run_process_until(
    env: dict[str, str],
    log: Path,
    feed: Callable[[], None],
    done: Callable[[], bool],
    what: str,
    timeout_s: float = 90.0,
) -> int:
    """`flopwatch run` as a process: feed it, wait until `done()` (failing with `what` past
    the deadline, or with its log if it dies), stop it with SIGTERM; its exit code."""
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "monitor", "run"], env=env,
                                stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        try:
            feed()
            deadline = time.monotonic() + timeout_s
            while not done():
                assert proc.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, what
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(30)
    return code

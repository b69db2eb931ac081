"""A daemon (Runner + KafkaSource + Checkpointer, optionally /metrics) in the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from kafka_helpers import isolated_settings
from prometheus_client import CollectorRegistry

from monitor.checkpoint import Checkpointer, CheckpointStore
from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.daemon.embedded import EmbeddedBroker
from monitor.daemon.http import HttpServer
from monitor.daemon.prometheus import register_metrics
from monitor.daemon.repartition import Repartitioner
from monitor.daemon.runner import Runner
from monitor.sinks.base import Sink
from monitor.sinks.kafka import KafkaSink
from monitor.sinks.memory import ListSink
from monitor.sources.kafka import KafkaSource

DEVICES = 32
# The broker holds a departed member's partitions until its session times out, so a
# restart within the default 10 s session takes ~20 s; these keep it to about a second.
FAST_GROUP = {"session_timeout_ms": 1000, "heartbeat_interval_ms": 100,
              "rebalance_timeout_ms": 2000}  # fmt: skip


def fast_settings(broker: EmbeddedBroker) -> Settings:
    """Isolated topics, and batches small enough (~0.1 s of work) that a heartbeat is never
    held up past the short session timeout, which would rebalance mid-test."""
    s = isolated_settings(broker)
    return s.model_copy(update={"kafka": s.kafka.model_copy(update={"max_batch_records": 256})})


@dataclass
class Daemon:
    """One running daemon (Runner + KafkaSource + Checkpointer) in this event loop."""

    settings: Settings
    clock: Callable[[], float] = time.monotonic
    pipeline: Pipeline = field(init=False)
    source: KafkaSource = field(init=False)
    checkpointer: Checkpointer = field(init=False)
    sink: ListSink = field(default_factory=ListSink)
    runner: Runner = field(init=False)
    task: asyncio.Task[None] = field(init=False)
    http: HttpServer | None = None  # set by `setup(http=True)`: serves on a free port
    # With `kafka.repartition` on: the copy stage, run beside the runner as `flopwatch run` does.
    rep: Repartitioner | None = None
    rep_task: asyncio.Task[None] | None = None
    # With `kafka.fleet_stage` on: the Kafka sink, which publishes the fleet-stage reports
    # and also sends the alerts to the alerts topic, as `flopwatch run` does.
    kafka_sink: KafkaSink | None = None

    async def setup(self, http: bool = False) -> Daemon:
        """Build everything (and start /metrics) without joining the group yet."""
        self.pipeline = Pipeline(self.settings)
        self.source = KafkaSource(self.settings.kafka, consumer_options=FAST_GROUP)
        store = CheckpointStore(self.settings.kafka, self.settings.checkpoint)
        await store.start()
        self.checkpointer = Checkpointer(self.source, self.pipeline, store,
                                         self.settings.checkpoint, clock=self.clock)  # fmt: skip
        self.source.hooks = self.checkpointer
        sinks: list[Sink] = [self.sink]
        if self.settings.kafka.fleet_stage:
            self.kafka_sink = KafkaSink(self.settings.kafka)
            await self.kafka_sink.start()
            sinks.append(self.kafka_sink)
        self.runner = Runner(self.source, self.pipeline, sinks, checkpointer=self.checkpointer,
                             publish_report=self.kafka_sink.send_report if self.kafka_sink
                             else None)  # fmt: skip
        if http:
            registry = register_metrics(CollectorRegistry(), self.runner, self.source,
                                        self.checkpointer, lambda: self.source.ready)  # fmt: skip
            self.http = HttpServer(registry, lambda: self.source.ready)
            await self.http.start()
        return self

    async def start(self) -> Daemon:
        """Join the group and run (after `setup`, which this calls if needed)."""
        if not hasattr(self, "runner"):
            await self.setup()
        if self.settings.kafka.repartition:
            self.rep = Repartitioner(self.settings.kafka, consumer_options=FAST_GROUP)
            await self.rep.start()
            self.rep_task = asyncio.create_task(self.rep.run())
        await self.source.start()
        self.task = asyncio.create_task(self.runner.run())
        return self

    async def stop(self) -> None:
        """Clean stop: the runner finishes its batch and writes a final checkpoint."""
        self.runner.stop.set()
        try:
            await asyncio.wait_for(self.task, 30)
        finally:
            await self._close()

    async def crash(self) -> None:
        """Stop without the final checkpoint (what a kill leaves behind)."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self._close()

    async def _close(self) -> None:
        if self.rep is not None and self.rep_task is not None:
            self.rep.stop.set()
            await asyncio.wait_for(self.rep_task, 30)
            await self.rep.close()
        if self.http is not None:
            await self.http.close()
        await self.source.close()
        await self.checkpointer.close()
        if self.kafka_sink is not None:
            await self.kafka_sink.close()

    @property
    def records(self) -> int:
        """Window records the pipeline accepted."""
        return self.pipeline.stats.records_in


async def until(cond: Callable[[], bool], what: str, within: float = 30.0) -> None:
    """Poll a condition until it holds; fail with `what` at the deadline."""
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)

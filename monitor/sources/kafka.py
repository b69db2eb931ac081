"""Kafka source: an aiokafka consumer-group member reading samples and change events.

Offsets are committed manually after the sinks have acknowledged a batch
(at-least-once); duplicates after a restart are dropped by the stream table.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

from monitor.config import KafkaSettings
from monitor.logging import get_logger
from monitor.sources.base import RawMessage


class _CommitOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: KafkaSource) -> None:
        self.source = source

    async def on_partitions_revoked(self, revoked: object) -> None:
        await self.source.commit()

    async def on_partitions_assigned(self, assigned: object) -> None:
        parts = sorted(str(tp) for tp in assigned)  # type: ignore[attr-defined]
        self.source.log.info("partitions assigned", partitions=parts)


class KafkaSource:
    """Consumes the samples and changes topics in `getmany` batches."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka
        self.log = get_logger("source.kafka", group=kafka.group_id)
        self.consumer = AIOKafkaConsumer(
            **kafka.client_kwargs(),
            group_id=kafka.group_id,
            enable_auto_commit=False,
            auto_offset_reset=kafka.auto_offset_reset,
        )
        self._pending = False

    async def start(self) -> None:
        """Connect and subscribe."""
        await self.consumer.start()
        t = self.kafka.topics
        self.consumer.subscribe([t.samples, t.changes], listener=_CommitOnRevoke(self))

    async def batches(self) -> AsyncIterator[list[RawMessage]]:
        """Batches from `getmany`; an empty poll yields nothing and polls again."""
        while True:
            got = await self.consumer.getmany(
                timeout_ms=self.kafka.poll_timeout_ms, max_records=self.kafka.max_batch_records
            )
            if not got:
                yield []
                continue
            batch = [
                RawMessage(tp.topic, tp.partition, m.offset, m.key, m.value)
                for tp, msgs in got.items()
                for m in msgs
                if m.value is not None
            ]
            self._pending = True
            yield batch

    async def commit(self) -> None:
        """Commit the positions of everything yielded so far."""
        if self._pending:
            await self.consumer.commit()
            self._pending = False

    async def close(self) -> None:
        """Leave the group and close connections."""
        await self.consumer.stop()

"""Kafka source: an aiokafka consumer-group member reading samples and change events.

Offsets are committed manually after the sinks have acknowledged a batch
(at-least-once); duplicates after a restart are dropped by the stream table.

Rebalances are serialised with batch processing by one lock: a batch is
yielded with the lock held, and the lock is released only when the runner asks
for the next batch, i.e. after it processed, sent and committed this one. The
revoke callback takes the same lock, so it never sees half a batch. The offsets
committed (and checkpointed) are the ones this source delivered, tracked per
partition, never the consumer's fetch position, which may run ahead.

Assignment is finished lazily, in the poll loop rather than in aiokafka's
callback: heartbeats do not run during that callback, and restoring large
checkpoints there could cost the group membership. New partitions stay paused
until their hooks ran and they were sought to where processing must resume.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Set
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from monitor.config import KafkaSettings
from monitor.logging import get_logger
from monitor.sources.base import RawMessage


class RebalanceHooks(Protocol):
    """What a stateful consumer (the checkpointer) does when partitions move.

    `revoked` runs with no batch in flight, before the revoked partitions'
    offsets are committed; `assigned` runs before any record of the new
    assignment is delivered and returns the offsets to resume from (partitions
    it leaves out resume from their committed offset).
    """

    async def revoked(self, partitions: Set[TopicPartition]) -> None:
        """Partitions about to be taken away (state still reflects everything delivered)."""
        ...

    async def assigned(self, partitions: Set[TopicPartition]) -> Mapping[TopicPartition, int]:
        """Partitions just given to this member; returns {partition: next offset to read}."""
        ...


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: KafkaSource) -> None:
        self.source = source

    async def on_partitions_revoked(self, revoked: Set[TopicPartition]) -> None:
        await self.source._revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Set[TopicPartition]) -> None:
        self.source._assigned(set(assigned))


class KafkaSource:
    """Consumes the samples and changes topics in `getmany` batches."""

    def __init__(
        self,
        kafka: KafkaSettings,
        hooks: RebalanceHooks | None = None,
        consumer_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.kafka = kafka
        self.hooks = hooks
        self.log = get_logger("source.kafka", group=kafka.group_id)
        # `consumer_options`: extra aiokafka arguments, e.g. the short session timeouts
        # that let tests restart a group member in about a second.
        self.consumer = AIOKafkaConsumer(
            **kafka.client_kwargs(),
            group_id=kafka.group_id,
            enable_auto_commit=False,
            auto_offset_reset=kafka.auto_offset_reset,
            **(consumer_options or {}),
        )
        self._pending = False
        self._lock = asyncio.Lock()
        # Bumped by every rebalance callback: a poll that overlapped one is discarded.
        self._generation = 0
        self._next: dict[TopicPartition, int] = {}  # next offset to deliver, per partition
        self._to_assign: set[TopicPartition] | None = None
        self.assignments = 0  # completed assignments (restores included)
        self.polled = False  # a poll succeeded since the last completed assignment

    async def start(self) -> None:
        """Connect and subscribe."""
        await self.consumer.start()
        t = self.kafka.topics
        self.consumer.subscribe([t.samples, t.changes], listener=_Listener(self))

    @property
    def ready(self) -> bool:
        """Assigned (checkpoints restored) and polled since; false during a reassignment."""
        return self.assignments > 0 and self._to_assign is None and self.polled

    def delivered(self) -> dict[TopicPartition, int]:
        """Next offset to deliver per assigned partition (all before it were yielded)."""
        return dict(self._next)

    async def batches(self) -> AsyncIterator[list[RawMessage]]:
        """Batches from `getmany`; an empty poll yields nothing and polls again."""
        while True:
            if self._to_assign is not None:
                async with self._lock:
                    await self._finish_assignment()
            generation = self._generation
            got = await self.consumer.getmany(
                timeout_ms=self.kafka.poll_timeout_ms, max_records=self.kafka.max_batch_records
            )
            async with self._lock:
                if generation != self._generation or self._to_assign is not None:
                    self._rewind()
                    continue
                self.polled = True
                if not got:
                    yield []
                    continue
                batch = [
                    RawMessage(tp.topic, tp.partition, m.offset, m.key, m.value)
                    for tp, msgs in got.items()
                    for m in msgs
                    if m.value is not None
                ]
                for tp, msgs in got.items():
                    if msgs:
                        self._next[tp] = msgs[-1].offset + 1
                self._pending = True
                # The lock stays held until the runner comes back for the next batch.
                yield batch

    async def commit(self) -> None:
        """Commit the positions of everything yielded so far."""
        if self._pending and self._next:
            try:
                await self.consumer.commit(dict(self._next))
            except CommitFailedError as exc:
                # The group moved on without us: the partitions' next owner resumes from
                # the last committed offset or checkpoint, and replay is safe.
                self.log.warning("commit failed; records will be re-read", error=repr(exc))
                return
            self._pending = False

    async def close(self) -> None:
        """Leave the group and close connections."""
        await self.consumer.stop()

    def _rewind(self) -> None:
        """Forget a poll that raced a rebalance: fetch again from what was delivered."""
        assigned = self.consumer.assignment()
        for tp, offset in self._next.items():
            if tp in assigned:
                self.consumer.seek(tp, offset)

    async def _revoked(self, revoked: set[TopicPartition]) -> None:
        if not revoked:
            self._to_assign = None
            return  # the first join of this member: nothing to hand over
        async with self._lock:
            self._to_assign = None
            try:
                if self.hooks is not None:
                    await self.hooks.revoked(revoked & self._next.keys())
                await self.commit()
            finally:
                for tp in revoked:
                    self._next.pop(tp, None)
                self._generation += 1
            self.log.info("partitions revoked", partitions=_names(revoked))

    def _assigned(self, assigned: set[TopicPartition]) -> None:
        self._to_assign = assigned
        self._generation += 1
        self.polled = False
        if assigned:
            self.consumer.pause(*assigned)

    async def _finish_assignment(self) -> None:
        assigned, self._to_assign = self._to_assign or set(), None
        seeks = await self.hooks.assigned(assigned) if self.hooks is not None else {}
        current = self.consumer.assignment()
        for tp in assigned:
            if tp not in current:
                continue  # revoked again while the hooks ran; the next assignment handles it
            try:
                if tp in seeks:
                    self.consumer.seek(tp, seeks[tp])
                    self._next[tp] = seeks[tp]
                else:
                    self._next[tp] = await self.consumer.position(tp)
            except IllegalStateError:
                continue
        self.consumer.resume(*(assigned & current))
        self._generation += 1
        self.assignments += 1
        self.log.info("partitions assigned", partitions=_names(assigned),
                      resumed_from_checkpoint=len(seeks))  # fmt: skip


def _names(tps: Set[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}/{tp.partition}" for tp in tps)

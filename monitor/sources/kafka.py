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

Only the samples topic (or its by-pool copy, `monitor/repartition.py`) is
shared out by the group, with, under `kafka.fleet_stage`, the change-point topic (its
member runs the fleet stage, `core/fleet.py`). Change events are broadcast:
a second consumer, outside the group, reads every partition of the changes
topic from its beginning, so every member knows every change. Samples are keyed
by device, so each member sees part of every pool; a change read by one member
only would leave the others' pages without their rollback. At start the changes
already on the topic are read before the first batch is yielded, so a restarted
member knows them before it pages again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Set
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from monitor.config import KafkaSettings
from monitor.core.types import RawMessage
from monitor.kafka_client import client_kwargs
from monitor.log import get_logger


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


# How long start() reads the changes already on the topic before it goes on (the rest
# then arrive with the first batches).
CHANGES_CATCH_UP_S = 30.0


class KafkaSource:
    """Consumes the samples topic as a group member and every change event, in batches."""

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
            **client_kwargs(kafka),
            group_id=kafka.group_id,
            enable_auto_commit=False,
            auto_offset_reset=kafka.auto_offset_reset,
            **(consumer_options or {}),
        )
        # Change events: every partition, no group, nothing committed (read from the
        # beginning on every start; the advisor drops duplicates and events past its
        # look-back).
        self.changes_consumer = AIOKafkaConsumer(
            **client_kwargs(kafka), group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest",
        )  # fmt: skip
        self._early_changes: list[RawMessage] = []
        self._pending = False
        self._lock = asyncio.Lock()
        # Bumped by every rebalance callback: a poll that overlapped one is discarded.
        self._generation = 0
        self._next: dict[TopicPartition, int] = {}  # next offset to deliver, per partition
        # Per partition resumed from a checkpoint behind its committed offset: that offset.
        # Records before it were processed (and their alerts sent) before the restart.
        self._replay_to: dict[TopicPartition, int] = {}
        self.batch_replays = False  # the last batch held such records
        self._to_assign: set[TopicPartition] | None = None
        self.assignments = 0  # completed assignments (restores included)
        self.polled = False  # a poll succeeded since the last completed assignment
        self.broker_ok = True  # the last metadata probe was answered
        self._progress_at = time.monotonic()  # records delivered, or nothing left to deliver
        self._probe: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect, read the change events already on the topic, and join the group."""
        await self.changes_consumer.start()
        # No group: aiokafka assigns every partition of the topic, and any added later
        # (or the topic itself, if it is created after this start) on a metadata update.
        self.changes_consumer.subscribe([self.kafka.topics.changes])
        self._early_changes = await self._catch_up_changes()
        await self.consumer.start()
        topics = [self.kafka.input_topic]
        if self.kafka.fleet_stage:
            # The group hands its one busy partition (the fleet's key) to one member: the one
            # that runs the fleet stage (`core.fleet`).
            topics.append(self.kafka.topics.change_points)
        self.consumer.subscribe(topics, listener=_Listener(self))
        self._probe = asyncio.create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        """Ask the cluster for its metadata every `probe_s`: a broker that is down must
        make the member unready, though polls just come back empty."""
        while True:
            await asyncio.sleep(self.kafka.probe_s)
            try:
                await asyncio.wait_for(self.consumer.topics(), self.kafka.probe_s)
            except (KafkaError, TimeoutError) as exc:
                if self.broker_ok:  # said once per change of state, not per probe
                    self.log.warning("broker unreachable: not ready", error=repr(exc))
                self.broker_ok = False
                continue
            if not self.broker_ok:
                self.log.info("broker reachable again")
            self.broker_ok = True

    @property
    def stalled(self) -> bool:
        """Nothing delivered for `stall_s` while the broker reports records not delivered."""
        if time.monotonic() - self._progress_at <= self.kafka.stall_s:
            return False
        return any(
            (high := self.consumer.highwater(tp)) is not None and high > self._next.get(tp, 0)
            for tp in self.consumer.assignment()
        )

    def _note_progress(self, delivered: bool) -> None:
        """A poll delivered records, or every assigned partition is caught up."""
        caught_up = all(
            (high := self.consumer.highwater(tp)) is None or high <= self._next.get(tp, 0)
            for tp in self.consumer.assignment()
        )
        if delivered or caught_up:
            self._progress_at = time.monotonic()

    async def _catch_up_changes(self) -> list[RawMessage]:
        """The change events on the topic now (up to its end offsets at this call)."""
        c = self.changes_consumer
        deadline = time.monotonic() + CHANGES_CATCH_UP_S
        out: list[RawMessage] = []
        # The first fetch makes the assignment (from the metadata) and reads.
        out.extend(_raw(await c.getmany(timeout_ms=self.kafka.poll_timeout_ms)))
        tps = list(c.assignment())
        if not tps:
            self.log.warning("changes topic not found; pages carry no rollback until it exists",
                             topic=self.kafka.topics.changes)  # fmt: skip
            return out
        end = await c.end_offsets(tps)
        while [tp for tp in tps if await c.position(tp) < end[tp]]:
            if time.monotonic() > deadline:
                self.log.warning("changes not read to the end at start; they follow later",
                                 read=len(out))  # fmt: skip
                break
            out.extend(_raw(await c.getmany(timeout_ms=self.kafka.poll_timeout_ms)))
        self.log.info("change events read at start", count=len(out))
        return out

    async def _new_changes(self) -> list[RawMessage]:
        """Change events fetched since the last call (no wait)."""
        early, self._early_changes = self._early_changes, []
        return early + _raw(await self.changes_consumer.getmany(timeout_ms=0))

    @property
    def ready(self) -> bool:
        """Assigned (checkpoints restored) and polled since, the broker answering, and the
        consumer not stalled; false during a reassignment."""
        return (
            self.assignments > 0
            and self._to_assign is None
            and self.polled
            and self.broker_ok
            and not self.stalled
        )

    @property
    def replaying(self) -> bool:
        """The last batch re-read records processed before a restart (between a restored
        checkpoint and the committed offset)."""
        if self._replay_to:
            self._replay_to = {
                tp: o for tp, o in self._replay_to.items() if self._next.get(tp, o) < o
            }
        return self.batch_replays

    def delivered(self) -> dict[TopicPartition, int]:
        """Next offset to deliver per assigned partition (all before it were yielded)."""
        return dict(self._next)

    async def batches(self) -> AsyncIterator[list[RawMessage]]:
        """Batches from `getmany`; an empty poll yields nothing and polls again."""
        while True:
            if self._to_assign is not None:
                async with self._lock:
                    await self._finish_assignment()
            step = self.kafka.max_batch_records
            while len(self._early_changes) > step:
                # A long changes topic goes through in batch-sized pieces, all before the
                # first samples: the loop (probes, metrics) runs between them.
                chunk, self._early_changes = self._early_changes[:step], self._early_changes[step:]
                yield chunk
            generation = self._generation
            got = await self.consumer.getmany(
                timeout_ms=self.kafka.poll_timeout_ms, max_records=self.kafka.max_batch_records
            )
            async with self._lock:
                if generation != self._generation or self._to_assign is not None:
                    self._rewind()
                    continue
                self.polled = True
                self._note_progress(bool(got))
                # Changes first: a page in this batch can then name a change that came
                # with it.
                changes = await self._new_changes()
                if not got:
                    yield changes
                    continue
                batch = changes + _raw(got)
                self.batch_replays = False
                for tp, msgs in got.items():
                    if msgs:
                        end = self._replay_to.get(tp)
                        if end is not None and msgs[0].offset < end:
                            self.batch_replays = True
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
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        try:
            await self.consumer.stop()
        finally:
            await self.changes_consumer.stop()

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
                    committed = await self.consumer.committed(tp)
                    if committed is not None and committed > seeks[tp]:
                        self._replay_to[tp] = committed
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


def _raw(got: Mapping[TopicPartition, list[Any]]) -> list[RawMessage]:
    """A `getmany` result as raw messages, in partition then offset order (tombstones out)."""
    return [
        RawMessage(tp.topic, tp.partition, m.offset, m.key, m.value)
        for tp, msgs in got.items()
        for m in msgs
        if m.value is not None
    ]


def _names(tps: Set[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}/{tp.partition}" for tp in tps)

"""When to checkpoint what, and restoring on assignment (the policy over the store).

What is stored. Each input partition's state (`Pipeline.snapshot_partition`: streams,
detectors, load models and the open incidents that partition owns) under the base
key `<group_id>/<input topic>/<partition>`, and the cross-partition state
(`Pipeline.snapshot_incidents`: incidents, recent evidence, change events) under
`<group_id>/<input topic>/incidents/<lowest assigned partition>`. The input topic
is the samples topic, or the by-pool topic when `kafka.repartition` is on.

The off-by-one rule: a checkpoint records, per input partition, the NEXT offset to
read. The state includes every record before that offset and none at or after it,
so restoring it and seeking there resumes exactly (records between the checkpoint
and the committed offset are read again; replay is safe because restored state has
not seen them, and alert ids are deterministic fingerprints). Checkpoints are
written after the sinks acknowledged and before the offsets are committed, so the
committed offset never runs ahead of the newest checkpoint by a record that was not
delivered.

Incidents follow partitions: an open incident travels in the checkpoint of the
partition that owns it (the lowest of its regressions' partitions), so a member
that takes the partition over in a rebalance restores the incident with it. The
member-wide incidents checkpoint, keyed by its lowest partition, is restored only
when it was written together with at least one restored partition checkpoint
(same recorded offset), so stale incidents of an old assignment never come back.

The fleet stage (`kafka.fleet_stage`, `core/fleet.py`) is stored with the change-point
partition it reads, under `<group_id>/<change-point topic>/<partition>` with that
partition's next offset, and restored by whichever member is assigned that partition.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping, Set
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from monitor.checkpoint.format import Checkpoint, offset_key
from monitor.checkpoint.store import CheckpointStore, Written
from monitor.config import CheckpointSettings, KafkaSettings
from monitor.core.pipeline import Pipeline
from monitor.errors import StateVersionError
from monitor.log import get_logger


@dataclass
class CheckpointStats:
    """Counters read by the metrics collector at scrape time (no work on the hot path)."""

    writes: int = 0
    write_failures: int = 0
    bytes_written: int = 0  # compressed, all checkpoints so far
    restores: int = 0  # partitions restored from a checkpoint
    incident_restores: int = 0
    restore_failures: int = 0  # a checkpoint found but unusable (fell back)
    version_mismatches: int = 0  # written by another state version (fell back)
    last_write_s: float = 0.0  # wall time of the last save round
    last_restore_s: float = 0.0
    # Per samples partition: when its stored state was last current (clock units), size.
    saved_at: dict[int, float] = field(default_factory=dict)
    stored_bytes: dict[int, int] = field(default_factory=dict)


class DeliveredOffsets(Protocol):
    """What the checkpointer needs of a source: where processing would resume."""

    def delivered(self) -> dict[TopicPartition, int]:
        """Per input partition, the next offset after the last record yielded."""
        ...


class Checkpointer:
    """When to checkpoint, what, and restore on assignment; the source's rebalance hooks.

    The runner calls `save` (when `due`) after sinks acknowledged a batch and
    before it commits, and once more on clean shutdown; the source calls
    `revoked` (save the revoked partitions) and `assigned` (restore and say where
    to resume).
    """

    def __init__(
        self,
        source: DeliveredOffsets,
        pipeline: Pipeline,
        store: CheckpointStore,
        settings: CheckpointSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.pipeline = pipeline
        self.store = store
        self.interval_s = settings.interval_s
        self.clock = clock
        kafka = store.kafka
        self.topic = kafka.input_topic
        self.group = kafka.group_id
        self.stats = CheckpointStats()
        self.log = get_logger("checkpoint", group=self.group)
        self._last_round = clock()
        self._saved: dict[int, int] = {}  # samples partition -> offset of its stored state
        self._incidents_saved: tuple[object, ...] | None = None
        self._incidents_restored = False
        self._parked: dict[int, int] = {}  # revoked, kept in memory in case they come back
        # The fleet stage's change-point topic (None: no fleet stage), the (partition, offset)
        # of its stored state, and its revoked partition kept in memory like `_parked`.
        self.points_topic = kafka.topics.change_points if kafka.fleet_stage else None
        self._fleet_saved: tuple[int, int] | None = None
        self._fleet_parked: dict[int, int] = {}

    def partition_key(self, partition: int) -> str:
        """Base key of one samples partition's state."""
        return f"{self.group}/{self.topic}/{partition}"

    def incidents_key(self, lowest: int) -> str:
        """Base key of the incidents of the member whose lowest partition is `lowest`."""
        return f"{self.group}/{self.topic}/incidents/{lowest}"

    def fleet_key(self, partition: int) -> str:
        """Base key of the fleet stage's state, stored with its change-point partition."""
        return f"{self.group}/{self.points_topic}/{partition}"

    def saved_offsets(self) -> dict[int, int]:
        """Per samples partition, the next offset its newest stored checkpoint covers."""
        return dict(self._saved)

    def due(self) -> bool:
        """True when `interval_s` passed since the last save."""
        return self.clock() - self._last_round >= self.interval_s

    async def save(self, partitions: Collection[int] | None = None) -> None:
        """Store the state of these (default: all assigned) partitions, then the incidents.

        Call only with no batch in flight. A failed write is logged and counted; the
        next owner then restores an older checkpoint and replays more.
        """
        self._last_round = now = self.clock()
        t0 = time.perf_counter()
        offsets = self.source.delivered()
        samples = {tp.partition: o for tp, o in offsets.items() if tp.topic == self.topic}
        targets = sorted(samples if partitions is None else set(partitions) & samples.keys())
        for p in targets:
            if p not in self.pipeline.partitions:
                continue  # nothing decoded from it yet: fresh state is the same
            if self._saved.get(p) == samples[p]:
                self.stats.saved_at[p] = now
                continue
            w = await self._write(
                self.partition_key(p), self.pipeline.snapshot_partition(p),
                {offset_key(self.topic, p): samples[p]}, self.pipeline.partition_ts.get(p), p,
            )  # fmt: skip
            if w is not None:
                self._saved[p] = samples[p]
                self.stats.saved_at[p] = now
                self.stats.stored_bytes[p] = w.bytes
        if samples:
            lowest = min(samples)
            state = (lowest, *sorted(offsets.items()))
            if state != self._incidents_saved:
                # Samples offsets let a restore tell whether these incidents belong with
                # the partition checkpoints it found. (Change events need no offset: every
                # member reads the whole changes topic at start, `sources/kafka.py`.)
                covered = {offset_key(tp.topic, tp.partition): o for tp, o in offsets.items()}
                w = await self._write(
                    self.incidents_key(lowest), self.pipeline.snapshot_incidents(), covered,
                    self.pipeline.watermark(), lowest,
                )  # fmt: skip
                if w is not None:
                    self._incidents_saved = state
        await self._save_fleet(offsets)
        self.stats.last_write_s = time.perf_counter() - t0

    async def _save_fleet(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Store the fleet stage's state with its change-point partition, when it moved on."""
        fleet = self.pipeline.fleet
        if self.points_topic is None or fleet is None or fleet.partition is None:
            return
        p = fleet.partition
        offset = offsets.get(TopicPartition(self.points_topic, p))
        if offset is None or self._fleet_saved == (p, offset):
            return
        blob = self.pipeline.snapshot_fleet()
        if blob is None:
            return
        w = await self._write(self.fleet_key(p), blob, {offset_key(self.points_topic, p): offset},
                              fleet.watermark(), p)  # fmt: skip
        if w is not None:
            self._fleet_saved = (p, offset)

    async def _write(
        self, key: str, blob: bytes, offsets: dict[str, int], watermark: float | None, hint: int
    ) -> Written | None:
        try:
            w = await self.store.write(key, blob, offsets=offsets, watermark=watermark, hint=hint)
        except KafkaError as exc:
            self.stats.write_failures += 1
            self.log.exception("checkpoint write failed", key=key, error=repr(exc))
            return None
        self.stats.writes += 1
        self.stats.bytes_written += w.bytes
        self.log.debug("checkpoint written", key=key, bytes=w.bytes, raw_bytes=w.raw_bytes,
                       chunks=w.chunks, slot=w.slot)  # fmt: skip
        return w

    async def revoked(self, partitions: Set[TopicPartition]) -> None:
        """Save the revoked partitions (and incidents); keep their state until reassignment."""
        ours = [tp.partition for tp in partitions if tp.topic == self.topic]
        await self.save(ours)
        offsets = self.source.delivered()
        self._parked = {
            tp.partition: o
            for tp, o in offsets.items()
            if tp.topic == self.topic and tp in partitions
        }
        self._fleet_parked = {
            tp.partition: o
            for tp, o in offsets.items()
            if tp.topic == self.points_topic and tp in partitions
        }

    async def assigned(self, partitions: Set[TopicPartition]) -> dict[TopicPartition, int]:
        """Restore newly assigned partitions from their newest usable checkpoint.

        Returns where each restored partition must resume. Partitions that come
        back to this member in the same rebalance keep their in-memory state.
        Raises CheckpointError when the state topic cannot be read.
        """
        samples = sorted(tp.partition for tp in partitions if tp.topic == self.topic)
        seeks = {
            TopicPartition(self.topic, p): self._parked[p] for p in samples if p in self._parked
        }
        seeks.update(await self._assigned_fleet(partitions))
        for p in set(self._parked) - set(samples):
            self._forget(p)
        self._parked = {}
        fresh = [p for p in samples if TopicPartition(self.topic, p) not in seeks]
        wanted = {self.partition_key(p): p for p in fresh}
        inc_key = None
        if samples and not self._incidents_restored:
            inc_key = self.incidents_key(samples[0])
            wanted[inc_key] = samples[0]
        if not wanted:
            return seeks
        t0 = time.perf_counter()
        found = await self.store.load(wanted)
        restored: dict[str, int] = {}
        for p in fresh:
            offset = await self._restore_partition(p, found.get(self.partition_key(p), []))
            if offset is not None:
                seeks[TopicPartition(self.topic, p)] = offset
                restored[offset_key(self.topic, p)] = offset
        if inc_key is not None:
            self._incidents_restored = True
            cands = found.get(inc_key, [])
            await self._restore_incidents(cands, restored)
            # This member's last incidents may include partitions another member owns now.
            self.pipeline.keep_incidents_of(set(samples))
        self.stats.last_restore_s = time.perf_counter() - t0
        self.log.info("checkpoints restored", partitions=sorted(restored),
                      fresh=len(fresh) - len(restored),
                      seconds=round(self.stats.last_restore_s, 3))  # fmt: skip
        return seeks

    async def _assigned_fleet(self, partitions: Set[TopicPartition]) -> dict[TopicPartition, int]:
        """The change-point partitions of this assignment: the fleet stage kept (it came
        back), handed over (it went elsewhere) or restored from its checkpoint."""
        if self.points_topic is None:
            return {}
        topic = self.points_topic
        mine = sorted(tp.partition for tp in partitions if tp.topic == topic)
        parked, self._fleet_parked = self._fleet_parked, {}
        fleet = self.pipeline.fleet
        held = fleet.partition if fleet is not None else None
        if held is not None and held not in mine:
            self.pipeline.forget_fleet()
            self._fleet_saved = None
        seeks = {TopicPartition(topic, p): parked[p] for p in mine if p in parked}
        fresh = [p for p in mine if p not in parked]
        if not fresh:
            return seeks
        found = await self.store.load({self.fleet_key(p): p for p in fresh})
        for p in fresh:
            for cp in found.get(self.fleet_key(p), []):
                offset = cp.offsets.get(offset_key(topic, p))
                if offset is None:
                    self.stats.restore_failures += 1
                    continue
                if not await self._restore_one(
                    cp, partial(self.pipeline.restore_fleet, p), "fleet"
                ):
                    continue
                self._fleet_saved = (p, offset)
                seeks[TopicPartition(topic, p)] = offset
                self.log.info("fleet stage restored", partition=p, checkpoint=cp.id)
                break
        return seeks

    async def _restore_partition(self, p: int, candidates: list[Checkpoint]) -> int | None:
        for cp in candidates:
            offset = cp.offsets.get(offset_key(self.topic, p))
            if offset is None:
                self.stats.restore_failures += 1
                self.log.warning("checkpoint without an offset for its partition", key=cp.key,
                                 checkpoint=cp.id)  # fmt: skip
                continue
            try:
                blob = await asyncio.to_thread(cp.payload)
                outcomes = self.pipeline.restore_partition(p, blob)
            except StateVersionError as exc:
                self._version_mismatch(cp, exc)
                self._forget(p)
                continue
            except Exception as exc:  # noqa: BLE001 - a bad checkpoint must never stop the daemon
                self.stats.restore_failures += 1
                self.log.warning("unusable checkpoint, trying an older one", key=cp.key,
                                 checkpoint=cp.id, reason=repr(exc))  # fmt: skip
                self._forget(p)
                continue
            self.stats.restores += 1
            changed = {k: v for k, v in outcomes.items() if v != "kept"}
            if changed:
                # The configuration changed since the checkpoint: say what that did to state.
                self.log.warning("detector settings differ from the checkpoint's", partition=p,
                                 checkpoint=cp.id, detectors=changed)  # fmt: skip
            self._saved[p] = offset
            self.stats.saved_at[p] = self.clock()
            self.stats.stored_bytes[p] = len(cp.compressed)
            return offset
        return None

    async def _restore_incidents(
        self, candidates: list[Checkpoint], restored: Mapping[str, int]
    ) -> None:
        for cp in candidates:
            if not any(cp.offsets.get(k) == o for k, o in restored.items()):
                # Written with other partition state (an old assignment, or a torn round).
                self.log.info("incidents checkpoint does not match the restored partitions",
                              key=cp.key, checkpoint=cp.id)  # fmt: skip
                continue
            if await self._restore_one(cp, self.pipeline.restore_incidents, "incidents"):
                return

    async def _restore_one(
        self, cp: Checkpoint, restore: Callable[[bytes], None], what: str
    ) -> bool:
        """One incidents or fleet checkpoint into `restore`; False, counted and logged, when it
        is of another version or unusable (the caller tries an older one)."""
        try:
            blob = await asyncio.to_thread(cp.payload)
            restore(blob)
        except StateVersionError as exc:
            self._version_mismatch(cp, exc)
            return False
        except Exception as exc:  # noqa: BLE001 - a bad checkpoint must never stop the daemon
            self.stats.restore_failures += 1
            self.log.warning("unusable checkpoint, trying an older one", kind=what,
                             key=cp.key, checkpoint=cp.id, reason=repr(exc))  # fmt: skip
            return False
        self.stats.incident_restores += 1
        return True

    def _version_mismatch(self, cp: Checkpoint, exc: StateVersionError) -> None:
        """Another build's state: never guessed at; the partition starts fresh (or from an
        older checkpoint this build wrote)."""
        self.stats.version_mismatches += 1
        self.log.warning("checkpoint of another state version, not restored", key=cp.key,
                         checkpoint=cp.id, reason=str(exc))  # fmt: skip

    def _forget(self, p: int) -> None:
        # A partition that left (or whose restore failed half-way) must not keep state:
        # if it comes back, it is restored from the newest checkpoint instead. Its open
        # incidents went into that checkpoint too, for the partition's next owner.
        self.pipeline.forget_partition(p)
        self._saved.pop(p, None)
        self.stats.saved_at.pop(p, None)
        self.stats.stored_bytes.pop(p, None)

    async def close(self) -> None:
        """Disconnect the store (the runner already wrote the final checkpoint)."""
        await self.store.close()


async def open_checkpointer(
    source: DeliveredOffsets,
    pipeline: Pipeline,
    kafka: KafkaSettings,
    settings: CheckpointSettings,
    *,
    private_broker: bool = False,
) -> Checkpointer | None:
    """A started checkpointer over `source`, or None when checkpoints are disabled; the
    caller installs it as the source's rebalance hooks.

    `private_broker`: the embedded loopback broker of `up`, which nobody else can write
    to, so unsigned checkpoints are not worth a warning there.
    """
    if not settings.enabled:
        return None
    store = CheckpointStore(kafka, settings)
    await store.start(warn_unsigned=not private_broker)
    return Checkpointer(source, pipeline, store, settings)

"""Checkpoints of detector and incident state in the Kafka state topic, per input partition.

What is stored. Each samples-topic partition's state (`Pipeline.snapshot_partition`)
under the base key `<group_id>/<samples topic>/<partition>`, and the incidents
(`Pipeline.snapshot_incidents`: correlator and advisor, which span partitions) under
`<group_id>/<samples topic>/incidents/<lowest assigned samples partition>`.

The off-by-one rule: a checkpoint records, per input partition, the NEXT offset to
read. The state includes every record before that offset and none at or after it,
so restoring it and seeking there resumes exactly (records between the checkpoint
and the committed offset are read again; replay is safe because restored state has
not seen them, and alert ids are deterministic fingerprints). Checkpoints are
written after the sinks acknowledged and before the offsets are committed, so the
committed offset never runs ahead of the newest checkpoint by a record that was not
delivered.

Why incidents are keyed by the lowest assigned partition: an incident groups change
points of one (pool, model), whose devices hash to many partitions, so it cannot be
split per partition without breaking it up. Each member correlates its own
partitions (see README), and the key of its lowest partition is the same across
restarts as long as the assignment is (one replica: always `.../incidents/0`;
N replicas with the range assignor: stable while N is). On the first assignment
the member restores the incidents checkpoint of its lowest partition, and only if
it was written together with at least one restored partition checkpoint (same
recorded offset), so stale incidents of an old assignment never come back. Limit:
incidents do not follow partitions in a live rebalance; a member keeps its own in
memory, and a member taking over partitions from another starts with none of that
member's incidents (their ids stay the same if they page again).

Record layout. The payload is zlib-compressed and cut into chunks of at most
`chunk_bytes` (a real Kafka rejects records over max.message.bytes, about 1 MB by
default, and one partition's state is tens of MB before compression). Each chunk
is a record with key `<base>#<slot>/<index>` and value
`FWCP | u16 format version | u32 header length | JSON header | chunk bytes`. The
header has the checkpoint id, chunk index and count, compressed size and CRC-32,
the offsets covered, the event-time watermark and the wall-clock creation time.

Why every chunk index and two slots get keys of their own: the state topic is
compacted, and compaction keeps only the newest record per key. One key for all
chunks would keep only the last chunk. One key per chunk index is not enough
either: a crash halfway through a write would replace the first chunks of the
previous checkpoint and leave no complete one. So writes alternate between two
slots; a torn write can only damage the slot it was writing, and the other slot
still holds the previous complete checkpoint. Chunks left over in a slot by a
longer earlier checkpoint are deleted with tombstones.

Reading. All records of a base key go to state partition `hint % N` (the hint is
the samples partition; N is the state topic's partition count, which, as for any
changelog, must not change), in write order. The loader reads only the partitions
it needs, from the beginning to their end offset (the embedded broker never
compacts, so it may see many generations), and keeps per base key the newest
complete checkpoints whose CRC matches; the caller tries them newest first and
falls back to an older one, or to fresh state, when one cannot be restored.

Authentication. Restoring a checkpoint unpickles it, so whoever can produce to the
state topic could run code in the daemon. With `checkpoint.key` set, every chunk
header carries an HMAC-SHA256 over the base key, checkpoint id, offsets, watermark
and compressed bytes (so a checkpoint cannot be replayed under another partition's
key either), and only checkpoints with a valid MAC are restored. Without a key the
daemon warns at start; restrict produce ACLs on the state topic then.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import math
import struct
import time
import uuid
import zlib
from collections.abc import Callable, Collection, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from monitor.config import CheckpointSettings, KafkaSettings
from monitor.logging import get_logger
from monitor.pipeline import Pipeline
from monitor.sources.kafka import KafkaSource

MAGIC = b"FWCP"
FORMAT_VERSION = 1
_PREFIX = struct.Struct(">4sHI")
# Complete checkpoints kept per key while loading: the newest, and one to fall back to.
KEEP = 2
# Snapshots are mostly zero-filled arrays: level 6 is ~3x smaller than level 1 at
# ~1.5x the time, and it runs off the event loop.
_LEVEL = 6
# Room for the chunk header and the record framing above `chunk_bytes`.
_MARGIN = 64 * 1024


class CheckpointError(Exception):
    """A checkpoint record that cannot be used, or a state topic that cannot be read."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One complete, CRC-checked checkpoint as read back from the state topic."""

    key: str
    id: str
    slot: int
    offsets: dict[str, int]  # "topic/partition" -> next offset to read
    watermark: float | None
    created_at: float
    compressed: bytes

    def payload(self) -> bytes:
        """The snapshot bytes (raises zlib.error when corrupt despite the CRC)."""
        return zlib.decompress(self.compressed)


def record_key(base: str, slot: int, index: int) -> str:
    """The record key of one chunk."""
    return f"{base}#{slot}/{index}"


def split_key(key: str) -> tuple[str, int, int]:
    """(base, slot, chunk index) of a record key; CheckpointError if it is not one."""
    base, sep, rest = key.rpartition("#")
    slot, sep2, index = rest.partition("/")
    if not (sep and sep2 and slot.isdigit() and index.isdigit()):
        raise CheckpointError(f"not a checkpoint key: {key!r}")
    return base, int(slot), int(index)


def offset_key(topic: str, partition: int) -> str:
    """How a topic partition is named in a checkpoint's `offsets`."""
    return f"{topic}/{partition}"


@dataclass(frozen=True, slots=True)
class _Header:
    id: str
    chunk: int
    chunks: int
    size: int
    crc: int
    offsets: dict[str, int]
    watermark: float | None
    created_at: float
    mac: str | None


def checkpoint_mac(
    key: bytes,
    base: str,
    checkpoint_id: str,
    offsets: Mapping[str, int],
    watermark: float | None,
    compressed: bytes,
) -> str:
    """HMAC-SHA256 (hex) binding a checkpoint's bytes to its key, id, offsets and watermark."""
    meta = json.dumps(
        {"base": base, "id": checkpoint_id, "offsets": dict(offsets), "watermark": watermark},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    mac = hmac.new(key, meta, hashlib.sha256)
    mac.update(b"\0")
    mac.update(compressed)
    return mac.hexdigest()


def encode_chunks(
    base: str,
    compressed: bytes,
    *,
    checkpoint_id: str,
    slot: int,
    offsets: Mapping[str, int],
    watermark: float | None,
    created_at: float,
    chunk_bytes: int,
    mac_key: bytes | None = None,
) -> list[tuple[str, bytes]]:
    """The (key, value) records of one checkpoint, chunk 0 first (signed with `mac_key`)."""
    n = max(1, math.ceil(len(compressed) / chunk_bytes))
    common: dict[str, Any] = {
        "id": checkpoint_id, "chunks": n, "size": len(compressed),
        "crc": zlib.crc32(compressed), "offsets": dict(offsets), "watermark": watermark,
        "created_at": created_at,
    }  # fmt: skip
    if mac_key is not None:
        common["mac"] = checkpoint_mac(mac_key, base, checkpoint_id, offsets, watermark, compressed)
    out = []
    for i in range(n):
        header = json.dumps({**common, "chunk": i}, separators=(",", ":")).encode()
        body = compressed[i * chunk_bytes : (i + 1) * chunk_bytes]
        value = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header + body
        out.append((record_key(base, slot, i), value))
    return out


def decode_chunk(value: bytes, index: int | None = None) -> tuple[_Header, bytes]:
    """Header and bytes of one chunk record; CheckpointError with the reason otherwise."""
    if len(value) < _PREFIX.size:
        raise CheckpointError(f"record too short ({len(value)} bytes)")
    magic, version, n = _PREFIX.unpack_from(value)
    if magic != MAGIC:
        raise CheckpointError("not a checkpoint record (bad magic)")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"unsupported format version {version}")
    end = _PREFIX.size + n
    try:
        h = json.loads(value[_PREFIX.size : end])
        header = _Header(
            id=str(h["id"]), chunk=int(h["chunk"]), chunks=int(h["chunks"]), size=int(h["size"]),
            crc=int(h["crc"]), offsets={str(k): int(v) for k, v in h["offsets"].items()},
            watermark=None if h["watermark"] is None else float(h["watermark"]),
            created_at=float(h["created_at"]), mac=None if h.get("mac") is None else str(h["mac"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"bad header: {exc!r}") from None
    if not 0 <= header.chunk < header.chunks:
        raise CheckpointError(f"chunk {header.chunk} of {header.chunks}")
    if index is not None and header.chunk != index:
        raise CheckpointError(f"key says chunk {index}, header says {header.chunk}")
    return header, value[end:]


@dataclass(slots=True)
class _Partial:
    header: _Header
    slot: int
    seq: int
    parts: dict[int, bytes] = field(default_factory=dict)


class Assembler:
    """Reassembles checkpoints from state-topic records fed in log order (pure, no I/O)."""

    def __init__(
        self, wanted: Collection[str] | None = None, keep: int = KEEP, mac_key: bytes | None = None
    ) -> None:
        self.wanted = None if wanted is None else set(wanted)
        self.mac_key = mac_key
        self.keep = keep
        self.rejected = 0
        # Highest chunk count seen per (base, slot): stale chunks to delete on the next write.
        self.slot_chunks: dict[tuple[str, int], int] = {}
        self._partial: dict[tuple[str, str], _Partial] = {}
        self._complete: dict[str, list[Checkpoint]] = {}
        self._seq = 0
        self.log = get_logger("checkpoint")

    def feed(self, key: bytes | None, value: bytes | None) -> None:
        """Take the next record of the state topic (tombstones and foreign keys are skipped)."""
        self._seq += 1
        try:
            text = key.decode() if key is not None else ""
            base, slot, index = split_key(text)
        except (UnicodeDecodeError, CheckpointError):
            return  # not ours: the state topic may hold other keys
        if self.wanted is not None and base not in self.wanted:
            return
        if value is None:
            return
        sk = (base, slot)
        self.slot_chunks[sk] = max(self.slot_chunks.get(sk, 0), index + 1)
        try:
            header, body = decode_chunk(value, index)
        except CheckpointError as exc:
            self._reject(text, str(exc))
            return
        part = self._partial.get((base, header.id))
        if part is None:
            part = self._partial[(base, header.id)] = _Partial(header, slot, self._seq)
        elif (part.header.chunks, part.header.crc) != (header.chunks, header.crc):
            del self._partial[(base, header.id)]
            self._reject(text, "chunks of one checkpoint disagree on count or CRC")
            return
        part.parts[index] = body
        if len(part.parts) == header.chunks:
            self._complete_one(base, part)

    def _complete_one(self, base: str, part: _Partial) -> None:
        h = part.header
        del self._partial[(base, h.id)]
        # A checkpoint started before this one and still incomplete was torn: drop it.
        for k in [k for k, p in self._partial.items() if k[0] == base and p.seq < part.seq]:
            del self._partial[k]
        blob = b"".join(part.parts[i] for i in range(h.chunks))
        if len(blob) != h.size or zlib.crc32(blob) != h.crc:
            self._reject(record_key(base, part.slot, 0), "CRC or size mismatch after reassembly")
            return
        if self.mac_key is not None:
            want = checkpoint_mac(self.mac_key, base, h.id, h.offsets, h.watermark, blob)
            if h.mac is None or not hmac.compare_digest(h.mac, want):
                why = "unsigned" if h.mac is None else "MAC mismatch"
                self._reject(
                    record_key(base, part.slot, 0), f"{why}: not restored (checkpoint.key)"
                )
                return
        done = self._complete.setdefault(base, [])
        done.append(Checkpoint(base, h.id, part.slot, h.offsets, h.watermark, h.created_at, blob))
        del done[: -self.keep]

    def _reject(self, key: str, reason: str) -> None:
        self.rejected += 1
        self.log.warning("unusable checkpoint record", key=key, reason=reason)

    def result(self) -> dict[str, list[Checkpoint]]:
        """Per base key, the complete checkpoints found, newest first."""
        return {base: cps[::-1] for base, cps in self._complete.items()}


@dataclass(frozen=True, slots=True)
class Written:
    """What one checkpoint write cost."""

    id: str
    slot: int
    chunks: int
    bytes: int  # compressed, as stored
    raw_bytes: int


class CheckpointStore:
    """Writes and reads chunked checkpoints in the state topic (one job: Kafka I/O)."""

    def __init__(self, kafka: KafkaSettings, settings: CheckpointSettings) -> None:
        self.kafka = kafka
        self.topic = kafka.topics.state
        self.chunk_bytes = settings.chunk_bytes
        self.load_timeout_s = settings.load_timeout_s
        self.mac_key = None if settings.key is None else settings.key.get_secret_value().encode()
        self.rejected = 0
        self._producer = AIOKafkaProducer(
            **kafka.client_kwargs(), acks="all", linger_ms=0,
            max_request_size=settings.chunk_bytes + _MARGIN,
        )  # fmt: skip
        self._partitions = 0
        self._slot: dict[str, int] = {}
        self._slot_chunks: dict[tuple[str, int], int] = {}

    async def start(self, *, warn_unsigned: bool = True) -> None:
        """Connect and check that the state topic exists (CheckpointError if not)."""
        try:
            await self._producer.start()
        except BaseException:
            await self._producer.stop()  # else aiokafka warns of an unclosed producer
            raise
        cluster = await self._producer.client.fetch_all_metadata()
        parts = cluster.partitions_for_topic(self.topic)
        if not parts:
            await self._producer.stop()
            raise CheckpointError(
                f"state topic {self.topic!r} not found: create it (cleanup.policy=compact) "
                "or set FLOPWATCH_CHECKPOINT__ENABLED=false"
            )
        self._partitions = len(parts)
        if self.mac_key is None and warn_unsigned:
            get_logger("checkpoint").warning(
                "checkpoints are not authenticated: whoever can produce to the state topic "
                "can run code here; set checkpoint.key or restrict the topic's produce ACLs",
                topic=self.topic,
            )

    async def close(self) -> None:
        """Flush and disconnect."""
        await self._producer.stop()

    def partition_for(self, hint: int) -> int:
        """The state partition that holds the keys of samples partition `hint`."""
        return hint % self._partitions

    async def write(
        self,
        base: str,
        payload: bytes,
        *,
        offsets: Mapping[str, int],
        watermark: float | None,
        hint: int,
    ) -> Written:
        """Store one checkpoint and wait for the broker's acks (KafkaError on failure)."""
        compressed = await asyncio.to_thread(zlib.compress, payload, _LEVEL)
        slot = 1 - self._slot.get(base, 1)
        cid = uuid.uuid4().hex[:16]
        records = encode_chunks(
            base, compressed, checkpoint_id=cid, slot=slot, offsets=offsets, watermark=watermark,
            created_at=time.time(), chunk_bytes=self.chunk_bytes, mac_key=self.mac_key,
        )  # fmt: skip
        part = self.partition_for(hint)
        stale = range(len(records), self._slot_chunks.get((base, slot), 0))
        futs = [
            await self._producer.send(self.topic, key=k.encode(), value=v, partition=part)
            for k, v in records
        ]
        futs += [
            await self._producer.send(
                self.topic, key=record_key(base, slot, i).encode(), value=None, partition=part
            )
            for i in stale
        ]
        for f in futs:
            await f
        self._slot[base] = slot
        self._slot_chunks[(base, slot)] = len(records)
        return Written(cid, slot, len(records), len(compressed), len(payload))

    async def load(self, bases: Mapping[str, int]) -> dict[str, list[Checkpoint]]:
        """Newest complete checkpoints (newest first) of each base key -> partition hint.

        Raises CheckpointError when the state topic cannot be read in time; bad
        records are skipped with a warning.
        """
        if not bases:
            return {}
        asm = Assembler(bases.keys(), mac_key=self.mac_key)
        tps = sorted({TopicPartition(self.topic, self.partition_for(h)) for h in bases.values()})
        consumer = AIOKafkaConsumer(
            **self.kafka.client_kwargs(), group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest", max_partition_fetch_bytes=self.chunk_bytes + _MARGIN,
        )  # fmt: skip
        await consumer.start()
        try:
            consumer.assign(tps)
            async with asyncio.timeout(self.load_timeout_s):
                end = await consumer.end_offsets(tps)
                await consumer.seek_to_beginning(*tps)
                left = {tp for tp in tps if await consumer.position(tp) < end[tp]}
                while left:
                    got = await consumer.getmany(*left, timeout_ms=500)
                    for msgs in got.values():
                        for m in msgs:
                            asm.feed(m.key, m.value)
                    left = {tp for tp in left if await consumer.position(tp) < end[tp]}
        except (TimeoutError, KafkaError) as exc:
            raise CheckpointError(f"cannot read state topic {self.topic!r}: {exc!r}") from exc
        finally:
            await consumer.stop()
        for sk, n in asm.slot_chunks.items():
            self._slot_chunks[sk] = max(self._slot_chunks.get(sk, 0), n)
        self.rejected += asm.rejected
        found = asm.result()
        for base, cps in found.items():
            # Next write goes to the other slot, so the newest complete one survives a tear.
            self._slot[base] = cps[0].slot
        return found


@dataclass
class CheckpointStats:
    """Counters read by the metrics collector at scrape time (no work on the hot path)."""

    writes: int = 0
    write_failures: int = 0
    bytes_written: int = 0  # compressed, all checkpoints so far
    restores: int = 0  # partitions restored from a checkpoint
    incident_restores: int = 0
    restore_failures: int = 0  # a checkpoint found but unusable (fell back)
    last_write_s: float = 0.0  # wall time of the last save round
    last_restore_s: float = 0.0
    # Per samples partition: when its stored state was last current (clock units), size.
    saved_at: dict[int, float] = field(default_factory=dict)
    stored_bytes: dict[int, int] = field(default_factory=dict)


class Checkpointer:
    """When to checkpoint, what, and restore on assignment; installs itself as rebalance hooks.

    The runner calls `save` (when `due`) after sinks acknowledged a batch and
    before it commits, and once more on clean shutdown; the source calls
    `revoked` (save the revoked partitions) and `assigned` (restore and say where
    to resume).
    """

    def __init__(
        self,
        source: KafkaSource,
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
        kafka = source.kafka
        self.topic = kafka.input_topic
        self.group = kafka.group_id
        self.stats = CheckpointStats()
        self.log = get_logger("checkpoint", group=self.group)
        self._last_round = clock()
        self._saved: dict[int, int] = {}  # samples partition -> offset of its stored state
        self._incidents_saved: tuple[object, ...] | None = None
        self._incidents_restored = False
        self._parked: dict[int, int] = {}  # revoked, kept in memory in case they come back
        source.hooks = self

    def partition_key(self, partition: int) -> str:
        """Base key of one samples partition's state."""
        return f"{self.group}/{self.topic}/{partition}"

    def incidents_key(self, lowest: int) -> str:
        """Base key of the incidents of the member whose lowest partition is `lowest`."""
        return f"{self.group}/{self.topic}/incidents/{lowest}"

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
        self.stats.last_write_s = time.perf_counter() - t0

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
            try:
                blob = await asyncio.to_thread(cp.payload)
                self.pipeline.restore_incidents(blob)
            except Exception as exc:  # noqa: BLE001 - a bad checkpoint must never stop the daemon
                self.stats.restore_failures += 1
                self.log.warning("unusable incidents checkpoint, trying an older one",
                                 key=cp.key, checkpoint=cp.id, reason=repr(exc))  # fmt: skip
                continue
            self.stats.incident_restores += 1
            return

    def _forget(self, p: int) -> None:
        # A partition that left (or whose restore failed half-way) must not keep state:
        # if it comes back, it is restored from the newest checkpoint instead. Its open
        # incidents went into that checkpoint too, for the partition's next owner.
        self.pipeline.hand_over(p)
        self.pipeline.partitions.pop(p, None)
        self.pipeline.partition_ts.pop(p, None)
        self._saved.pop(p, None)
        self.stats.saved_at.pop(p, None)
        self.stats.stored_bytes.pop(p, None)

    async def close(self) -> None:
        """Disconnect the store (the runner already wrote the final checkpoint)."""
        await self.store.close()


async def open_checkpointer(
    source: KafkaSource,
    pipeline: Pipeline,
    settings: CheckpointSettings,
    *,
    private_broker: bool = False,
) -> Checkpointer | None:
    """A started checkpointer hooked into `source`, or None when checkpoints are disabled.

    `private_broker`: the embedded loopback broker of `up`, which nobody else can write
    to, so unsigned checkpoints are not worth a warning there.
    """
    if not settings.enabled:
        return None
    store = CheckpointStore(source.kafka, settings)
    await store.start(warn_unsigned=not private_broker)
    return Checkpointer(source, pipeline, store, settings)

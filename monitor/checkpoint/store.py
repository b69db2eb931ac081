"""The state topic: writes checkpoints as chunk records and reads them back.

Reading. All records of a base key go to state partition `hint % N` (the hint is
the samples partition; N is the state topic's partition count, which, as for any
changelog, must not change), in write order. The loader reads only the partitions
it needs, from the beginning to their end offset (the embedded broker never
compacts, so it may see many generations), and keeps per base key the newest
complete checkpoints whose CRC matches; the caller tries them newest first and
falls back to an older one, or to fresh state, when one cannot be restored.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from monitor.checkpoint.format import (
    Assembler,
    Checkpoint,
    compress,
    encode_chunks,
    record_key,
)
from monitor.config import CheckpointSettings, KafkaSettings
from monitor.errors import CheckpointError
from monitor.kafka_client import client_kwargs
from monitor.log import get_logger

# Tombstones one write may add for a slot's leftover chunks.
MAX_STALE = 4096
# Room for the chunk header and the record framing above `chunk_bytes`.
_MARGIN = 64 * 1024


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
            **client_kwargs(kafka), acks="all", linger_ms=0,
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
                "can forge detector and incident state; set checkpoint.key or restrict the "
                "topic's produce ACLs",
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
        compressed = await asyncio.to_thread(compress, payload)
        slot = 1 - self._slot.get(base, 1)
        cid = uuid.uuid4().hex[:16]
        records = encode_chunks(
            base, compressed, checkpoint_id=cid, slot=slot, offsets=offsets, watermark=watermark,
            created_at=time.time(), chunk_bytes=self.chunk_bytes, mac_key=self.mac_key,
        )  # fmt: skip
        part = self.partition_for(hint)
        # Chunks a longer checkpoint left in this slot are deleted; never more than
        # MAX_STALE per write, whatever a forged record claimed about the slot.
        stale = range(len(records), min(self._slot_chunks.get((base, slot), 0),
                                        len(records) + MAX_STALE))  # fmt: skip
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
            **client_kwargs(self.kafka), group_id=None, enable_auto_commit=False,
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

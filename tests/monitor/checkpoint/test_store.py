"""Checkpoint records: chunking, reassembly, torn writes, compaction and corruption."""

from __future__ import annotations

import json
import random
import struct
import zlib

import pytest
from aiokafka import AIOKafkaProducer
from kafka_helpers import isolated_settings
from structlog.testing import capture_logs

from monitor.checkpoint.format import Assembler, encode_chunks, record_key, split_key
from monitor.checkpoint.store import CheckpointStore
from monitor.config import CheckpointSettings
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics


def _records(base: str, payload: bytes, cid: str, slot: int, chunk: int = 100):
    compressed = zlib.compress(payload)
    return encode_chunks(
        base, compressed, checkpoint_id=cid, slot=slot, offsets={"s/0": len(payload)},
        watermark=1.5, created_at=2.5, chunk_bytes=chunk,
    )  # fmt: skip


def _payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)  # incompressible: many chunks


def _newest(records, base="g/s/0") -> list[bytes]:
    asm = Assembler()
    for k, v in records:
        asm.feed(k.encode(), v)
    return [cp.payload() for cp in asm.result().get(base, [])]


def _compact(records):
    """What Kafka's log compaction leaves: the last record per key, in log order."""
    last = {k: i for i, (k, _) in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r[0]] == i]


def test_keys_are_distinct_per_slot_and_chunk() -> None:
    """Each chunk of each slot has its own key, and the key parses back."""
    a, b = _payload(500, 1), _payload(500, 2)
    keys = [k for k, _ in _records("g/s/0", a, "a", 0) + _records("g/s/0", b, "b", 1)]
    assert len(keys) == len(set(keys)) > 2
    assert split_key(record_key("g#x/s/0", 1, 12)) == ("g#x/s/0", 1, 12)


def test_chunks_reassemble_newest_first() -> None:
    """Two complete checkpoints: the newer one comes first, the older one is the fallback."""
    a, b = _payload(450, 1), _payload(450, 2)
    recs = _records("g/s/0", a, "a", 0) + _records("g/s/0", b, "b", 1)
    assert len(recs) > 6
    assert _newest(recs) == [b, a]


def test_torn_write_falls_back_to_previous_complete() -> None:
    """A checkpoint missing its last chunk does not count; the previous one is used."""
    a, b = _payload(450, 1), _payload(450, 2)
    torn = _records("g/s/0", b, "b", 1)[:-1]
    assert _newest(_records("g/s/0", a, "a", 0) + torn) == [a]


def test_torn_write_survives_compaction() -> None:
    """Compaction after a torn write still leaves the previous checkpoint complete (two slots)."""
    a, b, c = _payload(450, 1), _payload(300, 2), _payload(450, 3)
    log = _records("g/s/0", a, "a", 0) + _records("g/s/0", b, "b", 1)
    log += _records("g/s/0", c, "c", 0)[:2]  # crash while rewriting slot 0
    assert _newest(_compact(log)) == [b]


def test_interleaved_keys_and_foreign_records() -> None:
    """Other partitions' chunks, tombstones and foreign keys in between do not disturb it."""
    a, b = _payload(350, 1), _payload(350, 2)
    ra, rb = _records("g/s/0", a, "a", 0), _records("g/s/1", b, "b", 0)
    log = [x for pair in zip(ra, rb, strict=True) for x in pair]
    asm = Assembler()
    asm.feed(b"unrelated", b"{}")
    asm.feed(None, b"x")
    asm.feed(record_key("g/s/0", 1, 0).encode(), None)
    for k, v in log:
        asm.feed(k.encode(), v)
    got = asm.result()
    assert [cp.payload() for cp in got["g/s/0"]] == [a]
    assert [cp.payload() for cp in got["g/s/1"]] == [b]
    cp = got["g/s/0"][0]
    assert (cp.offsets, cp.watermark, cp.created_at, cp.slot) == ({"s/0": 350}, 1.5, 2.5, 0)
    assert asm.rejected == 0


def test_corrupt_records_are_skipped_with_key_and_reason() -> None:
    """A flipped byte fails the CRC and garbage fails the magic: both logged, older one used."""
    a, b = _payload(450, 1), _payload(450, 2)
    bad = _records("g/s/0", b, "b", 1)
    k, v = bad[2]
    bad[2] = (k, v[:-1] + bytes([v[-1] ^ 0xFF]))
    log = _records("g/s/0", a, "a", 0) + bad + [(record_key("g/s/0", 0, 0), b"garbage!!!!!")]
    with capture_logs() as logs:
        assert _newest(log) == [a]
    reasons = {e["reason"] for e in logs if e["event"] == "unusable checkpoint record"}
    assert any("CRC" in r for r in reasons), logs
    assert any("magic" in r for r in reasons), logs
    assert all(e["key"].startswith("g/s/0#") for e in logs)


@pytest.mark.integration
async def test_store_round_trip_on_broker(broker: EmbeddedBroker) -> None:
    """Write chunked checkpoints to the real broker, tear the newest, load the previous."""
    settings = isolated_settings(broker)
    await ensure_topics(settings.kafka)
    store = CheckpointStore(settings.kafka, CheckpointSettings(chunk_bytes=1024))
    await store.start()
    try:
        first, second = _payload(5000, 1), _payload(7000, 2)
        w1 = await store.write("g/s/2", first, offsets={"s/2": 10}, watermark=5.0, hint=2)
        w2 = await store.write("g/s/2", second, offsets={"s/2": 20}, watermark=6.0, hint=2)
        assert (w1.slot, w2.slot) == (0, 1)
        assert w2.chunks == -(-w2.bytes // 1024) > 5
        other = await store.write("g/s/3", first, offsets={"s/3": 1}, watermark=None, hint=3)
        assert other.slot == 0

        # A crash while writing the third checkpoint: only its first two chunks landed.
        torn = encode_chunks(
            "g/s/2", zlib.compress(_payload(6000, 3)), checkpoint_id="torn", slot=0,
            offsets={"s/2": 30}, watermark=7.0, created_at=0.0, chunk_bytes=1024,
        )  # fmt: skip
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await p.start()
        for k, v in torn[:2]:
            await p.send_and_wait(settings.kafka.topics.state, v, k.encode(),
                                  partition=store.partition_for(2))  # fmt: skip
        await p.stop()

        fresh = CheckpointStore(settings.kafka, CheckpointSettings(chunk_bytes=1024))
        await fresh.start()
        try:
            found = await fresh.load({"g/s/2": 2, "g/s/3": 3, "g/s/9": 9})
            assert [cp.payload() for cp in found["g/s/2"]] == [second, first]
            assert found["g/s/2"][0].offsets == {"s/2": 20}
            assert found["g/s/2"][0].watermark == 6.0
            assert [cp.payload() for cp in found["g/s/3"]] == [first]
            assert "g/s/9" not in found
            # The next write avoids the slot of the newest complete checkpoint.
            w3 = await fresh.write("g/s/2", first, offsets={"s/2": 40}, watermark=8.0, hint=2)
            assert w3.slot == 0
            again = await fresh.load({"g/s/2": 2})
            assert again["g/s/2"][0].offsets == {"s/2": 40}
        finally:
            await fresh.close()
    finally:
        await store.close()


def _signed(payload: bytes, key: bytes | None, base: str = "g/s/0", cid: str = "a"):
    return encode_chunks(
        base, zlib.compress(payload), checkpoint_id=cid, slot=0, offsets={"s/0": 7},
        watermark=1.5, created_at=2.5, chunk_bytes=100, mac_key=key,
    )  # fmt: skip


def _assemble(records, key: bytes | None) -> tuple[dict, int]:
    asm = Assembler(mac_key=key)
    for k, v in records:
        asm.feed(k.encode(), v)
    return asm.result(), asm.rejected


def test_with_a_key_only_checkpoints_signed_with_it_are_restored() -> None:
    """checkpoint.key: a checkpoint signed with the key is restored; one signed with another
    key, an unsigned one, and one whose bytes were altered (CRC fixed up) are rejected."""
    payload = _payload(450, 3)
    got, rejected = _assemble(_signed(payload, b"k1"), b"k1")
    assert [cp.payload() for cp in got["g/s/0"]] == [payload]
    assert rejected == 0
    for records in (_signed(payload, b"k2"), _signed(payload, None)):
        got, rejected = _assemble(records, b"k1")
        assert got == {}
        assert rejected == 1
    # Forge: same header (MAC included), other bytes, CRC and size recomputed to match.
    forged_blob = zlib.compress(_payload(450, 4))
    genuine = _signed(payload, b"k1")
    header = json.loads(genuine[0][1][10 : 10 + struct.unpack_from(">I", genuine[0][1], 6)[0]])
    forged = encode_chunks(
        "g/s/0", forged_blob, checkpoint_id="a", slot=0, offsets={"s/0": 7}, watermark=1.5,
        created_at=2.5, chunk_bytes=100, mac_key=b"attacker",
    )  # fmt: skip
    patched = []
    for k, v in forged:
        n = struct.unpack_from(">I", v, 6)[0]
        h = json.loads(v[10 : 10 + n])
        h["mac"] = header["mac"]
        hb = json.dumps(h, separators=(",", ":")).encode()
        patched.append((k, v[:6] + struct.pack(">I", len(hb)) + hb + v[10 + n :]))
    got, rejected = _assemble(patched, b"k1")
    assert got == {}
    assert rejected == 1


def test_a_signed_checkpoint_cannot_be_replayed_under_another_partition() -> None:
    """The MAC binds the base key: partition 0's checkpoint copied to partition 1's keys is
    rejected."""
    records = _signed(_payload(300, 5), b"k1", base="g/s/0")
    moved = [(k.replace("g/s/0", "g/s/1", 1), v) for k, v in records]
    got, rejected = _assemble(moved, b"k1")
    assert got == {}
    assert rejected == 1


async def test_signed_store_round_trip_on_broker(broker: EmbeddedBroker) -> None:
    """With checkpoint.key set, the store signs what it writes and restores it; a store with
    another key restores nothing and counts the records as rejected."""
    settings = isolated_settings(broker)
    await ensure_topics(settings.kafka)
    signed = CheckpointSettings(chunk_bytes=1024, key="s3cret")
    store = CheckpointStore(settings.kafka, signed)
    await store.start()
    try:
        data = _payload(3000, 7)
        await store.write("g/s/1", data, offsets={"s/1": 5}, watermark=1.0, hint=1)
        found = await store.load({"g/s/1": 1})
        assert [cp.payload() for cp in found["g/s/1"]] == [data]
        other = CheckpointStore(settings.kafka, CheckpointSettings(chunk_bytes=1024, key="x"))
        await other.start()
        try:
            assert await other.load({"g/s/1": 1}) == {}
            assert other.rejected == 1
        finally:
            await other.close()
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("key", "warn", "expected"), [(None, True, 1), (None, False, 0), ("k", True, 0)]
)
async def test_unsigned_checkpoints_warn_at_start(
    broker: EmbeddedBroker, key: str | None, warn: bool, expected: int
) -> None:
    """Without checkpoint.key the store warns once at start (not for `up`'s private broker)."""
    settings = isolated_settings(broker)
    await ensure_topics(settings.kafka)
    store = CheckpointStore(settings.kafka, CheckpointSettings(key=key))
    with capture_logs() as logs:
        await store.start(warn_unsigned=warn)
    await store.close()
    warned = [e for e in logs if "not authenticated" in e["event"]]
    assert len(warned) == expected

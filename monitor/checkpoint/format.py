"""The checkpoint record format: chunked, CRC-checked, optionally signed; pure, no I/O.

Record layout. The payload is compressed (zstd; zlib in checkpoints written before
zstd, told apart by the first bytes, `compress`) and cut into chunks of at most
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

Authentication. With `checkpoint.key` set, every chunk header carries an
HMAC-SHA256 over the base key, checkpoint id, offsets, watermark and compressed
bytes (so a checkpoint cannot be replayed under another partition's key either),
and only checkpoints with a valid MAC are restored (`Assembler`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import struct
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import zstandard

from monitor.errors import CheckpointError
from monitor.log import get_logger

MAGIC = b"FWCP"
FORMAT_VERSION = 1
_PREFIX = struct.Struct(">4sHI")
# Complete checkpoints kept per key while loading: the newest, and one to fall back to.
KEEP = 2


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
        """The snapshot bytes (raises zstd's or zlib's error when corrupt despite the CRC)."""
        return decompress(self.compressed)


# zstd at level 1: over a 100k-device partition's state, compression was most of a
# checkpoint round's CPU with zlib (level 6 about 12x zstd 1's time, and larger).
_ZSTD_LEVEL = 1
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame; a zlib stream starts with 0x78


def compress(payload: bytes) -> bytes:
    """A checkpoint payload as stored (a zstd frame that records its content size)."""
    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(payload)


def decompress(compressed: bytes) -> bytes:
    """What `compress` stored; zlib streams of checkpoints written before zstd too."""
    if compressed[:4] == _ZSTD_MAGIC:
        return zstandard.ZstdDecompressor().decompress(compressed)
    return zlib.decompress(compressed)


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
        try:
            header, body = decode_chunk(value, index)
        except CheckpointError as exc:
            self._reject(text, str(exc))
            return
        if self.mac_key is None:
            # Unsigned: any well-formed chunk may have left a slot longer than the next write.
            sk = (base, slot)
            self.slot_chunks[sk] = max(self.slot_chunks.get(sk, 0), index + 1)
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
        # Signed: only a checkpoint whose MAC held says how many chunks a slot holds.
        sk = (base, part.slot)
        self.slot_chunks[sk] = max(self.slot_chunks.get(sk, 0), h.chunks)
        done = self._complete.setdefault(base, [])
        done.append(Checkpoint(base, h.id, part.slot, h.offsets, h.watermark, h.created_at, blob))
        del done[: -self.keep]

    def _reject(self, key: str, reason: str) -> None:
        self.rejected += 1
        self.log.warning("unusable checkpoint record", key=key, reason=reason)

    def result(self) -> dict[str, list[Checkpoint]]:
        """Per base key, the complete checkpoints found, newest first."""
        return {base: cps[::-1] for base, cps in self._complete.items()}

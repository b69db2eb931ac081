"""Forged or absurd state-topic records cost nothing but a counted rejection."""

from __future__ import annotations

import zlib

from monitor.checkpoint.format import Assembler, compress, encode_chunks


def _records(key: bytes | None, chunks_of: int = 3, cid: str = "a"):
    payload = bytes(range(256)) * chunks_of
    return encode_chunks(
        "g/s/0", zlib.compress(payload, 0), checkpoint_id=cid, slot=0, offsets={"s/0": 7},
        watermark=1.5, created_at=2.5, chunk_bytes=256, mac_key=key,
    )  # fmt: skip


def test_a_malformed_record_with_a_huge_chunk_index_is_only_a_rejection() -> None:
    """A 4-byte value under key `.../0#0/20000000` once made the next write delete 20 million
    chunks: the slot's length now comes only from chunks whose header is well formed."""
    asm = Assembler()
    for k, v in _records(None):
        asm.feed(k.encode(), v)
    asm.feed(b"g/s/0#0/20000000", b"\x00\x01\x02\x03")
    assert asm.rejected == 1
    assert asm.slot_chunks == {("g/s/0", 0): len(_records(None))}
    assert [cp.id for cp in asm.result()["g/s/0"]] == ["a"]


def test_signed_slots_are_sized_by_verified_checkpoints_only() -> None:
    """With a key, a well-formed but unsigned chunk claiming a far slot is not believed."""
    key = b"k" * 32
    forged = _records(None, chunks_of=40, cid="forged")  # many chunks, no MAC
    asm = Assembler(mac_key=key)
    for k, v in [*forged[-1:], *_records(key)]:
        asm.feed(k.encode(), v)
    assert asm.slot_chunks == {("g/s/0", 0): len(_records(key))}
    assert len(forged) > len(_records(key))


def test_payloads_are_zstd_and_zlib_checkpoints_still_restore() -> None:
    """New checkpoints are zstd frames; one written before zstd (zlib) reads back too."""
    payload = b"state" * 10_000 + bytes(range(256))
    stored = compress(payload)
    assert stored[:4] == b"\x28\xb5\x2f\xfd"
    assert len(stored) < len(payload) // 10
    for blob in (stored, zlib.compress(payload, 6)):
        asm = Assembler()
        for k, v in encode_chunks("g/s/0", blob, checkpoint_id="c", slot=0, offsets={"s/0": 7},
                                  watermark=None, created_at=0.0, chunk_bytes=1000):  # fmt: skip
            asm.feed(k.encode(), v)
        (cp,) = asm.result()["g/s/0"]
        assert cp.payload() == payload

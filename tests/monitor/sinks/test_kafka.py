"""The dead-letter envelope: reason and origin, and never bigger than a broker accepts."""

from __future__ import annotations

import base64
import hashlib
import json

from monitor.core.types import DeadLetter, RawMessage
from monitor.sinks.kafka import dead_letter_value


def test_a_large_non_utf8_record_is_cut_with_its_size_and_hash() -> None:
    """An 800 KB non-UTF-8 record once made a 1.1 MB base64 dead letter the broker refused."""
    value = bytes(range(256)) * 3200
    env = json.loads(dead_letter_value(DeadLetter(RawMessage("s", 2, 7, b"k", value), "why"),
                                       max_bytes=64 * 1024))  # fmt: skip
    assert len(json.dumps(env)) < 100 * 1024
    assert (env["encoding"], env["truncated"], env["value_bytes"]) == ("base64", True, len(value))
    assert env["value_sha256"] == hashlib.sha256(value).hexdigest()
    assert base64.b64decode(env["value"]) == value[: 64 * 1024]
    assert (env["reason"], env["partition"], env["offset"], env["key"]) == ("why", 2, 7, "k")


def test_a_small_record_travels_whole() -> None:
    env = json.loads(dead_letter_value(DeadLetter(RawMessage("s", 0, 1, None, b"{bad"), "r")))
    assert (env["value"], env["encoding"]) == ("{bad", "utf-8")
    assert "truncated" not in env

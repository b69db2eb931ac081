"""The source seam: something that yields batches of raw messages, in order per partition."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RawMessage:
    """One undecoded record and where it came from (offset -1 when not from Kafka)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


class Source(Protocol):
    """Yields batches; `commit` marks everything yielded so far as processed."""

    def batches(self) -> AsyncIterator[list[RawMessage]]:
        """Batches of raw messages (samples and change events, told apart by `topic`)."""
        ...

    async def commit(self) -> None:
        """Acknowledge all batches yielded so far (at-least-once: call after sinks ack)."""
        ...

    async def close(self) -> None:
        """Release connections and files."""
        ...

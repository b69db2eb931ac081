"""The source seam: something that yields batches of raw messages, in order per partition."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from monitor.core.types import RawMessage


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

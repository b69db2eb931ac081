"""Recording source: `.jsonl` / `.jsonl.gz` files of window records and change events.

Lines are read in order and cut into fixed-size batches, so a replay is
deterministic. A line is routed to the change-event path when it carries a
`kind` and no `layers`; everything else is treated as a window record (and a
bad one is rejected with its reason, like any other input).
"""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import IO

from monitor.config import Topics
from monitor.core.types import RawMessage
from monitor.errors import RecordingError


def open_recording(path: Path) -> IO[bytes]:
    """Open a recording for binary line reading; gzip by suffix."""
    if not path.is_file():
        raise RecordingError(f"recording not found: {path}")
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if path.suffix == ".zst":
        raise RecordingError(f"{path}: .zst recordings are not supported yet; use .jsonl.gz")
    return path.open("rb")


def iter_lines(path: Path, read: list[int] | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number, stripped line) for each non-empty line; `read[0]`, when given, follows
    the bytes of the file read so far (compressed bytes for .gz), for a progress bar."""
    try:
        with open_recording(path) as f:
            raw = getattr(f, "fileobj", f)  # gzip's underlying file
            for n, line in enumerate(f, start=1):
                line = line.strip()  # noqa: PLW2901 - stripping is the point
                if read is not None and n % 1024 == 0:
                    read[0] = raw.tell()
                if line:
                    yield n, line
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise RecordingError(f"{path}: {exc}") from None


def is_change_line(line: bytes) -> bool:
    """Cheap routing test: change events have `kind`, window records have `layers`."""
    return b'"kind"' in line and b'"layers"' not in line


class RecordingSource:
    """Replays a recording in fixed-size batches (partition 0, offset = line number)."""

    def __init__(
        self,
        path: Path,
        topics: Topics,
        batch_size: int = 5000,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.path = path
        self.topics = topics
        self.batch_size = batch_size
        self.lines = 0
        # Called before each batch with (lines, bytes of the file read so far).
        self.progress = progress

    async def batches(self) -> AsyncIterator[list[RawMessage]]:
        """Batches of raw messages in file order."""
        batch: list[RawMessage] = []
        read = [0]
        for n, line in iter_lines(self.path, read):
            self.lines += 1
            topic = self.topics.changes if is_change_line(line) else self.topics.samples
            batch.append(RawMessage(topic, 0, n, None, line))
            if len(batch) >= self.batch_size:
                if self.progress is not None:
                    self.progress(self.lines, read[0])
                yield batch
                batch = []
        if batch:
            yield batch

    async def commit(self) -> None:
        """Nothing to acknowledge for a file."""

    async def close(self) -> None:
        """Files are closed as iteration ends."""

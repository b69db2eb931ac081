"""Recording source: `.jsonl` / `.jsonl.gz` / `.jsonl.zst` files of records and change events.

Lines are read in order and cut into fixed-size batches, so a replay is
deterministic. A line is routed to the change-event path when it carries a
`kind` and no `layers`; everything else is treated as a window record (and a
bad one is rejected with its reason, like any other input).
"""

from __future__ import annotations

import gzip
import io
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

import zstandard

from monitor.config import Topics
from monitor.core.types import RawMessage
from monitor.errors import RecordingError

RECORDING_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")


def open_recording(path: Path) -> IO[bytes]:
    """Open a recording for binary line reading; gzip or zstd by suffix."""
    if not path.is_file():
        raise RecordingError(f"recording not found: {path}")
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if path.suffix == ".zst":
        # Across frames: a recording appended to, or written in pieces, is one stream.
        raw = path.open("rb")
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(reader)
    return path.open("rb")


def create_recording(path: Path) -> IO[bytes]:
    """Open a recording for writing; gzip (no timestamp, so same bytes) or zstd by suffix."""
    if not path.name.endswith(RECORDING_SUFFIXES):
        raise RecordingError(f"a recording must end in {', '.join(RECORDING_SUFFIXES)}: {path}")
    try:
        if path.suffix == ".gz":
            return gzip.GzipFile(path, mode="wb", mtime=0)  # type: ignore[return-value]
        if path.suffix == ".zst":
            return zstandard.ZstdCompressor(level=3).stream_writer(path.open("wb"))
        return path.open("wb")
    except OSError as exc:
        raise RecordingError(f"{path}: {exc.strerror or exc}") from None


def iter_lines(path: Path, read: list[int] | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number, stripped line) for each non-empty line; `read[0]`, when given, follows
    the bytes of the file read so far (compressed bytes for .gz), for a progress bar."""
    try:
        with open_recording(path) as f:
            if read is None:
                yield from numbered(f)
                return
            raw = getattr(f, "fileobj", f)  # gzip's underlying file
            for n, line in numbered(f):
                if n % 1024 == 0:
                    read[0] = raw.tell()
                yield n, line
    except (OSError, EOFError, gzip.BadGzipFile, zstandard.ZstdError) as exc:
        raise RecordingError(f"{path}: {exc}") from None


def numbered(lines: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(line number, stripped line) for each non-empty line of `lines`."""
    for n, line in enumerate(lines, start=1):
        line = line.strip()  # noqa: PLW2901 - stripping is the point
        if line:
            yield n, line


def is_change_line(line: bytes) -> bool:
    """Cheap routing test: change events have `kind`, window records have `layers`."""
    return b'"kind"' in line and b'"layers"' not in line


class RecordingSource:
    """Replays a recording in fixed-size batches (partition 0, offset = line number).

    `lines` stands in for the file: (line number, line) pairs in the same order, such as
    a simulation's, so that a recording never written to disk replays as if it had been.
    """

    def __init__(
        self,
        path: Path,
        topics: Topics,
        batch_size: int = 5000,
        lines: Callable[[], Iterable[tuple[int, bytes]]] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.path = path
        self.topics = topics
        self.batch_size = batch_size
        self.lines = 0
        # Called before each batch with (lines, bytes of the file read so far).
        self.progress = progress
        self._read = [0]
        self._lines = lines or (lambda: iter_lines(path, self._read))

    async def batches(self) -> AsyncIterator[list[RawMessage]]:
        """Batches of raw messages in file order."""
        batch: list[RawMessage] = []
        for n, line in self._lines():
            self.lines += 1
            topic = self.topics.changes if is_change_line(line) else self.topics.samples
            batch.append(RawMessage(topic, 0, n, None, line))
            if len(batch) >= self.batch_size:
                if self.progress is not None:
                    self.progress(self.lines, self._read[0])
                yield batch
                batch = []
        if batch:
            yield batch

    async def commit(self) -> None:
        """Nothing to acknowledge for a file."""

    async def close(self) -> None:
        """Files are closed as iteration ends."""

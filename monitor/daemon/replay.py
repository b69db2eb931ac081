"""`flopwatch replay`: the monitor over a recording, alerts as JSONL (CI's deterministic run).

`replay_source` is the one replay: the command, `flopwatch test` and the pytest plugin
all run it, so what they judge is what `flopwatch replay` prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from monitor.config import Settings
from monitor.core.types import DeadLetter
from monitor.daemon.assemble import Daemon, DeadLetterFn, Wiring, assemble, run_daemon
from monitor.errors import UsageError
from monitor.progress import Progress
from monitor.sinks.base import Sink
from monitor.sinks.jsonl import JsonlSink
from monitor.sources.recording import RecordingSource
from monitor.wire import Alert


class _StatusCount:
    """A sink that only counts alerts by status, for the summary line."""

    def __init__(self) -> None:
        self.by_status: Counter[str] = Counter()

    async def send(self, batch: Sequence[Alert]) -> None:
        """Count."""
        self.by_status.update(a.status for a in batch)

    async def close(self) -> None:
        """Nothing to release."""


def _size(path: Path) -> int:
    return path.stat().st_size


def recording_source(
    path: Path,
    settings: Settings,
    batch_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RecordingSource:
    """The source `flopwatch replay` reads `path` with."""
    size = settings.kafka.max_batch_records if batch_size is None else batch_size
    if size < 1:
        raise UsageError("--batch-size must be >= 1")
    return RecordingSource(path, settings.kafka.topics, batch_size=size, progress=progress)


async def replay_source(
    source: RecordingSource,
    settings: Settings,
    sinks: Sequence[Sink],
    dead_letters: DeadLetterFn | None = None,
) -> Daemon:
    """Run the monitor over `source` to its end; returns the daemon (stats, rejections)."""
    async with AsyncExitStack() as stack:
        wiring = Wiring(source=source, sinks=sinks, dead_letters=dead_letters, http_host=None)
        daemon = await assemble(stack, settings, wiring)
        await run_daemon(daemon, stack)
    return daemon


async def replay(args: argparse.Namespace, settings: Settings) -> int:
    """Replay `args.file`; alerts to `--alerts-out` or stdout, a summary on stderr."""
    if not args.file.is_file():
        raise UsageError(f"recording not found: {args.file}")
    # No bar over alerts printed to the same terminal: they are the progress there.
    bar = Progress("replay", _size(args.file), "lines")
    bar.enabled = bar.enabled and not (args.alerts_out is None and sys.stdout.isatty())
    source = recording_source(args.file, settings, args.batch_size,
                              progress=lambda lines, read: bar.update(read, lines))  # fmt: skip
    counts = _StatusCount()
    t0 = time.perf_counter()
    dead_out = args.dead_letters.open("w") if args.dead_letters else contextlib.nullcontext()
    with contextlib.closing(bar), dead_out as dead_file:

        async def dead(items: Sequence[DeadLetter]) -> None:
            if dead_file is not None:
                for d in items:
                    line = {"line": d.message.offset, "reason": d.reason}
                    dead_file.write(json.dumps(line) + "\n")

        daemon = await replay_source(source, settings, [JsonlSink(args.alerts_out), counts], dead)
    dt = time.perf_counter() - t0
    c = daemon.pipeline.stats
    rejected = sum(daemon.runner.rejected.values())
    reasons = ", ".join(f"{k}: {v}" for k, v in daemon.runner.rejected.most_common(5))
    print(
        f"replayed {source.lines} lines in {dt:.2f}s "
        f"({source.lines / max(dt, 1e-9):,.0f} lines/s): "
        f"{c.records_in} window records used, {c.changes_in} change events, "
        f"{c.records_duplicate} duplicates dropped, {rejected} rejected"
        f"{' (' + reasons + ')' if reasons else ''}; "
        f"alerts: {counts.by_status['firing']} firing, {counts.by_status['resolved']} resolved",
        file=sys.stderr,
    )
    return 0

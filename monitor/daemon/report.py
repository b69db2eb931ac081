"""`flopwatch report`: a recording (and its alerts) as one self-contained HTML page.

Without `--alerts` the recording is replayed first (`flopwatch replay`'s machinery) to
find them. Then a second replay feeds the series keeper with the pipeline's own
matrices, watching every incident's listed devices from the start, so the plots show
what the detectors measured, before the onset too.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import msgspec

from monitor.config import Settings
from monitor.daemon.assemble import Wiring, assemble, run_daemon
from monitor.errors import DecodeError, RecordingError, UsageError
from monitor.progress import Progress
from monitor.report.render import incident_views, report_html
from monitor.report.series import SeriesKeeper
from monitor.sinks.memory import ListSink
from monitor.sources.recording import RecordingSource, is_change_line, iter_lines
from monitor.wire import Alert, ChangeEvent, Codec


def load_alerts(path: Path) -> list[Alert]:
    """Alert records from a JSONL file (`replay --alerts-out`, the jsonl sink)."""
    if not path.is_file():
        raise UsageError(f"alerts file not found: {path}")
    decoder = msgspec.json.Decoder(Alert)
    out = []
    for n, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(decoder.decode(line))
        except msgspec.ValidationError as exc:
            raise UsageError(f"{path}:{n}: not an alert record: {exc}") from None
        except msgspec.DecodeError as exc:
            raise UsageError(f"{path}:{n}: not JSON: {exc}") from None
    return out


async def _pass(
    path: Path, settings: Settings, label: str, keeper: SeriesKeeper | None, size: int
) -> tuple[list[Alert], RecordingSource]:
    """One replay of the recording (`size` bytes): its alerts, with `keeper` watching."""
    with Progress(label, size, "lines") as bar:
        source = RecordingSource(
            path,
            settings.kafka.topics,
            settings.kafka.max_batch_records,
            progress=lambda lines, read: bar.update(read, lines),
        )
        sink = ListSink()
        async with AsyncExitStack() as stack:
            wiring = Wiring(source=source, sinks=[sink], http_host=None)
            daemon = await assemble(stack, settings, wiring)
            daemon.pipeline.observer = keeper.observe if keeper is not None else None
            await run_daemon(daemon, stack)
    return sink.alerts, source


def _changes(path: Path, settings: Settings) -> list[ChangeEvent]:
    """The recording's valid change events, in time order (window records are skipped
    without being decoded)."""
    codec = Codec(settings.limits.max_record_bytes, settings.limits.max_layers)
    changes: dict[str, ChangeEvent] = {}
    for _, line in iter_lines(path):
        if is_change_line(line):
            try:
                ch = codec.decode_change(line)
            except DecodeError:
                continue
            changes.setdefault(ch.id, ch)
    return sorted(changes.values(), key=lambda c: (c.ts, c.id))


def _checked(path: Path, out: Path) -> int:
    """The recording's size; UsageError for a missing recording or a non-HTML output."""
    if not path.is_file():
        raise UsageError(f"recording not found: {path}")
    if out.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--out must end in .html, got {out}")
    return path.stat().st_size


def _write(out: Path, html: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")


async def report(args: argparse.Namespace, settings: Settings) -> int:
    """Write the HTML report of `args.input` to `args.out`; a summary on stderr."""
    path: Path = args.input
    size = _checked(path, args.out)
    t0 = time.perf_counter()
    alerts = load_alerts(args.alerts) if args.alerts is not None else None
    try:
        if alerts is None:
            alerts, _ = await _pass(path, settings, "report: replay", None, size)
        views = incident_views(alerts)
        keeper = SeriesKeeper(windows=None)
        for v in views:
            keeper.watch(v.alert)
        _, source = await _pass(path, settings, "report: series", keeper, size)
        changes = _changes(path, settings)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    views = [
        dataclasses.replace(
            v, series=keeper.series(v.alert), hosts=keeper.hosts(v.alert.scope.hosts)
        )
        for v in views
    ]
    html = report_html(views, changes, f"flopwatch report: {path.name}", keeper.span)
    _write(args.out, html)
    print(
        f"report of {source.lines} lines, {len(views)} incidents, {len(changes)} change "
        f"events -> {args.out} ({len(html) / 1024:.0f} KiB) in "
        f"{time.perf_counter() - t0:.2f}s",
        file=sys.stderr,
    )
    return 0

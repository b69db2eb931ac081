"""Recordings: records and change events as JSON lines (optionally gzip), plus labels.json."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

from sim.run import Simulation


def labels_path(path: Path) -> Path:
    """`<stem>.labels.json` next to a `.jsonl` / `.jsonl.gz` recording."""
    name = path.name
    for suffix in (".jsonl.gz", ".jsonl"):
        if name.endswith(suffix):
            return path.with_name(name[: -len(suffix)] + ".labels.json")
    raise ValueError(f"recording path must end in .jsonl or .jsonl.gz: {path}")


def write_recording(
    sim: Simulation, path: Path, progress: Callable[[int, int], None] | None = None
) -> int:
    """Write every window record and change event in event-time order; returns records written.

    Change events go before the window records of the window they landed in, so a
    replay sees a deploy before the regression it causes. Labels are written last
    (after the run, so dirty-stream counts are final). `progress` is called after each
    window with (windows done, records written).
    """
    path = Path(path)
    lpath = labels_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("wb") as raw, ThreadPoolExecutor(max_workers=1) as writer:
        fh: IO[bytes] | gzip.GzipFile = raw
        if path.name.endswith(".gz"):
            # mtime=0 keeps the bytes identical across runs; level 3 is ~2x faster than 6
            fh = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=3)
        with fh:
            # zlib releases the GIL: window k compresses while window k+1 is simulated
            pending: Future[int] | None = None
            for k, win in enumerate(sim.windows(), start=1):
                lines = [v for _, v in win.changes]
                lines += [v for _, v in win.records]
                n += len(win.records)
                if progress is not None:
                    progress(k, n)
                if not lines:
                    continue
                if pending is not None:
                    pending.result()
                pending = writer.submit(fh.write, b"\n".join(lines) + b"\n")
            if pending is not None:
                pending.result()
    lpath.write_text(json.dumps(sim.labels, indent=1) + "\n")
    return n

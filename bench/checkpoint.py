"""Checkpoint size and time: a partition's state after a simulated run, raw and compressed.

    python -m bench.checkpoint --json out/bench/checkpoint.json [--devices 256 1024]

Runs the `pool_regression` scenario through the pipeline in process (4 input
partitions, devices spread by key), then snapshots, compresses (as
`monitor.checkpoint` stores it: zstd level 1) and restores every partition.
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from pathlib import Path
from typing import Any

from monitor.checkpoint.format import compress, decompress
from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from sim.run import simulate

PARTITIONS = 4


def measure(devices: int) -> dict[str, Any]:
    """Bytes and milliseconds of one checkpoint round over all partitions."""
    sim = simulate("pool_regression", devices=devices, seed=0)
    pipeline = Pipeline(Settings())
    batch: list[RawMessage] = []
    offset = 0
    for window in sim.windows():
        for key, value in window.records:
            part = zlib.crc32(key) % PARTITIONS  # stable across runs, unlike hash()
            batch.append(RawMessage("flopwatch.samples", part, offset, key, value))
            offset += 1
        if len(batch) >= 5000:
            pipeline.process(batch)
            batch = []
    if batch:
        pipeline.process(batch)
    t0 = time.perf_counter()
    blobs = {p: pipeline.snapshot_partition(p) for p in pipeline.partitions}
    t1 = time.perf_counter()
    packed = {p: compress(b) for p, b in blobs.items()}
    t2 = time.perf_counter()
    twin = Pipeline(Settings())
    for p, b in packed.items():
        twin.restore_partition(p, decompress(b))
    t3 = time.perf_counter()
    raw = sum(len(b) for b in blobs.values())
    comp = sum(len(b) for b in packed.values())
    return {
        "devices": devices,
        "records": offset,
        "raw_bytes": raw,
        "compressed_bytes": comp,
        "compressed_bytes_per_device": comp / devices,
        "snapshot_ms": 1e3 * (t1 - t0),
        "compress_ms": 1e3 * (t2 - t1),
        "restore_ms": 1e3 * (t3 - t2),
    }


def main(argv: list[str] | None = None) -> int:
    """Measure; print a table; write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--devices", type=int, nargs="+", default=[256, 1024])
    args = ap.parse_args(argv)
    rows = [measure(d) for d in args.devices]
    head = ("devices", "raw MB", "zstd MB", "KB/device", "snapshot ms", "compress ms", "restore ms")
    print("  ".join(f"{h:>11}" for h in head))
    for r in rows:
        cells = (
            r["devices"], r["raw_bytes"] / 1e6, r["compressed_bytes"] / 1e6,
            r["compressed_bytes_per_device"] / 1e3, r["snapshot_ms"], r["compress_ms"],
            r["restore_ms"],
        )  # fmt: skip
        print("  ".join(f"{c:>11.1f}" if isinstance(c, float) else f"{c:>11}" for c in cells))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"partitions": PARTITIONS, "runs": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

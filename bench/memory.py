"""Memory of the in-process pipeline: RSS per stream at fleet sizes, and flat under churn.

    python -m bench.memory --json out/bench/memory.json [--devices 10000 50000 100000]

Each size runs in a fresh process: the pipeline (default settings, 4 input partitions,
devices spread by key) takes `--windows` windows of every device, 6 layer types per
record, in batches of 5,000 as the daemon reads them. RSS is read from /proc after
the last batch, less the process's RSS once imports and one small warm-up batch are
done (the baseline, reported apart). A stream is one device x layer type series (the
device-level stream and the groups ride along; per device is the other view). Then
every partition is checkpointed as the daemon does it, one at a time (snapshot, zstd),
and the peak RSS of that round is read (VmHWM, reset first).

The flood run sends `--flood-devices` new device names every window under the caps the
Helm chart sets (`--caps`: limits.max_devices, max_streams, max_groups per partition):
the least recently seen are evicted, and RSS and the checkpoint peak stay at what the
caps allow, whatever the flood. The churn run keeps `--churn-devices` devices and
spreads them over 32 pools renamed every 2 windows (`detector.stream_ttl_s` = 300 s,
30 windows): without group expiry every name would stay; RSS at the end of each third
of the run shows whether memory is flat.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The repo root first: tests/monitor must not shadow the monitor package.
from bench.decode import LAYERS, full_record
from monitor.checkpoint.format import compress
from monitor.config import DetectorSettings, LimitSettings, Settings
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from monitor.daemon.prometheus import _state_bytes
from tests.factories import T0

PARTITIONS = 4
BATCH = 5000
_VARIANTS = 8  # templates with different MFU, so streams are not constant
CHURN_POOLS, CHURN_EVERY = 32, 2  # pools at a time; windows between renames


def _proc_status(field: str) -> int:
    """A `/proc/self/status` figure in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak() -> None:
    """Make VmHWM start again from the current RSS (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def _templates(pool: str, factor: float = 1.0, **layer: Any) -> list[bytes]:
    """Encoded records with placeholders for device and time, 6 layer types each; MFU
    scaled by `factor`, `layer` (kernel, fallback) passed to every layer."""
    out = []
    for v in range(_VARIANTS):
        mfu = 0.45 * factor * (1 + 0.01 * (v - _VARIANTS / 2))
        rec = full_record("HOST/GPU", 1.0, pool=pool, mfu=mfu, **layer)
        out.append(json.dumps(rec).encode().replace(b'"ts": 1.0', b'"ts": TS'))
    return out


def batches(devices: int, windows: int, pools: Iterator[str] | None = None,
            first: int = 0, flood: bool = False) -> Iterator[list[RawMessage]]:  # fmt: skip
    """Batches of encoded window records, window by window; `pools` gives each window's
    pool-name prefix (device d is in pool `<prefix>-<d % CHURN_POOLS>`), or all devices sit
    in one pool; `flood`: new device names every window."""
    batch: list[RawMessage] = []
    templates = [_templates("train-a")]
    for w in range(first, first + windows):
        if pools is not None:
            prefix = next(pools)
            templates = [_templates(f"{prefix}-{k}") for k in range(CHURN_POOLS)]
        ts = f"{T0 + 10.0 * (w + 1):.1f}".encode()
        for d in range(w * devices if flood else 0, (w + 1) * devices if flood else devices):
            host, gpu = f"node-{d // 8:05d}".encode(), f"gpu{d % 8}".encode()
            value = (templates[d % len(templates)][(d + w) % _VARIANTS].replace(b"HOST", host)
                     .replace(b"GPU", gpu).replace(b"TS", ts))  # fmt: skip
            key = host + b"/" + gpu
            batch.append(RawMessage("flopwatch.samples", d % PARTITIONS, -1, key, value))
            if len(batch) == BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def _state(p: Pipeline) -> dict[str, int]:
    tables = [st.table for st in p.partitions.values()]
    return {
        "devices": sum(len(t.devices) for t in tables),
        "layer_streams": sum(len(t.layer_index) for t in tables),
        "groups": sum(len(t.groups) for t in tables),
        "numpy_state_bytes": sum(_state_bytes(st) for st in p.partitions.values()),
    }


def measure_size(devices: int, windows: int, caps: list[int] | None = None) -> dict[str, Any]:
    """RSS of the pipeline holding `devices` devices x 6 layers, and its checkpoint peak;
    with `caps`, `devices` new devices every window under those caps."""
    settings = Settings()
    if caps is not None:
        settings = Settings(limits=LimitSettings(max_devices=caps[0], max_streams=caps[1],
                                                 max_groups=caps[2]))  # fmt: skip
    p = Pipeline(settings)
    for b in batches(8, 2, first=-2):  # warm-up: code paths, caches, numpy
        p.process(b)
    baseline = _proc_status("VmRSS")
    for b in batches(devices, windows, flood=caps is not None):
        p.process(b)
    rss = _proc_status("VmRSS")
    _reset_peak()
    raw = compressed = 0
    for part in sorted(p.partitions):
        blob = p.snapshot_partition(part)
        raw += len(blob)
        compressed += len(compress(blob))
        del blob
    peak = _proc_status("VmHWM")
    state = _state(p)  # what is held at the end: under caps, less than was sent
    streams = len(LAYERS) * state["devices"]
    return {
        "devices_per_window": devices,
        "streams": streams,
        "windows": windows,
        **state,
        "baseline_rss_bytes": baseline,
        "rss_bytes": rss,
        "rss_bytes_per_stream": (rss - baseline) / streams,
        "rss_bytes_per_device": (rss - baseline) / state["devices"],
        "snapshot_peak_rss_bytes": peak,
        "checkpoint_raw_bytes": raw,
        "checkpoint_compressed_bytes": compressed,
        "devices_evicted": p.stats.streams_evicted["device"],
        "records_over_capacity": p.stats.records_capacity,
    }


def measure_churn(devices: int, windows: int) -> dict[str, Any]:
    """RSS at each third of a run whose pool names change every `CHURN_EVERY` windows."""
    settings = Settings(detector=DetectorSettings(stream_ttl_s=300.0))
    p = Pipeline(settings)
    names = (f"pool-{w // CHURN_EVERY}" for w in range(windows))
    thirds: list[int] = []
    state: list[dict[str, int]] = []
    done = 0
    for b in batches(devices, windows, pools=names):
        p.process(b)
        done += len(b)
        while len(thirds) < 3 and done >= (len(thirds) + 1) * devices * windows // 3:
            thirds.append(_proc_status("VmRSS"))
            state.append(_state(p))
    return {
        "devices": devices,
        "windows": windows,
        "pool_names": CHURN_POOLS * (windows // CHURN_EVERY),
        "rss_bytes_by_third": thirds,
        "groups_by_third": [s["groups"] for s in state],
        "numpy_state_bytes_by_third": [s["numpy_state_bytes"] for s in state],
        "groups_expired": p.stats.streams_expired["group"],
    }


def _child(kind: str, n: int, windows: int, caps: list[int]) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter (RSS never shrinks back)."""
    cmd = [sys.executable, "-m", "bench.memory", "--child", kind, str(n), str(windows),
           *map(str, caps)]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main() -> None:
    """Measure every size and the churn run; print a table; optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--devices", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--flood-devices", type=int, default=60_000)
    ap.add_argument("--caps", type=int, nargs=3, default=[10_000, 60_000, 2_000],
                    metavar=("DEVICES", "STREAMS", "GROUPS"))  # fmt: skip
    ap.add_argument("--churn-devices", type=int, default=5_000)
    ap.add_argument("--churn-windows", type=int, default=120)
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, n, w, *caps = args.child[0], *map(int, args.child[1:])
        result = (measure_churn(n, w) if kind == "churn" else
                  measure_size(n, w, caps if kind == "flood" else None))  # fmt: skip
        print(json.dumps(result))
        return
    sizes = [_child("size", n, args.windows, args.caps) for n in args.devices]
    flood = _child("flood", args.flood_devices, args.windows, args.caps)
    churn = _child("churn", args.churn_devices, args.churn_windows, args.caps)
    head = (
        ("devices", 8),
        ("streams", 8),
        ("RSS", 10),
        ("baseline", 9),
        ("B/stream", 9),
        ("B/device", 9),
        ("numpy B/stream", 15),
        ("snapshot peak", 14),
        ("ckpt zstd", 10),
    )
    print(" ".join(f"{name:>{width}}" for name, width in head))
    for r in [*sizes, flood]:
        print(f"{r['devices']:>8,} {r['streams']:>8,} {_mib(r['rss_bytes']):>10} "
              f"{_mib(r['baseline_rss_bytes']):>9} {r['rss_bytes_per_stream']:>9,.0f} "
              f"{r['rss_bytes_per_device']:>9,.0f} "
              f"{r['numpy_state_bytes'] / r['streams']:>15,.0f} "
              f"{_mib(r['snapshot_peak_rss_bytes']):>14} "
              f"{_mib(r['checkpoint_compressed_bytes']):>10}")  # fmt: skip
    f = flood
    print(f"\nflood: {f['devices_per_window']:,} new devices a window for {f['windows']} "
          f"windows under caps {args.caps} per partition: {f['devices_evicted']:,} devices "
          f"evicted, {f['records_over_capacity']:,} records dead-lettered (one batch beyond "
          "a cap); its row shows what was kept")  # fmt: skip
    print(
        f"\npool-name churn: {churn['devices']:,} devices, {churn['windows']} windows, "
        f"{churn['pool_names']} pool names, {churn['groups_expired']:,} groups expired"
    )
    print("  RSS at each third:  " + ", ".join(_mib(x) for x in churn["rss_bytes_by_third"]))
    print("  groups:             " + ", ".join(str(x) for x in churn["groups_by_third"]))
    print("  numpy state:        "
          + ", ".join(_mib(x) for x in churn["numpy_state_bytes_by_third"]))  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"sizes": sizes, "flood": flood, "churn": churn}
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Where the in-process pipeline's CPU time goes, stage by stage, at the daemon's batch shape.

    python -m bench.stages --json out/bench/stages.json [--devices 20000] [--windows 4]

The records are bench.memory's (6 layer types each, every field set), keyed by device
over 4 input partitions, in batches of 5,000 grouped by partition as the Kafka source
hands them over (a partition's records next to each other, which is also what keeps
them in cache between decode and the stream table: interleaved, `collect` costs about a
third more). The
first window creates every stream and is not counted; the rest are. Each stage's CPU
time (`time.process_time`, all threads) is taken by wrapping the method that runs it,
so the same module measures older code too (run it with that code first on PYTHONPATH):

| stage | method |
| --- | --- |
| decode | `Pipeline._decode` (parse, validate, key and future checks, split by partition) |
| accept | `StreamTable._accept` (order, duplicates and late records, caps) |
| collect | `StreamTable._collect` (the batch's raw columns: rows, groups, kernels) |
| frame | `StreamTable._frame` (metric matrices and pool aggregates) |
| load models | `LoadAdjuster.adjust` |
| detectors | `Pipeline._detect` less the load models (bank updates, change points) |
| correlate | `Pipeline._correlate` (correlator, advisor, lifecycle) |
| expire | `Pipeline._expire` |
| other | the rest of `Pipeline.process` (group levels, rewind bookkeeping, counters) |
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any

from bench.memory import batches
from monitor.config import Settings
from monitor.core import pipeline as pipeline_mod
from monitor.core.load import LoadAdjuster
from monitor.core.pipeline import Pipeline
from monitor.core.stream_table import StreamTable

_PARTITION = attrgetter("partition")
STAGES = {
    "decode": (Pipeline, "_decode"),
    "accept": (StreamTable, "_accept"),
    "collect": (StreamTable, "_collect"),
    "frame": (StreamTable, "_frame"),
    "load models": (LoadAdjuster, "adjust"),
    "detect": (Pipeline, "_detect"),
    "correlate": (Pipeline, "_correlate"),
    "expire": (Pipeline, "_expire"),
    "total": (Pipeline, "process"),
}


def _timed(fn: Callable[..., Any], spent: dict[str, float], name: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.process_time() - t

    return wrapper


def measure(devices: int, windows: int) -> dict[str, Any]:
    """CPU seconds per stage over windows 2.. of `devices` devices, and records/s."""
    spent = dict.fromkeys(STAGES, 0.0)
    for name, (cls, attr) in STAGES.items():
        setattr(cls, attr, _timed(getattr(cls, attr), spent, name))
    p = Pipeline(Settings())
    n, start = 0, None
    for b in batches(devices, windows):
        p.process(sorted(b, key=_PARTITION))
        n += len(b)
        if start is None and n >= devices:  # stream creation (the first window) not counted
            start = n
            spent.update(dict.fromkeys(STAGES, 0.0))
    counted = n - (start or 0)
    stages = {k: v for k, v in spent.items() if k != "total"}
    stages["detectors"] = stages.pop("detect") - stages["load models"]
    stages["other"] = spent["total"] - sum(stages.values())
    return {
        "devices": devices,
        "records": counted,
        "layers_per_record": 6,
        "pipeline_records_per_s": round(counted / spent["total"]),
        "us_per_record": {k: round(1e6 * v / counted, 2) for k, v in stages.items()},
        "share": {k: round(v / spent["total"], 3) for k, v in stages.items()},
        "module": pipeline_mod.__file__,
    }


def main() -> int:
    """Run, print a table, optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--devices", type=int, default=20_000)
    ap.add_argument("--windows", type=int, default=4)
    args = ap.parse_args()
    if args.windows < 2:
        ap.error("--windows must be >= 2 (the first one is not counted)")
    result = measure(args.devices, args.windows)
    print(f"{'stage':<12} {'us/record':>10} {'share':>7}")
    for k, v in result["us_per_record"].items():
        print(f"{k:<12} {v:>10.2f} {result['share'][k]:>7.1%}")
    print(f"{'records/s':<12} {result['pipeline_records_per_s']:>10,}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

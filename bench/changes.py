"""Change events at scale: how fast a changes topic of N events loads into the advisor.

    python -m bench.changes [--events 1000000] [--json PATH]

Every member reads the whole changes topic at start, so its size bounds start-up. The
events go through `Pipeline.process` in batches of 5,000 (decode, validate, index),
mostly in time order with 1% late ones, as a real topic holds them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage

T0 = 1_764_432_000.0


def _events(n: int, seed: int = 0) -> list[RawMessage]:
    rng = np.random.default_rng(seed)
    ts = T0 + np.arange(n) * 0.5
    late = rng.random(n) < 0.01
    ts[late] -= rng.uniform(0, 3600, late.sum())
    kinds = ["kernel_lib", "driver", "firmware", "compiler", "model", "scheduler_config"]
    return [
        RawMessage(
            "flopwatch.changes",
            0,
            i,
            None,
            json.dumps(
                {
                    "v": 1,
                    "ts": float(t),
                    "id": f"chg-{i}",
                    "kind": kinds[i % len(kinds)],
                    "scope": {"pool": f"pool-{i % 50}"},
                    "from": "1",
                    "to": "2",
                }
            ).encode(),
        )
        for i, t in enumerate(ts.tolist())
    ]


def measure(n: int) -> dict[str, float]:
    """Seconds and events/s to load `n` change events."""
    msgs = _events(n)
    # Keep every event: the look-back spans the whole run.
    settings = Settings(alerts={"change_lookback_s": 10 * n + 7200.0})
    pipeline = Pipeline(settings)
    t0 = time.perf_counter()
    for i in range(0, n, 5000):
        pipeline.process(msgs[i : i + 5000])
    dt = time.perf_counter() - t0
    assert len(pipeline.advisor.changes) == n  # noqa: S101 - the bench measures a full load
    return {"events": n, "seconds": round(dt, 3), "events_per_s": round(n / dt)}


def main() -> None:
    """Print a table; `--json` writes it too."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [measure(n) for n in args.events]
    print(f"{'events':>10} {'seconds':>9} {'events/s':>10}")
    for r in rows:
        print(f"{r['events']:>10,} {r['seconds']:>9.2f} {r['events_per_s']:>10,}")
    if args.json:
        args.json.write_text(json.dumps({"changes": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Ingest speed: profiler traces and dmon CSVs into window records.

    python -m bench.ingest --json out/bench/ingest.json [--repeat 3]

Ingests every trace under tests/data/real/traces (read, link, classify, aggregate,
encode) and reports trace events/s and records/s; the best of `--repeat` runs each.
Also times `--dmon` parsing of the shared MIGProfiler CSVs when that folder exists.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from monitor.hardware import Catalog
from monitor.ingest.dcgm import Naming, read_dmon, record
from monitor.ingest.output import encode
from monitor.ingest.rules import HwAliases, LayerRules
from monitor.ingest.torch_trace import Identity, ingest_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "real" / "traces"
DMON = ROOT.parent / "shared" / "real-data" / "dcgm"


def _traces(repeat: int) -> dict[str, Any]:
    rules, aliases, catalog = LayerRules.build(), HwAliases(), Catalog()
    rows: list[dict[str, Any]] = []
    for path in sorted(TRACES.glob("*.json.gz")):
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            records, st = ingest_trace(path, rules, aliases, catalog, Identity())
            for r in records:
                encode(r)
            best = min(best, time.perf_counter() - t0)
        rows.append({"trace": path.name, "mb": path.stat().st_size / 2**20, "events": st.events,
                     "kernels": st.kernels, "records": len(records), "s": best,
                     "linked_share": st.linked_share})  # fmt: skip
    events = sum(r["events"] for r in rows)
    secs = sum(r["s"] for r in rows)
    return {
        "traces": rows,
        "trace_events_per_s": events / secs,
        "trace_kernels_per_s": sum(r["kernels"] for r in rows) / secs,
        "trace_records_per_s": sum(r["records"] for r in rows) / secs,
        "trace_mb_per_s": sum(r["mb"] for r in rows) / secs,
    }


def _dmon(repeat: int) -> dict[str, Any]:
    files = sorted(DMON.glob("*__dcgm.csv")) if DMON.is_dir() else []
    if not files:
        return {}
    naming = Naming(HwAliases(), Catalog(), hw="a100-sxm")
    samples = records = 0
    best_total = 0.0
    for path in files:
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = [encode(record(d, ts, w, naming)) for ts, w, d in read_dmon(path, "h", 10.0)]
            best = min(best, time.perf_counter() - t0)
        samples += sum(1 for _ in path.open()) - 1
        records += len(out)
        best_total += best
    return {"dmon_samples_per_s": samples / best_total, "dmon_records_per_s": records / best_total}


def main() -> None:
    """Measure and print a table; JSON with --json."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    report = {**_traces(args.repeat), **_dmon(args.repeat)}
    head = ("MB", "events", "kernels", "records", "linked", "s")
    print(f"{'trace':70s} " + " ".join(f"{h:>8s}" for h in head))
    for r in report["traces"]:
        print(f"{r['trace'][:70]:70s} {r['mb']:8.2f} {r['events']:8d} {r['kernels']:8d} "
              f"{r['records']:8d} {r['linked_share']:8.0%} {r['s']:8.3f}")  # fmt: skip
    for key, value in report.items():
        if key != "traces":
            print(f"{key:28s} {value:12,.0f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

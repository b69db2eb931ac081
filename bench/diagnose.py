"""Diagnosis quality over the simulator's scenario pack: incidents, stages, rollbacks, delay.

    python -m bench.diagnose --json out/bench/diagnose.json [--devices 128] [--scenario NAME]
        [--late-join SHARE@FRACTION] [--param NAME=VALUE ...]

Each scenario runs in process (simulator → pipeline, no broker) with its labels
as ground truth. An alert matches a labelled incident when it names the same
pool and its onset lies within `--tolerance` windows of the labelled onset
(the incident's end, if labelled, bounds it too).

`--late-join 0.25@0.5` holds back the records of every fourth device (by id)
until half the run has passed: those devices join their pools then, as new
devices or ones back after their streams expired do. `--param` sets detector
parameters (e.g. `--param warm_start=1024`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from monitor.cli import detector_param
from monitor.config import DetectorSettings, Settings, first_error
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from monitor.daemon.runner import Runner
from monitor.sinks.memory import ListSink
from monitor.sources.simulated import SimulatorSource
from monitor.wire import Alert
from sim.run import simulate
from sim.scenarios import SCENARIOS

PACK = [n for n in SCENARIOS if n not in ("dirty_stream",)]


@dataclass
class ScenarioResult:
    """Scores of one scenario run."""

    scenario: str
    incidents: int
    found: int = 0
    false_incidents: int = 0
    false_pages: int = 0  # of those, at severity page at some point (what wakes on-call)
    false_tickets: int = 0  # at most ticket
    duplicate_alerts: int = 0
    stage_ok: int = 0
    rollback_ok: int = 0
    after_onset_suggestions: int = 0
    resolved_ok: int = 0  # labelled as ended (e.g. rolled back) and the alert resolved after
    resolved_early: int = 0  # alert resolved while the labelled incident was still on
    ended: int = 0
    delays: list[float] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    false: list[str] = field(default_factory=list)
    seconds: float = 0.0


class LateJoinSource(SimulatorSource):
    """The simulator's batches with every `every`-th device (by sorted id) held back
    until window `join_at`: devices that join their pools mid-run."""

    def __init__(self, *args: Any, every: int, join_at: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.every, self.join_at = every, join_at

    async def batches(self) -> AsyncIterator[list[RawMessage]]:
        """The batches, less the late devices' records before they join."""
        late: set[bytes] | None = None
        w = 0
        async for batch in super().batches():
            if late is None:
                keys = sorted({m.key for m in batch if m.topic == self.topics.samples and m.key})
                late = set(keys[:: self.every])
            kept = batch
            if w < self.join_at:
                kept = [m for m in batch if m.topic != self.topics.samples or m.key not in late]
            w += 1
            yield kept


async def run_scenario(name: str, devices: int | None, seed: int, settings: Settings,
                       tolerance: float, late_join: tuple[float, float] | None = None,
                       ) -> tuple[ScenarioResult, list[Alert]]:  # fmt: skip
    """Simulate one scenario, run the monitor over it, and score the alerts."""
    sc = SCENARIOS[name]
    sim = simulate(name, devices=devices or sc.default_devices,
                   duration_s=sc.default_duration_s, seed=seed)  # fmt: skip
    sink = ListSink()
    t0 = time.perf_counter()
    source: SimulatorSource = SimulatorSource(sim, settings.kafka.topics, partitions=4)
    if late_join is not None:
        share, frac = late_join
        windows = round(sc.default_duration_s / float(sim.labels["window_s"]))
        source = LateJoinSource(
            sim,
            settings.kafka.topics,
            partitions=4,
            every=max(1, round(1.0 / share)),
            join_at=round(frac * windows),
        )
    await Runner(source, Pipeline(settings), [sink]).run()  # fmt: skip
    labels = sim.labels
    res = score(labels, sink.alerts, tolerance)
    res.seconds = time.perf_counter() - t0
    return res, sink.alerts


_SEVERITY = ("page", "ticket", "info")


def score(labels: dict[str, Any], alerts: list[Alert], tolerance: float) -> ScenarioResult:
    """Match alerts to labelled incidents and count what went right and wrong."""
    w = float(labels["window_s"])
    truth = labels["incidents"]
    changes = {c["id"]: c for c in labels["changes"]}
    res = ScenarioResult(labels["scenario"], len(truth))
    res.ended = sum(1 for inc in truth if inc.get("end_ts") is not None)
    by_id: dict[str, list[Alert]] = {}
    resolved_at: dict[str, float] = {}
    for a in alerts:
        if a.status == "firing":
            by_id.setdefault(a.id, []).append(a)
        else:
            resolved_at[a.id] = a.ts
    matched_ids: set[str] = set()
    for inc in truth:
        lo = inc["onset_ts"] - tolerance * w
        hi = inc["onset_ts"] + tolerance * w
        # Any record of an alert may carry the matching onset: it firms up as devices join.
        hits = [
            aid for aid, seq in by_id.items()
            if seq[0].scope.pool == inc["scope"]["pool"]
            and any(lo <= a.onset_ts <= hi for a in seq)
        ]  # fmt: skip
        if not hits:
            res.misses.append(inc["id"])
            continue
        res.found += 1
        res.duplicate_alerts += len(hits) - 1
        matched_ids.update(hits)
        first = min((by_id[h][0] for h in hits), key=lambda a: a.detected_ts)
        last = by_id[first.id][-1]
        res.delays.append((first.detected_ts - inc["onset_ts"]) / w)
        res.stage_ok += last.first_failing_stage == inc["first_failing_stage"]
        res.rollback_ok += last.suggestion.change_id == inc["change_id"]
        ended = inc.get("end_ts")
        for h in hits:
            if h in resolved_at:
                if ended is not None and resolved_at[h] >= ended:
                    res.resolved_ok += 1
                else:
                    res.resolved_early += 1
    for aid, seq in by_id.items():
        a = seq[-1]
        cid = a.suggestion.change_id
        if cid is not None and cid in changes and changes[cid]["ts"] > a.onset_ts + w:
            res.after_onset_suggestions += 1
        if aid not in matched_ids:
            res.false_incidents += 1
            worst = min(_SEVERITY.index(r.severity) for r in seq)
            res.false_pages += worst == 0
            res.false_tickets += worst == 1
            res.false.append(
                f"{a.scope.pool}:{'/'.join(a.layers)}:{a.metric}:{a.delta_pct:+.1f}%"
                f" ({_SEVERITY[worst]}, {a.scope.level})"
            )
    return res


def _late_join(text: str) -> tuple[float, float]:
    """SHARE@FRACTION, both in (0, 1]."""
    share, sep, frac = text.partition("@")
    try:
        pair = (float(share), float(frac))
    except ValueError:
        pair = (math.nan, math.nan)
    if not sep or not all(0.0 < v <= 1.0 for v in pair):
        raise argparse.ArgumentTypeError(f"invalid --late-join {text!r} (use SHARE@FRACTION)")
    return pair


def main() -> int:
    """Run the pack, print a table, optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--devices", type=int, default=None, help="override each scenario's size")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tolerance", type=float, default=6.0, help="onset match, in windows")
    ap.add_argument("--scenario", action="append", help="run only these")
    ap.add_argument(
        "--late-join",
        type=_late_join,
        metavar="SHARE@FRACTION",
        help="hold back every 1/SHARE-th device until FRACTION of the run",
    )
    ap.add_argument(
        "--param",
        type=detector_param,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a detector parameter (repeatable)",
    )
    args = ap.parse_args()
    try:
        settings = Settings()
        if args.param:
            # On top of the configured detector (FLOPWATCH_DETECTOR__* still apply).
            conf = settings.detector.model_dump()
            conf["params"] = {**conf["params"], **dict(args.param)}
            settings = settings.model_copy(update={"detector": DetectorSettings(**conf)})
    except ValidationError as exc:
        ap.error(first_error(exc, "detector"))
    results = []
    for name in args.scenario or PACK:
        res, _ = asyncio.run(run_scenario(name, args.devices, args.seed, settings, args.tolerance,
                                          args.late_join))  # fmt: skip
        results.append(res)
    hdr = f"{'scenario':26} {'inc':>3} {'found':>5} {'false':>5} {'f.page':>6} {'dup':>3} " \
          f"{'stage':>5} {'rollbk':>6} {'delay':>5} {'sec':>5}  notes"  # fmt: skip
    print(hdr)
    for r in results:
        delay = f"{statistics.median(r.delays):.1f}" if r.delays else "-"
        notes = "; ".join([*(f"miss {m}" for m in r.misses), *(f"false {f}" for f in r.false[:3])])
        print(f"{r.scenario:26} {r.incidents:>3} {r.found:>5} {r.false_incidents:>5} "
              f"{r.false_pages:>6} {r.duplicate_alerts:>3} {r.stage_ok:>5} {r.rollback_ok:>6} "
              f"{delay:>5} {r.seconds:>5.1f}  {notes}")  # fmt: skip
    total = sum(r.incidents for r in results)
    found = sum(r.found for r in results)
    delays = [d for r in results for d in r.delays]
    summary = {
        "incident_recall": round(found / total, 3) if total else None,
        "false_incidents": sum(r.false_incidents for r in results),
        # Severity routes: page -> on-call, ticket -> a queue, info -> dashboards only.
        "false_pages": sum(r.false_pages for r in results),
        "false_tickets": sum(r.false_tickets for r in results),
        "duplicate_alerts": sum(r.duplicate_alerts for r in results),
        "stage_accuracy": round(sum(r.stage_ok for r in results) / found, 3) if found else None,
        "rollback_accuracy": round(sum(r.rollback_ok for r in results) / found, 3)
        if found
        else None,
        "median_delay_windows": round(statistics.median(delays), 2) if delays else None,
        "after_onset_suggestions": sum(r.after_onset_suggestions for r in results),
        "resolved_after_fix": sum(r.resolved_ok for r in results),
        "resolved_while_still_broken": sum(r.resolved_early for r in results),
        "incidents_ended_in_labels": sum(r.ended for r in results),
        "incidents": total,
        "detector": settings.detector.kind,
        "detector_params": settings.detector.params,
        "late_join": args.late_join,
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        detail = [
            {k: v for k, v in vars(r).items() if k != "delays"} | {"delays": r.delays}
            for r in results
        ]
        args.json.write_text(json.dumps(summary | {"scenarios": detail}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

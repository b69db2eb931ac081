"""Diagnosis quality over the simulator's scenario pack: incidents, stages, rollbacks, delay.

    python -m bench.diagnose --json out/bench/diagnose.json [--seeds 1-5] [--holdout]
        [--classic] [--devices 128] [--scenario NAME] [--late-join SHARE@FRACTION]
        [--param NAME=VALUE ...] [--hours 2]
    python -m bench.diagnose --healthy-fleet [--seeds 1] [--devices 1024] [--hours 6]

Each scenario runs in process (simulator → pipeline, no broker) with its labels
as ground truth, once per seed; figures are pooled over the seeds. Runs are wide
(noise, traffic, headroom and pool sizes drawn per seed) unless `--classic`.
`--holdout` also runs seeds 101-105, which nobody tunes on, and reports them
separately. `--healthy-fleet` runs only the long healthy fleet and reports false
pages and tickets per hour of it. `--hours` sets every scenario's duration (its
faults keep their places as fractions of the run). An alert matches a labelled incident when it
names the same pool and its onset lies within `--tolerance` windows of the
labelled onset.

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
import sys
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

PACK = [n for n in SCENARIOS if n not in ("dirty_stream", "healthy_fleet")]
HOLDOUT = [101, 102, 103, 104, 105]  # never looked at while tuning


def seed_list(text: str) -> list[int]:
    """`1-5`, `1,3,7` or a mix (`1-3,9`) as a list of seeds."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.partition("-")
            out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seeds {text!r} (use 1-5 or 1,2,3)") from None
    if not out:
        raise argparse.ArgumentTypeError(f"invalid seeds {text!r} (use 1-5 or 1,2,3)")
    return out


@dataclass
class ScenarioResult:
    """Scores of one scenario run."""

    scenario: str
    incidents: int
    seed: int = 0
    hours: float = 0.0  # simulated event time
    found: int = 0
    paged: int = 0  # found by an alert that reached severity page (on-call was woken)
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
    unpaged: list[str] = field(default_factory=list)  # found, but never paged
    false: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)  # found, wrong stage or rollback
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
                       *, wide: bool = False, duration_s: float | None = None,
                       partitions: int = 4,
                       ) -> tuple[ScenarioResult, list[Alert]]:  # fmt: skip
    """Simulate one scenario, run the monitor over it, and score the alerts."""
    sc = SCENARIOS[name]
    sim = simulate(name, devices=devices or sc.default_devices,
                   duration_s=duration_s or sc.default_duration_s, seed=seed,
                   wide=wide)  # fmt: skip
    sink = ListSink()
    t0 = time.perf_counter()
    source: SimulatorSource = SimulatorSource(sim, settings.kafka.topics, partitions=partitions)
    if late_join is not None:
        share, frac = late_join
        windows = sim.n_windows
        source = LateJoinSource(
            sim,
            settings.kafka.topics,
            partitions=partitions,
            every=max(1, round(1.0 / share)),
            join_at=round(frac * windows),
        )
    await Runner(source, Pipeline(settings), [sink]).run()  # fmt: skip
    labels = sim.labels
    res = score(labels, sink.alerts, tolerance)
    res.seconds = time.perf_counter() - t0
    res.seed = seed
    res.hours = sim.n_windows * sim.window_s / 3600.0
    return res, sink.alerts


_SEVERITY = ("page", "ticket", "info")


def _describe(a: Alert, onset: float, w: float) -> str:
    """An alert in one line: what, where, how bad, and its onset against `onset` (windows)."""
    return (
        f"{a.metric}{'/' + ','.join(a.layers) if a.layers else ''} {a.delta_pct:+.1f}% "
        f"stage={a.first_failing_stage} scope={a.scope.level} {a.severity} "
        f"rollback={a.suggestion.change_id} onset{(a.onset_ts - onset) / w:+.0f}w"
    )


def score(labels: dict[str, Any], alerts: list[Alert], tolerance: float) -> ScenarioResult:
    """Match alerts to labelled incidents and count what went right and wrong."""
    w = float(labels["window_s"])
    truth = labels["incidents"]
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
        matched_ids.update(_match(res, inc, by_id, resolved_at, tolerance, w))
    _count_unmatched(res, labels, by_id, matched_ids)
    return res


def _want(inc: dict[str, Any]) -> str:
    return (
        f"{inc['id']} (want {inc['first_failing_stage']}, {inc['scope']['level']}, "
        f"rollback={inc['change_id']})"
    )


def _match(res: ScenarioResult, inc: dict[str, Any], by_id: dict[str, list[Alert]],
           resolved_at: dict[str, float], tolerance: float, w: float) -> list[str]:  # fmt: skip
    """Score one labelled incident against the alerts; returns the ids that match it."""
    lo = inc["onset_ts"] - tolerance * w
    hi = inc["onset_ts"] + tolerance * w
    # Any record of an alert may carry the matching onset: it firms up as devices join.
    hits = [
        aid for aid, seq in by_id.items()
        if seq[0].scope.pool == inc["scope"]["pool"]
        and any(lo <= a.onset_ts <= hi for a in seq)
    ]  # fmt: skip
    if not hits:
        near = [_describe(seq[-1], inc["onset_ts"], w) for seq in by_id.values()
                if seq[0].scope.pool == inc["scope"]["pool"]]  # fmt: skip
        res.misses.append(f"{_want(inc)}; pool alerts: {'; '.join(near) or 'none'}")
        return []
    res.found += 1
    res.duplicate_alerts += len(hits) - 1
    first = min((by_id[h][0] for h in hits), key=lambda a: a.detected_ts)
    last = by_id[first.id][-1]
    worst = min(_SEVERITY.index(a.severity) for h in hits for a in by_id[h])
    res.paged += worst == 0
    if worst:
        res.unpaged.append(
            f"{_want(inc)}: {_SEVERITY[worst]} {_describe(last, inc['onset_ts'], w)}"
        )
    res.delays.append((first.detected_ts - inc["onset_ts"]) / w)
    stage_ok = last.first_failing_stage == inc["first_failing_stage"]
    rollback_ok = last.suggestion.change_id == inc["change_id"]
    res.stage_ok += stage_ok
    res.rollback_ok += rollback_ok
    if not (stage_ok and rollback_ok):
        res.wrong.append(f"{_want(inc)}: got {_describe(last, inc['onset_ts'], w)}")
    ended = inc.get("end_ts")
    for h in hits:
        if h in resolved_at:
            if ended is not None and resolved_at[h] >= ended:
                res.resolved_ok += 1
            else:
                res.resolved_early += 1
    return hits


def _count_unmatched(res: ScenarioResult, labels: dict[str, Any],
                     by_id: dict[str, list[Alert]], matched_ids: set[str]) -> None:  # fmt: skip
    """Count suggestions of later changes and the alerts that match no labelled incident."""
    w = float(labels["window_s"])
    changes = {c["id"]: c for c in labels["changes"]}
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
                f" ({_SEVERITY[worst]}, {a.scope.level}, stage={a.first_failing_stage},"
                f" t={(a.onset_ts - float(labels['start_ts'])) / 60.0:.0f}min)"
            )


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


def summarize(results: list[ScenarioResult]) -> dict[str, Any]:
    """Pooled figures over runs (scenarios x seeds)."""
    total = sum(r.incidents for r in results)
    found = sum(r.found for r in results)
    delays = [d for r in results for d in r.delays]
    hours = sum(r.hours for r in results)
    pages = sum(r.false_pages for r in results)
    tickets = sum(r.false_tickets for r in results)
    return {
        "incident_recall": round(found / total, 3) if total else None,
        # Labelled incidents are regressions on-call must hear of: found at page severity.
        "page_recall": round(sum(r.paged for r in results) / total, 3) if total else None,
        "stage_accuracy": round(sum(r.stage_ok for r in results) / found, 3) if found else None,
        "rollback_accuracy": round(sum(r.rollback_ok for r in results) / found, 3)
        if found
        else None,
        "duplicate_alerts": sum(r.duplicate_alerts for r in results),
        "false_incidents": sum(r.false_incidents for r in results),
        # Severity routes: page -> on-call, ticket -> a queue, info -> dashboards only.
        "false_pages": pages,
        "false_tickets": tickets,
        "false_pages_per_hour": round(pages / hours, 3) if hours else None,
        "false_tickets_per_hour": round(tickets / hours, 3) if hours else None,
        "hours": round(hours, 2),
        "median_delay_windows": round(statistics.median(delays), 2) if delays else None,
        "after_onset_suggestions": sum(r.after_onset_suggestions for r in results),
        "resolved_after_fix": sum(r.resolved_ok for r in results),
        "resolved_while_still_broken": sum(r.resolved_early for r in results),
        "incidents_ended_in_labels": sum(r.ended for r in results),
        "incidents": total,
        "runs": len(results),
        "seconds": round(sum(r.seconds for r in results), 1),
    }


def print_table(results: list[ScenarioResult]) -> None:
    """One row per run, then what went wrong in it."""
    hdr = f"{'scenario':24} {'seed':>4} {'inc':>3} {'found':>5} {'false':>5} {'f.page':>6} " \
          f"{'dup':>3} {'stage':>5} {'rollbk':>6} {'delay':>5} {'sec':>5}"  # fmt: skip
    print(hdr)
    for r in results:
        delay = f"{statistics.median(r.delays):.1f}" if r.delays else "-"
        print(f"{r.scenario:24} {r.seed:>4} {r.incidents:>3} {r.found:>5} {r.false_incidents:>5} "
              f"{r.false_pages:>6} {r.duplicate_alerts:>3} {r.stage_ok:>5} {r.rollback_ok:>6} "
              f"{delay:>5} {r.seconds:>5.1f}")  # fmt: skip
        notes = [*(f"miss {m}" for m in r.misses), *(f"wrong {x}" for x in r.wrong),
                 *(f"unpaged {u}" for u in r.unpaged),
                 *(f"false {f}" for f in r.false)]  # fmt: skip
        for note in notes:
            print(f"    {note}")


def _settings(ap: argparse.ArgumentParser, params: list[tuple[str, Any]]) -> Settings:
    try:
        settings = Settings()
        if params:
            # On top of the configured detector (FLOPWATCH_DETECTOR__* still apply).
            conf = settings.detector.model_dump()
            conf["params"] = {**conf["params"], **dict(params)}
            settings = settings.model_copy(update={"detector": DetectorSettings(**conf)})
    except ValidationError as exc:
        ap.error(first_error(exc, "detector"))
    return settings


def seed_sets(seeds: list[int], holdout: bool) -> dict[str, list[int]]:
    """The seeds by set: holdout seeds are reported apart from tuning ones wherever they
    were asked for, so a look at one is never taken for a tuning figure."""
    held = set(HOLDOUT) if holdout else set()
    tuning = [s for s in seeds if s not in HOLDOUT]
    held |= set(seeds) - set(tuning)
    return ({"tuning": tuning} if tuning else {}) | ({"holdout": sorted(held)} if held else {})


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--devices", type=int, default=None, help="override each scenario's size")
    ap.add_argument("--seeds", type=seed_list, default=None, metavar="1-5",
                    help="seeds to pool over (default 1-5; with --healthy-fleet, 1)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=None, help="one seed (same as --seeds N)")
    ap.add_argument("--holdout", action="store_true", help="also run seeds 101-105, apart")
    ap.add_argument("--classic", action="store_true",
                    help="the classic pack's fixed physics (no per-seed draws)")  # fmt: skip
    ap.add_argument("--healthy-fleet", action="store_true",
                    help="only the long healthy fleet: false pages, tickets per hour")  # fmt: skip
    ap.add_argument("--hours", type=float, default=None,
                    help="each scenario's duration (default: the scenario's own)")  # fmt: skip
    ap.add_argument("--tolerance", type=float, default=6.0, help="onset match, in windows")
    ap.add_argument("--partitions", type=int, default=4,
                    help="input partitions the records are keyed over (by device)")  # fmt: skip
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
    return ap


def main() -> int:
    """Run the pack over the seeds, print a table and pooled figures, optionally write JSON."""
    ap = _parser()
    args = ap.parse_args()
    settings = _settings(ap, args.param)
    if args.seed is not None and args.seeds is not None:
        ap.error("use --seed or --seeds, not both")
    seeds = args.seeds or ([args.seed] if args.seed is not None else None)
    if args.healthy_fleet:
        names = ["healthy_fleet"]
        seeds = seeds or [1]
    else:
        names = args.scenario or PACK
        seeds = seeds or [1, 2, 3, 4, 5]
    duration = args.hours * 3600.0 if args.hours else None
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario {unknown[0]!r}")
    sets = seed_sets(seeds, args.holdout)
    if set(seeds) & set(HOLDOUT):
        print(f"seeds {HOLDOUT[0]}-{HOLDOUT[-1]} are the holdout set: reported apart, "
              "not for tuning", file=sys.stderr)  # fmt: skip
    out: dict[str, Any] = {
        "detector": settings.detector.kind,
        "detector_params": settings.detector.params,
        "late_join": args.late_join,
        "partitions": args.partitions,
        "wide": not args.classic,
        "scenarios": names,
    }
    details: list[dict[str, Any]] = []
    for label, seed_set in sets.items():
        results = []
        for seed in seed_set:
            for name in names:
                res, _ = asyncio.run(run_scenario(
                    name, args.devices, seed, settings, args.tolerance, args.late_join,
                    wide=not args.classic, duration_s=duration,
                    partitions=args.partitions))  # fmt: skip
                results.append(res)
                print(f"{label} seed {seed} {name}: found {res.found}/{res.incidents}, "
                      f"false {res.false_incidents} ({res.false_pages} pages), "
                      f"{res.seconds:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
        print(f"== {label} seeds {seed_set}")
        print_table(results)
        summary = summarize(results) | {"seeds": seed_set}
        print(json.dumps(summary, indent=2))
        out[label] = summary
        details += [
            {k: v for k, v in vars(r).items() if k != "delays"} | {"delays": r.delays, "set": label}
            for r in results
        ]
    # the tuning set's figures are the top-level keys (the holdout's when it ran alone)
    first = next(iter(sets))
    out |= {k: v for k, v in out[first].items() if k != "seeds"} | {"seeds": seeds}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out | {"runs_detail": details}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Run a spec: replay its input in process, as `flopwatch replay` does, then judge the alerts.

An incident is the alert records that share an id. An expectation is met by an
incident with one firing record that matches every field the expectation gives
(and, with `state`, whether the incident ended resolved). Each incident meets at
most one expectation, taken in the order written. A failure names the nearest
incident: the one that matches the most fields.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from pydantic import ValidationError

from monitor.config import Settings, first_error
from monitor.daemon.replay import replay_source
from monitor.errors import UsageError
from monitor.sinks.memory import ListSink
from monitor.sources.recording import RecordingSource, is_change_line, iter_lines
from monitor.sources.simulated import simulation, simulation_lines
from monitor.spec.schema import (
    ChangeRef,
    ExpectAlert,
    Quiet,
    Spec,
    Time,
    load_spec,
    resolve_time,
    seconds,
)
from monitor.wire import Alert

SEVERITY_RANK = {"page": 0, "ticket": 1, "info": 2}
Lines = Callable[[], Iterable[tuple[int, bytes]]]


@dataclass
class Prepared:
    """A spec made ready to run: its settings and its input's lines, all checked."""

    path: Path
    spec: Spec
    settings: Settings
    source_path: Path
    lines: Lines
    start_ts: float | None = None  # known up front for a simulation
    window_s: float | None = None


@dataclass
class Replayed:
    """What the replay produced, and what the judge needs to place times."""

    alerts: list[Alert]
    start_ts: float
    window_s: float
    changes: dict[str, float]
    lines: int
    seconds: float


@dataclass
class Outcome:
    """One checked expectation."""

    name: str
    ok: bool
    detail: str = ""


@dataclass
class SpecResult:
    """A spec's outcomes, with the replay they judged."""

    path: Path
    spec: Spec
    replayed: Replayed
    outcomes: list[Outcome]

    @property
    def ok(self) -> bool:
        """Every expectation met."""
        return all(o.ok for o in self.outcomes)


def _merge(into: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `into`: mappings merge key by key, anything else replaces."""
    out = dict(into)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_config(base: Settings, overrides: dict[str, Any]) -> Settings:
    """`overrides` merged onto `base`, checked like any configuration."""
    try:
        return Settings.model_validate(_merge(base.model_dump(), overrides))
    except ValidationError as exc:
        raise UsageError(f"config.{first_error(exc, 'config')}") from None


def prepare(path: Path, base: Settings) -> Prepared:
    """Load and check a spec file and everything it names, before anything runs."""
    return prepare_spec(load_spec(path), path, base)


def prepare_spec(spec: Spec, path: Path, base: Settings) -> Prepared:
    """Check what `spec` names (a recording relative to `path`'s folder, a scenario, the
    configuration) and make it ready to run; UsageError names `path` and the field."""
    try:
        settings = apply_config(base, spec.config)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None
    inp = spec.input
    if inp.recording is not None:
        rec = (path.parent / inp.recording).resolve()
        if not rec.is_file():
            raise UsageError(f"{path}: input.recording: not found: {rec}")
        return Prepared(path, spec, settings, rec, lambda: iter_lines(rec))
    scenario = inp.scenario or ""  # schema checks guarantee one of the two
    try:
        sim = simulation(
            scenario,
            devices=inp.devices,
            duration_s=None if inp.duration is None else seconds(inp.duration),
            seed=inp.seed,
            window_s=seconds(inp.window),
        )
    except ValueError as exc:
        raise UsageError(f"{path}: input.scenario: {exc}") from None
    return Prepared(
        path, spec, settings, path, lambda: simulation_lines(sim), sim.start_ts, sim.window_s
    )


class _Observer:
    """Watches the input go by: change event times, the first window's start and length."""

    def __init__(self) -> None:
        self.changes: dict[str, float] = {}
        self.start_ts: float | None = None
        self.window_s: float | None = None

    def wrap(self, lines: Lines) -> Lines:
        def watched() -> Iterator[tuple[int, bytes]]:
            for n, line in lines():
                if self.start_ts is None or is_change_line(line):
                    self._look(line)
                yield n, line

        return watched

    def _look(self, line: bytes) -> None:
        try:
            obj = json.loads(line)
            ts = float(obj["ts"])
        except (ValueError, KeyError, TypeError):
            return  # the pipeline rejects it with its reason
        if "layers" not in obj and isinstance(obj.get("id"), str):
            self.changes.setdefault(obj["id"], ts)
        elif self.start_ts is None and isinstance(obj.get("window_s"), float | int):
            self.window_s = float(obj["window_s"])
            self.start_ts = ts - self.window_s


async def replay_prepared(prep: Prepared) -> Replayed:
    """Replay the spec's input through the same machinery as `flopwatch replay`."""
    obs = _Observer()
    size = prep.spec.input.batch_size or prep.settings.kafka.max_batch_records
    source = RecordingSource(
        prep.source_path, prep.settings.kafka.topics, batch_size=size, lines=obs.wrap(prep.lines)
    )
    sink = ListSink()
    t0 = time.perf_counter()
    await replay_source(source, prep.settings, [sink])
    window = prep.window_s or obs.window_s or 10.0
    start = prep.start_ts if prep.start_ts is not None else obs.start_ts or 0.0
    return Replayed(sink.alerts, start, window, obs.changes, source.lines, time.perf_counter() - t0)


def run_spec(prep: Prepared) -> SpecResult:
    """Replay and judge one prepared spec."""
    replayed = asyncio.run(replay_prepared(prep))
    return SpecResult(prep.path, prep.spec, replayed, judge(prep.spec, replayed))


@dataclass
class Incident:
    """The alert records of one incident id, in order."""

    id: str
    firing: list[Alert] = field(default_factory=list)
    resolved: Alert | None = None

    @property
    def state(self) -> str:
        """Whether it ended resolved or still open."""
        return "resolved" if self.resolved is not None else "open"


def incidents(alerts: Iterable[Alert]) -> list[Incident]:
    """Alert records grouped by incident id, in order of first appearance."""
    by_id: dict[str, Incident] = {}
    for a in alerts:
        inc = by_id.setdefault(a.id, Incident(a.id))
        if a.status == "firing":
            inc.firing.append(a)
        else:
            inc.resolved = a
    return [inc for inc in by_id.values() if inc.firing]


def rel(ts: float, start: float) -> str:
    """A time as an offset from the start of the input: +8m10s."""
    s = round(ts - start)
    sign = "-" if s < 0 else "+"
    h, rest = divmod(abs(s), 3600)
    m, sec = divmod(rest, 60)
    return f"{sign}{h}h{m:02d}m{sec:02d}s" if h else f"{sign}{m}m{sec:02d}s"


def describe(a: Alert, start: float, state: str | None = None) -> str:
    """One alert record on one line."""
    sug = a.suggestion
    roll = f" rollback {sug.change_id}" if sug.action == "rollback" else f" {sug.action}"
    pool = f" {a.scope.pool}" if a.scope.pool else ""
    layers = f" [{','.join(a.layers)}]" if a.layers else ""
    end = f" {state}" if state else ""
    return (
        f"{a.id} {a.severity} {a.scope.level}{pool}{layers} {a.metric} {a.delta_pct:+.1f}% "
        f"{a.first_failing_stage}/{a.bottleneck}{roll} onset {rel(a.onset_ts, start)}{end}"
    )


@dataclass
class _Check:
    """One field of an expectation: what was asked, how to test a record, what it had."""

    name: str
    want: str
    test: Callable[[Alert], bool]
    got: Callable[[Alert], str]


def _rollback(a: Alert) -> str | None:
    return a.suggestion.change_id if a.suggestion.action == "rollback" else None


def _checks(exp: ExpectAlert, run: Replayed) -> list[_Check]:
    """The record-level checks an expectation asks for (ValueError: an unknown change)."""
    out: list[_Check] = []

    def eq(name: str, want: str | None, get: Callable[[Alert], str | None]) -> None:
        if want is not None:
            out.append(_Check(name, want, lambda a: get(a) == want, lambda a: str(get(a))))

    eq("metric", exp.metric, lambda a: a.metric)
    eq("pool", exp.pool, lambda a: a.scope.pool)
    eq("scope", exp.scope, lambda a: a.scope.level)
    eq("severity", exp.severity, lambda a: a.severity)
    eq("first_failing_stage", exp.first_failing_stage, lambda a: a.first_failing_stage)
    eq("bottleneck", exp.bottleneck, lambda a: a.bottleneck)
    if exp.layers is not None:
        want = set(exp.layers)
        out.append(
            _Check(
                "layers",
                ",".join(exp.layers) + " (at least)",
                lambda a: want <= set(a.layers),
                lambda a: ",".join(a.layers) or "-",
            )
        )
    if exp.host is not None:
        host = exp.host
        out.append(
            _Check(
                "host",
                host,
                lambda a: host in a.scope.hosts,
                lambda a: ",".join(a.scope.hosts[:4]) or "-",
            )
        )
    if exp.rollback is not msgspec.UNSET:
        cid = exp.rollback
        out.append(
            _Check("rollback", str(cid), lambda a: _rollback(a) == cid, lambda a: str(_rollback(a)))
        )
    if exp.onset is not None:
        o = exp.onset
        at: Time = o.at if o.at is not None else ChangeRef(change=o.change or "")
        anchor = resolve_time(at, run.start_ts, run.changes)
        tol, w = o.within * run.window_s, run.window_s
        where = rel(anchor, run.start_ts)
        where = f"{o.change} ({where})" if o.change else where
        out.append(
            _Check(
                "onset",
                f"within {o.within:g} windows of {where}",
                lambda a: abs(a.onset_ts - anchor) <= tol,
                lambda a: (
                    f"{rel(a.onset_ts, run.start_ts)} ({(a.onset_ts - anchor) / w:+.1f} windows)"
                ),
            )
        )
    return out


def _label(exp: ExpectAlert, i: int) -> str:
    """`alerts[0]` with the expectation's name, or the fields it gives."""
    if exp.name:
        return f"alerts[{i}] {exp.name}"
    given = {f: getattr(exp, f) for f in exp.__struct_fields__ if f not in ("name", "onset")}
    parts = [
        f"{k}={','.join(v) if isinstance(v, list) else v}"
        for k, v in given.items()
        if v is not None and v is not msgspec.UNSET
    ]
    return " ".join([f"alerts[{i}]", *parts])


def _score(inc: Incident, checks: list[_Check], state: str | None) -> tuple[int, Alert]:
    """Fields matched by the incident's best record (ties: the latest), state included."""
    best = max(reversed(inc.firing), key=lambda a: sum(c.test(a) for c in checks))
    hits = sum(c.test(best) for c in checks)
    return hits + (state is not None and inc.state == state), best


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    widths = [max(len(r[k]) for r in rows) for k in range(3)]
    return "\n".join(
        f"    {m:1} {f:<{widths[1]}}  {w:<{widths[2]}}  {g}".rstrip() for m, f, w, g in rows
    )


def expect(
    exp: ExpectAlert, i: int, run: Replayed, incs: list[Incident], claimed: set[str]
) -> Outcome:
    """Claim the first unclaimed incident that meets `exp`, or say what came nearest."""
    name = _label(exp, i)
    try:
        checks = _checks(exp, run)
    except ValueError as exc:
        return Outcome(name, False, str(exc))
    full = len(checks) + (exp.state is not None)
    scored = [(inc, *_score(inc, checks, exp.state)) for inc in incs if inc.id not in claimed]
    for inc, score, _ in scored:
        if score == full:
            claimed.add(inc.id)
            return Outcome(name, True)
    if not scored:
        others = " unclaimed" if incs else ""
        return Outcome(name, False, f"no incident matches: the replay paged nothing{others}")
    inc, _, best = max(scored, key=lambda s: s[1])
    rows = [("", "field", "expected", "got")]
    rows += [("✓" if c.test(best) else "✗", c.name, c.want, c.got(best)) for c in checks]
    if exp.state is not None:
        rows.append(("✓" if inc.state == exp.state else "✗", "state", exp.state, inc.state))
    return Outcome(
        name,
        False,
        f"no incident matches; nearest of {len(scored)}: "
        f"{describe(best, run.start_ts, inc.state)}\n{_table(rows)}",
    )


def quiet(q: Quiet, i: int, run: Replayed) -> Outcome:
    """No incident of `q.severity` or worse (in `q.pool`) detected within the interval.

    Detection time, not the record's send time: a replay sends at the end of each batch,
    so only `detected_ts` is the same whatever the batch size.
    """
    try:
        lo = -float("inf") if q.from_ is None else resolve_time(q.from_, run.start_ts, run.changes)
        hi = float("inf") if q.to is None else resolve_time(q.to, run.start_ts, run.changes)
    except ValueError as exc:
        return Outcome(f"quiet[{i}]", False, str(exc))
    span = (
        f"{'start' if q.from_ is None else rel(lo, run.start_ts)}.."
        f"{'end' if q.to is None else rel(hi, run.start_ts)}"
    )
    name = f"quiet[{i}] {span}{' pool=' + q.pool if q.pool else ''} severity<={q.severity}"
    rank = SEVERITY_RANK[q.severity]
    loud = [
        a
        for a in run.alerts
        if a.status == "firing"
        and lo <= a.detected_ts <= hi
        and SEVERITY_RANK[a.severity] <= rank
        and (q.pool is None or a.scope.pool == q.pool)
    ]
    if not loud:
        return Outcome(name, True)
    lines = [
        f"    detected {rel(a.detected_ts, run.start_ts)}: {describe(a, run.start_ts)}"
        for a in loud[:5]
    ]
    more = [f"    ... and {len(loud) - 5} more"] if len(loud) > 5 else []
    return Outcome(
        name, False, "\n".join([f"{_n(len(loud), 'alert record')} fired:", *lines, *more])
    )


def judge(spec: Spec, run: Replayed) -> list[Outcome]:
    """Every expectation of `spec` checked against the replay."""
    incs = incidents(run.alerts)
    claimed: set[str] = set()
    out = [expect(exp, i, run, incs, claimed) for i, exp in enumerate(spec.alerts)]
    out += [quiet(q, i, run) for i, q in enumerate(spec.quiet)]
    if spec.unexpected == "fail":
        extra = [inc for inc in incs if inc.id not in claimed]
        lines = [f"    {describe(inc.firing[-1], run.start_ts, inc.state)}" for inc in extra]
        detail = "\n".join([f"{_n(len(extra), 'incident')} no expectation claims:", *lines])
        out.append(Outcome("no unexpected incident", not extra, detail if extra else ""))
    return out


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def report(result: SpecResult) -> str:
    """PASS/FAIL, then each failed expectation with its diff."""
    r = result.replayed
    n_inc = len(incidents(r.alerts))
    failed = [o for o in result.outcomes if not o.ok]
    n = len(result.outcomes)
    checks = f"{len(failed)} of {n} checks failed" if failed else f"{n} checks"
    lines = [
        f"{'FAIL' if failed else 'PASS'} {result.path}  ({checks}; {_n(n_inc, 'incident')}, "
        f"{_n(len(r.alerts), 'alert record')} from {r.lines} lines in {r.seconds:.1f}s)"
    ]
    lines += [f"  {o.name}: {o.detail}" for o in failed]
    return "\n".join(lines)

"""The spec file: what to replay, with which settings, and what must (not) page.

A spec is YAML checked against msgspec structs, so an unknown or mistyped field is
one line that names it (`alerts[0].severty: unknown field`), and `flopwatch test
--schema` prints the same structs as JSON Schema.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from monitor.errors import UsageError
from monitor.units import parse_duration
from monitor.wire import ScopeLevel, Severity, Stage

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Windows = Annotated[float, msgspec.Meta(ge=0)]


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Unknown fields are errors: a misspelt expectation must not pass silently."""


class ChangeRef(_Strict):
    """The time of a change event of the input, by its id."""

    change: str


# A time: a number is Unix seconds; a string is an offset from the start of the input
# ("90s", "15m", "+1h") or an ISO-8601 date-time with its zone; {change: ID} is that
# change event's time.
Time = float | str | ChangeRef


class Input(_Strict):
    """What to replay: a recording (relative to the spec file) or a simulated scenario."""

    recording: str | None = None
    scenario: str | None = None
    seed: int = 0
    devices: PositiveInt | None = None
    duration: str | float | None = None
    window: str | float = "10s"
    batch_size: PositiveInt | None = None  # default: kafka.max_batch_records, as replay


class Onset(_Strict):
    """The incident's onset lies within `within` windows of a time or of a change event."""

    at: Time | None = None
    change: str | None = None
    within: Windows = 6.0


class ExpectAlert(_Strict):
    """An incident that must page; every given field must match one of its alert records."""

    name: str | None = None
    metric: str | None = None
    layers: list[str] | None = None  # the alert names at least these
    pool: str | None = None
    host: str | None = None  # among the scope's hosts
    scope: ScopeLevel | None = None
    severity: Severity | None = None
    first_failing_stage: Stage | None = None
    bottleneck: str | None = None
    # The change id a rollback is suggested for; null: no rollback suggested.
    rollback: str | msgspec.UnsetType | None = msgspec.UNSET
    onset: Onset | None = None
    state: Literal["open", "resolved"] | None = None  # at the end of the input


class Quiet(_Strict, rename={"from_": "from"}):
    """An interval (default: the whole input) in which no alert of `severity` or worse fires."""

    from_: Time | None = None
    to: Time | None = None
    pool: str | None = None
    severity: Severity = "info"


class Spec(_Strict):
    """One expectation file."""

    input: Input
    name: str | None = None
    config: dict[str, Any] = msgspec.field(default_factory=dict)  # onto Settings
    alerts: list[ExpectAlert] = msgspec.field(default_factory=list)
    quiet: list[Quiet] = msgspec.field(default_factory=list)
    # fail: an incident no expectation claims fails the spec (as promtool's exp_alerts).
    unexpected: Literal["fail", "allow"] = "fail"


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def spec_reason(exc: msgspec.ValidationError) -> str:
    """msgspec's message as `path: what` (`alerts[0].severty: unknown field`)."""
    msg = str(exc)
    m = _AT.search(msg)
    path = m.group("path").lstrip(".") if m else ""
    text = msg[: m.start()] if m else msg
    field = text.split("`")[1] if "`" in text else ""
    prefix = f"{path}." if path else ""
    if text.startswith("Object contains unknown field"):
        return f"{prefix}{field}: unknown field"
    if text.startswith("Object missing required field"):
        return f"{prefix}{field}: missing required field"
    return f"{path or 'spec'}: {text[0].lower()}{text[1:]}"


def _plain(node: Any) -> Any:
    """YAML's unquoted date-times as ISO strings, as if they had been quoted."""
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, dt.datetime | dt.date):
        return node.isoformat()
    return node


def parse_spec(text: str | bytes, where: str = "spec") -> Spec:
    """Validate a spec; a UsageError names the file and the field."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise UsageError(f"{where}: {line}invalid YAML: {problem}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: expected a mapping with `input:` at the top")
    try:
        spec = msgspec.convert(_plain(raw), Spec)
    except msgspec.ValidationError as exc:
        raise UsageError(f"{where}: {spec_reason(exc)}") from None
    check_spec(spec, where)
    return spec


def check_spec(spec: Spec, where: str) -> None:
    """What the types cannot say: one input, one onset anchor, parseable times."""
    inp = spec.input
    if (inp.recording is None) == (inp.scenario is None):
        raise UsageError(f"{where}: input: give exactly one of recording or scenario")
    if inp.recording is not None and (inp.devices is not None or inp.duration is not None):
        raise UsageError(f"{where}: input.devices/duration: only for a scenario")
    for name, value in (("input.duration", inp.duration), ("input.window", inp.window)):
        _seconds(value or 1.0, f"{where}: {name}")
    times: list[tuple[str, Time | None]] = []
    for i, exp in enumerate(spec.alerts):
        o = exp.onset
        if o is not None and (o.at is None) == (o.change is None):
            raise UsageError(f"{where}: alerts[{i}].onset: give exactly one of at or change")
        times.append((f"alerts[{i}].onset.at", o.at if o is not None else None))
    for i, q in enumerate(spec.quiet):
        times += [(f"quiet[{i}].from", q.from_), (f"quiet[{i}].to", q.to)]
    for name, t in times:
        if isinstance(t, str):
            try:
                resolve_time(t, 0.0, {})
            except ValueError as exc:
                raise UsageError(f"{where}: {name}: {exc}") from None


def _seconds(value: str | float, where: str) -> float:
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}") from None
    if value <= 0:
        raise UsageError(f"{where}: expected > 0, got {value}")
    return float(value)


def seconds(value: str | float) -> float:
    """A checked duration in seconds (from a spec already validated)."""
    return _seconds(value, "duration")


def resolve_time(t: Time, start: float, changes: dict[str, float]) -> float:
    """Unix seconds of a spec time; ValueError for an unknown change or a bad string."""
    if isinstance(t, ChangeRef):
        if t.change not in changes:
            raise ValueError(f"change {t.change!r} is not in the input")
        return changes[t.change]
    if isinstance(t, float | int):
        return float(t)
    text = t.strip()
    if re.match(r"^\d{4}-\d\d-\d\d", text):
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"bad date-time {t!r}") from None
        if when.tzinfo is None:
            raise ValueError(f"date-time {t!r} needs a zone (Z or +00:00)")
        return when.timestamp()
    return start + parse_duration(text.removeprefix("+"))


def load_spec(path: Path) -> Spec:
    """Read and validate a spec file."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    return parse_spec(text, str(path))


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a spec file."""
    return msgspec.json.schema(Spec)

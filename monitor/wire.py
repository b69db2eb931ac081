"""Wire types of contract v1 (window record, change event, alert) and their codecs.

Decoding is the hot path: msgspec validates types and bounds in C while it
parses, so a record is checked once and never re-walked in Python. Every
rejection becomes a `DecodeError` whose reason names the field, e.g.
``layers[2].busy_s: expected >= 0, got -1``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec

from monitor.errors import DecodeError

NonNeg = Annotated[float, msgspec.Meta(ge=0.0)]
Unit = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Positive = Annotated[float, msgspec.Meta(gt=0.0)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]

LAYER_TYPES = (
    "attention", "mlp", "embedding", "norm", "softmax", "moe_router",
    "allreduce", "conv", "other", "all",
)  # fmt: skip
LayerType = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9_]{1,32}$")]

# The window record's structs are `gc=False` (untracked by the cycle collector): they hold
# only numbers, strings and lists of each other, so they can never be part of a reference
# cycle. Tracked, a batch of them (one object per record and per layer) triggers
# collections that walk the daemon's whole heap while it decodes.


class Ingress(msgspec.Struct, frozen=True, gc=False):
    """Request-ingress counters for the window (stage `ingress`)."""

    req_rate: NonNeg | None = None
    queue_depth: NonNeg | None = None
    queue_wait_ms: NonNeg | None = None
    batch: NonNeg | None = None


class DeviceStats(msgspec.Struct, frozen=True, gc=False):
    """Power, temperature and clock over the window (stage `execution`)."""

    power_w: NonNeg | None = None
    temp_c: Annotated[float, msgspec.Meta(ge=-273.15)] | None = None
    clock_mhz: NonNeg | None = None


class Slo(msgspec.Struct, frozen=True, gc=False):
    """Latency quantiles, quality and errors (stage `validation`)."""

    lat_p50_ms: NonNeg | None = None
    lat_p95_ms: NonNeg | None = None
    lat_p99_ms: NonNeg | None = None
    quality: float | None = None
    errors: NonNeg | None = None


class Layer(msgspec.Struct, frozen=True, gc=False):
    """Counters of one layer type within one window; a missing field means not measured."""

    type: LayerType
    flops: NonNeg | None = None
    busy_s: NonNeg | None = None
    cycles: NonNeg | None = None
    stall_mem_cycles: NonNeg | None = None
    occupancy: Unit | None = None
    bytes_hbm: NonNeg | None = None
    sram_hit: Unit | None = None
    spill_bytes: NonNeg | None = None
    sync_wait_s: NonNeg | None = None
    fallback_frac: Unit | None = None
    kernel: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class WindowRecord(msgspec.Struct, frozen=True, gc=False):
    """One device's measurement window (contract §1), keyed by `device`."""

    v: Literal[1]
    ts: Positive
    window_s: Positive
    device: Name
    layers: list[Layer]
    host: Name | None = None
    pool: Name | None = None
    model: Name | None = None
    hw: Name | None = None
    dtype: Name | None = None
    ingress: Ingress | None = None
    device_stats: DeviceStats | None = None
    slo: Slo | None = None
    source: str | None = None
    flops_estimated: bool | None = None


class ChangeScope(msgspec.Struct, frozen=True, omit_defaults=True):
    """Any subset of pool / host / device / model a change applies to."""

    pool: str | None = None
    host: str | None = None
    device: str | None = None
    model: str | None = None


ChangeKind = Literal[
    "kernel_lib", "compiler", "driver", "firmware", "model",
    "scheduler_config", "traffic_policy", "other",
]  # fmt: skip


class ChangeEvent(msgspec.Struct, frozen=True, rename={"from_": "from"}):
    """A deploy, config or software change a regression can be rolled back to (contract §2)."""

    v: Literal[1]
    ts: Positive
    id: Name
    kind: ChangeKind
    scope: ChangeScope
    from_: str | None = None
    to: str | None = None
    author: str | None = None
    url: str | None = None


Stage = Literal["ingress", "lowering", "scheduling", "execution", "validation", "release"]
Severity = Literal["page", "ticket", "info"]
ScopeLevel = Literal["device", "host", "pool", "fleet"]
STAGES: tuple[Stage, ...] = (
    "ingress", "lowering", "scheduling", "execution", "validation", "release",
)  # fmt: skip


class AlertScope(msgspec.Struct, frozen=True, kw_only=True):
    """Where an incident is: the widest fitting level and the devices it covers."""

    level: ScopeLevel
    pool: str | None = None
    model: str | None = None
    hosts: list[str] = msgspec.field(default_factory=list)
    devices: list[str] = msgspec.field(default_factory=list)  # may be truncated
    device_count: int  # always exact


class Evidence(msgspec.Struct, frozen=True):
    """One indicator that moved, so the attribution can be checked by a person."""

    stage: Stage
    indicator: str
    layer: str | None
    before: float
    after: float
    onset_ts: float
    score: float


class Suggestion(msgspec.Struct, frozen=True, rename={"from_": "from"}):
    """The bounded, reversible change to make, and the guardrail that proves it worked."""

    action: Literal["rollback", "mitigate", "investigate"]
    guardrail: str
    confidence: float
    change_id: str | None = None
    kind: str | None = None
    from_: str | None = None
    to: str | None = None
    scope: ChangeScope | None = None


class NotJudged(msgspec.Struct, frozen=True):
    """A stage the incident's devices could not show failing: none of its fields came in.

    `missing` names the contract §3 fields (a `+` joins the parts of a ratio), any one of
    which would have let the stage be judged; `devices` is how many of the incident's
    devices lacked them all (of `scope.device_count`).
    """

    stage: Stage
    devices: int
    missing: list[str]


class Alert(msgspec.Struct, frozen=True, omit_defaults=True):
    """An incident alert (contract §5), keyed by its deterministic `id`.

    `not_judged` is an optional field (the contract lets v1 gain optional fields), left
    out when every stage could be judged on every device of the incident.
    """

    v: Literal[1]
    id: str
    status: Literal["firing", "resolved"]
    ts: float
    onset_ts: float
    detected_ts: float
    severity: Severity
    scope: AlertScope
    layers: list[str]
    metric: str
    before: float
    after: float
    delta_pct: float
    first_failing_stage: Stage
    bottleneck: str
    evidence: list[Evidence]
    suggestion: Suggestion
    summary: str
    runbook: str
    # Optional (absent when empty): on a fleet-scope alert of the fleet stage across
    # replicas (`kafka.fleet_stage`), the ids of the pool alerts its replicas sent for it.
    pool_alerts: list[str] = msgspec.field(default_factory=list)
    # Optional (absent when empty): the stages the incident's devices could not show
    # failing, for lack of fields (`core.coverage`).
    not_judged: list[NotJudged] = msgspec.field(default_factory=list)


_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_EXPECTED = re.compile(r"^Expected `(?P<type>[^`]+)`(?P<rest>.*)$")
_PATH_PART = re.compile(r"\.(\w+)|\[(\d+)\]")
_TYPE_WORDS = {
    "float": "a number", "int": "an integer", "str": "a string", "bool": "a boolean",
    "object": "an object", "array": "an array", "null": "null",
}  # fmt: skip
_MISSING = object()


def _lookup(raw: Any, path: str) -> Any:
    node = raw
    for key, idx in _PATH_PART.findall(path):
        try:
            node = node[int(idx)] if idx else node[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return node


def _type_words(t: str) -> str:
    parts = [p.strip() for p in t.split("|") if p.strip() != "null"]
    return " or ".join(_TYPE_WORDS.get(p, p) for p in parts) or "null"


def _bound(rest: str) -> str:
    rest = rest.split(", got", maxsplit=1)[0].strip()
    rest = re.sub(r"(\d)\.0\b", r"\1", rest)
    return rest.replace("matching regex", "matching")


def _reason(exc: msgspec.ValidationError, data: bytes) -> str:
    """Rewrite msgspec's message as ``path: expected X, got Y`` (slow path, rejections only)."""
    msg = str(exc)
    m = _PATH.search(msg)
    path = m.group("path").lstrip(".") if m else ""
    text = msg[: m.start()] if m else msg
    if text.startswith("Object missing required field"):
        field = text.split("`")[1]
        return f"{path + '.' if path else ''}{field}: missing required field"
    try:
        got = _lookup(msgspec.json.decode(data), m.group("path") if m else "")
    except (msgspec.DecodeError, RecursionError):  # untyped, the nesting is not bounded
        got = _MISSING
    where = path or "record"
    shown = "" if got is _MISSING else f", got {_show(got)}"
    if text.startswith("Number out of range"):
        return f"{where}: expected a finite number, got a value out of range"
    if text.startswith("Invalid enum value"):
        return f"{where}: unsupported value {_show(got)}"
    e = _EXPECTED.match(text)
    if e:
        t = _type_words(e.group("type"))
        bound = _bound(e.group("rest"))
        if bound.startswith(("of length", "matching")):
            return f"{where}: expected {t} {bound}{shown}"
        if bound:
            return f"{where}: expected {bound}{shown}"
        return f"{where}: expected {t}{shown}"
    return f"{where}: {text[0].lower() + text[1:]}"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if len(value) < 40 else repr(value[:37] + "...")
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return str(int(value))
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return msgspec.json.encode(value).decode()


# Unix seconds stay below 1e10 until the year 2286; a larger `ts` is another unit.
_MAX_UNIX_S = 1e10
_UNITS = ((1e17, "nanoseconds"), (1e14, "microseconds"), (1e11, "milliseconds"))


def _ts_reason(ts: float) -> str:
    unit = next((name for bound, name in _UNITS if ts >= bound), None)
    guess = f" ({unit}?)" if unit else " (beyond the year 2286)"
    return f"ts: expected Unix seconds, got {_show(ts)}{guess}"


def _layer_reason(rec: WindowRecord) -> str | None:
    """The first layer (in order) that repeats a type or stalls more cycles than it ran."""
    seen: set[str] = set()
    for i, layer in enumerate(rec.layers):
        if layer.type in seen:
            return f"layers[{i}].type: {layer.type!r} repeated in one window"
        seen.add(layer.type)
        if (
            layer.stall_mem_cycles is not None
            and layer.cycles is not None
            and layer.stall_mem_cycles > layer.cycles * (1 + 1e-6)
        ):
            return (
                f"layers[{i}].stall_mem_cycles: expected <= cycles ({_show(layer.cycles)}), "
                f"got {_show(layer.stall_mem_cycles)}"
            )
    return None


class Codec:
    """Reusable decoders/encoders; construct once, share across batches.

    `max_bytes` and `max_layers` bound what one record may cost: a larger record is
    rejected before it is parsed, a longer layer list after.
    """

    def __init__(self, max_bytes: int = 1 << 20, max_layers: int = 256) -> None:
        self.max_bytes, self.max_layers = max_bytes, max_layers
        self._window = msgspec.json.Decoder(WindowRecord)
        self._change = msgspec.json.Decoder(ChangeEvent)
        self._alert = msgspec.json.Decoder(Alert)
        self._enc = msgspec.json.Encoder()

    def _decode(self, dec: msgspec.json.Decoder[Any], data: bytes) -> Any:
        if len(data) > self.max_bytes:
            raise DecodeError(f"record: {len(data)} bytes, over the limit of {self.max_bytes}")
        try:
            return dec.decode(data)
        except RecursionError:
            raise DecodeError("malformed JSON: nested too deep") from None
        except msgspec.ValidationError as exc:
            raise DecodeError(_reason(exc, data)) from None
        except msgspec.DecodeError as exc:
            detail = str(exc).removeprefix("JSON is malformed: ")
            raise DecodeError(f"malformed JSON: {detail}") from None

    def decode_window(self, data: bytes) -> WindowRecord:
        """Decode and validate one window record; raises DecodeError with a field-named reason."""
        rec = self._decode_record(data)
        reason = _layer_reason(rec)
        if reason is not None:
            raise DecodeError(reason)
        return rec

    def decode_windows(self, values: Sequence[bytes]) -> list[WindowRecord | DecodeError]:
        """`decode_window` over a batch: per value, the record or the error it would raise.

        Each record is checked across its layers right after it is parsed, while its
        objects are still in cache: the same checks as one numpy pass over the whole
        batch's layers afterwards cost more (bench.stages), for the walk back over them.
        """
        out: list[WindowRecord | DecodeError] = []
        for data in values:
            try:
                out.append(self.decode_window(data))
            except DecodeError as exc:
                out.append(exc)
        return out

    def _decode_record(self, data: bytes) -> WindowRecord:
        """Parse, type and bound checks, and the record-level checks (not across layers)."""
        rec: WindowRecord = self._decode(self._window, data)
        if rec.ts >= _MAX_UNIX_S:
            raise DecodeError(_ts_reason(rec.ts))
        if len(rec.layers) > self.max_layers:
            raise DecodeError(
                f"layers: {len(rec.layers)} entries, over the limit of {self.max_layers}"
            )
        return rec

    def decode_change(self, data: bytes) -> ChangeEvent:
        """Decode and validate one change event."""
        ev: ChangeEvent = self._decode(self._change, data)
        if ev.ts >= _MAX_UNIX_S:
            raise DecodeError(_ts_reason(ev.ts))
        return ev

    def decode_alert(self, data: bytes) -> Alert:
        """Decode and validate one alert record."""
        alert: Alert = self._decode(self._alert, data)
        return alert

    def encode(self, obj: Any) -> bytes:
        """Encode any wire struct (or plain JSON value) to compact JSON bytes."""
        return self._enc.encode(obj)


def json_schemas() -> dict[str, Any]:
    """JSON Schema of each record type, keyed by record name."""
    return {
        "window_record": msgspec.json.schema(WindowRecord),
        "change_event": msgspec.json.schema(ChangeEvent),
        "alert": msgspec.json.schema(Alert),
    }

"""Advisor (pure): joins change events to incidents and proposes one bounded, reversible step.

A change explains an incident when its scope covers the affected devices, it
landed no later than the first affected window (onset + one window: the onset
estimate is the end of the last healthy window) and within the look-back, its
kind fits the first failing stage, and the pool had not already run at the
onset's load for `LEAD_WINDOWS` windows between the change and the onset (a test
the change passed, `exposure`). It never proposes a change that landed after that.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from monitor.core.correlator import LEAD_WINDOWS, ChangePoint, Incident
from monitor.core.exposure import PoolExposure
from monitor.indicators import (
    BACKLOG,
    LOAD_FOLLOWING,
    LOAD_METRICS,
    QUEUEING,
    SHEDDING,
    WAITING,
)
from monitor.wire import ChangeEvent, ChangeScope, Stage, Suggestion

# Which first-failing stages a kind of change can explain. A compiler picks kernels and
# also tiles them, so it explains lowering and scheduling failures alike.
KIND_STAGES: dict[str, frozenset[Stage]] = {
    "kernel_lib": frozenset({"lowering"}),
    "compiler": frozenset({"lowering", "scheduling"}),
    "scheduler_config": frozenset({"scheduling"}),
    "driver": frozenset({"execution"}),
    "firmware": frozenset({"execution"}),
    "traffic_policy": frozenset({"ingress"}),
    "model": frozenset({"validation"}),
}


# The decision matrix: a stage that names its class outright, then what moved.
_STAGE_CLASS: dict[str, str] = {
    "ingress": "ingress",
    "lowering": "kernel_selection",
    "scheduling": "memory_locality",
}
_MOVED_CLASS: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"sync_frac"}), "synchronisation"),
    (frozenset({"clock_mhz"}), "thermal_power"),
    (frozenset({"occupancy", "stall_frac"}), "memory_locality"),
    (frozenset({"lat_p95_ms", "lat_p99_ms", "queue_wait_ms"}), "contention"),
    (frozenset({"temp_c"}), "thermal_power"),  # heat no power explains: the cooling
)


def bottleneck_class(
    stage: Stage, indicators: set[str], *, explained: bool = False, queue_held: bool = False
) -> str:
    """Bottleneck class from the first failing stage and what moved (decision matrix).

    Queueing moved, with nothing else but what follows load (heat, utilisation) and
    the requests a full queue turns away (`SHEDDING`): overload, a matter of capacity,
    unless a change explains it (`explained`). Failures are a backlog's with a queue, or
    with what follows load or the offered load's rise (`req_rate`: a queue at its
    admission limit from the start of a stream never steps); failures alone are a
    regression. `queue_held`: the devices report their queue and it did not move, so a
    latency rise is time in service, not in a queue (`indicators.WAITING`).
    """
    load = LOAD_FOLLOWING | LOAD_METRICS
    if queue_held:
        indicators = indicators - (QUEUEING - WAITING)
    backlog = bool(indicators & QUEUEING) or bool(indicators & SHEDDING and indicators & load)
    if not explained and backlog and indicators <= BACKLOG | load:
        # Per-layer efficiency held (no MFU, stall or mechanism moved): the devices serve
        # as well as before and the wait is work arriving faster than they serve it. No
        # rise of the request rate is required: a saturated pool reports what it served,
        # capped at capacity, so the offered load's rise does not show in it. A change
        # that fits (a traffic policy) still makes it a regression (`lifecycle.render`).
        return "overload"
    if stage in _STAGE_CLASS:
        return _STAGE_CLASS[stage]
    if stage == "validation" and "quality" in indicators:
        return "quality"
    if stage == "validation" and "error_rate" in indicators:
        return "errors"
    return next((cls for moved, cls in _MOVED_CLASS if indicators & moved), "unclassified")


NEXT_STEP: dict[str, tuple[str, str]] = {
    "kernel_selection": ("mitigate", "pin the previous kernel variant for the affected layers"),
    "memory_locality": ("investigate", "compare tiling and memory placement against the baseline "
                        "artifact; revert the placement policy for one host first"),
    "synchronisation": ("investigate", "drain and re-test the slowest host's interconnect; "
                        "check collective message sizes"),
    "thermal_power": ("mitigate", "cordon the throttling devices and check cooling and power caps"),
    "contention": ("investigate", "inspect queueing and fairness policy under burst load"),
    "ingress": ("mitigate", "shed or re-route burst traffic; cap batch size at the previous level"),
    "overload": ("mitigate", "scale out the pool or shed / re-route load until the queue "
                 "drains; offered load exceeds the pool's capacity"),
    "quality": ("investigate", "run the full regression matrix against the previous model"),
    "errors": ("investigate", "read the failed requests' errors by version and host; drain the "
               "hosts they come from if they cluster"),
    "unclassified": ("investigate", "align counters with a profile of one affected device"),
}  # fmt: skip


@dataclass
class Advisor:
    """Holds recent change events, in (ts, id) order, and matches them to incidents.

    Inserting a change and finding those in an incident's look-back are binary searches,
    so a changes topic of a million events loads in seconds, not hours.
    """

    lookback_s: float = 6 * 3600.0
    changes: list[ChangeEvent] = field(default_factory=list)
    # The load each pool ran at lately, to rule out changes it already put to the test.
    exposure: PoolExposure = field(default_factory=PoolExposure)
    _keys: list[tuple[float, str]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.exposure.span_s = self.lookback_s
        self.restore(self.changes)

    def restore(self, changes: list[ChangeEvent]) -> None:
        """Replace the known changes (from a checkpoint), repeats dropped."""
        by_id = {c.id: c for c in changes}
        self.changes = sorted(by_id.values(), key=lambda c: (c.ts, c.id))
        self._keys = [(c.ts, c.id) for c in self.changes]
        self._ids = set(by_id)

    def add_change(self, ev: ChangeEvent) -> None:
        """Remember a change event (ignores a repeat of the same id)."""
        if ev.id in self._ids:
            return
        key = (ev.ts, ev.id)
        i = bisect.bisect_right(self._keys, key)
        self._keys.insert(i, key)
        self.changes.insert(i, ev)
        self._ids.add(ev.id)

    def prune(self, now_ts: float) -> None:
        """Forget changes older than twice the look-back."""
        self.exposure.prune(now_ts)
        cut = bisect.bisect_left(
            self.changes, True, key=lambda c: now_ts - c.ts <= 2 * self.lookback_s
        )
        if cut:
            self._ids.difference_update(c.id for c in self.changes[:cut])
            del self.changes[:cut], self._keys[:cut]

    def candidates(
        self, inc: Incident, stage: Stage, level: str = "pool", since: float | None = None
    ) -> list[ChangeEvent]:
        """Changes that may explain the incident, most recent first (none before `since`)."""
        # Across a gap in the data the onset is anywhere in the gap: a change that landed in
        # it may be the cause (`Incident.latest_onset`).
        earliest, latest = inc.onset_ts - self.lookback_s, inc.latest_onset + inc.window_s
        if since is not None:
            earliest = max(earliest, since)
        lo = bisect.bisect_left(self.changes, True, key=lambda c: earliest <= c.ts)
        hi = bisect.bisect_left(self.changes, True, key=lambda c: c.ts > latest)
        out = [
            c
            for c in self.changes[lo:hi]
            if _covers(c.scope, inc, level)
            and stage in KIND_STAGES.get(c.kind, frozenset())
            and not self.exposure.tested(
                inc.pool, c.ts, inc.onset_ts, inc.detected_ts, inc.window_s, LEAD_WINDOWS
            )
        ]
        return out[::-1]

    def _between(self, start: float, end: float) -> Iterator[ChangeEvent]:
        """The changes that landed in (start, end], in time order."""
        lo = bisect.bisect_right(self._keys, (start, "\uffff"))
        for c in self.changes[lo:]:
            if c.ts > end:
                return
            yield c

    def landed_on(self, p: ChangePoint, start: float, end: float) -> bool:
        """Whether a change that could have caused `p` (`_acts_on`) landed in (start, end]."""
        return self.last_landed_on(p, start, end) is not None

    def last_landed_on(self, p: ChangePoint, start: float, end: float) -> float | None:
        """When the latest change that could have caused `p` landed in (start, end]."""
        return max((c.ts for c in self._between(start, end) if _acts_on(c, p)), default=None)

    def new_cause(self, inc: Incident, p: ChangePoint, via: Iterable[ChangePoint] = ()) -> bool:
        """Whether a change landed after anything that could explain `inc` and by the first
        bad window of `p`, of a kind that fits p's stage, where p is: p then has a cause of
        its own and is not more of `inc`. Two windows after inc's onset: the onset
        estimate's own uncertainty, within which a change may still be inc's cause; from
        the latest onset the samples allow (`latest_onset`), as a gap in the data leaves
        a shift anywhere in it.

        `via`: points of p's pool showing a stage upstream of p's got worse. A change that
        degraded its own stage (a point of `via` it fits and covers, by that point's first
        bad window: a fallback began, a spill grew) causes what follows downstream of that
        stage too: an MFU drop after a kernel library's fallback has its own cause, though
        a kernel library cannot explain an execution stage by itself."""
        lo, hi = inc.latest_onset + 2 * inc.window_s, p.latest_onset + p.window_s
        landed = []
        for c in self._between(lo, hi):
            if _acts_on(c, p):
                return True
            landed.append(c)
        if not landed:
            return False  # `via` is not read: the common case costs one binary search
        return any(
            c.ts <= e.latest_onset + e.window_s and _acts_on(c, e) for e in via for c in landed
        )

    def suggest(
        self,
        inc: Incident,
        stage: Stage,
        bottleneck: str,
        guardrail: str,
        level: str = "pool",
        since: float | None = None,
    ) -> Suggestion:
        """A rollback when a fitting change exists, else the next bounded step (a hypothesis)."""
        found = self.candidates(inc, stage, level, since)
        if found:
            ch = found[0]
            # Closer to the onset and alone in its window -> more likely the cause.
            confidence = 0.8 if len(found) == 1 else 0.6
            return Suggestion(
                action="rollback",
                change_id=ch.id,
                kind=ch.kind,
                from_=ch.to,
                to=ch.from_,
                scope=ch.scope,
                guardrail=guardrail,
                confidence=confidence,
            )
        action, step = NEXT_STEP.get(bottleneck, NEXT_STEP["unclassified"])
        return Suggestion(
            action="mitigate" if action == "mitigate" else "investigate",
            guardrail=f"hypothesis: {step}; {guardrail}",
            confidence=0.3,
            scope=ChangeScope(pool=inc.pool, model=inc.model),
        )


def _acts_on(c: ChangeEvent, p: ChangePoint) -> bool:
    """Whether change `c` could have caused point `p`: its kind fits p's stage and its
    scope covers p's device."""
    sc = c.scope
    return (
        p.stage in KIND_STAGES.get(c.kind, frozenset())
        and sc.pool in (None, p.pool)
        and sc.model in (None, p.model)
        and sc.host in (None, p.host)
        and sc.device in (None, p.device)
    )


def _covers(scope: ChangeScope, inc: Incident, level: str) -> bool:
    """The change reached the affected devices, and its reach fits the incident's.

    A change rolled out to a whole pool that hurt only one host or a few devices is
    an unlikely cause: it would have hurt the pool. Host- or device-scoped changes
    can explain narrow incidents.
    """
    if scope.pool is not None and scope.pool != inc.pool:
        return False
    broad = scope.host is None and scope.device is None
    if broad and level in ("device", "host"):
        return False
    if scope.model is not None and scope.model != inc.model:
        return False
    if scope.host is not None and not inc.hosts <= {scope.host}:
        return False
    return scope.device is None or inc.devices <= {scope.device}

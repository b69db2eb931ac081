"""Incident correlator (pure, no I/O): change points -> incidents.

Change points of the same pool and model whose onsets lie within
`group_window_s` of each other form one incident. The incident's first failing
stage is the stage whose evidence changed earliest (median onset over its
devices; ties within half a window go upstream, contract §3), and its scope
widens from device to host to pool as more of the pool's devices join.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Literal

from monitor.core.coverage import BIT
from monitor.indicators import (
    BACKLOG,
    BAD_DIRECTION,
    COMPLEMENT,
    CORROBORATING,
    DEFAULT_MIN_REL_CHANGE,
    HEAT,
    HEAT_SOURCES,
    LOAD_FOLLOWING,
    LOAD_METRICS,
    MIN_REL_CHANGE,
    PRIMARY_ORDER,
    QUEUEING,
    SHEDDING,
    is_primary,
)
from monitor.wire import STAGES, ScopeLevel, Stage

IncidentStatus = Literal["open", "resolved"]
_POWER_FIELD = BIT["power_w"]

# How far before an incident's onset a cause may show (windows), and on what share of
# the incident's devices an indicator must move to count as its evidence.
LEAD_WINDOWS = 6
# Device field of change points found on (pool, model, layer) aggregates, not on a device.
AGGREGATE = "pool:"
SUPPORT_SHARE = 0.25
# Rates of rare events per request: a device sees one every few windows, so its onset
# lags; the pool's aggregate dates it (`Incident.aggregate_onset`).
RARE_EVENTS = SHEDDING | COMPLEMENT
# Offered load this far above the pool's recent level makes a queueing-only incident
# overload (`advisor.bottleneck_class`), and holds back a collective's waits.
OVERLOAD_RATIO = 1.25
# A served request rate this far up is a material rise: the reporting floor of the rate.
SERVED_RISE = MIN_REL_CHANGE.get("req_rate", DEFAULT_MIN_REL_CHANGE)


def offered_load_rose(ratio: float, moved: Iterable[str]) -> bool:
    """Whether the offered load rose, from the served rate's shift `ratio` and what moved.

    By `OVERLOAD_RATIO`; or by any material step (`SERVED_RISE`) while a queue grew: a
    pool near capacity reports the rate it served, so an offered-load rise shows there
    only in part and the rest waits in the queue (near saturation a queue grows as
    rho / (1 - rho), so a small served rise can come with a large queue). A slower
    service serves less, not more: a queue that grew while the served rate rose is load.
    """
    if ratio >= OVERLOAD_RATIO:
        return True
    return ratio >= 1.0 + SERVED_RISE and not QUEUEING.isdisjoint(moved)


def is_load_context(p: ChangePoint) -> bool:
    """Whether a point is context for what load did: an offered-load shift, or a queue
    draining (the backlog a burst left is gone, and with it the work it gave)."""
    return p.metric in LOAD_METRICS or (p.metric in QUEUEING and not p.is_regression)


# A multi-device incident confirms on this share of its pool, or on hosts most of whose
# devices moved.
CLUSTER_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class ChangePoint:
    """One detected change on one stream, with the metadata needed to group it."""

    device: str
    host: str | None
    pool: str | None
    model: str | None
    layer: str | None  # None for device-level metrics
    metric: str
    stage: Stage
    onset_ts: float
    detected_ts: float
    before: float
    after: float
    score: float
    window_s: float
    row: int = -1  # stream row of the metric (layer row or device row) in its partition
    partition: int = 0
    norm_before: float = math.nan  # levels as the detector saw them (load-normalised)
    norm_after: float = math.nan
    # The fields its device's newest record carried when it was found (`core.coverage`;
    # -1: not known, as on pool aggregates): what the alert says it could not judge.
    fields: int = -1
    # On a pool aggregate: the devices behind it (its partition's share of the pool);
    # 0 on a device's point, or not known.
    members: int = 0
    # The latest onset its samples allow: the start of the first shifted window seen.
    # Later than `onset_ts` across a gap in the data, where the shift began anywhere.
    onset_late: float = math.nan

    @property
    def latest_onset(self) -> float:
        """The latest time the change can have begun (`onset_late`, or `onset_ts`)."""
        return self.onset_late if self.onset_late > self.onset_ts else self.onset_ts

    @property
    def is_aggregate(self) -> bool:
        """Found on a pool aggregate rather than on one device."""
        return self.device.startswith(AGGREGATE)

    @property
    def is_regression(self) -> bool:
        """True when the change goes in the metric's bad direction."""
        sign = BAD_DIRECTION.get(self.metric, 0)
        return sign != 0 and (self.after - self.before) * sign > 0


@dataclass(slots=True, eq=False)  # identity: parents and children refer to each other
class Incident:
    """A set of related regressions on one pool/model, growing while it is open.

    Grouping state only: what the alert lifecycle has sent and observed of it lives
    in `lifecycle.AlertState`, keyed by `alert_id`.
    """

    pool: str | None
    model: str | None
    anchor_ts: float  # onset of the first point: the grouping anchor, never moves
    detected_ts: float
    window_s: float
    group_window_s: float = 300.0
    points: list[ChangePoint] = field(default_factory=list)
    evidence: list[ChangePoint] = field(default_factory=list)
    # Offered-load shifts (LOAD_METRICS) of the pool around the onset, and its queues
    # draining (`is_load_context`): context, not evidence.
    load: list[ChangePoint] = field(default_factory=list)
    status: IncidentStatus = "open"
    resolved_ts: float = 0.0
    # Its identity once it paged (a fingerprint, `lifecycle.fingerprint`); a paged incident
    # that is still open goes on absorbing the same regression showing again.
    alert_id: str | None = None
    # Its primary metric, fixed when it first paged: the alert keeps its metric (and its
    # Alertmanager labels) however the evidence grows.
    metric: str | None = None
    # The most devices its (pool, model) had while it was open. A model rollout moves the
    # pool's devices to the new model, and judged against the old model's count (then 0),
    # three noisy devices would confirm it and weigh as the whole pool.
    pool_size: int = 0
    # Fleet scope: the same regression on several pools pages once, as the parent.
    parent: Incident | None = None
    children: list[Incident] = field(default_factory=list)

    @property
    def paging(self) -> bool:
        """Open, paged and top-level: an incident on-call has been told about."""
        return self.status == "open" and self.alert_id is not None and self.parent is None

    def merged(self) -> Incident:
        """This incident with its fleet children folded in (pool unset; model if shared)."""
        members = [self, *self.children]
        models = {m.model for m in members}
        return Incident(
            None,
            models.pop() if len(models) == 1 else None,
            self.anchor_ts,
            min(m.detected_ts for m in members),
            self.window_s,
            self.group_window_s,
            points=[p for m in members for p in m.points],
            evidence=[e for m in members for e in m.evidence],
            load=[e for m in members for e in m.load],
            alert_id=self.alert_id,
            metric=self.metric,
        )

    def as_of(self, ts: float) -> Incident:
        """The incident as it stood at event time `ts`: only what had been found by then."""
        return Incident(
            self.pool, self.model, self.anchor_ts, self.detected_ts, self.window_s,
            self.group_window_s,
            points=[p for p in self.points if p.detected_ts <= ts],
            evidence=[e for e in self.evidence if e.detected_ts <= ts],
            load=[e for e in self.load if e.detected_ts <= ts],
            alert_id=self.alert_id,
            metric=self.metric,
        )  # fmt: skip

    @property
    def pools(self) -> list[str]:
        """Pools this incident spans (one, or several for a fleet incident)."""
        return sorted({m.pool or "" for m in (self, *self.children)})

    def pool_devices(self, counts: Mapping[tuple[str | None, str | None], int]) -> int:
        """Devices of its (pool, model) to judge it against: now, or the most seen while open."""
        return max(counts.get((self.pool, self.model), 0), self.pool_size)

    @property
    def onset_ts(self) -> float:
        """Estimated change time: median onset of the primary metric over its devices.

        Only the first wave of points counts: the same regression showing again at the
        next burst joins the incident but does not move when it began.
        """
        return self._first_wave_median(lambda p: p.onset_ts)

    def aggregate_onset(self) -> float:
        """For a rate of rare events (failed requests, wrong answers), when it began moving
        on its pool's aggregates: the median onset of those that moved its way in the
        grouping window before its onset (or up to two windows after), where that is
        earlier than its own onset; its own otherwise, and for any other metric.

        An aggregate counts every device's events: where each device sees one every few
        windows its first shifted windows come late by chance (none in a window has odds
        e^-rate), so the devices' median onset lags the change, while the pool's sum dates
        it within a window or two."""
        metric, onset = self.primary_metric, self.onset_ts
        if metric not in RARE_EVENTS:
            return onset
        sign = BAD_DIRECTION.get(metric, 0)
        found = [
            e.onset_ts
            for e in self.primary_aggregates()
            if (e.after - e.before) * sign > 0
            and onset - self.group_window_s <= e.onset_ts <= onset + 2 * self.window_s
        ]  # fmt: skip
        return min(onset, float(median(found))) if found else onset

    @property
    def latest_onset(self) -> float:
        """The latest it can have begun: as `onset_ts`, over its points' `latest_onset`."""
        return self._first_wave_median(lambda p: p.latest_onset)

    def _first_wave_median(self, value: Callable[[ChangePoint], float]) -> float:
        """Median of `value` over the primary points of the first wave (all of them if none)."""
        pts = self.primary_points()
        first = [value(p) for p in pts if p.onset_ts - self.anchor_ts <= self.group_window_s]
        return float(median(first or [value(p) for p in pts]))

    @property
    def devices(self) -> set[str]:
        """Devices whose primary metric regressed."""
        return {p.device for p in self.points}

    @property
    def hosts(self) -> set[str]:
        """Hosts of those devices."""
        return {p.host for p in self.points if p.host}

    def devices_by_host(self) -> dict[str, set[str]]:
        """Those devices by host (devices without a host left out)."""
        per_host: dict[str, set[str]] = {}
        for p in self.points:
            if p.host:
                per_host.setdefault(p.host, set()).add(p.device)
        return per_host

    def main_host(self) -> str | None:
        """The host holding most of those devices (the one a host-scope incident is on)."""
        per_host = self.devices_by_host()
        return min(per_host, key=lambda h: (-len(per_host[h]), h), default=None)

    @property
    def primary_metric(self) -> str:
        """The most telling metric (PRIMARY_ORDER) among those that moved on at least half as
        many devices as the widest one; a lone noisy MFU point never outranks a host-wide
        device-MFU drop. Fixed once the incident paged."""
        if self.metric is not None:
            return self.metric
        devices: dict[str, set[str]] = {}
        for p in self.points:
            devices.setdefault(p.metric, set()).add(p.device)
        widest = max(len(d) for d in devices.values())
        return next(m for m in PRIMARY_ORDER if len(devices.get(m, ())) * 2 >= widest)

    @property
    def found_ts(self) -> float:
        """When its primary metric was first detected on any device."""
        return min(p.detected_ts for p in self.primary_points())

    def primary_points(self) -> list[ChangePoint]:
        """The points of the primary metric."""
        m = self.primary_metric
        return [p for p in self.points if p.metric == m]

    def primary_aggregates(self) -> list[ChangePoint]:
        """The pool aggregates' points of its primary metric, on its layers."""
        metric = self.primary_metric
        layers: set[str | None] = set(self.layers) or {None}
        return [e for e in self.evidence
                if e.is_aggregate and e.metric == metric and e.layer in layers]  # fmt: skip

    def aggregate_share(self, pool_devices: int = 0) -> float:
        """The share of its pool its primary metric moved on, as the pool aggregates tell it
        (0.0: no aggregate of that metric and layer moved at its onset).

        An aggregate is a mean over its devices, so a fault on k of its n devices moves it
        by k / n of their shift: a host's fault moves it a little, a pool's as much as its
        devices. Streams too young or too noisy to show the shift one by one still move
        their mean. Records are keyed by device, so each input partition aggregates its
        own share of the pool: its shift times its devices is the sum of their shifts, k
        times theirs, and over the partitions that moved (one that did not adds about
        nothing) that sum over the pool's devices is the share. Without the pool's size or
        an aggregate's devices, the median aggregate's shift over theirs.
        """
        near = 2 * self.window_s
        moved = [e for e in self.primary_aggregates() if abs(e.onset_ts - self.onset_ts) <= near]
        own = median(p.after - p.before for p in self.primary_points())
        if not moved or own == 0.0:
            return 0.0
        if pool_devices > 0 and all(e.members > 0 for e in moved):
            per_part: dict[tuple[int, int], list[ChangePoint]] = {}
            for e in moved:
                per_part.setdefault((e.partition, e.row), []).append(e)
            summed = sum(
                median(e.after - e.before for e in es) * max(e.members for e in es)
                for es in per_part.values()
            )
            return min(1.0, max(0.0, summed / (own * pool_devices)))
        return min(1.0, max(0.0, median(e.after - e.before for e in moved) / own))

    def _layer_devices(self) -> dict[str | None, set[str]]:
        by_layer: dict[str | None, set[str]] = {}
        for p in self.primary_points():
            by_layer.setdefault(p.layer, set()).add(p.device)
        return by_layer

    @staticmethod
    def _headline(by_layer: dict[str | None, set[str]]) -> str | None:
        return max(by_layer, key=lambda k: (len(by_layer[k]), k or ""))

    def headline_points(self) -> list[ChangePoint]:
        """Primary-metric points on the layer most devices moved on: levels are quoted
        per layer (mixing attention's and norm's MFU in one median means nothing)."""
        top = self._headline(self._layer_devices())
        return [p for p in self.primary_points() if p.layer == top]

    @property
    def layers(self) -> list[str]:
        """Layer types whose primary metric regressed on at least half as many devices as
        the headline layer, headline first."""
        by_layer = self._layer_devices()
        top = self._headline(by_layer)
        rest = sorted(
            k for k, d in by_layer.items() if k and k != top and 2 * len(d) >= len(by_layer[top])
        )
        return [top, *rest] if top else rest

    def supporting(self) -> dict[tuple[Stage, str, str | None], list[ChangePoint]]:
        """The indicators that moved with this incident, grouped by (stage, metric, layer).

        Only the incident's own devices count, only changes that began at most
        `LEAD_WINDOWS` before its onset (causes precede effects, but not by much),
        and only indicators that moved on enough of those devices: one noisy
        device must not decide where a pool-wide incident started. The primary
        metric supports it whatever its share: it is what the incident is about (fixed
        at its first page, it can be a minority of devices the incident grew to).
        The incident's own points count from its anchor (its first point's onset) on,
        however long before its onset: they are what it is made of, not evidence found
        beside it. Its onset is their median, so it comes later as later devices join,
        and a queue that opened it a minute before the latency that heads it would
        otherwise stop counting as the incident grew. Points dated before the anchor
        joined later and did not open it: as evidence, they must lead by little.
        """
        devices = self.devices
        onset = self.onset_ts
        lo, hi = onset - LEAD_WINDOWS * self.window_s, onset + self.group_window_s
        heat_lo = onset - self.group_window_s
        everything = (*self.points, *self.evidence)
        need = max(1, math.ceil(SUPPORT_SHARE * len(devices)))
        stragglers = self.stragglers()
        members = devices | stragglers
        # Heat builds up over the cooling's time constant before the clock steps down, so
        # on a device whose clock stepped down a temperature rise counts from as far back
        # as the grouping window: it is the throttle's cause, however slowly it came.
        throttled = {
            p.device for p in everything
            if p.metric == "clock_mhz" and p.device in members and lo <= p.onset_ts <= hi
        }  # fmt: skip
        own = {id(p) for p in self.points}
        groups: dict[tuple[Stage, str, str | None], list[ChangePoint]] = {}
        for p in everything:
            if p.device not in members or p.onset_ts > hi:
                continue
            if (
                lo <= p.onset_ts
                or (id(p) in own and p.onset_ts >= self.anchor_ts)
                or (p.metric in HEAT and p.device in throttled and heat_lo <= p.onset_ts)
            ):
                groups.setdefault((p.stage, p.metric, p.layer), []).append(p)
        primary = self.primary_metric
        return {
            k: v
            for k, v in groups.items()
            if k[1] == primary
            or len({p.device for p in v}) >= need
            or ((k[1] == "clock_mhz" or k[1] in HEAT) and {p.device for p in v} <= stragglers)
        }

    def stragglers(self) -> set[str]:
        """Members of the pool whose hardware failed, where the pool's collective waits rose.

        A collective is as slow as its slowest member: every rank waits at the barrier for
        the one that is late, so a throttling device slows the whole job (its device MFU
        drops on every member) while its own wait shrinks. Where the waits rose (on the
        pool aggregate, or on a real share of the incident's devices), a member whose
        clock stepped down as it heated (independent indicators agree: a hardware fault)
        is why, whatever its share of the pool.
        """
        everything = (*self.points, *self.evidence)
        devices = self.devices
        need = max(1, math.ceil(SUPPORT_SHARE * len(devices)))
        onset = self.onset_ts
        lo, hi = onset - LEAD_WINDOWS * self.window_s, onset + self.group_window_s
        waits = [
            p for p in everything
            if p.metric == "sync_frac" and p.is_regression and lo <= p.onset_ts <= hi
        ]  # fmt: skip
        if not waits or not (
            any(p.is_aggregate for p in waits)
            or len({p.device for p in waits if p.device in devices}) >= need
        ):
            return set()
        return self._heated_clocks(None)

    def throttled(self) -> set[str]:
        """Its devices whose clock stepped down as they heated: a cooling fault's throttle,
        whatever metric opened the incident (independent indicators agree)."""
        return self._heated_clocks(self.devices)

    def _heated_clocks(self, among: set[str] | None) -> set[str]:
        """Devices (of `among`, or any) whose clock stepped down from `LEAD_WINDOWS` before
        the onset to a grouping window after it, and whose heat rose from a grouping window
        before it (the die heats over its cooling's time constant before it throttles)."""
        everything = (*self.points, *self.evidence)
        onset = self.onset_ts
        lo, hi = onset - LEAD_WINDOWS * self.window_s, onset + self.group_window_s
        clocked = {
            p.device for p in everything
            if p.metric == "clock_mhz" and p.is_regression and lo <= p.onset_ts <= hi
            and (among is None or p.device in among)
        }  # fmt: skip
        heat_lo = onset - self.group_window_s
        return {
            p.device for p in everything
            if p.metric in HEAT and p.device in clocked and heat_lo <= p.onset_ts <= hi
            and not p.is_aggregate  # a pool's aggregate is no member to cordon
        }  # fmt: skip

    def load_ratio(self) -> float:
        """Offered load at the onset vs the pool's recent level (1.0 when it did not shift).

        Per device (and per pool aggregate), the latest request-rate shift that began within
        the grouping window before the onset, or after it up to two windows or up to the
        first detection, whichever is later: its level after over before. The median over
        them; a burst that already ended counts down. A change found late is dated no
        better than its detection delay (its statistic climbed from noise somewhere in
        that span): a burst that began before the change was found may be what moved it.
        A fall that began more than two windows after the onset is not counted: the load
        receding as the change was being found is not the load it began under.
        """
        onset = self.onset_ts
        near = onset + 2 * self.window_s
        lo, hi = onset - self.group_window_s, max(near, self.found_ts)
        latest: dict[str, ChangePoint] = {}
        for p in sorted(self.load, key=lambda q: q.onset_ts):
            # A fall that began after the onset (a burst ending while the change was still
            # being found) is not the load the change began under.
            receding = p.onset_ts > near and p.after < p.before
            if (
                p.metric in LOAD_METRICS
                and lo <= p.onset_ts <= hi
                and p.before > 0
                and not receding
            ):
                latest[p.device] = p
        if not latest:
            return 1.0
        return float(median(p.after / p.before for p in latest.values()))

    def drained(self) -> bool:
        """Whether a queue in front of the pool drained as the incident began (within two
        windows of its onset, as `confirmed_at` pairs indicators, or between the drain's
        onset and its detection: a change found late is dated no better than its detection
        delay): the backlog that kept its devices busy is gone."""
        near = 2 * self.window_s
        onset = self.onset_ts
        return any(
            p.metric in QUEUEING
            and p.onset_ts - near <= onset <= max(p.onset_ts, p.detected_ts) + near
            for p in self.load
        )

    def first_failing_stage(self) -> Stage:
        """Most upstream stage among those whose indicators changed first.

        A queue in front of the devices grows when work arrives faster or when it is
        served slower. Where an efficiency indicator moved at the same time and the
        offered load did not rise, the queue and the latency it adds are the slower
        service's consequence, so they do not name ingress as the stage that failed.
        """
        onsets = self._stage_onsets()
        if not onsets:
            return self.points[0].stage
        earliest = min(onsets.values())
        # Onsets are estimated on the window grid: a change inside a window shows in it
        # only in part, so one indicator (a tail latency) may date it a window before
        # another (the mean queue wait). A window apart is a tie; ties go upstream.
        tie = self.window_s
        return next(s for s in STAGES if s in onsets and onsets[s] <= earliest + tie)

    def first_onset(self) -> float:
        """When the first failing indicator changed (contract §5 `onset_ts`): the onset of
        the earliest stage's indicators, never later than the primary metric's."""
        onsets = self._stage_onsets()
        return min(self.onset_ts, onsets[self.first_failing_stage()]) if onsets else self.onset_ts

    def _stage_onsets(self) -> dict[Stage, float]:
        """Per stage, the earliest median onset of its supporting indicators."""
        supporting = self.supporting()
        moved = {metric for _, metric, _ in supporting}
        efficiency = moved - (BACKLOG | LOAD_FOLLOWING | LOAD_METRICS)
        if efficiency and not offered_load_rose(self.load_ratio(), moved):
            supporting = {k: v for k, v in supporting.items() if k[1] not in QUEUEING}
        onsets: dict[Stage, float] = {}
        for (stage, _, _), pts in supporting.items():
            t = median(p.onset_ts for p in pts)
            onsets[stage] = min(onsets.get(stage, t), t)
        return onsets

    def confirmed_at(
        self,
        pool_devices: int,
        min_devices: int,
        min_fraction: float,
        host_sizes: Mapping[str | None, int] | None = None,
    ) -> float | None:
        """When it became corroborated enough to page (event time), or None if not yet.

        Enough devices moved, or a second mechanism moved on the same device at the
        same time: one noisy device is the commonest false page in a fleet, while a
        real single-device fault (thermal, a bad link) shows a second indicator.
        "Enough devices" also means a real share of the pool, or most of the devices of
        some hosts (a bad host, a partial rollout), at least `min_devices` of them
        whatever the pool's size: a handful scattered over the pool, or a third of one
        host, is what correlated noise looks like.
        Heat that nothing heating its device explains (`Correlator._cooling`) is two
        physical indicators already, temperature against power: sure once judged so.
        """
        sizes = host_sizes or {}
        points = self.primary_points()
        if self.primary_metric in HEAT:
            return min(p.detected_ts for p in points)
        first_seen: dict[str, tuple[float, str | None]] = {}
        for p in sorted(points, key=lambda q: q.detected_ts):
            first_seen.setdefault(p.device, (p.detected_ts, p.host))
        need = max(min_devices, math.ceil(min_fraction * pool_devices))
        # A collective waits on a link: a slow one shows on the devices behind it, most of
        # one host. Waits that rose on devices scattered over hosts are the traffic's
        # doing (a burst reshuffling an expert all-to-all), not a fault of the collective.
        sync = self.primary_metric == "sync_frac"
        if sync and offered_load_rose(self.load_ratio(), (m for _, m, _ in self.supporting())):
            # Waits that rose with the offered load (a burst feeding an expert all-to-all)
            # are the traffic's doing: compared with calm, not with the last burst.
            return None
        spread_ok = not sync
        by_devices = math.inf
        per_host: dict[str | None, int] = {}
        for n, (t, host) in enumerate(sorted(first_seen.values(), key=lambda x: x[0]), 1):
            per_host[host] = per_host.get(host, 0) + 1
            clustered = sum(
                k for h, k in per_host.items() if h is not None and 2 * k >= sizes.get(h, 1 << 30)
            )
            # Most of some hosts is enough whatever the pool's size: a share of a large
            # pool can be more devices than one host has, and a bad host must page.
            if clustered >= min_devices or (
                spread_ok and n >= need and n >= CLUSTER_SHARE * pool_devices
            ):
                by_devices = t
                break
        near = 2 * self.window_s
        onsets = {p.device: p.onset_ts for p in points}
        by_mechanism = min(
            (
                max(e.detected_ts, first_seen[e.device][0])
                for e in self.evidence
                if e.metric in CORROBORATING
                and e.device in onsets
                and abs(e.onset_ts - onsets[e.device]) <= near
            ),
            default=math.inf,
        )
        # Enough devices, and the pool aggregate of the same metric moved with them: the
        # pool shifted, even if the devices are too few or too scattered to say so alone.
        first = min(t for t, _ in first_seen.values())
        by_aggregate = min(
            (
                max(e.detected_ts, first)
                for e in self.primary_aggregates()
                if abs(e.onset_ts - self.onset_ts) <= near
            ),
            default=math.inf,
        )
        if len(first_seen) < need or sync:
            by_aggregate = math.inf
        if sync:
            # A link fault is confirmed by its host, nothing else: most of it waiting, or
            # `min_devices` of it waiting where the work done fell on one of them too.
            by_mechanism = self._host_link(first_seen, min_devices)
        when = min(by_devices, by_mechanism, by_aggregate)
        return None if when == math.inf else when

    def _host_link(self, first_seen: dict[str, tuple[float, str | None]], need: int) -> float:
        """When `need` devices of one host waited longer at their collective and the work
        done fell on one of them at the same time (its device MFU): two
        independent counters on the host agree. `lifecycle._link_fault` pages on that,
        and also counts the host's devices that only did less work towards `need`.
        A collective is as slow as its slowest link, and a NIC a few per cent slower is
        found on some of its host's devices before the others' detectors catch up."""
        near = 2 * self.window_s
        # As the incident's supporting indicators are read: a wait that began long before
        # the onset is another device's drift, not this link's.
        lo = self.onset_ts - LEAD_WINDOWS * self.window_s
        onsets = {p.device: p.onset_ts for p in self.primary_points() if p.onset_ts >= lo}
        less_work = {
            e.device: e.detected_ts for e in (*self.points, *self.evidence)
            if e.metric == "device_mfu" and e.is_regression and not e.is_aggregate
            and e.device in onsets and abs(e.onset_ts - onsets[e.device]) <= near
        }  # fmt: skip
        when = math.inf
        per_host: dict[str, list[float]] = {}
        for device, (t, host) in first_seen.items():
            if host is not None and device in onsets:
                per_host.setdefault(host, []).append(t)
        for host, times in per_host.items():
            if len(times) < need:
                continue
            waited = sorted(times)[need - 1]
            done = [t for d, t in less_work.items() if first_seen[d][1] == host]
            if done:
                when = min(when, max(waited, min(done)))
        return when

    def scope_level(
        self,
        pool_devices: int,
        pool_fraction: float,
        host_sizes: Mapping[str | None, int] | None = None,
    ) -> ScopeLevel:
        """device, host or pool, from how many of the pool's devices moved.

        `pool` once `pool_fraction` of the pool moved, on its devices or on its aggregate
        (`aggregate_share`), or its upstream cause did (`cause_share`); `host` when the
        devices share one host, or when most of them are most of one host (a stray
        device elsewhere is noise joining a host's fault); `pool` again when they are
        spread over hosts as a real share of the pool (`_pool_showing`); otherwise
        `device` (one device, or a few scattered ones: naming the devices is the honest
        scope).
        """
        n = len(self.devices)
        if pool_devices > 0 and n >= max(2, pool_fraction * pool_devices):
            return "pool"
        if n >= 2 and self.aggregate_share(pool_devices) >= pool_fraction:
            return "pool"  # the pool's mean moved as far as its devices: the pool did
        if self.cause_share(pool_devices) >= pool_fraction:
            return "pool"  # its cause is the pool's: a kernel fell back on most devices
        if n > 1 and len(self.hosts) == 1:
            return "host"
        if n > 1 and host_sizes:
            per_host = self.devices_by_host()
            whole = [h for h, d in per_host.items() if 2 * len(d) >= host_sizes.get(h, 1 << 30)]
            if len(whole) == 1 and 2 * len(per_host[whole[0]]) > n:
                return "host"
        if self._pool_showing(pool_devices):
            return "pool"
        return "device"

    def cause_share(self, pool_devices: int) -> float:
        """The share of the pool on which a stage upstream of its primary metric's got
        worse at its onset, on its layers (a kernel falling back, a spill rising): found
        by what load cannot move, on each device (0.0 without the pool's size).

        The same cause on every device of one model and pool costs each of them what it
        cost those whose own streams have shown it: devices whose MFU detectors are young
        or noisy have not found that yet, and the pool's is the scope and the loss."""
        if pool_devices <= 0:
            return 0.0
        points = self.primary_points()
        rank = min(STAGES.index(p.stage) for p in points)
        layers = set(self.layers)
        near = 2 * self.window_s
        devices = {
            e.device for e in self.evidence
            if not e.is_aggregate and e.is_regression and e.metric not in _NOT_A_CAUSE
            and STAGES.index(e.stage) < rank and (not layers or e.layer in layers)
            and abs(e.onset_ts - self.onset_ts) <= near
        }  # fmt: skip
        if len(devices) < 2:
            return 0.0  # a cause on one device is that device's, as a pool needs two
        return min(len(devices) / pool_devices, 1.0)

    def _pool_showing(self, pool_devices: int) -> bool:
        """Whether its devices are a real share of the pool (`CLUSTER_SHARE`, on which
        scattered devices confirm an incident), spread over hosts (none holds half of
        them), and no pool aggregate says the rest of the pool held: the pool changing,
        seen first where its detectors are quickest, not a few devices each with a fault
        of its own. (An aggregate that moved by just their share says it is theirs.)"""
        n = len(self.devices)
        if pool_devices <= 0 or n < max(2, CLUSTER_SHARE * pool_devices):
            return False
        per_host = self.devices_by_host()
        if len(per_host) < 2 or 2 * max(len(d) for d in per_host.values()) > n:
            return False
        return self.aggregate_share(pool_devices) == 0.0


# Upstream points that do not show a change degrading its stage (`Correlator._upstream`).
_NOT_A_STAGE_WORSE = LOAD_METRICS | QUEUEING | {"kernel"}
# Nor is what follows load (heat, served work) a cause a whole pool shares (`cause_share`).
_NOT_A_CAUSE = _NOT_A_STAGE_WORSE | LOAD_FOLLOWING


class Correlator:
    """Groups change points into incidents; evidence may arrive before or after its incident."""

    def __init__(self, group_window_s: float = 300.0) -> None:
        self.group_window_s = group_window_s
        self.incidents: list[Incident] = []
        self.recent: list[ChangePoint] = []  # non-primary evidence waiting for an incident
        # Event time up to which heat in `recent` has been judged (`_cooling`); a restored
        # correlator judges what it holds again (a rise already in an incident is skipped).
        self.judged_to = -math.inf
        self.pool_sizes: dict[tuple[str | None, str | None], int] = {}
        # Whether a point has a change of its own after an incident's onset (the advisor's
        # `new_cause`): then it opens its own incident instead of joining that one. Its
        # third argument: upstream evidence of the point's pool (`_upstream`).
        self.new_cause: Callable[[Incident, ChangePoint, Iterable[ChangePoint]], bool] | None = None

    def add(
        self,
        points: list[ChangePoint],
        now_ts: float,
        pool_sizes: Mapping[tuple[str | None, str | None], int] | None = None,
    ) -> list[Incident]:
        """Fold new change points in; return the incidents that changed."""
        sizes = pool_sizes or {}
        touched: dict[int, Incident] = {}

        def opens(p: ChangePoint) -> bool:
            return is_primary(p.metric, p.layer) and p.is_regression and not p.is_aggregate

        # Evidence first: a primary point of this batch may have a cause of its own that
        # only this batch's evidence shows (`_own_cause`); a new incident takes in the
        # evidence from `recent` when it opens (`_home`), so the order changes no grouping.
        for e in (p for p in points if not opens(p)):
            for inc in self._file(e):
                touched[id(inc)] = inc
        primary = [p for p in points if opens(p)]
        for p in sorted(primary, key=lambda q: (q.onset_ts, q.device, q.metric, q.layer or "")):
            inc = self._home(p, sizes.get((p.pool, p.model), 0))
            inc.points.append(p)
            touched[id(inc)] = inc
        # Pool sizes come only with batches that bring points or hold incidents; heat is
        # judged later, so the last ones known serve (none after a restore: not shared).
        self.pool_sizes = dict(sizes) or self.pool_sizes
        for p in self._cooling(now_ts, self.pool_sizes):
            inc = self._home(p, sizes.get((p.pool, p.model), 0))
            inc.points.append(p)
            touched[id(inc)] = inc
        for inc in self._fold_stragglers():
            touched[id(inc)] = inc
        for inc in self.incidents:
            if inc.status == "open":
                inc.pool_size = max(inc.pool_size, sizes.get((inc.pool, inc.model), 0))
        horizon = now_ts - 2 * self.group_window_s
        self.recent = [e for e in self.recent if e.detected_ts >= horizon]
        return list(touched.values())

    def _cooling(
        self, now_ts: float, sizes: Mapping[tuple[str | None, str | None], int]
    ) -> list[ChangePoint]:
        """Device temperature rises that nothing heating the device explains, each judged
        once, `LEAD_WINDOWS` after it was found (what heats it shows by then).

        Heat follows power (`HEAT_SOURCES`): a rise of the device's power, or of the
        offered load on any of its pool's devices (traffic reaches them alike; a device
        re-learning its level may not show it), from a grouping window before the rise (the
        cooling's time constant) to two windows after it, or up to the rise's detection
        when that is later, explains it: a rise found late is dated no better than its
        detection delay (as `Incident.load_ratio` reads it), so a burst that began before
        the heat was found may be what heated the die. So does heat that
        rose within a grouping window on a real share of the pool (`SUPPORT_SHARE` of its
        devices), hosts other than this one's among them: traffic reaches a pool's hosts
        alike, while a cooling fault is one board's or one chassis's, or a few (and a
        burst that follows another within a detector's re-learning shows as heat before
        its load shows as a change). With none, the cooling got worse, and the rise
        opens (or joins) an incident of its own.
        """
        lead, span = LEAD_WINDOWS, self.group_window_s
        since, self.judged_to = self.judged_to, now_ts
        # Only on devices that report their power: without it nothing tells heat that
        # follows work from the cooling's.
        ripe = [
            p for p in self.recent
            if p.metric in HEAT and not p.is_aggregate and p.is_regression
            and p.fields >= 0 and p.fields & _POWER_FIELD
            and since < p.detected_ts + lead * p.window_s <= now_ts
        ]  # fmt: skip
        if not ripe:
            return []
        sources: dict[str | None, list[ChangePoint]] = {}
        heat: dict[str | None, list[ChangePoint]] = {}
        for q in self.recent:
            if q.metric in HEAT_SOURCES and q.after > q.before:
                sources.setdefault(q.pool, []).append(q)
            elif q.metric in HEAT and not q.is_aggregate and q.is_regression:
                heat.setdefault(q.pool, []).append(q)
        homed = {
            (p.device, p.onset_ts) for i in self.incidents for p in i.points if p.metric in HEAT
        }
        out: list[ChangePoint] = []
        for p in ripe:
            lo, hi = p.onset_ts - span, max(p.onset_ts + 2 * p.window_s, p.detected_ts)
            chassis = p.host or p.device
            alike = [q for q in heat.get(p.pool, ()) if abs(q.onset_ts - p.onset_ts) <= span]
            shared = any((q.host or q.device) != chassis for q in alike) and len(
                {q.device for q in alike}
            ) >= SUPPORT_SHARE * sizes.get((p.pool, p.model), 1 << 30)
            explained = shared or any(
                (q.device == p.device or q.is_aggregate or q.metric in LOAD_METRICS)
                and lo <= q.onset_ts <= hi
                for q in sources.get(p.pool, ())
            )
            if not explained and (p.device, p.onset_ts) not in homed:
                # Heat climbs over the cooling's time constant, found in steps: the level
                # before is the device's before the climb's first step within a grouping
                # window, whatever explained that step (the share of cooling lost is judged
                # on the whole climb, `lifecycle.heat_severity`). Known for a cooling fault
                # once judged, not when the rise was found.
                start = min(
                    q.before for q in (p, *heat.get(p.pool, ()))
                    if q.device == p.device and lo <= q.onset_ts <= p.onset_ts
                )  # fmt: skip
                out.append(replace(p, before=start, detected_ts=p.detected_ts + lead * p.window_s))
        return out

    def _home(self, p: ChangePoint, pool_size: int) -> Incident:
        """The incident a regression of a primary metric joins, or a new one it opens (which
        takes in the recent evidence that fits it)."""
        inc = self._heat_match(p) if p.metric in HEAT else self._match(p, pool_size)
        if inc is None:
            inc = Incident(
                p.pool, p.model, p.onset_ts, p.detected_ts, p.window_s, self.group_window_s
            )
            self.incidents.append(inc)
            for e in self.recent:
                if self._fits(inc, e):
                    (inc.load if is_load_context(e) else inc.evidence).append(e)
        return inc

    def _file(self, e: ChangePoint) -> list[Incident]:
        """File a non-opening point: load context, or evidence of the open incidents it fits
        (returned); kept a while for incidents that open later. Other steps back are skipped."""
        if is_load_context(e):
            for inc in self.incidents:
                if inc.status == "open" and self._fits(inc, e):
                    inc.load.append(e)
            self.recent.append(e)
            return []
        if not e.is_regression:
            # A step back: on a paged incident the lifecycle's business (a fix showing,
            # `AlertLifecycle.note_steps`); on one not sent yet, a move that is over.
            self._step_back(e)
            return []
        homes = [i for i in self.incidents if i.status == "open" and self._fits(i, e)]
        for inc in homes:
            inc.evidence.append(e)
        self.recent.append(e)
        return homes

    def _step_back(self, e: ChangePoint) -> None:
        """Drop from incidents not sent yet the moves that `e` undoes: its stream's
        regressions, where `e` takes it more than half way back to the level before the
        first of them. A transient (one device's collective waits spiking for a minute) is
        over, not the start of whatever comes next: an incident left with nothing closes,
        so the next move opens its own and is dated by itself."""
        if e.is_aggregate or not is_primary(e.metric, e.layer):
            return
        emptied: set[int] = set()
        for inc in self.incidents:
            if inc.status != "open" or inc.alert_id is not None:
                continue
            if inc.parent is not None or inc.children:  # a fleet link: judged as one
                continue
            if inc.pool != e.pool or inc.model != e.model:
                continue
            mine = [
                q for q in inc.points
                if (q.device, q.metric, q.layer) == (e.device, e.metric, e.layer)
            ]  # fmt: skip
            if not mine or max(q.onset_ts for q in mine) >= e.onset_ts:
                continue
            level = min(mine, key=lambda q: q.onset_ts).before
            if abs(e.after - level) > 0.5 * abs(e.before - level):
                continue
            gone = {id(q) for q in mine}
            inc.points = [q for q in inc.points if id(q) not in gone]
            if not inc.points:
                emptied.add(id(inc))
        if emptied:
            self.incidents = [i for i in self.incidents if id(i) not in emptied]

    def _fits(self, inc: Incident, p: ChangePoint) -> bool:
        return (
            inc.pool == p.pool
            and inc.model == p.model
            and abs(p.onset_ts - inc.anchor_ts) <= self.group_window_s
        )

    def _own_cause(self, inc: Incident, p: ChangePoint) -> bool:
        return self.new_cause is not None and self.new_cause(inc, p, self._upstream(p))

    def _upstream(self, p: ChangePoint) -> Iterator[ChangePoint]:
        """Recent evidence of p's pool from stages upstream of p's (read only when a change
        landed in p's pool since an open incident's onset, `Advisor.new_cause`)."""
        rank = STAGES.index(p.stage)
        # Only what shows a stage got worse and load cannot move: a kernel's new name shows
        # that a change landed (a harmless deploy switches kernels too), and a queue grows
        # with every burst, whatever changed.
        return (
            e for e in self.recent
            if e.pool == p.pool and e.model == p.model and e.is_regression
            and STAGES.index(e.stage) < rank and e.metric not in _NOT_A_STAGE_WORSE
        )  # fmt: skip

    def _fold_stragglers(self) -> list[Incident]:
        """Cooling faults that opened on their own, not paged yet, whose devices an open
        incident of their pool already sent now names as the stragglers its collective
        waits for: each joins that incident (returned), as its cause. The heat is judged
        `LEAD_WINDOWS` after it was found, and the waits that name the straggler can be
        found later. An incident not sent yet may never be sure (a few members' waits):
        the fault's own page must not wait on it."""
        heat = [
            i for i in self.incidents
            if i.status == "open" and i.alert_id is None and i.primary_metric in HEAT
            and i.parent is None and not i.children
        ]  # fmt: skip
        if not heat:
            return []
        out: list[Incident] = []
        folded: set[int] = set()
        for inc in (i for i in self.incidents if i.status == "open" and i.alert_id is not None):
            fits = [
                h for h in heat
                if id(h) not in folded and (h.pool, h.model) == (inc.pool, inc.model)
                and abs(h.anchor_ts - inc.anchor_ts) <= self.group_window_s
            ]  # fmt: skip
            stragglers = inc.stragglers() if fits else set()
            for h in (h for h in fits if h.devices <= stragglers):
                known = {id(e) for e in inc.evidence}
                inc.points.extend(h.points)
                inc.evidence.extend(e for e in h.evidence if id(e) not in known)
                folded.add(id(h))
                out.append(inc)
        if folded:
            self.incidents = [i for i in self.incidents if id(i) not in folded]
        return out

    def _heat_match(self, p: ChangePoint) -> Incident | None:
        """A cooling fault joins what its own device shows (a throttle found first) or the
        same cooling failing on other devices of its pool: heat that opened an incident, or
        an incident whatever its metric that some of its devices' throttle explains. Not an
        incident of another mechanism."""
        for inc in self.incidents:
            if (
                inc.status == "open"
                and self._fits(inc, p)
                and (p.device in inc.devices or inc.primary_metric in HEAT or inc.throttled())
            ):
                return inc
        return None

    def _match(self, p: ChangePoint, pool_size: int) -> Incident | None:
        # A paged incident that has not resolved is still going on: its metric on the
        # same layer moving again (a burst-only regression at the next burst) is that
        # incident, however long after its onset, on one of its devices or, for a
        # pool-wide incident, anywhere in the pool.
        for inc in self.incidents:
            if inc.status != "open" or inc.alert_id is None or self._own_cause(inc, p):
                continue
            if inc.pool != p.pool or inc.model != p.model:
                continue
            same = [q for q in inc.points if q.metric == p.metric and q.layer == p.layer]
            if not same:
                continue
            pool_wide = pool_size > 0 and 2 * len(inc.devices) >= pool_size
            if pool_wide or any(q.device == p.device for q in same):
                return inc
        fits = [
            inc for inc in self.incidents
            if inc.status == "open" and self._fits(inc, p) and not self._own_cause(inc, p)
        ]  # fmt: skip
        # One device moving at one moment (within the onset estimate's own uncertainty,
        # two windows) is one event: a latency that rose with its device's queue is that
        # queue's incident, not the earlier one of another mechanism the grouping window
        # still holds open.
        for inc in fits:
            if any(
                q.device == p.device and abs(q.onset_ts - p.onset_ts) <= 2 * p.window_s
                for q in inc.points
            ):
                return inc
        return fits[0] if fits else None

    def drop_resolved(self, now_ts: float, keep_s: float) -> None:
        """Forget resolved incidents older than keep_s, and never-paged ones gone stale."""
        self.incidents = [
            i
            for i in self.incidents
            if (i.status == "open" and (i.alert_id is not None or now_ts - i.anchor_ts <= keep_s))
            or (i.status != "open" and now_ts - i.resolved_ts <= keep_s)
        ]

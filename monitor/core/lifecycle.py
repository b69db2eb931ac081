"""Alert lifecycle: when an incident pages, updates and resolves, and its alert record.

Ids are fingerprints of pool, model, primary metric, first failing stage and
onset window taken when the incident first pages, so replays, restarts and
replicas produce the same id for the same incident and never page twice.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Literal

import msgspec
import numpy as np

from monitor.config import AlertSettings
from monitor.core.advisor import Advisor, bottleneck_class
from monitor.core.correlator import (
    LEAD_WINDOWS,
    OVERLOAD_RATIO,
    SERVED_RISE,
    ChangePoint,
    Incident,
    offered_load_rose,
)
from monitor.core.coverage import BIT, not_judged
from monitor.core.exposure import BIN_S, EFFICIENCY
from monitor.core.load import LOAD_SENSITIVE
from monitor.indicators import (
    BACKLOG,
    BAD_DIRECTION,
    CLOCK_BOUND,
    COMM_LAYERS,
    COMPLEMENT,
    DEFAULT_MIN_REL_CHANGE,
    DEVICE_METRICS,
    HEAT,
    LAYER_METRICS,
    LOAD_FOLLOWING,
    LOAD_METRICS,
    MIN_REL_CHANGE,
    QUEUEING,
    SHEDDING,
    TIME_SHARES,
    WAITING,
    judged,
    judged_sign,
)
from monitor.wire import (
    STAGES,
    Alert,
    AlertScope,
    Evidence,
    NotJudged,
    ScopeLevel,
    Severity,
    Stage,
    Suggestion,
)

if TYPE_CHECKING:
    from monitor.core.types import NormView

PoolKey = tuple[str | None, str | None]
# Per pool: its open overload records that shed, as (alert id, when the shedding began).
_Shedding = dict[str | None, list[tuple[str, float]]]
# A healthy window counts towards resolving only at this share of the load seen while broken.
LOAD_EVIDENCE = 0.8
RUNBOOK = "docs/runbook.md#"
_METRIC_WORDS = {
    "mfu": "MFU", "device_mfu": "device MFU", "stall_frac": "memory-stall fraction",
    "error_rate": "failed-request rate",
}  # fmt: skip


def fingerprint(*parts: object) -> str:
    """Short stable id: 'fw-' + 12 hex of sha256 over the parts."""
    h = hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()
    return "fw-" + h[:12]


# A rollout that hurts every pool at once shows on all of them within a minute (at 10 s
# windows). The grouping window (5 minutes) is for one pool's devices; across pools it let
# a host's sync contention on one pool join another pool's MFU drop 30 windows earlier, and
# the fleet alert then hid the host incident (`fleet_day`, seed 6). A rollout staged pool by
# pool pages per pool, each with its own change to roll back.
FLEET_ONSET_WINDOWS = 6
# Who links the incidents of several pools into one fleet alert: `link`, this lifecycle (one
# daemon holding the whole fleet); `off`, nobody here (a replica of several, whose pools the
# fleet stage links, `core.fleet`); `only`, this lifecycle and it sends nothing else (the
# fleet stage: a pool's own alert is its replica's to send).
FleetMode = Literal["link", "off", "only"]
_RANK: dict[Severity, int] = {"info": 0, "ticket": 1, "page": 2}


@dataclass(slots=True)
class AlertState:
    """What the lifecycle sent of one paged incident, and how its recovery is going."""

    devices: int = 0  # device count of the last record sent
    level: ScopeLevel | None = None  # scope level of the last record sent
    change: str | None = None  # rollback change id of the last record sent
    severity: Severity | None = None  # of the last record sent
    sent_ts: float = 0.0  # event time of the last record sent
    observed_ts: float = 0.0  # recovery is judged only on windows after this
    healthy_windows: int = 0
    bad_loads: list[float] = field(default_factory=list)  # batch sizes of broken windows
    recovered: set[str] = field(default_factory=set)  # devices whose metric stepped back
    # When each step back was found (its `detected_ts`): a window counts those found by
    # its own time only, so when the incident resolves does not depend on how many windows
    # a batch brought. Absent (older checkpoints): known from the start.
    recovered_at: dict[str, float] = field(default_factory=dict)
    # Per sink: what may still be open there (`AlertmanagerSink.delivery_state`), kept by
    # the runner so that the checkpoint carries it to a restarted or new owner.
    delivery: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # The members its records named as throttling (`Incident.stragglers`), sorted: what
    # on-call was told, though the incident's median onset and waiting share move on.
    stragglers: list[str] = field(default_factory=list)
    # The offered-load rise measured around its onset (`AlertLifecycle._offered_load`;
    # 1.0: none), kept: the windows it was read from age out.
    offered: float | None = None
    # A cooling fault's devices whose clock stepped down after its record (`_escalate`),
    # sorted: heat and the clock now agree, so work is lost and the record pages.
    throttled: list[str] = field(default_factory=list)
    # The bottleneck class of the last record sent (absent from older checkpoints): an
    # open `overload` info record says its pool is over capacity (`_shedding_overloads`).
    bottleneck: str | None = None
    # When the open overload its failures grew in began to shed (`_sheds_into_overload`),
    # kept once found: that overload may end before this record does.
    shedding: float | None = None
    # Windows after `observed_ts` not judged yet, by window time: sums over the streams
    # that reported so far (`_PENDING`). Partitions are drained unevenly and a fetch can
    # end inside a window, so a window is judged once complete, not on its first part.
    pending: dict[float, list[float]] = field(default_factory=dict)


# A pending window's sums: the primary metric (sum, count), the batch (sum, count) and
# the temperature of the incident's heat (sum, count).
_PENDING = 6


class AlertLifecycle:
    """Decides when incidents emit alert records and renders them (contract §5)."""

    def __init__(
        self, settings: AlertSettings, advisor: Advisor, fleet: FleetMode = "link"
    ) -> None:
        self.s = settings
        self.advisor = advisor
        self.fleet = fleet
        # `only`: when each unpaged incident was sure, and on what (`_sure_at`).
        self._sure: dict[int, tuple[Incident, tuple[int, ...], float | None]] = {}
        self.states: dict[str, AlertState] = {}  # by alert id, for paged incidents
        # Known devices per host, as of the last `due`: what makes a host's devices a host.
        self.host_sizes: Mapping[str | None, int] = {}
        # Per pool, as of the last `due` or `restate`: its open overload records that shed
        # requests, as (alert id, when the shedding began) (`_shedding_overloads`).
        self.shedding: _Shedding = {}

    def state(self, inc: Incident) -> AlertState:
        """The alert state of a paged incident (created at its first page)."""
        assert inc.alert_id is not None  # noqa: S101 - only paged incidents have one
        return self.states.setdefault(inc.alert_id, AlertState())

    def told(self, inc: Incident) -> bool:
        """Open, sent, and more than an `info` record: on-call was told of a fault.

        An info record says what is not one (capacity, heat no more than the work
        brought): nothing later can be that record's fault going on, nor its mechanism
        already on on-call's screen.
        """
        sent = self.states.get(inc.alert_id or "")
        return inc.paging and (sent is None or sent.severity != "info")

    def _pages(self, incidents: list[Incident]) -> _Paged:
        """What each incident on-call was told of shows (`told`), by (pool, model)."""
        return _paged([inc for inc in incidents if self.told(inc)])

    def note_steps(self, points: list[ChangePoint], incidents: list[Incident]) -> None:
        """Primary metrics stepping back on a paged incident's devices: a fix showing."""
        for p in points:
            if p.is_regression or p.metric in LOAD_METRICS:
                continue
            for inc in incidents:
                if inc.status != "open" or inc.alert_id is None:
                    continue
                if p.metric != inc.primary_metric:
                    continue
                if any(q.device == p.device and q.layer == p.layer for q in inc.primary_points()):
                    st = self.state(inc)
                    st.recovered.add(p.device)
                    st.recovered_at[p.device] = min(
                        st.recovered_at.get(p.device, math.inf), p.detected_ts
                    )

    def forget(self, alert_ids: set[str]) -> None:
        """Drop the alert state of incidents this member no longer holds."""
        for aid in alert_ids:
            self.states.pop(aid, None)

    def keep(self, alert_ids: set[str]) -> None:
        """Keep only the alert state of these incidents (the others were dropped)."""
        self.states = {k: v for k, v in self.states.items() if k in alert_ids}

    def due(
        self,
        incidents: list[Incident],
        now_ts: float,
        pool_devices: dict[PoolKey, int],
        host_sizes: Mapping[str | None, int] | None = None,
    ) -> list[Alert]:
        """Alerts to send now: first pages after settling, and growth updates."""
        out: list[tuple[int, Alert]] = []
        self.host_sizes = host_sizes or {}
        self.shedding = self._shedding_overloads(incidents)
        sure_at = self._sure_times(incidents, pool_devices, host_sizes)
        self._link_fleet(incidents, sure_at)
        paged = self._pages(incidents)
        for at, inc in _faults_first(incidents):
            # (The fleet stage leaves one pool's incident to the replica that holds it.)
            if inc.status != "open" or inc.parent is not None or self._not_ours(inc):
                continue
            view, n_pool, level = self._view(inc, pool_devices)
            n = len(view.devices)
            first = inc.alert_id is None
            if first and not self._identify(inc, view, incidents, sure_at, now_ts):
                continue
            self._rejudge(inc)
            view.detected_ts = inc.detected_ts
            alert = self.render(
                view, now_ts, n_pool, "firing", level=level, shown=_shown_before(inc, paged)
            )
            sent = self.state(inc)
            alert = _held(alert, sent)
            if first and self._unsettled_ticket(inc, alert, now_ts):
                # Nothing goes out: the incident stays unsent, judged afresh next time.
                self.states.pop(inc.alert_id or "", None)
                inc.alert_id = inc.metric = None
                continue
            # Big growth re-sends at once; any other change in count at a calm pace.
            grew = n >= sent.devices * (1 + self.s.update_growth) or (
                n != sent.devices
                and now_ts - sent.sent_ts >= self.s.update_every_windows * inc.window_s
            )
            news = level != sent.level or alert.suggestion.change_id != sent.change
            # A deeper drop on the same devices raises the severity without growth: a
            # ticket that became a page must reach on-call now, not at the next growth.
            worse = sent.severity is None or _RANK[alert.severity] > _RANK[sent.severity]
            if not (first or grew or news or worse):
                continue
            sent.devices, sent.level, sent.sent_ts = n, level, now_ts
            sent.change = alert.suggestion.change_id
            sent.severity, sent.bottleneck = alert.severity, alert.bottleneck
            if alert.bottleneck == "thermal_power":
                sent.stragglers = sorted({*sent.stragglers, *view.stragglers()})
            out.append((at, alert))
        # Judged faults first, sent in the incidents' order (a batch's records keep theirs).
        return [alert for _, alert in sorted(out, key=lambda x: x[0])]

    def _identify(
        self,
        inc: Incident,
        view: Incident,
        incidents: list[Incident],
        sure_at: dict[int, float],
        now_ts: float,
    ) -> bool:
        """Give an unsent incident its id if its first record is due now (False: not yet,
        or it was closed as an open page's consequence)."""
        if now_ts - inc.detected_ts < self._settle_windows(inc) * inc.window_s:
            return False
        sure = min((sure_at[id(m)] for m in (inc, *inc.children) if id(m) in sure_at),
                   default=None)  # fmt: skip
        if sure is None:
            return False
        if _awaits_fault(inc, incidents, sure_at):
            # Its job's throttling member is a fault that is sure but settling: judged
            # after that fault's page, it is seen to be its consequence.
            return False
        hw = self._consequence_of(inc, incidents)
        if hw is not None:
            # One mechanism, one page: an open page already shows what moved here again
            # (its devices serving slower: their queue, the pool's latency).
            self._escalate(hw, inc)
            inc.status, inc.resolved_ts = "resolved", now_ts
            return False
        inc.detected_ts = sure
        # The id is what the incident was when it became sure, in event time: a batch
        # that reaches further past that moment must not change it.
        then = view.as_of(sure)
        inc.metric = view.metric = then.primary_metric
        inc.alert_id = view.alert_id = fingerprint(
            "fleet" if inc.children else inc.pool, view.model, then.primary_metric,
            then.first_failing_stage(), int(then.onset_ts // inc.window_s),
        )  # fmt: skip
        return True

    @staticmethod
    def _unsettled_ticket(inc: Incident, alert: Alert, now_ts: float) -> bool:
        """Whether `alert`, an incident's first record, is a ticket while the incident's
        grouping window is still open: it waits for the window (a page never does).

        Detectors find a burst's pieces a few windows apart: the failures it sheds before
        the offered-load step that explains them, a queue before the power that shows the
        work. Until the window closed the evidence that classes the incident (capacity,
        not a fault) may still come, and a ticket is read in working hours: minutes cost
        nothing, and one opened and then closed as capacity costs on-call's trust.
        """
        return (
            alert.severity == "ticket"
            and not inc.children
            and now_ts - inc.onset_ts < inc.group_window_s
        )

    def _rejudge(self, inc: Incident) -> None:
        """A ticket, a fault not worth a page yet, is judged on the incident's most telling
        metric as the evidence comes in (a layer's MFU found a window after the device's
        own). What on-call was paged with stays fixed, and so does an `info` record: it
        said what is not a fault (capacity, heat the work brought). The id never changes."""
        if not inc.children and self.state(inc).severity == "ticket":
            inc.metric = None
            inc.metric = inc.primary_metric

    def _settle_windows(self, inc: Incident) -> int:
        """Windows an incident waits after its detection before its first record.

        Failures wait as long as a cause may lead them (`LEAD_WINDOWS`) for the backlog
        that would shed them: its queue, heat and utilisation are load-normalised and
        slower to show than a step up from no failures.
        """
        if inc.primary_metric in SHEDDING:
            return max(self.s.settle_windows, LEAD_WINDOWS)
        return self.s.settle_windows

    def restate(
        self, incidents: list[Incident], now_ts: float, pool_devices: dict[PoolKey, int]
    ) -> list[Alert]:
        """The current record of every open incident that has paged, as it stands now.

        After a restore the sinks start empty: Alertmanager's would never re-post a page
        it was not told about in this process, and Alertmanager resolves what is not
        re-posted within its `resolve_timeout`, while the regression goes on.
        """
        out: list[Alert] = []
        paged = self._pages(incidents)
        self.shedding = self._shedding_overloads(incidents)
        for inc in incidents:
            if not inc.paging:
                continue
            view, n_pool, level = self._view(inc, pool_devices)
            view.detected_ts = inc.detected_ts
            shown = _shown_before(inc, paged)
            alert = self.render(view, now_ts, n_pool, "firing", level=level, shown=shown)
            out.append(_held(alert, self.state(inc)))
        return out

    def _consequence_of(self, inc: Incident, incidents: list[Incident]) -> Incident | None:
        """The open, paged incident of the same pool and model whose mechanism this one
        shows again (or None): one mechanism, one page.

        - a throttle: the clock stepped down again, as it began, on that hardware fault's
          devices or hosts (those devices were already found faulty, so one is enough),
          or on a member that a job's page names as the throttling one its collective
          waits for (`Incident.stragglers`);
        - a throttle cycling: most of this incident's devices are that hardware fault's,
          it is about what a clock moves (MFU, the stall share, what serving slower
          moves), and no change landed since that fault began that could be its own
          cause. A throttling device's clock steps down and back as it heats and cools,
          and each step moves its clock-bound ratios (memory stalls take a larger share
          of a faster core's time); the page's step, cordoning those devices, covers
          them, and a move seen mostly elsewhere is judged on its own;
        - a slower service: this incident is about what serving slower moves (queue,
          latency, the requests a full queue sheds, served MFU), and the mechanism behind
          it (a per-layer efficiency or placement indicator) is one the paged incident
          moved, on its devices or on the pool aggregate (a placement regression at the
          next burst).
        """
        throttled = _throttled(inc)
        served = inc.primary_metric in SERVED_SLOWER
        mine = _mechanisms(inc) if served else {}
        for hw in incidents:
            if hw is inc or not self.told(hw) or (hw.pool, hw.model) != (inc.pool, inc.model):
                continue
            shown = _Shown.of(hw)
            # A cooling fault (heat no power explains) is hardware too: its devices
            # throttling later is that fault going on, not a new mechanism.
            if throttled and shown.hardware and _shows_fault_of(throttled, hw):
                return hw
            # A job's page that named its throttling members already shows their fault.
            named = self.states.get(hw.alert_id or "")
            if named is not None and any(p.device in named.stragglers for p in throttled):
                return hw
            if (
                shown.hardware
                and inc.primary_metric in CLOCK_BOUND | QUEUEING
                and 2 * len(inc.devices & shown.devices) > len(inc.devices)
                and not any(self.advisor.new_cause(hw, p) for p in inc.points)
            ):
                return hw
            if any(shown.shows_mechanism(p) for pts in mine.values() for p in pts):
                return hw
        return None

    def _escalate(self, hw: Incident, inc: Incident) -> None:
        """Note the devices of cooling fault `hw` whose clock `inc` saw step down.

        A cooling fault is a ticket while its clock holds (`heat_severity`): no work is
        lost yet. Its devices throttling later is that fault going on, not a new one, so
        it pages under its own id (`_held`), with the heat and the clock now agreeing
        as they do for a throttle found at once (`_hardware_fault`).
        """
        if hw.primary_metric not in HEAT or hw.children:
            return
        devices = {
            p.device for p in _throttled(inc) if p.device in hw.devices or p.host in hw.hosts
        }
        sent = self.state(hw)
        if devices - set(sent.throttled):
            sent.throttled = sorted({*sent.throttled, *devices})

    def _not_ours(self, inc: Incident) -> bool:
        """An incident of one pool, in the fleet stage (its replica sends that alert)."""
        return self.fleet == "only" and not inc.children

    def _sure_times(
        self,
        incidents: list[Incident],
        pool_devices: dict[PoolKey, int],
        host_sizes: Mapping[str | None, int] | None,
    ) -> dict[int, float]:
        """When each open incident that has not paged became sure, by `id`; unsure left out."""
        if self._sure:
            held = {id(i) for i in incidents if i.alert_id is None}
            self._sure = {k: v for k, v in self._sure.items() if k in held}
        sure_at: dict[int, float] = {}
        for inc in incidents:
            if inc.status == "open" and inc.alert_id is None:
                sure = self._sure_at(inc, inc.pool_devices(pool_devices), host_sizes)
                if sure is not None:
                    sure_at[id(inc)] = sure
        return sure_at

    def _sure_at(
        self, inc: Incident, n_pool: int, host_sizes: Mapping[str | None, int] | None
    ) -> float | None:
        """The earliest event time at which the incident, as it stood then, was confirmed.

        Judged as of each detection time in turn, not on everything this batch brought: a
        larger batch sees later evidence (another primary metric, say) and must still find
        the moment, and so the id, a smaller one found.
        """
        key = (len(inc.points), len(inc.evidence), len(inc.load), n_pool)
        hit = self._sure.get(id(inc))
        if hit is not None and hit[0] is inc and hit[1] == key:
            return hit[2]
        found = None
        for t in sorted({p.detected_ts for p in inc.points}):
            then = inc.as_of(t)
            sure = then.confirmed_at(n_pool, self.s.min_devices, self.s.min_fraction, host_sizes)
            if sure is not None and sure <= t:
                found = sure
                break
        if self.fleet == "only":
            # The stage never pages one pool's incident, so it would judge each again at
            # every batch while it stays open: the answer holds until the incident grows.
            self._sure[id(inc)] = (inc, key, found)
        return found

    def _view(
        self, inc: Incident, pool_devices: dict[PoolKey, int]
    ) -> tuple[Incident, int, ScopeLevel]:
        """What an alert shows of a top-level incident: the incident (with its fleet
        children folded in), the devices of its pools, and its scope level."""
        if inc.children:
            n_pool = sum(m.pool_devices(pool_devices) for m in (inc, *inc.children))
            return inc.merged(), n_pool, "fleet"
        n_pool = inc.pool_devices(pool_devices)
        return inc, n_pool, inc.scope_level(n_pool, self.s.pool_fraction, self.host_sizes)

    def _link_fleet(self, incidents: list[Incident], sure_at: dict[int, float]) -> None:
        """Fold same-metric, same-layer incidents of different pools with close onsets into
        one fleet incident (a driver or firmware rollout hits every pool at once)."""
        if self.fleet == "off":
            return
        live = [
            i for i in incidents
            if i.status == "open" and i.parent is None and (i.alert_id or id(i) in sure_at)
        ]  # fmt: skip
        live.sort(key=lambda i: (i.alert_id is None, i.anchor_ts))
        for inc in live:
            if inc.parent is not None:
                continue
            key = (inc.primary_metric, inc.layers[:1])
            if inc.primary_metric in QUEUEING:
                continue  # a pool's queue is its own capacity, never a fleet regression
            for other in live:
                if (
                    other is not inc
                    and other.parent is None
                    and not other.children
                    and other.alert_id is None
                    and other.pool not in inc.pools
                    and (other.primary_metric, other.layers[:1]) == key
                    and abs(other.onset_ts - inc.onset_ts) <= FLEET_ONSET_WINDOWS * inc.window_s
                ):
                    other.parent = inc
                    inc.children.append(other)

    def observe(
        self,
        incidents: list[Incident],
        views: list[NormView],
        n_pool: dict[PoolKey, int],
        reached: float,
    ) -> list[Alert]:
        """Track recovery of paged incidents; resolved alerts for those back to baseline.

        Recovery is judged on the values as the detector saw them (load-normalised),
        so a quiet hour does not look like a fix and a burst does not look like a relapse.
        `reached`: the event time every active partition has reached (the watermark).
        """
        out: list[Alert] = []
        paged = self._pages(incidents)
        for inc in incidents:
            if not inc.paging:
                continue
            t = self._recovered_at(inc, views, reached)
            if t is None:
                continue
            for member in (inc, *inc.children):
                member.status = "resolved"
                member.resolved_ts = t
            self.state(inc).sent_ts = t
            n = sum(m.pool_devices(n_pool) for m in (inc, *inc.children))
            if inc.children:
                out.append(self.render(inc.merged(), t, n, "resolved", level="fleet"))
            else:
                out.append(self.render(inc, t, n, "resolved", shown=_shown_before(inc, paged)))
        return out

    def _recovered_at(self, inc: Incident, views: list[NormView], reached: float) -> float | None:
        """The window at which a paged incident counts as fixed, if this batch completes it.

        A window is judged once all the incident's headline streams reported it, or once
        every active partition has passed it (`reached`; a stream went silent): judged on
        the part of it one partition or one fetch brought, a window is a smaller sample,
        and when the incident resolves would depend on how records were batched.
        """
        st = self.state(inc)
        metric = inc.primary_metric
        # The level each device left when the incident began on it: a device found again
        # later (noise on the degraded level, the same fault at the next burst) started
        # that point from the degraded level, which is no level to recover to.
        headline = inc.headline_points()
        first = _first_per_device(headline)
        before = judged(metric, median(p.norm_before for p in first))
        sign = judged_sign(metric)
        # Recovery needs a step back on most devices, not a slow drift of the
        # expectation: a frozen load model extrapolating a new load range is no fix.
        # Counted per window by when each step back was found, as a window-by-window
        # replay would: a batch of many windows knows at its first the steps of its last.
        need = len({p.device for p in inc.primary_points()})
        found = sorted(st.recovered_at.get(d, -math.inf) for d in st.recovered)
        # A throttle cycles (the clock steps back up as the die cools, and down as it
        # heats): while the heat that drove it is still there, the fault is too.
        heat = [
            p for (_, m, _), pts in inc.supporting().items() if m in HEAT and m != metric
            for p in pts if p.is_regression and not p.is_aggregate
        ]  # fmt: skip
        heat_bound = math.inf
        if heat:
            floor = MIN_REL_CHANGE.get("temp_c", DEFAULT_MIN_REL_CHANGE)
            heat_bound = _spans(heat)[0] * (1 + floor)
        # A batch can reach back before the detection: only later windows are held.
        after = max(st.observed_ts, inc.detected_ts)
        _hold(st, after, _window_sums(inc, views), 0)
        if heat:
            _hold(st, after, _window_sums(inc, views, "temp_c", heat), 4)
        streams = len({(p.partition, p.row) for p in headline})
        for t, sums in _complete(st, streams, reached):
            level = judged(metric, sums[0] / sums[1])
            batch = sums[2] / sums[3] if sums[3] else math.nan
            if (level - before) * sign > tolerance(metric, self.s) * abs(before):
                if math.isfinite(batch):
                    st.bad_loads = [*st.bad_loads[-63:], batch]
                st.healthy_windows = 0
                continue
            if heat and not (sums[5] and sums[4] / sums[5] <= heat_bound):
                st.healthy_windows = 0
                continue
            # A regression that shows only under burst load looks healthy between
            # bursts: a calm window says nothing about the fix, so it does not count.
            if st.bad_loads and batch < LOAD_EVIDENCE * median(st.bad_loads):
                continue
            st.healthy_windows += 1
            stepped = 2 * bisect_right(found, t) >= need
            if stepped and st.healthy_windows >= self.s.resolve_windows:
                st.pending.clear()
                return t
        return None

    def render(
        self,
        inc: Incident,
        now_ts: float,
        n_pool: int,
        status: str,
        level: ScopeLevel | None = None,
        shown: list[_Shown] | None = None,
    ) -> Alert:
        """The alert record for an incident as it stands now; `shown`: what earlier open
        pages of its pool and model show (`_shown_before`)."""
        metric = inc.primary_metric
        pts = inc.headline_points()
        before, after = _spans(pts) if metric in HEAT else _medians(pts)
        # Levels are sent to 6 decimals: one that rounds to 0 has no relative change.
        delta_pct = 100.0 * (after - before) / before if round(before, 6) else 0.0
        levels = (before, after) if metric in SHEDDING else None  # failures: quote both
        stage = inc.first_failing_stage()
        support = _beside_pages(inc.supporting(), shown or [], metric)
        moved = {metric for _, metric, _ in support}
        # The offered-load rise, quoted in an overload's summary when the pool reports one.
        follows = metric in BACKLOG | LOAD_FOLLOWING or metric == "sync_frac"
        load = self._offered_load(inc) if follows else 1.0
        classed, queue_only = self._classed_under(inc, support, moved, load)
        # Once the incident's scope settled (its queue had the grouping window to show),
        # latency that rose at a steady offered load while the devices' reported queue
        # held is service time. Under a burst, a bigger batch takes longer to serve.
        settled = now_ts - inc.onset_ts >= inc.group_window_s
        queue_held = settled and _steady(load) and not moved & WAITING and _reports_queue(inc)
        bottleneck = bottleneck_class(stage, classed, queue_held=queue_held)
        level = level or inc.scope_level(n_pool, self.s.pool_fraction, self.host_sizes)
        devices = sorted(inc.devices)
        what = f"{inc.layers[0] + ' ' if inc.layers else ''}{_METRIC_WORDS.get(metric, metric)}"
        # What queueing alone looks like (overload) is explained by a change only when the
        # change came right before it (within LEAD_WINDOWS, as any cause must): an admission
        # rule acts on the queue at once. A queue that built up at a burst long after a
        # traffic change is the burst's, like every burst before it: capacity, not a page.
        # Failures with no backlog seen (`errors`) likewise: a release that fails requests
        # fails them from its first window; failures that began at a burst long after a
        # deploy look like what the burst sheds, whatever the release.
        # The lead is counted from when the pool's aggregates began to move, where they
        # date the change before its devices do (`Incident.aggregate_onset`).
        lead = bottleneck == "overload" or (bottleneck == "errors" and metric in SHEDDING)
        since = inc.aggregate_onset() - LEAD_WINDOWS * inc.window_s if lead else None
        suggestion = self.advisor.suggest(
            inc, stage, bottleneck, guardrail(what, metric, before, self.s), level, since=since
        )
        capacity = ""
        if bottleneck == "overload" and suggestion.action == "rollback" and not queue_only:
            # A change that fits explains it: the traffic only exposed it. Not overload.
            # Unless the queue is all there is and the load is one the pool never ran at:
            # then the load explains the queue (a routing change that sent the load is
            # named, the record stays capacity), and an admission rule cannot be told
            # from it until the pool has run at that load before. Nor where what the
            # pool did bounds it (`_capacity_bound`).
            capacity = self._capacity_bound(inc, (metric, load), moved, classed, suggestion)
            if not capacity:
                bottleneck = bottleneck_class(stage, classed, explained=True, queue_held=queue_held)
        share = _share(inc, n_pool, level, bottleneck, support, moved)
        heat_text = ""
        if metric in HEAT:
            served = self._served(inc)
            sev = heat_severity(before, after, self.s.page_loss, bottleneck, served)
            if sev != heat_severity(before, after, self.s.page_loss, bottleneck):
                heat_text = f" as its pool served x{served:.2f} the requests (heat follows work)"
        else:
            sev = severity(metric, before, after, delta_pct, share, bottleneck, self.s.page_loss)
        if sev != "page" and bottleneck == "thermal_power" and _hardware_fault(moved):
            sev, heat_text = "page", ""  # the clock stepped down: work is lost, whatever heated it
        # A host's link fault pages once its scope settled (`_link_fault`).
        link = bottleneck == "synchronisation" and level == "host" and settled
        if sev != "page" and link and _steady(load) and _link_fault(support, self.s.min_devices):
            sev = "page"
        sev = _unblamed_failures(sev, metric, suggestion)
        sev, novel_text = self._load_explains(
            inc, sev, (metric, before, after), moved, load, suggestion
        )
        novel_text += capacity
        return Alert(
            v=1,
            id=inc.alert_id or "",
            status="resolved" if status == "resolved" else "firing",
            ts=now_ts,
            # The median onset can lie after the first detection once later devices join;
            # a change is never found before it began.
            onset_ts=min(inc.first_onset(), inc.detected_ts),
            detected_ts=inc.detected_ts,
            severity=sev,
            scope=AlertScope(
                level=level,
                pool=inc.pool,
                model=inc.model,
                hosts=sorted(inc.hosts)[: self.s.max_devices_listed],
                devices=devices[: self.s.max_devices_listed],
                device_count=len(devices),
            ),
            layers=inc.layers,
            metric=metric,
            before=round(before, 6),
            after=round(after, 6),
            delta_pct=round(delta_pct, 2),
            first_failing_stage=stage,
            bottleneck=bottleneck,
            evidence=_evidence(inc),
            suggestion=suggestion,
            summary=summary(inc, level, what, delta_pct, suggestion, bottleneck, load, levels)
            + novel_text
            + heat_text,
            runbook=RUNBOOK + bottleneck.replace("_", "-"),
            not_judged=self._not_judged(inc),
        )

    def _offered_load(self, inc: Incident) -> float:
        """The offered load's shift at `inc`'s onset: the load detectors'
        (`Incident.load_ratio`), or the pool's request rate measured window by window
        around the onset (`PoolExposure.offered_ratio`) where that shows a larger rise.

        A detector re-learns after each step it finds, so in a run of bursts a few
        minutes apart the next burst's start is found late or not at all, while the
        queue, the failures it sheds and the heat of the work show within a window or
        two; the latest step found may be the last burst's end. Read against that, the
        load seems to have fallen, and the backlog reads as a regression. A rise within
        the request rate's reporting floor (`SERVED_RISE`) is no rise. The rate is read
        against the grouping window before the lead a cause may have, and, for a queue,
        latency or failures, against the lead's windows themselves: a burst that ended
        just before the onset leaves the first reading high and the second shows the rise
        (what follows load with no backlog, heat or served work, follows it at once and is
        read on the first alone). The measurement is kept per alert: the windows it was
        read from age out.
        """
        ratio = inc.load_ratio()
        sent = self.states.get(inc.alert_id or "")
        if sent is not None and sent.offered is not None:
            rise = sent.offered
        else:
            lead = LEAD_WINDOWS * inc.window_s
            exposure = self.advisor.exposure
            # A backlog right after a burst's end reads the 6 windows before it too.
            spans: tuple[tuple[float, float], ...] = ((lead, inc.group_window_s), (0.0, lead))
            if inc.primary_metric not in BACKLOG:
                spans = spans[:1]
            raws = [
                exposure.offered_ratio(inc.pool, inc.onset_ts, skip, 2 * inc.window_s, span)
                for skip, span in spans
            ]
            raw = max((r for r in raws if math.isfinite(r)), default=math.nan)
            if not math.isfinite(raw):
                return ratio
            rise = raw if raw >= 1.0 + SERVED_RISE else 1.0
            if sent is not None:
                sent.offered = rise
        return max(ratio, rise) if rise > 1.0 else ratio

    def _classed_under(
        self,
        inc: Incident,
        support: dict[tuple[Stage, str, str | None], list[ChangePoint]],
        moved: set[str],
        load: float,
    ) -> tuple[set[str], bool]:
        """What moved, as the bottleneck class reads it at offered load `load`, and whether
        the incident is queueing alone at a peak the pool never ran at (a change before it
        does not make that a regression)."""
        # Collective waits that rose with the offered load (a burst feeding an expert
        # all-to-all) follow the traffic, as in `Incident.confirmed_at`: they do not make
        # an overload a regression, whether they or the queue they come with headline it.
        up = offered_load_rose(load, moved)
        # A queue that grew as the offered load fell is a burst's backlog draining (a
        # slower service shows its mechanism where it queues): there too a mechanism seen
        # on a few of the devices that queue is not why the rest queue (a stall share
        # stepping back to its pre-burst level as the burst ends, on one device of four).
        drains = inc.primary_metric in BACKLOG and load < 1.0 - SERVED_RISE
        classed = _classed(inc, support, load_rose=up) if up or drains else moved
        novelty = self._load_novelty(inc) if up else 1.0
        # Queueing alone, the offered load up, and at a peak the pool never ran at: near
        # capacity a queue grows as rho / (1 - rho) and past it without bound, so no
        # earlier burst, however close, says what this load does to the queue, and
        # nothing in it tells a change from the load (`render`'s advisor step).
        queue_only = novelty > 1.0 and not classed & _NORMALISED
        if classed & _NORMALISED and not _hardware_fault(moved) and novelty >= OVERLOAD_RATIO:
            # Burst against burst: at a load the pool never ran at, what the load model
            # expects of its per-layer efficiency is an extrapolation, and nothing says
            # the efficiency is worse than the pool's own at that load (`_novel_load`).
            # It does not make the queue a regression; a change right before the burst
            # still can (`render`'s advisor step).
            classed = classed - _NORMALISED
        if inc.primary_metric in SHEDDING:
            classed = classed | _pool_backlog(inc) | (LOAD_METRICS if up else set())
        if inc.stragglers():
            # The members wait for the ones whose hardware failed: the waits are that
            # fault's consequence, not the collective's (whose class would send on-call
            # to the interconnect).
            classed = classed - {"sync_frac"}
        return classed, queue_only

    def _load_explains(
        self,
        inc: Incident,
        sev: Severity,
        levels: tuple[str, float, float],
        moved: set[str],
        load: float,
        suggestion: Suggestion,
    ) -> tuple[Severity, str]:
        """`sev`, lowered to info where the offered load explains the move, and the words
        that say how (for the summary); `levels`: the metric, its levels before and after."""
        metric, before, after = levels
        novel = self._novel_load(inc, metric, moved, suggestion)
        if novel:
            # Burst is judged against burst: at a load the pool never ran at, what the
            # load model expects is an extrapolation, and nothing says this efficiency is
            # worse than the pool's own at that load. A capacity finding for the owners.
            return "info", (
                f" at x{novel:.2f} the highest offered load the pool ran before (no earlier"
                " burst at this load to compare with)"
            )
        then = self._as_at_earlier_bursts(inc, metric, after, moved)
        if then is not None:
            # Burst against burst at a load the pool ran at before: its efficiency there
            # is what it was at those bursts, so the load, not a change, moved it (a
            # change that made bursts worse leaves it worse than then, and pages).
            return "info", (
                f" at a burst like earlier ones ({_METRIC_WORDS.get(metric, metric)} then"
                f" {then:.4g} at that load; per-layer efficiency unchanged)"
            )
        fell = _less_work_offered(metric, before, after, load, moved, inc.drained())
        if fell:
            return "info", f" as {fell} (less work offered; per-layer efficiency unchanged)"
        return sev, ""

    def _novel_load(
        self, inc: Incident, metric: str, moved: set[str], suggestion: Suggestion
    ) -> float:
        """How far above any load the pool ran at before it a load-normalised efficiency
        drop began (0.0: not so). Only without a change to blame, without a hardware
        fault, and at `OVERLOAD_RATIO` above the highest earlier minute (the pool's
        bursts before this one and before the grouping window)."""
        if metric not in LOAD_SENSITIVE or metric in QUEUEING or suggestion.action == "rollback":
            return 0.0
        if _hardware_fault(moved):
            return 0.0
        return self._unseen_load(inc)

    def _as_at_earlier_bursts(
        self, inc: Incident, metric: str, after: float, moved: set[str]
    ) -> float | None:
        """The level the pool's aggregate showed at earlier bursts at this incident's load,
        where its devices' level now is no worse than that by the metric's reporting floor
        (None: not so, not a burst, or no earlier burst at that load).

        Only for per-layer efficiency that dropped as the offered load rose, without a
        hardware fault. The load model forgets over minutes, so a burst an hour after the
        last one reads against calm; earlier bursts say what this load does."""
        if metric not in EFFICIENCY or not inc.layers or inc.model is None:
            return None  # the exposure keeps the per-layer efficiency columns only
        if _hardware_fault(moved) or not offered_load_rose(inc.load_ratio(), moved):
            return None
        exposure = self.advisor.exposure
        peak = exposure.peak_load(inc.pool, inc.onset_ts, _found(inc))
        then = exposure.earlier_level(
            (inc.pool, inc.model, inc.layers[0]), metric, peak,
            inc.onset_ts - inc.group_window_s, OVERLOAD_RATIO,
        )  # fmt: skip
        if then is None:
            return None
        return then if _no_worse(metric, after, then) else None

    def _capacity_bound(
        self,
        inc: Incident,
        at: tuple[str, float],
        moved: set[str],
        classed: set[str],
        suggestion: Suggestion,
    ) -> str:
        """How what the pool did bounds a backlog a change came right before, in words for
        the summary ("": it does not, and the change explains it); `at`: the metric and
        the offered load.

        A queue grows with the load, so where the pool's queue is no longer than it was
        at the nearest higher load it ran at, that load bounds what this one does, and a
        rule that holds requests back queues them longer (`_backlog_bound`). Failures
        that grew in an overload already shedding when the change came moved with
        capacity, judged on the change's mechanism (`_sheds_into_overload`)."""
        metric, load = at
        bound = self._backlog_bound(inc, metric, load, moved, classed)
        if bound is not None:
            return (
                f" (the pool's {_METRIC_WORDS.get(metric, metric)} {bound[0]:.4g}; it was"
                f" {bound[1]:.4g} at a higher load before)"
            )
        shed = self._sheds_into_overload(inc, suggestion)
        if shed is None:
            return ""
        return (
            f" (its pool's overload was shedding requests {(inc.onset_ts - shed) / 60:.1f}"
            " min before; at the admission limit failures are the offered load beyond"
            " capacity)"
        )

    def _backlog_bound(
        self, inc: Incident, metric: str, load: float, moved: set[str], classed: set[str]
    ) -> tuple[float, float] | None:
        """(the pool's level now, its level at the nearest higher load it ran at before)
        where queueing alone rose with the offered load and is no worse than that earlier
        level by the metric's reporting floor (None: not so, or not known).

        Queueing grows with the load (as rho / (1 - rho) near capacity), so at a higher
        load the same service queues at least as long: a change that only sent more load
        leaves the queue within what the pool showed at a higher load, while one that holds
        requests back (an admission rule) or slows their service queues them longer.

        A queue found as the offered load fell is the backlog of the load before the fall
        (a backlog carries over from window to window): its load is the peak from the
        lead a cause may have before the onset, where that backlog was built; its level is
        read from the first minute after the onset's (each minute keeps the level at its
        peak load, which in the onset's minute was before the fall)."""
        if metric not in BACKLOG or classed & _NORMALISED or _hardware_fault(moved):
            return None
        drains = load < 1.0 - SERVED_RISE
        if inc.model is None or not (offered_load_rose(load, moved) or drains):
            return None
        exposure = self.advisor.exposure
        key = (inc.pool, inc.model)
        built = inc.onset_ts - LEAD_WINDOWS * inc.window_s if drains else inc.onset_ts
        peak = exposure.peak_load(inc.pool, built, _found(inc))
        then = exposure.backlog_bound(key, metric, peak, inc.onset_ts - inc.group_window_s)
        since = (math.floor(inc.onset_ts / BIN_S) + 1) * BIN_S if drains else inc.onset_ts
        now = exposure.backlog_since(key, metric, since, max(since, _found(inc)))
        if then is None or now is None:
            return None
        return (now, then) if _no_worse(metric, now, then) else None

    def _shedding_overloads(self, incidents: list[Incident]) -> _Shedding:
        """Per pool, its open overload records whose devices shed requests, as (alert id,
        the median onset of their failures)."""
        out: _Shedding = {}
        for inc in incidents:
            sent = self.states.get(inc.alert_id or "")
            if not inc.paging or sent is None or sent.bottleneck != "overload":
                continue
            onsets = [p.onset_ts for p in inc.points if p.metric in SHEDDING and p.is_regression]
            if onsets and inc.alert_id is not None:
                out.setdefault(inc.pool, []).append((inc.alert_id, float(median(onsets))))
        return out

    def _sheds_into_overload(self, inc: Incident, suggestion: Suggestion) -> float | None:
        """When the open overload of `inc`'s pool began to shed, where `inc`'s failures
        grew in it after the change `suggestion` names landed (None: not so).

        At its admission limit a pool sheds the offered load beyond its capacity: a change
        that landed while it was shedding moves how much (a model that costs more per
        request, a slower kernel), and the failures alone cannot tell which. A slower
        service shows its own mechanism (per-layer efficiency, a kernel, a clock), judged
        and paged on that; what is left is capacity, as the overload was before the
        change. Failures a release causes at a load the pool serves page as ever."""
        if inc.primary_metric not in SHEDDING or suggestion.change_id is None:
            return None
        sent = self.states.get(inc.alert_id or "")
        if sent is not None and sent.shedding is not None:
            return sent.shedding
        landed = next((c.ts for c in self.advisor.changes if c.id == suggestion.change_id), None)
        if landed is None:
            return None
        began = min(
            (o for aid, o in self.shedding.get(inc.pool, ()) if aid != inc.alert_id and o < landed),
            default=None,
        )
        if sent is not None:
            sent.shedding = began
        return began

    def _load_novelty(self, inc: Incident) -> float:
        """The peak offered load from the incident's onset to its first detection over the
        highest minute of its pool's look-back before its grouping window (1.0: unknown)."""
        return self.advisor.exposure.novelty(
            inc.pool, inc.onset_ts, _found(inc), inc.onset_ts - inc.group_window_s
        )

    def _served(self, inc: Incident) -> float:
        """The work its pool's devices served from the incident's onset to its first
        detection over the grouping window before it (1.0: unknown, as on a training
        pool, which reports no request rate)."""
        return self.advisor.exposure.served_ratio(
            inc.pool, inc.onset_ts, _found(inc), inc.group_window_s
        )

    def _unseen_load(self, inc: Incident) -> float:
        """`_load_novelty` where it is at least `OVERLOAD_RATIO` (0.0: not so, or unknown)."""
        ratio = self._load_novelty(inc)
        return ratio if ratio >= OVERLOAD_RATIO else 0.0

    @staticmethod
    def _not_judged(inc: Incident) -> list[NotJudged]:
        """The stages the incident's devices could not show failing, for lack of fields:
        each device as its newest point found it (the points carry their device's mask, so
        the fleet stage, which holds no stream table, says the same)."""
        newest: dict[str, ChangePoint] = {}
        for p in inc.points:
            if p.fields >= 0 and (
                p.device not in newest or p.detected_ts >= newest[p.device].detected_ts
            ):
                newest[p.device] = p
        return not_judged(p.fields for p in newest.values())


def _found(inc: Incident) -> float:
    """When `inc`'s primary metric was first found, or its onset where that is later: the
    end of the span its load and levels are read over, from its onset. The onset is the
    median of its devices', so a device found early (at a burst before the change that
    moved the rest) can date the first detection before it, and the span would be empty."""
    return max(inc.found_ts, inc.onset_ts)


def _no_worse(metric: str, now: float, then: float) -> bool:
    """Whether `now` is no worse than `then` by the metric's reporting floor."""
    floor = MIN_REL_CHANGE.get(metric, DEFAULT_MIN_REL_CHANGE) * abs(then)
    return (now - then) * BAD_DIRECTION.get(metric, 0) <= floor


def tolerance(metric: str, s: AlertSettings) -> float:
    """How far from its level before a metric may be and count as recovered (relative).

    An error rate (quality) is noisy in relative terms: within its materiality floor it
    is no regression, so it is back.
    """
    if metric in COMPLEMENT:
        return max(s.resolve_tolerance, MIN_REL_CHANGE.get(metric, 0.0))
    return s.resolve_tolerance


def _classed(inc: Incident, support: dict[tuple[Stage, str, str | None], list[ChangePoint]],
             *, load_rose: bool = True) -> set[str]:  # fmt: skip
    """What moved, as the bottleneck class reads it when the offered load rose, or fell
    under a backlog (`load_rose` False: a burst's backlog draining).

    A collective's waits follow the traffic when it rose (`Incident.confirmed_at`); when it
    did not they are a mechanism on however few devices, as a collective couples its
    members (a few members waiting longer can be all of them slowing). A mechanism seen on
    fewer than half as many devices as the incident covers (the rule that picks its
    primary metric) cannot be why all of them queue: the load is (a burst, or the backlog
    one left), and that mechanism, if real, is an incident of its own. Where the pool's
    aggregate queues, the incident covers the pool. One seen on the pool aggregate is
    pool-wide. Nor can one whose median onset is more than
    `LEAD_WINDOWS` after the incident's: a cause comes first, as a change must to explain
    a queue (`render`).
    """
    n = len(inc.devices)
    if _pool_backlog(inc) & QUEUEING:
        # The pool's aggregate queues: the whole pool does, found on its devices or not
        # (a detector finds a burst's queue on a few of them first), so a mechanism must
        # show on half of the pool to be why.
        n = max(n, inc.pool_size)
    latest = inc.onset_ts + LEAD_WINDOWS * inc.window_s

    def counts(metric: str, pts: list[ChangePoint]) -> bool:
        if metric == "sync_frac":
            return not load_rose
        return metric in BACKLOG | LOAD_FOLLOWING or (
            median(p.onset_ts for p in pts) <= latest
            and (any(p.is_aggregate for p in pts) or 2 * len({p.device for p in pts}) >= n)
        )

    return {metric for (_, metric, _), pts in support.items() if counts(metric, pts)}


def _reports(inc: Incident, field: int) -> bool:
    """Whether the incident's devices' records carry `field` (a `coverage.BIT`)."""
    return any(p.fields >= 0 and p.fields & field for p in inc.points)


def _reports_queue(inc: Incident) -> bool:
    """Whether the incident's devices report the time requests wait in their queue."""
    return _reports(inc, _QUEUE_WAIT_FIELD)


def _serving(inc: Incident) -> bool:
    """Whether the incident's devices serve requests (their records carry a request rate):
    replicas that each serve on their own, not the ranks of one synchronous job."""
    return _reports(inc, _REQ_RATE_FIELD)


def _less_work_offered(
    metric: str, before: float, after: float, load: float, moved: set[str], drained: bool
) -> str:
    """How a device-MFU drop is the offered work's fall, in words ("": it is not).
    Devices do the work they are given: served FLOPs fall with the requests (hosts
    joining the pool, traffic ebbing), by at most the load's own fall at the same work
    per request, and devices that served a backlog at full speed slow to the offered
    rate once it drains (a burst ending), whatever the served rate's detector has shown
    yet. Only with nothing else moved but what follows load: no queue grew (a slower
    service at capacity serves less too, and its queue grows) and no per-layer
    efficiency or mechanism moved."""
    if metric != "device_mfu" or not moved <= LOAD_FOLLOWING | LOAD_METRICS:
        return ""
    if load < 1.0 - SERVED_RISE and after >= load * before:
        return f"the offered load fell to x{load:.2f}"
    return "its queue drained" if drained else ""


def _unblamed_failures(sev: Severity, metric: str, suggestion: Suggestion) -> Severity:
    """At most a ticket for failures with no change to blame and no backlog seen: a pool
    whose queue sat at its admission limit from its streams' start never shows the queue
    step that would name them shed, so nothing tells them from a failing dependency."""
    if sev == "page" and metric in SHEDDING and suggestion.action != "rollback":
        return "ticket"
    return sev


def _pool_backlog(inc: Incident) -> set[str]:
    """Queueing and what follows load that rose on the pool's aggregates as the incident
    began: a pool-wide backlog, which sheds failures on devices whose own queue ratio is
    still withheld or never stepped (a stream born in a burst)."""
    lo, hi = inc.onset_ts - LEAD_WINDOWS * inc.window_s, inc.onset_ts + inc.group_window_s
    return {
        e.metric
        for e in inc.evidence
        if e.is_aggregate
        and e.is_regression
        and e.metric in QUEUEING | LOAD_FOLLOWING
        and lo <= e.onset_ts <= hi
    }


def _mechanisms(
    inc: Incident, support: dict[tuple[Stage, str, str | None], list[ChangePoint]] | None = None
) -> dict[tuple[str, str | None], list[ChangePoint]]:
    """What moved with an incident besides a backlog (queueing, shedding), load and what
    follows load, by (metric, layer): its mechanism, with the points that show it (of
    `support`, the incident's `supporting()` where already at hand)."""
    return {
        (metric, layer): pts
        for (_, metric, layer), pts in (support or inc.supporting()).items()
        if metric not in BACKLOG | LOAD_FOLLOWING | LOAD_METRICS
    }


_REQ_RATE_FIELD = BIT["req_rate"]
_QUEUE_WAIT_FIELD = BIT["queue_wait_ms"]
# What a pool serving slower moves: its queue and latency, the requests a full queue sheds,
# and the work its devices serve.
SERVED_SLOWER = BACKLOG | LOAD_FOLLOWING

# Per-layer efficiency judged against the load model's expectation: at a load never run
# at, that expectation is an extrapolation.
_NORMALISED = LOAD_SENSITIVE - QUEUEING - LOAD_FOLLOWING - {"sync_frac"}

# What a hardware fault shows on its own devices: its physical indicators, and what a
# clock moves (`AlertLifecycle._consequence_of`).
_FAULT_SHOWS = frozenset({"clock_mhz", "temp_c", "power_w"}) | CLOCK_BOUND


@dataclass(frozen=True, slots=True)
class _Shown:
    """What an open, paged incident already shows on-call: where it began, its devices,
    its mechanisms (`_mechanisms`), and whether it is a hardware fault."""

    onset_ts: float
    devices: frozenset[str]
    mechanisms: frozenset[tuple[str, str | None]]
    hardware: bool

    @classmethod
    def of(cls, inc: Incident) -> _Shown:
        """What `inc`, open and paged, shows."""
        support = inc.supporting()
        return cls(
            onset_ts=inc.onset_ts,
            devices=frozenset(inc.devices),
            mechanisms=frozenset(_mechanisms(inc, support)),
            hardware=_is_hardware(inc, support),
        )

    def shows_mechanism(self, p: ChangePoint) -> bool:
        """Whether `p` is a mechanism this page moved, on its devices or the pool aggregate."""
        return (p.metric, p.layer) in self.mechanisms and (
            p.is_aggregate or p.device in self.devices
        )

    def covers(self, p: ChangePoint, served: bool) -> bool:
        """Whether `p` is this page's mechanism going on: a hardware fault's indicators on
        its own devices; for an incident about serving slower (`served`), a mechanism it
        moved (`shows_mechanism`)."""
        if self.hardware and p.metric in _FAULT_SHOWS and p.device in self.devices:
            return True
        return served and self.shows_mechanism(p)


_Paged = dict[tuple[str | None, str | None], list[_Shown]]


def _paged(incidents: list[Incident]) -> _Paged:
    """What each open, paged incident shows, by (pool, model)."""
    out: _Paged = {}
    for inc in incidents:
        if inc.paging:
            out.setdefault((inc.pool, inc.model), []).append(_Shown.of(inc))
    return out


def _shown_before(inc: Incident, paged: _Paged) -> list[_Shown]:
    """The pages of `inc`'s pool and model that began before it."""
    return [s for s in paged.get((inc.pool, inc.model), ()) if s.onset_ts < inc.onset_ts]


def _beside_pages(
    support: dict[tuple[Stage, str, str | None], list[ChangePoint]],
    shown: list[_Shown],
    primary: str,
) -> dict[tuple[Stage, str, str | None], list[ChangePoint]]:
    """`support` less what earlier open pages already show (`_Shown.covers`).

    One mechanism, one page, at every record, not only the first (`_consequence_of`):
    a throttling device's clock steps down further when a burst heats it, and a paged
    placement regression spills more at a burst. Points like these join the burst's
    incident by moving in the same minutes, and would make its queue a regression. The
    incident's headline metric stays its own.
    """
    if not shown:
        return support
    served = primary in SERVED_SLOWER
    out = {}
    for key, pts in support.items():
        own = pts
        if key[1] != primary:
            own = [p for p in pts if not any(s.covers(p, served) for s in shown)]
        if own:
            out[key] = own
    return out


def _faults_first(incidents: list[Incident]) -> list[tuple[int, Incident]]:
    """`incidents` by position, the hardware faults that have not paged yet first.

    A throttling device slows the job it is part of, so its fault and its peers' slower
    steps can become sure in the same record; judged first, the fault's page is open when
    the peers' incident asks whether a page already shows its mechanism
    (`AlertLifecycle._consequence_of`), whichever the incident list holds first.
    """

    def new_fault(inc: Incident) -> bool:
        return inc.status == "open" and inc.alert_id is None and _is_hardware(inc)

    return sorted(enumerate(incidents), key=lambda x: not new_fault(x[1]))


def _held(alert: Alert, sent: AlertState) -> Alert:
    """`alert` at no lower a severity than its incident's records already had.

    Alertmanager tells alerts apart by their labels, severity among them: a page whose
    next record is a ticket resolves the page there, and the page after it notifies
    again, one incident paging twice while nothing recovered. A view that grew to a
    host, or a throttling member that left the job's waiting share, is no recovery; only
    resolution ends a page. A capacity record (`overload`) is the exception: it says the
    page was load, not a regression, and must read so. A cooling fault whose devices'
    clock stepped down since (`AlertLifecycle._escalate`) pages.
    """
    if sent.throttled and alert.severity != "page" and alert.bottleneck != "overload":
        alert = msgspec.structs.replace(
            alert,
            severity="page",
            summary=f"{alert.summary}; since then the clock stepped down on "
            f"{', '.join(sent.throttled[:3])}{' ...' if len(sent.throttled) > 3 else ''}"
            " (work is lost)",
        )
    if (
        sent.severity is None
        or alert.bottleneck == "overload"
        or _RANK[alert.severity] >= _RANK[sent.severity]
    ):
        return alert
    return msgspec.structs.replace(alert, severity=sent.severity)


def _throttled(inc: Incident) -> list[ChangePoint]:
    """Clock step-downs in `inc`'s support and evidence around its onset (a throttle)."""
    lo, hi = inc.onset_ts - LEAD_WINDOWS * inc.window_s, inc.onset_ts + inc.group_window_s
    return [
        p for p in (*inc.points, *inc.evidence)
        if p.metric == "clock_mhz" and p.is_regression and lo <= p.onset_ts <= hi
    ]  # fmt: skip


def _shows_fault_of(throttled: list[ChangePoint], hw: Incident) -> bool:
    """Whether any of these clock step-downs is on `hw`'s devices or hosts."""
    return any(p.device in hw.devices or p.host in hw.hosts for p in throttled)


def _awaits_fault(inc: Incident, incidents: list[Incident], sure_at: dict[int, float]) -> bool:
    """Whether `inc` must wait for a hardware fault's first page before it is judged.

    A throttling device slows the job it is part of: its peers' slower steps and its own
    fault are one mechanism, and the peers' incident can become sure a record or two
    before the fault's, which settles for as long as its detections keep coming. When
    `inc` itself saw the clock step down on the devices of such a fault (open, sure, not
    yet judged, of the same pool and model), it waits for that fault's page; then
    `AlertLifecycle._consequence_of` finds the page already showing it, whichever of the
    two the detectors finished first. A hardware fault never waits, so none waits forever
    on another that waits on it.
    """
    if _is_hardware(inc):
        return False
    throttled = _throttled(inc)
    if not throttled:
        return False
    return any(
        hw is not inc
        and hw.status == "open"
        and hw.alert_id is None
        and id(hw) in sure_at
        and (hw.pool, hw.model) == (inc.pool, inc.model)
        and _is_hardware(hw)
        and _shows_fault_of(throttled, hw)
        for hw in incidents
    )


def _is_hardware(
    inc: Incident, support: dict[tuple[Stage, str, str | None], list[ChangePoint]] | None = None
) -> bool:
    """Whether `inc` is a hardware fault: a cooling fault, or a clock step-down with heat or
    power in its support (`support`: `inc.supporting()`, when already at hand)."""
    if inc.primary_metric in HEAT:
        return True
    moved = {m for _, m, _ in (inc.supporting() if support is None else support)}
    return _hardware_fault(moved)


def _hardware_fault(moved: set[str]) -> bool:
    """The clock stepped down and heat or power moved with the primary metric: independent
    physical indicators agree, so even one device is a real fault (it does not heal, and
    the bounded step, cordoning it, is cheap), whatever its share of the pool."""
    return "clock_mhz" in moved and bool(moved & {"temp_c", "power_w"})


def _share(
    inc: Incident,
    n_pool: int,
    level: ScopeLevel,
    bottleneck: str,
    support: dict[tuple[Stage, str, str | None], list[ChangePoint]],
    moved: set[str],
) -> float:
    """The share of its pool an incident weighs for severity."""
    share = len(inc.devices) / n_pool if n_pool else 1.0
    if level == "pool" and n_pool:
        # The devices found so far are a lower bound: streams too young or noisy to
        # show the shift one by one still move their pool's mean, which tells the
        # share of the pool that moved (`Incident.aggregate_share`, as the scope), and
        # so does the spread of the upstream cause the found devices show
        # (`Incident.cause_share`): the same cause costs its devices the same.
        share = max(share, inc.aggregate_share(n_pool), inc.cause_share(n_pool))
    if (
        bottleneck == "synchronisation"
        and any(layer in COMM_LAYERS for _, _, layer in support)
        and "device_mfu" in moved
        and not _serving(inc)
    ):
        # A collective is as slow as its slowest member: every rank of the job waits
        # at the barrier for the host that is late, so the whole pool loses the time.
        # That loss is work not done, so the devices' MFU falls with it. Waits that
        # rose while their devices' work did not (a host's members waiting a little
        # longer for one of their own) have cost the job nothing measurable yet:
        # they are sized by their devices, as any other metric is. So are a serving
        # pool's: its replicas serve requests each on its own, so a slow one loses
        # its own devices' work, not the pool's.
        share = 1.0
    return share


def _steady(load: float) -> bool:
    """The served rate moved less than its reporting floor (`SERVED_RISE`) either way: the
    devices' work did not fall or rise with the requests sent to them."""
    return abs(math.log(load)) < math.log1p(SERVED_RISE) if load > 0 else False


def _link_fault(support: dict[tuple[Stage, str, str | None], list[ChangePoint]], need: int) -> bool:
    """`need` devices of one host wait longer at their collective or do less work, at
    least one of them both, and nothing they run computes slower: the host's link
    degraded. The host loses work on enough of its devices to confirm an incident
    (`alerts.min_devices`; one device waiting is as likely a peer waiting for a slower
    member whose own slowdown is not in the incident), and two independent counters
    agree on a device of them (the collective's wait timer and the FLOPs done: a link a
    few per cent slower lowers each device's MFU by about that much, which not every
    detector finds at once; a device's share of time in the collective is noisy, and its
    wait is found on fewer devices than its FLOPs): a device doing less work at the same
    compute speed (no layer's MFU fell) idles, and the wait timer says where. And no
    throttle or slower compute explains the waits (the clock stepping down, a compute
    layer's MFU falling), so it is a hardware fault like a throttle: it pages at the scope
    it has, whatever its share of the pool, with "drain the host" as the bounded step.
    Only for an incident still of host scope once its grouping window has passed (waits
    that rose over many hosts at once, found a few minutes apart, are the traffic's or
    the job's, not one host's link) and at a steady offered load (`_steady`): a serving
    device's work follows its requests, and its collective's waits a burst."""

    def devices(metric: str, comm: bool | None) -> set[tuple[str | None, str]]:
        return {
            (p.host, p.device) for (_, m, layer), pts in support.items()
            if m == metric and (comm is None or (layer in COMM_LAYERS) == comm)
            for p in pts if p.is_regression and not p.is_aggregate
        }  # fmt: skip

    if devices("mfu", False) or devices("clock_mhz", None):
        return False
    waits, less = devices("sync_frac", True), devices("device_mfu", None)
    both = waits & less
    hosts = Counter(host for host, _ in waits | less)
    return any(hosts[host] >= need for host, _ in both)


def _medians(pts: list[ChangePoint]) -> tuple[float, float]:
    """Levels before and after: the medians over the points."""
    return float(median(p.before for p in pts)), float(median(p.after for p in pts))


def _spans(pts: list[ChangePoint]) -> tuple[float, float]:
    """Levels before and after a climb found in steps (heat rises over the cooling's time
    constant): per device, before its first step and after its last; medians over them."""
    last: dict[str, ChangePoint] = {}
    for p in sorted(pts, key=lambda q: q.onset_ts):
        last[p.device] = p
    return (
        float(median(p.before for p in _first_per_device(pts))),
        float(median(p.after for p in last.values())),
    )


def heat_severity(
    before: float, after: float, page_loss: float, bottleneck: str, served: float = 1.0
) -> Severity:
    """ticket or info for heat no power explains: at the same power a die sits at
    inlet + R * power, so 1 - before/after (°C) is a lower bound on the share of its
    cooling lost (the inlet is above 0 °C). Losing `page_loss` of it is worth a ticket;
    it pages only once the clock steps down too (`_hardware_fault`): until then no work
    is lost, whatever the share of the pool. Heat that rose with a backlog (`overload`)
    is the work the backlog brought, as any overload is: an info capacity record.

    `served`: the work its pool's devices served since, over before (the request rate).
    Power is idle power plus a part that grows with the work, so work x`served` (at
    least 1) draws at most x`served` the power, and the same cooling holds the die at
    most x`served` as far above 0 °C: only heat beyond that shows cooling lost."""
    if bottleneck == "overload":
        return "info"
    lost = 1.0 - max(served, 1.0) * before / after if after > 0 else 0.0
    return "ticket" if lost >= page_loss else "info"


def guardrail(what: str, metric: str, before: float, s: AlertSettings) -> str:
    """The bound that says a rollback worked: the metric back within tolerance of before."""
    sign = judged_sign(metric)
    bound = judged(metric, judged(metric, before) * (1 + tolerance(metric, s) * sign))
    if metric in COMPLEMENT:
        sign = -sign  # the bound is quoted on the metric's own scale
    return (
        f"{what} back to {'>=' if sign < 0 else '<='} {bound:.3g} within "
        f"{s.resolve_windows} windows, else undo and escalate"
    )


def severity(
    metric: str,
    before: float,
    after: float,
    delta_pct: float,
    share: float,
    bottleneck: str,
    page_loss: float,
) -> Severity:
    """page, ticket or info from the share of the healthy level lost times the pool share.

    Lost is the relative drop for down-is-bad metrics (MFU) and 1 - before/after for
    up-is-bad ones (latency x2 loses half of the service rate; quality on its error
    rate: ten times the errors loses 90 %) and 1 - (1 - after)/(1 - before) for a share
    of time spent waiting (`TIME_SHARES`), in [0, 1], so a queue
    growing 500x on one device cannot outrank a pool-wide 15% MFU drop. Overload is
    capacity for offered load, not a regression: an info record for the owners.
    """
    sign = judged_sign(metric)
    lost = abs(delta_pct) / 100.0
    before, after = judged(metric, before), judged(metric, after)
    if sign > 0 and metric in TIME_SHARES and before < 1.0:
        lost = max(0.0, 1.0 - (1.0 - after) / (1.0 - before))
    elif sign > 0 and after > 0:
        lost = max(0.0, 1.0 - before / after)
    loss = lost * share
    sev: Severity = "page" if loss >= page_loss else "ticket" if loss >= page_loss / 5 else "info"
    if bottleneck == "overload":
        return "info"  # a capacity record for the owners, never a regression page
    return sev


def summary(
    inc: Incident,
    level: ScopeLevel,
    what: str,
    delta_pct: float,
    suggestion: Suggestion,
    bottleneck: str,
    load: float,
    levels: tuple[float, float] | None = None,
) -> str:
    """The one-line summary: what moved, where, and after which change (or under what load).

    A rate of failures near 0 has no telling relative size: `levels` (before, after), where
    given, quote the move as from one level to the other.
    """
    devices = sorted(inc.devices)
    pools = sorted({p.pool or "" for p in inc.points})
    where = {
        "fleet": f"{len(pools)} pools ({', '.join(pools)}; {len(devices)} devices)",
        "pool": f"pool {inc.pool} ({len(devices)} devices)",
        "host": f"host {inc.main_host()} ({len(devices)} devices)",
        "device": f"device {devices[0]}"
        if len(devices) == 1
        else f"{len(devices)} devices of pool {inc.pool}",
    }[level]
    after = f" after {suggestion.kind} {suggestion.to}->{suggestion.from_}"
    cause = (
        f" under offered load x{load:.2f} (capacity){after}"
        if suggestion.action == "rollback" and bottleneck == "overload"
        else after if suggestion.action == "rollback"
        else f" under offered load x{load:.2f} (capacity)" if bottleneck == "overload" and load > 1
        else " (capacity: per-layer efficiency unchanged)" if bottleneck == "overload"
        else ""
    )  # fmt: skip
    slow = sorted(inc.stragglers()) if bottleneck == "thermal_power" else []
    if slow:
        cause += f", waiting at the collective for throttling {', '.join(slow[:5])}"
        cause += f" (+{len(slow) - 5} more)" if len(slow) > 5 else ""
    moved = f"from {levels[0]:.2g} to {levels[1]:.2g}" if levels else f"{delta_pct:+.1f}%"
    return f"{what} {moved} on {where}{cause}"


def _evidence(inc: Incident) -> list[Evidence]:
    """One line per (stage, indicator, layer) that moved with the incident: device medians,
    then the pool aggregates that moved at its onset (indicator prefixed `pool_`)."""
    pooled: dict[tuple[Stage, str, str | None], list[ChangePoint]] = {}
    for p in inc.evidence:
        if p.is_aggregate and abs(p.onset_ts - inc.onset_ts) <= 2 * inc.window_s:
            pooled.setdefault((p.stage, f"pool_{p.metric}", p.layer), []).append(p)
    out = [
        Evidence(
            stage=stage,
            indicator=indicator,
            layer=layer,
            before=round(float(median(p.before for p in ps)), 6),
            after=round(float(median(p.after for p in ps)), 6),
            onset_ts=float(median(p.onset_ts for p in ps)),
            score=round(float(max(p.score for p in ps)), 3),
        )
        for groups in (inc.supporting(), pooled)
        for (stage, indicator, layer), ps in groups.items()
    ]
    out.sort(key=lambda e: (e.onset_ts, STAGES.index(e.stage), e.indicator, e.layer or ""))
    return out


def _first_per_device(pts: list[ChangePoint]) -> list[ChangePoint]:
    """Each device's earliest point (by onset; the first listed of a tie)."""
    first: dict[str, ChangePoint] = {}
    for p in pts:
        q = first.get(p.device)
        if q is None or p.onset_ts < q.onset_ts:
            first[p.device] = p
    return list(first.values())


def _window_sums(
    inc: Incident,
    views: list[NormView],
    metric: str | None = None,
    pts: list[ChangePoint] | None = None,
) -> dict[float, tuple[float, int, float, int]]:
    """Per window in these views: (sum, count) of the normalised metric and of the batch
    over the streams of `pts` (the primary metric over the incident's headline streams
    unless given); non-finite values left out."""
    metric = metric or inc.primary_metric
    on_layer = metric in LAYER_METRICS
    col = (LAYER_METRICS if on_layer else DEVICE_METRICS).index(metric)
    pts = inc.headline_points() if pts is None else pts
    ts_parts, v_parts, b_parts = [], [], []
    kind = "layer" if on_layer else "device"
    for view in views:
        f = view.frame
        rows, ts, vals, load = (
            (f.layer_rows, f.layer_ts, view.norm[kind], f.layer_load)
            if on_layer
            else (f.device_rows, f.device_ts, view.norm[kind], f.device_load)
        )
        mask = np.isin(rows, np.array([p.row for p in pts if p.partition == view.partition]))
        ts_parts.append(ts[mask])
        v_parts.append(vals[mask, col])
        b_parts.append(load[mask, 0])
    if not ts_parts:
        return {}
    win_ts, inv = np.unique(np.concatenate(ts_parts), return_inverse=True)
    out = []
    for values in (np.concatenate(v_parts), np.concatenate(b_parts)):
        ok = np.isfinite(values)
        out.append(np.bincount(inv[ok], weights=values[ok], minlength=win_ts.size))
        out.append(np.bincount(inv[ok], minlength=win_ts.size))
    return {
        float(t): (float(v), int(n), float(b), int(m))
        for t, v, n, b, m in zip(win_ts, *out, strict=True)
    }


def _hold(
    st: AlertState, after: float, sums: dict[float, tuple[float, int, float, int]], at: int
) -> None:
    """Add windows' sums (`_window_sums`) later than `after` to the pending ones, from
    position `at` (0: the primary metric and batch; 4: the heat)."""
    for t, (v, n, b, m) in sums.items():
        if t <= after:
            continue
        held = st.pending.setdefault(t, [0.0] * _PENDING)
        held[at] += v
        held[at + 1] += n
        if at == 0:
            held[2] += b
            held[3] += m


def _complete(st: AlertState, streams: int, reached: float) -> Iterator[tuple[float, list[float]]]:
    """The pending windows complete (all `streams` reported, or every active partition
    passed it), oldest first, each taken out as it is given; one not complete holds the
    later ones back."""
    for t in sorted(st.pending):
        sums = st.pending[t]
        if sums[1] < streams and t >= reached:
            return
        del st.pending[t]
        st.observed_ts = t
        if sums[1]:
            yield t, sums

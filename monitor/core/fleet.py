"""The fleet stage: one fleet-scope alert across replicas (`kafka.fleet_stage`).

With `repartition` each replica sees whole pools and none sees the fleet: a regression
on every pool (a driver rolled out everywhere) would page once per pool. With
`fleet_stage` on, every replica publishes one `Report` per batch to
`topics.change_points`, all under one key (`FLEET_KEY`), so one partition holds them
all: its material change points, the event time and (pool, model) device counts of the
input partitions it processed, the device counts of the hosts of those points, and the
alerts it sent. The group member that owns that partition runs this stage over them:
the daemon's own correlator and alert lifecycle over the change points of every pool,
the lifecycle in `only` mode (`lifecycle.FleetMode`). It links the incidents of
different pools exactly as one daemon holding the whole fleet would, and sends only the
fleet-scope alert, under the id that daemon would give it (`lifecycle.fingerprint` of
"fleet", model, metric, first failing stage and onset window, as of the moment it was
sure), naming the replicas' pool alerts in `pool_alerts`. The replicas' lifecycles link
nothing (`off`): each pool pages at pool scope on its replica, whichever pools that
replica holds, and the fleet alert stands beside those pages.

Recovery is the replicas' judgement (they hold the streams): the fleet alert resolves
once the pool alert it names for each of its pools has resolved (a pool whose replica
sent no matching alert within the grouping window after the fleet page does not keep it
open).

Pure, like the pipeline: no I/O and no clock; time is the replicas' event time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgspec

from monitor.config import Settings
from monitor.core.advisor import Advisor
from monitor.core.correlator import ChangePoint, Correlator, Incident
from monitor.core.lifecycle import AlertLifecycle, PoolKey
from monitor.core.state import (
    STATE_VERSION,
    FleetSnapshot,
    PoolPage,
    decode,
    encode,
    incident_records,
    incidents_of,
)
from monitor.core.types import DeadLetter, RawMessage
from monitor.wire import Alert

REPORT_VERSION = 1
# The key of every report: the fleet is one, so one partition (and one member) holds them.
FLEET_KEY = b"fleet"


class Report(msgspec.Struct, frozen=True):
    """What one replica's batch tells the fleet stage (msgpack on `topics.change_points`)."""

    v: int
    partitions: dict[int, float]  # input partition -> event time it reached
    pools: dict[int, list[tuple[str | None, str | None, int]]]  # ... its (pool, model, devices)
    hosts: dict[str, int]  # devices per host, for the hosts of `points`
    points: list[ChangePoint]  # the batch's material change points
    pages: list[PoolPage]  # the batch's alert records (none of fleet scope)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Report)


def encode_report(report: Report) -> bytes:
    """A report's bytes on the change-point topic."""
    return _encoder.encode(report)


def page_of(alert: Alert) -> PoolPage:
    """What the fleet stage keeps of a replica's alert record."""
    return PoolPage(alert.id, alert.status, alert.ts, alert.scope.pool, alert.scope.model,
                    alert.metric, alert.onset_ts)  # fmt: skip


def _key(p: ChangePoint) -> tuple[object, ...]:
    """What makes a change point the same one when a replica sends it again (a restart
    re-reads records it had processed)."""
    return (p.device, p.metric, p.layer, p.onset_ts, p.detected_ts)


class FleetStage:
    """Fleet-scope correlation over the reports of every replica (see the module doc)."""

    def __init__(self, settings: Settings, advisor: Advisor) -> None:
        self.settings = settings
        self.group_window_s = settings.alerts.group_window_s
        self.correlator = Correlator(self.group_window_s)
        self.correlator.new_cause = advisor.new_cause
        self.lifecycle = AlertLifecycle(settings.alerts, advisor, fleet="only")
        # The change-point partition this state belongs to (None: none read or restored).
        self.partition: int | None = None
        self.partition_ts: dict[int, float] = {}
        self.pools: dict[int, dict[PoolKey, int]] = {}
        self.hosts: dict[str | None, int] = {}
        self.pages: dict[str, PoolPage] = {}  # newest record of each replica alert heard
        self.named: dict[str, dict[str, str]] = {}  # fleet alert id -> pool -> pool alert id
        self._sent_names: dict[str, tuple[str, ...]] = {}
        self._seen: dict[tuple[object, ...], float] = {}  # change points taken, by key
        self._to_restate: list[Incident] = []
        self.restored_ids: set[str] = set()
        self.reports = 0  # reports taken
        self.rejected = 0  # reports that could not be read (dead-lettered)

    # -- the stage -------------------------------------------------------------------------
    def add(
        self, messages: Sequence[RawMessage], *, replaying: bool = False
    ) -> tuple[list[Alert], list[DeadLetter]]:
        """Take a batch of reports; returns the fleet alerts due and the unreadable reports.

        `replaying`: the batch re-reads reports taken before a restart; the restored fleet
        alerts are sent again only after that.
        """
        dead: list[DeadLetter] = []
        points: list[ChangePoint] = []
        for msg in messages:
            self.partition = msg.partition
            try:
                report = _decoder.decode(msg.value)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self.rejected += 1
                dead.append(DeadLetter(msg, f"change_points: {exc}"[:1024]))
                continue
            if report.v != REPORT_VERSION:
                self.rejected += 1
                dead.append(DeadLetter(msg, f"change_points: report version {report.v}, this "
                                            f"build reads {REPORT_VERSION}"))  # fmt: skip
                continue
            self.reports += 1
            self._take(report, points)
        if not self.partition_ts:
            return [], dead
        now = self.watermark()
        counts = self.pool_counts()
        out: list[Alert] = []
        if self._to_restate and not replaying:
            out.extend(self.lifecycle.restate(self._to_restate, now, counts))
            self._to_restate = []
        self.correlator.add(points, now, counts)
        live = [i for i in self.correlator.incidents if i.status == "open"]
        if live:
            out.extend(self.lifecycle.due(live, now, counts, self.hosts))
        self._match_pages()
        out.extend(self._resolve(now, counts))
        out = self._with_names(out, now, counts)
        self.correlator.drop_resolved(now, keep_s=4 * self.group_window_s)
        kept = {i.alert_id for i in self.correlator.incidents if i.alert_id}
        self.lifecycle.keep(kept)
        self.named = {k: v for k, v in self.named.items() if k in kept}
        self._sent_names = {k: v for k, v in self._sent_names.items() if k in kept}
        self._prune(now)
        if replaying and self.restored_ids:
            out = [a for a in out if a.id not in self.restored_ids or a.status == "resolved"]
        elif not replaying:
            self.restored_ids.clear()
        return out, dead

    def _take(self, report: Report, points: list[ChangePoint]) -> None:
        for part, ts in report.partitions.items():
            self.partition_ts[part] = max(self.partition_ts.get(part, ts), ts)
        for part, rows in report.pools.items():
            self.pools[part] = {(pool, model): n for pool, model, n in rows}
        self.hosts.update(report.hosts)
        for p in report.points:
            key = _key(p)
            if key not in self._seen:
                self._seen[key] = p.detected_ts
                points.append(p)
        for page in report.pages:
            old = self.pages.get(page.id)
            if old is None or page.ts >= old.ts:
                self.pages[page.id] = page

    def watermark(self) -> float:
        """Event time every active input partition reached (`Pipeline.watermark`'s rule)."""
        if not self.partition_ts:
            return 0.0
        high = max(self.partition_ts.values())
        skew = self.settings.alerts.max_skew_s
        return min(t for t in self.partition_ts.values() if t >= high - skew)

    def pool_counts(self) -> dict[PoolKey, int]:
        """Known devices per (pool, model) over every replica's input partitions."""
        c: Counter[PoolKey] = Counter()
        for counts in self.pools.values():
            c.update(counts)
        return dict(c)

    def _fleet_incidents(self) -> list[Incident]:
        return [i for i in self.correlator.incidents
                if i.alert_id is not None and i.parent is None and i.children]  # fmt: skip

    def _match_pages(self) -> None:
        """Name, per pool of each fleet incident, the replica's alert for it: same pool and
        model, onset within the grouping window (the nearest; then the lowest id)."""
        for inc in self._fleet_incidents():
            assert inc.alert_id is not None  # noqa: S101 - filtered above
            names = self.named.setdefault(inc.alert_id, {})
            for m in (inc, *inc.children):
                pool = m.pool or ""
                if pool in names:
                    continue
                onset = m.onset_ts
                cands = [p for p in self.pages.values()
                         if p.pool == m.pool and p.model == m.model
                         and abs(p.onset_ts - onset) <= self.group_window_s]  # fmt: skip
                if cands:
                    names[pool] = min(cands, key=lambda p: (abs(p.onset_ts - onset), p.id)).id

    def _resolve(self, now: float, counts: dict[PoolKey, int]) -> list[Alert]:
        """Resolve the fleet alerts whose named pool alerts have all resolved."""
        out: list[Alert] = []
        for inc in self.correlator.incidents:
            if not inc.paging or inc.alert_id is None:
                continue
            members = (inc, *inc.children)
            names = self.named.get(inc.alert_id, {})
            pages = [self.pages.get(pid) for pid in names.values()]
            if not pages or any(p is None or p.status != "resolved" for p in pages):
                continue
            unnamed = [m for m in members if (m.pool or "") not in names]
            if unnamed and now - inc.detected_ts <= self.group_window_s:
                continue  # their replicas may still send their alerts
            state = self.lifecycle.state(inc)
            t = max([state.sent_ts, *(p.ts for p in pages if p is not None)])
            for m in members:
                m.status = "resolved"
                m.resolved_ts = t
            state.sent_ts = t
            n = sum(m.pool_devices(counts) for m in members)
            out.append(self.lifecycle.render(inc.merged(), t, n, "resolved", level="fleet"))
        return out

    def _with_names(self, out: list[Alert], now: float, counts: dict[PoolKey, int]) -> list[Alert]:
        """Every fleet alert record with the pool alerts it names; a paging fleet alert that
        names more than its last record did is sent again."""
        sent = {a.id for a in out}
        again = [i for i in self._fleet_incidents() if i.paging and i.alert_id not in sent
                 and self._names(i.alert_id) != self._sent_names.get(i.alert_id or "")]  # fmt: skip
        out = out + self.lifecycle.restate(again, now, counts)
        named: list[Alert] = []
        for a in out:
            names = self._names(a.id)
            self._sent_names[a.id] = names
            named.append(msgspec.structs.replace(a, pool_alerts=list(names)) if names else a)
        return named

    def _names(self, alert_id: str | None) -> tuple[str, ...]:
        return tuple(sorted(set(self.named.get(alert_id or "", {}).values())))

    def _prune(self, now: float) -> None:
        """Forget change points and replica alerts too old to matter (a named one is kept)."""
        horizon = now - 4 * self.group_window_s
        if self._seen and min(self._seen.values()) < horizon:
            self._seen = {k: t for k, t in self._seen.items() if t >= horizon}
        keep = {pid for names in self.named.values() for pid in names.values()}
        self.pages = {pid: p for pid, p in self.pages.items()
                      if pid in keep or p.ts >= horizon or p.status == "firing"}  # fmt: skip

    # -- checkpoints and hand-over ----------------------------------------------------------
    def snapshot(self) -> bytes:
        """The stage's state as checkpoint bytes (stored with its change-point partition)."""
        pools = {part: [(pool, model, n) for (pool, model), n in c.items()]
                 for part, c in self.pools.items()}  # fmt: skip
        return encode(
            FleetSnapshot(
                STATE_VERSION,
                incident_records(self.correlator.incidents),
                self.correlator.recent,
                self.lifecycle.states,
                dict(self.partition_ts),
                pools,
                {h: n for h, n in self.hosts.items() if h is not None},
                list(self.pages.values()),
                self.named,
            )
        )

    def restore(self, blob: bytes, partition: int) -> None:
        """Take the state `snapshot` saved (StateVersionError: another version's); the next
        batch sends the fleet alerts still firing once more."""
        snap = decode(blob, FleetSnapshot)
        self.forget()
        self.partition = partition
        self.correlator.incidents = incidents_of(snap.incidents)
        for inc in self.correlator.incidents:
            inc.group_window_s = self.group_window_s
        self.correlator.recent = list(snap.recent)
        self.lifecycle.states = dict(snap.alerts)
        self.partition_ts = dict(snap.partition_ts)
        self.pools = {part: {(pool, model): n for pool, model, n in rows}
                      for part, rows in snap.pools.items()}  # fmt: skip
        self.hosts = {}
        for host, n in snap.hosts.items():
            self.hosts[host] = n
        self.pages = {p.id: p for p in snap.pages}
        self.named = {k: dict(v) for k, v in snap.named.items()}
        self._sent_names = {k: self._names(k) for k in self.named}
        held = (
            *self.correlator.recent,
            *(p for i in self.correlator.incidents for p in (*i.points, *i.evidence, *i.load)),
        )
        self._seen = {_key(p): p.detected_ts for p in held}
        self._to_restate = [i for i in self.correlator.incidents if i.paging]
        self.restored_ids = {i.alert_id for i in self._to_restate if i.alert_id is not None}

    def forget(self) -> list[str]:
        """Drop all state (the partition went to another member, which restores it from its
        checkpoint); returns the ids of the fleet alerts that were firing here."""
        gone = [i.alert_id for i in self.correlator.incidents if i.paging and i.alert_id]
        self.correlator = Correlator(self.group_window_s)
        self.correlator.new_cause = self.lifecycle.advisor.new_cause
        self.lifecycle.states = {}
        self.partition = None
        self.partition_ts, self.pools, self.hosts, self.pages = {}, {}, {}, {}
        self.named, self._sent_names, self._seen = {}, {}, {}
        self._to_restate, self.restored_ids = [], set()
        return gone

"""The fleet stage in process: replicas' reports in, the single-daemon fleet alert out."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from factories import fleet

from monitor.config import KafkaSettings, Settings
from monitor.core.fleet import FLEET_KEY, REPORT_VERSION, FleetStage, Report, encode_report
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from monitor.wire import Alert

STAGE = Settings(kafka=KafkaSettings(fleet_stage=True))
POINTS = STAGE.kafka.topics.change_points


def by_pool(batches: list[list[RawMessage]]) -> list[list[RawMessage]]:
    """Each pool on its own input partition, as `repartition` puts it (0: train-a)."""
    return [[m if m.topic == "flopwatch.changes"
             else msgspec.structs.replace(m, partition=0 if b'"train-a"' in m.value else 1)
             for m in batch] for batch in batches]  # fmt: skip


def rollout(
    pool: str = "*", windows: int = 90, fixed_at: int | None = None
) -> list[list[RawMessage]]:
    """A driver rolled out everywhere at window 48; MFU down 15 % on `pool` from window 49
    (until `fixed_at`, then healthy again)."""
    bad = fleet(windows, regress_at=49, change_at=48, regress_pool=pool, change_kind="driver",
                change_scope={}, kernel_fallback=False)  # fmt: skip
    if fixed_at is not None:
        bad = bad[:fixed_at] + fleet(windows, seed=1)[fixed_at:]
    return by_pool(bad)


def single(batches: list[list[RawMessage]]) -> list[Alert]:
    """What one daemon holding the whole fleet sends (no fleet stage)."""
    p = Pipeline(Settings())
    return [a for b in batches for a in p.process(b).alerts]


@dataclasses.dataclass
class Replicas:
    """Two replicas, one pool each; replica 0 also holds the change-point partition."""

    pipelines: tuple[Pipeline, Pipeline] = dataclasses.field(
        default_factory=lambda: (Pipeline(STAGE), Pipeline(STAGE)))  # fmt: skip
    alerts: list[tuple[int, Alert]] = dataclasses.field(default_factory=list)
    offset: int = 0

    def run(self, batches: list[list[RawMessage]]) -> None:
        """Each window to both (each its own pool), the reports of one batch to replica 0
        with the next."""
        pending: list[RawMessage] = []
        for batch in [*batches, []]:
            mine = [[m for m in batch if m.topic != "flopwatch.samples" or m.partition == i]
                    for i in (0, 1)]  # fmt: skip
            mine[0] += pending
            pending = []
            for i, (p, msgs) in enumerate(zip(self.pipelines, mine, strict=True)):
                out = p.process(msgs)
                assert not out.dead
                self.alerts += [(i, a) for a in out.alerts]
                for r in out.reports:
                    pending.append(RawMessage(POINTS, 0, self.offset, FLEET_KEY, r))
                    self.offset += 1

    def level(self, level: str) -> list[Alert]:
        return [a for _, a in self.alerts if a.scope.level == level]


def test_a_rollout_on_every_pool_is_one_fleet_alert_under_the_single_daemon_id() -> None:
    batches = rollout()
    want = single(batches)
    assert {a.scope.level for a in want} == {"fleet"}
    r = Replicas()
    r.run(batches)
    fleet_alerts = r.level("fleet")
    assert {a.id for a in fleet_alerts} == {want[0].id}
    # The record the one daemon sends first, and where it ends, but for the pool alerts
    # they name (a fleet record is sent again when it names a new pool alert, and with
    # it the devices found by then).
    bare = [msgspec.structs.replace(a, pool_alerts=[]) for a in fleet_alerts]
    assert bare[0] == want[0]
    key = [(a.id, a.severity, a.scope, a.metric, a.first_failing_stage, a.suggestion)
           for a in (bare[-1], want[-1])]  # fmt: skip
    assert key[0] == key[1]
    assert bare[-1].delta_pct == pytest.approx(want[-1].delta_pct, abs=0.1)
    # Sent by the replica holding the change-point partition; each replica pages its pool.
    assert {i for i, a in r.alerts if a.scope.level == "fleet"} == {0}
    pools = {(i, a.scope.pool) for i, a in r.alerts if a.scope.level == "pool"}
    assert pools == {(0, "train-a"), (1, "train-b")}
    assert fleet_alerts[-1].pool_alerts == sorted({a.id for a in r.level("pool")})


def test_a_regression_on_one_pool_is_no_fleet_alert() -> None:
    r = Replicas()
    r.run(rollout("train-a"))
    assert not r.level("fleet")
    assert {a.scope.pool for _, a in r.alerts} == {"train-a"}
    stage = r.pipelines[0].fleet
    assert stage is not None
    assert stage.reports > 0
    assert [i.pool for i in stage.correlator.incidents if i.status == "open"] == ["train-a"]


def test_a_replica_holding_both_pools_pages_each_and_leaves_the_fleet_to_the_stage() -> None:
    """With the fleet stage on, a replica links nothing itself: whatever pools it holds
    page at pool scope, and the stage (here the same member) sends the fleet alert."""
    p = Pipeline(STAGE)
    alerts: list[Alert] = []
    offset = 0
    for batch in rollout():
        out = p.process(batch)
        alerts += out.alerts
        msgs = [RawMessage(POINTS, 0, offset + k, FLEET_KEY, r) for k, r in enumerate(out.reports)]
        offset += len(msgs)
        alerts += p.process(msgs).alerts
    assert {(a.scope.level, a.scope.pool) for a in alerts} == {
        ("pool", "train-a"), ("pool", "train-b"), ("fleet", None)}  # fmt: skip
    assert {a.id for a in alerts if a.scope.level == "fleet"} == {single(rollout())[0].id}


def test_the_fleet_alert_resolves_once_its_pool_alerts_have() -> None:
    batches = rollout(windows=150, fixed_at=80)
    r = Replicas()
    r.run(batches)
    pool_ends = {a.id: a.ts for a in r.level("pool") if a.status == "resolved"}
    assert len(pool_ends) == 2
    fleet_alerts = r.level("fleet")
    assert [a.status for a in fleet_alerts][-1] == "resolved"
    assert [a.status for a in fleet_alerts].count("resolved") == 1
    assert fleet_alerts[-1].ts == max(pool_ends.values())
    assert fleet_alerts[-1].pool_alerts == sorted(pool_ends)


def test_the_stage_restores_from_its_checkpoint_and_sends_its_page_again() -> None:
    r = Replicas()
    r.run(rollout())
    stage = r.pipelines[0].fleet
    assert stage is not None
    (paged,) = {a.id for a in r.level("fleet")}
    blob = stage.snapshot()
    heir = Pipeline(STAGE)
    heir.restore_fleet(0, blob)
    assert heir.fleet is not None
    # A report re-read from before the checkpoint's offset: nothing is sent again yet...
    again = Report(REPORT_VERSION, {0: max(stage.partition_ts.values())}, {}, {}, [], [])
    replayed = heir.process([RawMessage(POINTS, 0, 1, FLEET_KEY, encode_report(again))],
                            replaying=True)  # fmt: skip
    assert not replayed.alerts
    # ... then the first batch after it sends the page once more, naming the pool pages.
    out = heir.process([RawMessage(POINTS, 0, 2, FLEET_KEY, encode_report(again))])
    assert [(a.id, a.status, a.scope.level) for a in out.alerts] == [(paged, "firing", "fleet")]
    assert out.alerts[0].pool_alerts == r.level("fleet")[-1].pool_alerts
    assert heir.forget_fleet() == [paged]
    assert heir.handed_over == [paged]


def test_an_unreadable_report_is_a_dead_letter() -> None:
    stage = FleetStage(STAGE, Pipeline(STAGE).advisor)
    bad = RawMessage(POINTS, 0, 7, FLEET_KEY, b"\x93not a report")
    alerts, dead = stage.add([bad])
    assert not alerts
    assert [d.message for d in dead] == [bad]
    assert dead[0].reason.startswith("change_points: ")
    assert (stage.rejected, stage.reports) == (1, 0)


def test_without_the_option_nothing_is_reported() -> None:
    p = Pipeline(Settings())
    assert p.fleet is None
    assert not any(p.process(b).reports for b in rollout(windows=60))


def staggered(gap: int) -> list[list[RawMessage]]:
    """train-a drops at window 49 after the rollout, train-b `gap` windows later."""
    a = fleet(90, regress_at=49, change_at=48, regress_pool="train-a", change_kind="driver",
              change_scope={}, kernel_fallback=False)  # fmt: skip
    b = fleet(90, regress_at=49 + gap, regress_pool="train-b", kernel_fallback=False, seed=3)
    return by_pool([
        [m for m in ba if m.topic == "flopwatch.changes" or b'"train-a"' in m.value]
        + [m for m in bb if m.topic != "flopwatch.changes" and b'"train-b"' in m.value]
        for ba, bb in zip(a, b, strict=True)
    ])  # fmt: skip


def test_a_pool_that_paged_alone_first_keeps_its_id_and_the_fleet_alert_has_its_own() -> None:
    """The one documented difference from a single daemon: when train-a pages before
    train-b is sure (4 windows later), that daemon turns train-a's alert into the fleet
    alert under train-a's id. Across replicas that id is train-a's replica's pool alert, so
    the stage sends its fleet alert under the fleet fingerprint instead: one fleet id, never
    one shared with a pool alert."""
    batches = staggered(4)
    one = single(batches)
    (first,) = {a.id for a in one}
    assert {a.scope.level for a in one} == {"pool", "fleet"}
    r = Replicas()
    r.run(batches)
    pool_ids = {a.scope.pool: a.id for a in r.level("pool")}
    assert pool_ids["train-a"] == first
    fleet_ids = {a.id for a in r.level("fleet")}
    assert len(fleet_ids) == 1
    assert not fleet_ids & set(pool_ids.values())
    assert r.level("fleet")[-1].pool_alerts == sorted(pool_ids.values())

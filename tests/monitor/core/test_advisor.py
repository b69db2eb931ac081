"""Advisor: which change explains an incident, and the next step when none does."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.core.advisor import NEXT_STEP, Advisor, bottleneck_class
from monitor.core.correlator import ChangePoint, Correlator, Incident
from monitor.wire import ChangeEvent, ChangeScope, Stage

T0, W = 1_000_000.0, 10.0


def _incident(devices: int = 8, host_per_device: bool = True) -> Incident:
    inc = Incident("train-a", "llama@v1", T0, T0 + 2 * W, W)
    for i in range(devices):
        host = f"h{i}" if host_per_device else "h0"
        inc.points.append(ChangePoint(
            device=f"{host}/gpu{i}", host=host, pool="train-a", model="llama@v1",
            layer="attention", metric="mfu", stage="execution", onset_ts=T0,
            detected_ts=T0 + 2 * W, before=0.5, after=0.4, score=2.0, window_s=W,
        ))  # fmt: skip
    return inc


def _change(cid: str, ts: float, kind: str = "kernel_lib", **scope: str) -> ChangeEvent:
    return ChangeEvent(v=1, ts=ts, id=cid, kind=kind,  # type: ignore[arg-type]
                       scope=ChangeScope(**scope or {"pool": "train-a"}),
                       from_="1", to="2")  # fmt: skip


def test_the_latest_fitting_change_before_the_onset_is_rolled_back() -> None:
    """Kind fits the stage, scope covers the devices, landed by the first bad window; a
    change after that, of another pool, or of a kind that cannot cause it never is."""
    adv = Advisor()
    for c in (
        _change("old", T0 - 3600),
        _change("fit", T0 - 60),
        _change("late", T0 + 2 * W),
        _change("elsewhere", T0 - 30, pool="train-b"),
        _change("wrong-kind", T0 - 20, kind="model"),
    ):
        adv.add_change(c)
    adv.add_change(_change("fit", T0 - 60))  # a repeat is ignored
    s = adv.suggest(_incident(), "lowering", "kernel_selection", "guard")
    assert (s.action, s.change_id, s.from_, s.to) == ("rollback", "fit", "2", "1")
    assert s.confidence == 0.6  # two fitting changes in the look-back: less sure
    assert [c.id for c in adv.candidates(_incident(), "lowering")] == ["fit", "old"]


def test_a_pool_wide_change_does_not_explain_a_single_host() -> None:
    """A rollout to the whole pool that hurt one host would have hurt the pool."""
    adv = Advisor()
    adv.add_change(_change("pool", T0 - 60, kind="driver"))
    adv.add_change(_change("host", T0 - 50, kind="driver", host="h0"))
    one_host = _incident(4, host_per_device=False)
    assert [c.id for c in adv.candidates(one_host, "execution", "host")] == ["host"]
    assert [c.id for c in adv.candidates(one_host, "execution", "pool")] == ["host", "pool"]


@pytest.mark.parametrize("bottleneck", sorted(NEXT_STEP))
def test_without_a_change_the_next_step_is_a_bounded_hypothesis(bottleneck: str) -> None:
    s = Advisor().suggest(_incident(), "execution", bottleneck, "guard")
    assert s.action == NEXT_STEP[bottleneck][0]
    assert s.change_id is None
    assert s.guardrail == f"hypothesis: {NEXT_STEP[bottleneck][1]}; guard"


@pytest.mark.parametrize(
    ("stage", "moved", "load", "expected"),
    [
        ("ingress", {"queue_wait_ms", "temp_c"}, 1.5, "overload"),
        ("ingress", {"queue_wait_ms"}, 1.0, "overload"),  # served rate capped at capacity
        ("ingress", {"queue_wait_ms", "mfu"}, 2.0, "ingress"),  # efficiency moved too
        ("lowering", {"mfu"}, 1.0, "kernel_selection"),
        ("scheduling", {"sram_hit"}, 1.0, "memory_locality"),
        ("validation", {"quality"}, 1.0, "quality"),
        ("validation", {"error_rate"}, 1.0, "errors"),  # failures alone: no backlog
        ("ingress", {"queue_wait_ms", "error_rate"}, 1.0, "overload"),  # shed by a full queue
        ("execution", {"temp_c", "error_rate"}, 1.0, "overload"),  # shed as the load heats
        ("validation", {"error_rate", "req_rate"}, 1.0, "overload"),  # as the offered load rose
        ("validation", {"error_rate", "quality"}, 1.0, "quality"),
        ("validation", {"lat_p99_ms"}, 1.0, "overload"),
        ("validation", {"lat_p99_ms", "sram_hit"}, 1.0, "contention"),
        ("execution", {"sync_frac", "clock_mhz"}, 1.0, "synchronisation"),
        ("execution", {"clock_mhz", "temp_c"}, 1.0, "thermal_power"),
        ("execution", {"stall_frac"}, 1.0, "memory_locality"),
        ("execution", {"mfu"}, 1.0, "unclassified"),
    ],
)
def test_bottleneck_decision_matrix(stage, moved, load, expected) -> None:
    assert bottleneck_class(stage, moved) == expected
    assert expected in NEXT_STEP


def test_latency_with_its_queue_held_is_service_time_not_overload() -> None:
    """Latency is queue wait plus service: where the queue is reported and held, a latency
    rise with less work done is the devices' slowdown, not a backlog and not contention."""
    slower = {"device_mfu", "lat_p50_ms", "lat_p99_ms"}
    assert bottleneck_class("execution", slower) == "overload"
    assert bottleneck_class("execution", slower, queue_held=True) == "unclassified"
    assert bottleneck_class("execution", slower | {"sync_frac"}, queue_held=True) == (
        "synchronisation"
    )
    queued = slower | {"queue_wait_ms"}  # the queue moved: backlog whatever the flag says
    assert bottleneck_class("execution", queued, queue_held=True) == "overload"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(-5000, 5000)), max_size=60),
    st.integers(-3000, 8000),
    st.integers(-3000, 8000),
)
def test_indexed_changes_match_a_plain_scan(events, prune_at, onset) -> None:
    """The binary-searched index keeps what a linear scan and a full sort would: repeats
    ignored, (ts, id) order, pruning and the look-back window alike."""
    adv = Advisor(lookback_s=1000.0)
    plain: dict[str, ChangeEvent] = {}
    for i, t in events:
        ev = _change(f"c{i}", T0 + t)
        adv.add_change(ev)
        plain.setdefault(ev.id, ev)
    adv.prune(T0 + prune_at)
    kept = sorted(
        (c for c in plain.values() if (T0 + prune_at) - c.ts <= 2000.0), key=lambda c: (c.ts, c.id)
    )
    assert adv.changes == kept
    inc = _incident()
    inc.points = [replace(p, onset_ts=T0 + onset) for p in inc.points]
    want = [c for c in kept if T0 + onset - 1000.0 <= c.ts <= T0 + onset + W][::-1]
    assert adv.candidates(inc, "lowering") == want
    adv.add_change(_change("fresh", T0 + 9000))
    assert adv.changes[-1].id == "fresh"


def test_a_change_the_pool_ran_through_for_hours_is_not_rolled_back() -> None:
    """A driver updated three hours before the onset, with the training pool running
    healthy in between, passed that test: no rollback; the same change right before the
    onset is suggested."""
    adv = Advisor()
    old = _change("old-driver", T0 - 3 * 3600, kind="driver")
    adv.add_change(old)
    t = T0 - 3 * 3600
    while t < T0 + 3 * W:
        adv.exposure.observe("train-a", t, float("nan"))
        t += W
    assert adv.candidates(_incident(), "execution") == []
    adv.add_change(_change("new-driver", T0 - 20, kind="driver"))
    assert [c.id for c in adv.candidates(_incident(), "execution")] == ["new-driver"]
    # Without observations (a restart) the plain look-back applies.
    fresh = Advisor()
    fresh.add_change(old)
    assert [c.id for c in fresh.candidates(_incident(), "execution")] == ["old-driver"]


def test_a_regression_after_its_own_change_opens_its_own_incident() -> None:
    """An admission-policy change lands while an overload incident of the pool is open; the
    queueing regression after it has a cause of its own and does not join that incident.
    A change that could still be the open incident's own cause (within two windows of
    its onset) does not split it."""
    adv = Advisor()
    corr = Correlator()
    corr.new_cause = adv.new_cause

    def queue_pt(device: str, onset: float) -> ChangePoint:
        return ChangePoint(
            device=device, host=device[:2], pool="serve", model="m@1", layer=None,
            metric="queue_wait_ms", stage="ingress", onset_ts=onset, detected_ts=onset + 2 * W,
            before=50.0, after=400.0, score=5.0, window_s=W,
        )  # fmt: skip

    corr.add([queue_pt(f"h{i}/gpu0", T0) for i in range(4)], T0 + 3 * W)
    (first,) = corr.incidents
    adv.add_change(_change("near", T0 + W, kind="traffic_policy", pool="serve"))
    corr.add([queue_pt("h4/gpu0", T0 + 2 * W)], T0 + 5 * W)
    assert len(corr.incidents) == 1  # `near` may be its own cause: the same incident
    adv.add_change(_change("policy", T0 + 120, kind="traffic_policy", pool="serve"))
    corr.add([queue_pt(f"h{i}/gpu0", T0 + 130) for i in range(4)], T0 + 150)
    assert len(corr.incidents) == 2
    assert len(first.points) == 5
    # A change of a kind that cannot move queueing (a driver) splits nothing.
    adv.add_change(_change("drv", T0 + 200, kind="driver", pool="serve"))
    corr.add([queue_pt(f"h{i}/gpu0", T0 + 210) for i in range(4, 6)], T0 + 230)
    assert len(corr.incidents) == 2


def _split_after(
    evidence: str, change_pool: str, kind: str = "kernel_lib", stage: Stage = "lowering"
) -> list[Incident]:
    """An all-reduce wait incident opens; a change of `kind` lands in `change_pool` two
    minutes later; then, in one batch, `evidence` rises and MFU falls on the attention
    layer of four other devices. The incidents that result."""
    adv = Advisor()
    corr = Correlator()
    corr.new_cause = adv.new_cause

    def pt(i: int, metric: str, layer: str, stage: Stage, onset: float, before: float,
           after: float) -> ChangePoint:  # fmt: skip
        return ChangePoint(
            device=f"h{i}/gpu0", host=f"h{i}", pool="train-a", model="llama@v1", layer=layer,
            metric=metric, stage=stage, onset_ts=onset, detected_ts=onset + 2 * W,
            before=before, after=after, score=5.0, window_s=W,
        )  # fmt: skip

    waits = [pt(i, "sync_frac", "allreduce", "execution", T0, 0.2, 0.3) for i in range(4)]
    corr.add(waits, T0 + 3 * W)
    adv.add_change(_change("kl", T0 + 120, kind=kind, pool=change_pool))
    up = [pt(i, evidence, "attention", stage, T0 + 130, 0.0, 0.4) for i in range(4, 8)]
    mfu = [pt(i, "mfu", "attention", "execution", T0 + 130, 0.5, 0.42) for i in range(4, 8)]
    corr.add(up + mfu, T0 + 150)
    return corr.incidents


def test_a_change_that_degraded_its_own_stage_splits_what_follows_downstream() -> None:
    """A kernel library change cannot explain an execution point by itself, but once the
    pool shows it degrading lowering (a fallback), the MFU drop after it is that change's,
    not more of an open incident of all-reduce waits: an incident of its own, first
    failing stage lowering. A kernel's new name alone (a harmless switch), a change of
    another pool, or a queue after a traffic policy change (a burst grows one whatever
    changed) splits nothing."""
    first, own = _split_after("fallback_frac", "train-a")
    assert {p.metric for p in first.points} == {"sync_frac"}
    assert {p.metric for p in own.points} == {"mfu"}
    assert len(own.points) == 4
    assert own.first_failing_stage() == "lowering"
    for evidence, pool in (("kernel", "train-a"), ("fallback_frac", "train-b")):
        (joined,) = _split_after(evidence, pool)
        assert {p.metric for p in joined.points} == {"sync_frac", "mfu"}
    (joined,) = _split_after("queue_depth", "train-a", "traffic_policy", "ingress")
    assert {p.metric for p in joined.points} == {"sync_frac", "mfu"}


def test_a_shift_dated_across_a_gap_may_have_begun_anywhere_in_it() -> None:
    """A device's data stops at T0 and comes back shifted 7 windows later: its onset is
    dated T0 (the last window before), but the shift may have begun at any time in the
    gap. A change that landed in the gap may be its cause (a rollback candidate), and the
    devices found after that change are more of the same incident, not one of their own.
    Without the gap the change came after the device's onset, and they split off."""
    gap_end = T0 + 7 * W
    change = _change("drv", T0 + 2.3 * W, kind="driver")

    def pt(i: int, onset: float, late: float) -> ChangePoint:
        return ChangePoint(
            device=f"h{i}/gpu0", host=f"h{i}", pool="train-a", model="llama@v1",
            layer="attention", metric="mfu", stage="execution", onset_ts=onset,
            detected_ts=gap_end + 5 * W, before=0.5, after=0.42, score=3.0, window_s=W,
            onset_late=late,
        )  # fmt: skip

    for late, incidents, rollback in ((gap_end - W, 1, "drv"), (T0, 2, None)):
        adv = Advisor()
        corr = Correlator()
        corr.new_cause = adv.new_cause
        adv.add_change(change)
        corr.add([pt(0, T0, late)], gap_end + 5 * W)
        assert corr.incidents[0].latest_onset == max(late, T0)
        assert [c.id for c in adv.candidates(corr.incidents[0], "execution")] == (
            [rollback] if rollback else []
        )
        corr.add([pt(i, T0 + 3 * W, T0 + 3 * W) for i in range(1, 5)], gap_end + 6 * W)
        assert len(corr.incidents) == incidents


def test_a_latency_that_rose_with_its_devices_queue_joins_that_queues_incident() -> None:
    """A quality drop on one device opens an incident; three minutes later an admission
    policy change queues the pool (an incident of its own, its own cause). The p99 of
    three devices, found after, rose at the very window their queues did: the queue's
    incident, though the quality one is older and still within its grouping window (on
    the old grouping, the first open incident that fit took them, and a one-device
    quality drop read as four devices)."""
    adv = Advisor()
    corr = Correlator()
    corr.new_cause = adv.new_cause

    def pt(i: int, metric: str, stage: Stage, onset: float, before: float, after: float,
           found: float) -> ChangePoint:  # fmt: skip
        return ChangePoint(
            device=f"h0/gpu{i}", host="h0", pool="serve", model="m@1", layer=None,
            metric=metric, stage=stage, onset_ts=onset, detected_ts=found, before=before,
            after=after, score=5.0, window_s=W,
        )  # fmt: skip

    corr.add([pt(2, "quality", "validation", T0, 0.970, 0.955, T0 + 15 * W)], T0 + 15 * W)
    (quality,) = corr.incidents
    onset = T0 + 21 * W
    adv.add_change(_change("policy", onset - 0.5 * W, kind="traffic_policy", pool="serve"))
    queues = [pt(i, "queue_wait_ms", "ingress", onset, 110.0, 365.0, onset + 4 * W)
              for i in range(8)]  # fmt: skip
    corr.add(queues, onset + 4 * W)
    lat = [pt(i, "lat_p99_ms", "validation", onset, 10_900.0, 12_100.0, onset + 6 * W)
           for i in (3, 5, 7)]  # fmt: skip
    corr.add(lat, onset + 6 * W)
    queue = next(i for i in corr.incidents if i is not quality)
    assert {p.metric for p in quality.points} == {"quality"}
    assert quality.devices == {"h0/gpu2"}
    assert {p.metric for p in queue.points} == {"queue_wait_ms", "lat_p99_ms"}
    # A device whose latency rose with no move of its own in the queue's incident joins the
    # first incident that fits, as before.
    corr.add([pt(2, "lat_p99_ms", "validation", onset + 8 * W, 10_900.0, 12_100.0,
                 onset + 10 * W)], onset + 10 * W)  # fmt: skip
    assert {p.metric for p in quality.points} == {"quality", "lat_p99_ms"}

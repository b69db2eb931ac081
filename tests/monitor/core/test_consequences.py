"""One mechanism, one page: a throttle dated from its heat, and what a paged mechanism slows
at the next burst joins its page instead of paging again."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import msgspec

from monitor.config import AlertSettings
from monitor.core.advisor import Advisor
from monitor.core.correlator import ChangePoint, Correlator, Incident
from monitor.core.coverage import BIT
from monitor.core.lifecycle import AlertLifecycle, _held
from monitor.indicators import STAGE_OF
from monitor.wire import Alert, ChangeEvent, ChangeScope

T0, W = 1_000_000.0, 10.0
POOL, MODEL = "vision", "resnet@v5"
HOT = "n7/gpu1"


def _pt(
    device: str, metric: str, before: float, after: float, onset: float, layer: str | None = None
) -> ChangePoint:
    return ChangePoint(
        device=device, host=device.split("/", maxsplit=1)[0], pool=POOL, model=MODEL,
        layer=layer, metric=metric, stage=STAGE_OF[metric], onset_ts=onset,
        detected_ts=onset + 2 * W, before=before, after=after, score=10.0, window_s=W,
    )  # fmt: skip


def _hot_device(clock: bool) -> list[ChangePoint]:
    """Cooling fails at T0: the temperature climbs for 14 windows, then (if `clock`) the
    clock steps down and the conv layer loses FLOP/s."""
    t = T0 + 14 * W
    pts = [_pt(HOT, "temp_c", 44.0, 86.0, T0), _pt(HOT, "mfu", 0.52, 0.48, t, "conv")]
    if clock:
        pts.append(_pt(HOT, "clock_mhz", 1840.0, 1730.0, t))
    return pts


def _lifecycle() -> AlertLifecycle:
    return AlertLifecycle(AlertSettings(), Advisor())


def test_heat_that_built_up_before_a_throttle_is_its_evidence_and_its_onset() -> None:
    """One device, temperature and clock with MFU: a hardware fault that pages whatever its
    share of the pool, dated from when the first indicator (the heat) moved."""
    corr = Correlator()
    corr.add(_hot_device(clock=True), T0 + 20 * W, {(POOL, MODEL): 8})
    (inc,) = corr.incidents
    alert = _lifecycle().render(inc, T0 + 20 * W, 8, "firing")
    assert alert.bottleneck == "thermal_power"
    assert alert.severity == "page"
    assert alert.onset_ts == T0
    assert "temp_c" in {e.indicator for e in alert.evidence}


def test_heat_long_before_an_mfu_drop_without_a_throttle_is_not_its_cause() -> None:
    """Without the clock stepping down, a temperature rise 14 windows earlier is outside
    the lead any cause has: the MFU drop is dated and judged on its own."""
    corr = Correlator()
    corr.add(_hot_device(clock=False), T0 + 20 * W, {(POOL, MODEL): 8})
    (inc,) = corr.incidents
    alert = _lifecycle().render(inc, T0 + 20 * W, 8, "firing")
    assert alert.onset_ts == T0 + 14 * W
    assert "temp_c" not in {e.indicator for e in alert.evidence}
    assert alert.severity != "page"


def _pool_slowdown(onset: float, clock: bool) -> list[ChangePoint]:
    """Later, at a burst, latency rises over the whole pool; with `clock`, the hot device's
    clock steps down further in the same window."""
    devs = [f"n7/gpu{i}" for i in range(8)]
    pts = [_pt(d, "lat_p99_ms", 60.0, 95.0, onset) for d in devs]
    pts += [_pt(d, "queue_wait_ms", 10.0, 14.0, onset) for d in devs]
    if clock:
        pts.append(_pt(HOT, "clock_mhz", 1730.0, 1310.0, onset))
        pts.append(dataclasses.replace(_pt(HOT, "temp_c", 86.0, 91.0, onset)))
    return pts


def _page_then(
    first_pts: list[ChangePoint], later_pts: list[ChangePoint], later: float,
    changes: tuple[ChangeEvent, ...] = (),
) -> tuple[list[str], list[str]]:  # fmt: skip
    """Ids of the first pages of `first_pts`, and of every firing record once `later_pts`
    (at `later`) came in; `changes` known to the advisor from the start."""
    corr, adv = Correlator(), Advisor()
    for c in changes:
        adv.add_change(c)
    life = AlertLifecycle(AlertSettings(), adv)
    corr.new_cause = adv.new_cause
    counts, hosts = {(POOL, MODEL): 8}, {"n7": 8}
    now = T0 + 20 * W
    corr.add(first_pts, now, counts)
    first = [a.id for a in life.due(corr.incidents, now, counts, hosts)]
    corr.add(later_pts, later + 3 * W, counts)
    after = life.due(corr.incidents, later + 4 * W, counts, hosts)
    return first, [a.id for a in after if a.status == "firing"]


def _run(clock: bool) -> tuple[list[str], list[str]]:
    """Ids of the first pages, and of every firing record after the pool's slowdown."""
    later = T0 + 200 * W
    return _page_then(_hot_device(clock=True), _pool_slowdown(later, clock), later)


def test_a_pool_slowed_by_a_paged_throttle_does_not_page_again() -> None:
    """The pool's latency rose because the paged device throttled deeper at a burst: one
    mechanism, one page, so nothing new goes to on-call."""
    first, after = _run(clock=True)
    assert len(first) == 1
    assert set(after) <= set(first)


def test_a_pool_slowdown_without_the_throttle_is_judged_on_its_own() -> None:
    """The same latency rise with the clock steady is not the throttle's: it opens and is
    judged as an incident of its own (a new id)."""
    first, after = _run(clock=False)
    assert len(first) == 1
    assert set(after) - set(first)


def _placement(onset: float) -> list[ChangePoint]:
    """KV placement moved to HBM on all 8 devices: attention spills and loses MFU."""
    devs = [f"n7/gpu{i}" for i in range(8)]
    pts = [_pt(d, "mfu", 0.30, 0.24, onset, "attention") for d in devs]
    pts += [_pt(d, "spill_frac", 0.01, 0.09, onset, "attention") for d in devs]
    return pts


def _burst_queue(onset: float, layer: str) -> list[ChangePoint]:
    """At a later burst the queue builds on every device, with `layer` spilling more."""
    devs = [f"n7/gpu{i}" for i in range(8)]
    pts = [_pt(d, "queue_wait_ms", 10.0, 30.0, onset) for d in devs]
    pts += [_pt(d, "spill_frac", 0.09, 0.15, onset, layer) for d in devs]
    return pts


def _burst_shedding(onset: float, layer: str) -> list[ChangePoint]:
    """At a later burst every device fails requests (its full queue sheds them), with
    `layer` spilling more."""
    devs = [f"n7/gpu{i}" for i in range(8)]
    pts = [_pt(d, "error_rate", 0.0001, 0.09, onset) for d in devs]
    pts += [_pt(d, "spill_frac", 0.09, 0.15, onset, layer) for d in devs]
    return pts


def _pages_after_burst(
    layer: str, burst: Callable[[float, str], list[ChangePoint]] = _burst_queue
) -> tuple[list[str], list[str]]:
    corr, life = Correlator(), _lifecycle()
    counts = {(POOL, MODEL): 8}
    corr.add(_placement(T0), T0 + 3 * W, counts)
    first = [a.id for a in life.due(corr.incidents, T0 + 4 * W, counts)]
    later = T0 + 300 * W
    corr.add(burst(later, layer), later + 3 * W, counts)
    after = [a for t in range(4, 40) for a in life.due(corr.incidents, later + t * W, counts)]
    return first, [a.id for a in after if a.status == "firing"]


def test_a_paged_mechanism_showing_again_as_a_bursts_queue_does_not_page_again() -> None:
    """The placement regression paged; at a burst its spill grows and the queue builds:
    that is the same mechanism at a higher load, already on on-call's screen."""
    first, after = _pages_after_burst("attention")
    assert len(first) == 1
    assert set(after) <= set(first)


def test_a_queue_behind_another_layers_mechanism_is_its_own_incident() -> None:
    """The same queue with another layer spilling is a mechanism the page never showed."""
    first, after = _pages_after_burst("mlp")
    assert len(first) == 1
    assert set(after) - set(first)


def test_requests_a_paged_mechanism_sheds_at_a_burst_do_not_page_again() -> None:
    """The placement regression paged; at a burst its spill grows and the full queue sheds
    requests: what serving slower moves, as the queue is, so no second alert. Failures
    behind another layer's spill are an incident of their own."""
    first, after = _pages_after_burst("attention", _burst_shedding)
    assert len(first) == 1
    assert set(after) <= set(first)
    first, after = _pages_after_burst("mlp", _burst_shedding)
    assert set(after) - set(first)


def _cycling(onset: float, devices: list[str]) -> list[ChangePoint]:
    """The stall share of the MLP layer up on these devices (the clock came back up)."""
    return [_pt(d, "stall_frac", 0.12, 0.43, onset, "mlp") for d in devices]


def _after_throttle(devices: list[str], changes: tuple[ChangeEvent, ...] = ()) -> tuple[
    list[str], list[str]
]:  # fmt: skip
    """Ids of a two-device throttle's first pages, and of the firing records after
    `_cycling` on `devices`."""
    throttle = _hot_device(clock=True)
    throttle += [dataclasses.replace(p, device="n7/gpu2") for p in throttle]
    later = T0 + 1400 * W
    return _page_then(throttle, _cycling(later, devices), later, changes)


def test_a_throttled_devices_efficiency_moving_again_does_not_page_again() -> None:
    """Four hours after a two-device throttle paged, the stall share of those devices and
    one neighbour jumps as their clocks cycle: the throttle's devices, no change of its
    own, so the open page covers it (`fleet_day`, seed 8, paged it as memory locality)."""
    first, after = _after_throttle([HOT, "n7/gpu2", "n7/gpu6"])
    assert len(first) == 1
    assert set(after) <= set(first)


def test_a_move_mostly_off_the_throttled_devices_or_with_its_own_change_pages() -> None:
    """Mostly on other devices, or with a driver change landed since the throttle, the same
    move is judged on its own and pages under a new id."""
    first, after = _after_throttle([HOT, "n7/gpu3", "n7/gpu4", "n7/gpu5"])
    assert set(after) - set(first)
    chg = ChangeEvent(
        v=1, ts=T0 + 1390 * W, id="chg-9", kind="driver",
        scope=ChangeScope(pool=POOL), from_="a", to="b",
    )  # fmt: skip
    first, after = _after_throttle([HOT, "n7/gpu2", "n7/gpu6"], (chg,))
    assert set(after) - set(first)


def _burst_then(
    paged: list[ChangePoint], step_on: str, step: tuple[tuple[str, str | None, float, float], ...]
) -> tuple[list[str], list[Alert]]:  # fmt: skip
    """`paged` pages; hours later a burst queues three devices, and after that incident's
    first record `step` ((metric, layer, before, after) on `step_on`) moves in the same
    minutes. The first page's ids, and the records after the step."""
    corr, life = Correlator(), _lifecycle()
    counts, hosts = {(POOL, MODEL): 8}, {"n7": 8}
    now = T0 + 20 * W
    corr.add(paged, now, counts)
    first = [a.id for a in life.due(corr.incidents, now, counts, hosts)]
    later = T0 + 1000 * W
    queued = ["n7/gpu0", "n7/gpu3", "n7/gpu4"]
    burst = [_pt(d, "lat_p99_ms", 60.0, 300.0, later) for d in queued]
    burst += [_pt(d, "queue_wait_ms", 10.0, 90.0, later) for d in queued]
    corr.add(burst, later + 3 * W, counts)
    assert [a.bottleneck for a in life.due(corr.incidents, later + 4 * W, counts, hosts)] == [
        "overload"
    ]
    moved = [
        dataclasses.replace(_pt(step_on, m, b, a, later + W, layer), detected_ts=later + 6 * W)
        for m, layer, b, a in step
    ]
    corr.add(moved, later + 6 * W, counts)
    return first, life.due(corr.incidents, later + 7 * W, counts, hosts)


_CLOCK_STEP = (("clock_mhz", None, 1730.0, 1560.0), ("device_mfu", None, 0.30, 0.27))


def test_a_throttled_devices_clock_at_a_burst_does_not_make_the_queue_a_regression() -> None:
    """The throttling device heats further at a burst and its clock steps down again as
    the pool queues: the paged fault going on, so the queue stays a capacity record
    (`fleet_day` seed 29 paged it as a regression)."""
    first, after = _burst_then(_hot_device(clock=True), HOT, _CLOCK_STEP)
    assert len(first) == 1
    assert after, "the queue's incident grew by a device: a record goes out"
    assert all(a.severity != "page" and a.bottleneck == "overload" for a in after), after


def test_a_clock_stepping_down_on_a_sound_device_at_a_burst_is_judged() -> None:
    """The same step on a device no open fault covers is judged as the queue's mechanism."""
    _, after = _burst_then(_hot_device(clock=True), "n7/gpu6", _CLOCK_STEP)
    assert [a.bottleneck for a in after] == ["thermal_power"]


def _spill(layer: str) -> tuple[tuple[str, str | None, float, float], ...]:
    return (("spill_frac", layer, 0.09, 0.15), ("device_mfu", None, 0.30, 0.27))


def test_a_paged_placement_spilling_more_after_a_bursts_first_record_stays_its_page() -> None:
    """The paged placement regression spills more on one of its devices a minute into a
    burst that had been recorded as capacity: its mechanism at a higher load, not a
    reason to page the queue (`fleet_day` seed 27 ticketed it as an ingress regression)."""
    first, after = _burst_then(_placement(T0), "n7/gpu6", _spill("attention"))
    assert len(first) == 1
    assert after
    assert all(a.bottleneck == "overload" for a in after), after
    _, after = _burst_then(_placement(T0), "n7/gpu6", _spill("mlp"))
    assert [a.bottleneck for a in after] != ["overload"], "another layer's spill is judged"


def _train_pt(device: str, metric: str, before: float, after: float, onset: float, det: int,
              layer: str | None = None) -> ChangePoint:  # fmt: skip
    p = _pt(device, metric, before, after, onset, layer)
    return dataclasses.replace(p, pool="train-a", model="llama@v1",
                               detected_ts=onset + det * W, fields=BIT["power_w"])  # fmt: skip


TRAIN_COUNTS = {("train-a", "llama@v1"): 64}
TRAIN_HOSTS = {f"n{i}": 8 for i in range(8)}
THROTTLED = ["n0/gpu4", "n3/gpu7"]


def _heat_and_clocks() -> tuple[list[ChangePoint], list[ChangePoint]]:
    heat = [_train_pt(d, "temp_c", 70.0, 90.0, T0, 2) for d in THROTTLED]
    clocks = [_train_pt(d, "clock_mhz", 1755.0, 1500.0, T0 + 3 * W, 3) for d in THROTTLED]
    return heat, clocks


def test_a_cooling_fault_and_its_jobs_slower_steps_sure_in_one_record_page_once() -> None:
    """Two devices of a synchronous job heat up and throttle; the six others of one host
    wait for them (device MFU down) and their incident opened first. Both become sure in
    the same record: whichever the incident list holds first, the cooling fault pages and
    the waits are its consequence, not a second alert."""
    peers = [f"n0/gpu{i}" for i in range(8) if f"n0/gpu{i}" not in THROTTLED]
    counts, hosts = TRAIN_COUNTS, TRAIN_HOSTS
    corr = Correlator()
    heat = [_train_pt(d, "temp_c", 70.0, 90.0, T0, 2) for d in THROTTLED]
    clocks = [_train_pt(d, "clock_mhz", 1755.0, 1500.0, T0 + 2 * W, 3) for d in THROTTLED]
    corr.add(heat + clocks, T0 + 5 * W, counts)
    slow = [_train_pt(d, "device_mfu", 0.45, 0.41, T0 + 2 * W, 4) for d in peers]
    corr.add(slow, T0 + 6 * W, counts)
    corr.add([], T0 + 9 * W, counts)  # the heat is judged a cooling fault
    assert [i.primary_metric for i in corr.incidents] == ["device_mfu", "temp_c"]
    for order in (1, -1):
        incidents = copy.deepcopy(corr.incidents)[::order]
        alerts = _lifecycle().due(incidents, T0 + 9 * W, counts, hosts)
        assert [(a.metric, a.severity) for a in alerts] == [("temp_c", "page")], order


def _job_and_its_cooling_fault(job_sent: bool) -> Correlator:
    """Two members heat and throttle; the six others of their host slow down (their
    incident sent, if `job_sent`), the heat is judged a cooling fault of its own, and
    then the job's waits at the collective are found."""
    peers = [f"n0/gpu{i}" for i in range(8) if f"n0/gpu{i}" not in THROTTLED]
    counts = TRAIN_COUNTS
    corr = Correlator()
    heat, clocks = _heat_and_clocks()
    corr.add(heat + clocks, T0 + 5 * W, counts)
    slow = [_train_pt(d, "device_mfu", 0.45, 0.41, T0 + 3 * W, 4) for d in peers]
    corr.add(slow, T0 + 6 * W, counts)
    if job_sent:
        corr.incidents[0].alert_id = "fw-job"  # as the lifecycle does with a first record
    corr.add([], T0 + 9 * W, counts)  # the heat is judged a cooling fault
    assert [i.primary_metric for i in corr.incidents] == ["device_mfu", "temp_c"]
    waits = [_train_pt(d, "sync_frac", 0.03, 0.2, T0 + 3 * W, 7, "allreduce") for d in peers]
    corr.add(waits, T0 + 10 * W, counts)
    return corr


def test_a_cooling_fault_joins_the_job_that_later_names_it_its_straggler() -> None:
    """The cooling fault of two members opened on its own: the job's waits at the collective
    were not found yet. Once they are, the job's incident, already sent, names those
    members as what it waits for, and the fault, not paged yet, joins it: one page for
    one fault. A job's incident not sent yet (it may never be sure) takes nothing."""
    corr = _job_and_its_cooling_fault(job_sent=True)
    (job,) = corr.incidents
    assert job.stragglers() == set(THROTTLED)
    assert {p.device for p in job.points if p.metric == "temp_c"} == set(THROTTLED)
    alerts = _lifecycle().due(corr.incidents, T0 + 10 * W, TRAIN_COUNTS, TRAIN_HOSTS)
    assert [(a.severity, a.bottleneck) for a in alerts] == [("page", "thermal_power")]
    assert "throttling n0/gpu4, n3/gpu7" in alerts[0].summary
    unsent = _job_and_its_cooling_fault(job_sent=False)
    assert [i.primary_metric for i in unsent.incidents][1:] == ["temp_c"]


def _throttled_host_and_a_second_cooling_fault(first_clock: bool) -> Correlator:
    """n0/gpu4 heats and (if `first_clock`) its clock steps down; MLP MFU falls on it and on
    three of its host's peers (their incident opens and is sent). A few windows later
    n3/gpu7 on another host heats and throttles too; its heat is judged a cooling fault."""
    first, second = THROTTLED
    counts = TRAIN_COUNTS
    corr = Correlator()
    early = [_train_pt(first, "temp_c", 70.0, 90.0, T0, 2)]
    if first_clock:
        early.append(_train_pt(first, "clock_mhz", 1755.0, 1500.0, T0 + 3 * W, 3))
    corr.add(early, T0 + 4 * W, counts)
    slow = [_train_pt(f"n0/gpu{g}", "mfu", 0.68, 0.57, T0 + 3 * W, 3, "mlp") for g in (1, 2, 3, 4)]
    corr.add(slow, T0 + 6 * W, counts)
    corr.incidents[0].alert_id = "fw-host"  # as the lifecycle does with a first record
    corr.add([_train_pt(second, "temp_c", 70.0, 90.0, T0 + 2 * W, 5),
              _train_pt(second, "clock_mhz", 1755.0, 1500.0, T0 + 4 * W, 5)],
             T0 + 9 * W, counts)  # fmt: skip
    corr.add([], T0 + 14 * W, counts)  # both heats judged
    return corr


def test_a_second_cooling_fault_joins_an_incident_its_pools_throttle_explains() -> None:
    """The host's MFU incident is a cooling fault (its own device's clock stepped down as it
    heated), whatever metric opened it: another device of the pool heating and throttling
    with it is the same cooling failing, one incident and one page. Without that throttle,
    the host's incident is another mechanism, and the cooling fault opens its own."""
    corr = _throttled_host_and_a_second_cooling_fault(first_clock=True)
    (inc,) = corr.incidents
    assert inc.throttled() == set(THROTTLED)
    alerts = _lifecycle().due(corr.incidents, T0 + 14 * W, TRAIN_COUNTS, TRAIN_HOSTS)
    assert [a.severity for a in alerts] == ["page"]
    apart = _throttled_host_and_a_second_cooling_fault(first_clock=False)
    assert [i.primary_metric for i in apart.incidents] == ["mfu", "temp_c"]
    assert apart.incidents[1].devices == {THROTTLED[1]}


def test_a_jobs_slower_steps_sure_while_its_throttle_settles_wait_for_its_page() -> None:
    """The peers' incident (device MFU down, the throttled members' clocks and heat in its
    evidence) is sure and settled a record before the cooling fault, which a new detection
    keeps settling: the peers wait for the fault's page and are then its consequence, not
    an alert of their own before it."""
    heat, clocks = _heat_and_clocks()
    peers = [f"n0/gpu{i}" for i in range(8) if f"n0/gpu{i}" not in THROTTLED]
    slow = [_train_pt(d, "device_mfu", 0.45, 0.41, T0 + 3 * W, 4) for d in peers]
    again = _train_pt(THROTTLED[0], "temp_c", 70.0, 90.0, T0, 8)
    incidents = [
        Incident("train-a", "llama@v1", T0 + 3 * W, T0 + 7 * W, W, points=slow,
                 evidence=heat + clocks),
        Incident("train-a", "llama@v1", T0, T0 + 8 * W, W, points=[*heat, again],
                 evidence=clocks),
    ]  # fmt: skip
    lifecycle = _lifecycle()
    sent = [
        (k, a.metric, a.severity)
        for k in range(8, 12)
        for a in lifecycle.due(incidents, T0 + k * W, TRAIN_COUNTS, TRAIN_HOSTS)
    ]
    assert sent == [(9, "temp_c", "page")]
    assert incidents[0].status == "resolved"


def test_a_throttle_its_jobs_page_named_does_not_page_again_after_the_job_grew() -> None:
    """A job's page named its throttling members (their clocks and heat, its waits); more
    members slowed later, so its waiting share no longer names them. The cooling fault of
    those members, sure after that, is what the page already told: it does not page."""
    heat, clocks = _heat_and_clocks()
    slow = [_train_pt(d, "mfu", 0.60, 0.52, T0 + 3 * W, 4, "mlp") for d in ("n0/gpu0", "n0/gpu1")]
    waits = [_train_pt("n0/gpu0", "sync_frac", 0.03, 0.2, T0 + 3 * W, 4, "allreduce")]
    job = Incident("train-a", "llama@v1", T0 + 3 * W, T0 + 7 * W, W, points=slow,
                   evidence=heat + clocks + waits)  # fmt: skip
    lifecycle = _lifecycle()
    first = lifecycle.due([job], T0 + 8 * W, TRAIN_COUNTS, TRAIN_HOSTS)
    assert [a.bottleneck for a in first] == ["thermal_power"]
    assert "throttling n0/gpu4, n3/gpu7" in first[0].summary
    job.points.extend(
        _train_pt(f"n{h}/gpu{g}", "mfu", 0.60, 0.52, T0 + 9 * W, 2, "mlp")
        for h in (1, 2) for g in range(4)
    )  # fmt: skip
    assert not job.stragglers()
    # Grown to ten devices and no longer naming its throttle, the job's next record reads
    # as another class; it is still the page it was, not a ticket that ends the page.
    grown = lifecycle.due([job], T0 + 11 * W, TRAIN_COUNTS, TRAIN_HOSTS)
    assert [(a.bottleneck, a.severity) for a in grown] == [("unclassified", "page")]
    # Read again as a capacity record, it may say so: load is no regression to page for.
    capacity = msgspec.structs.replace(grown[0], bottleneck="overload", severity="info")
    assert _held(capacity, lifecycle.state(job)).severity == "info"
    ticket = msgspec.structs.replace(grown[0], severity="ticket")
    assert _held(ticket, lifecycle.state(job)).severity == "page"
    fault = Incident(
        "train-a", "llama@v1", T0, T0 + 12 * W, W,
        points=[_train_pt(d, "temp_c", 70.0, 90.0, T0, 12) for d in THROTTLED],
        evidence=[_train_pt(d, "clock_mhz", 1755.0, 1500.0, T0 + 3 * W, 9) for d in THROTTLED],
    )  # fmt: skip
    sent = [
        (k, a.metric)
        for k in range(12, 16)
        for a in lifecycle.due([job, fault], T0 + k * W, TRAIN_COUNTS, TRAIN_HOSTS)
    ]
    assert "temp_c" not in [m for _, m in sent]
    assert fault.status == "resolved"


def test_a_pools_aggregate_is_never_named_a_throttling_member() -> None:
    """The pool aggregate's heat and clock moved with its members': the page names the
    members to cordon, not `pool:train-a`."""
    heat, clocks = _heat_and_clocks()
    pooled = [
        dataclasses.replace(p, device="pool:train-a", host=None)
        for p in (heat[0], clocks[0])
    ]  # fmt: skip
    slow = [_train_pt(d, "mfu", 0.60, 0.52, T0 + 3 * W, 4, "mlp") for d in ("n0/gpu0", "n0/gpu1")]
    waits = [_train_pt("n0/gpu0", "sync_frac", 0.03, 0.2, T0 + 3 * W, 4, "allreduce")]
    job = Incident("train-a", "llama@v1", T0 + 3 * W, T0 + 7 * W, W, points=slow,
                   evidence=heat + clocks + pooled + waits)  # fmt: skip
    assert job.stragglers() == set(THROTTLED)


def test_a_throttle_on_devices_of_an_info_heat_record_pages() -> None:
    """Two dies of n7 warmed +12 % as the pool served x1.5 the requests: an info record
    (heat no more than the work brought), not a fault on-call was told of. A throttle on
    one of them 80 windows later (clock down, conv MFU down, heat) is not that record
    going on: it pages under an id of its own. After a ticket for the same heat (the
    cooling lost, told), the throttle is that fault going on: the ticket pages, under its
    own id, once its devices' clock stepped down (work is lost now)."""

    def ids(burst: float) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        adv = Advisor()
        life = AlertLifecycle(AlertSettings(), adv)
        corr = Correlator()
        counts = {(POOL, MODEL): 8}
        for w in range(200):
            adv.exposure.observe(POOL, T0 + w * W, 100.0 * (burst if 30 <= w < 60 else 1.0))
        heat = [
            dataclasses.replace(_pt(d, "temp_c", 50.0, 56.0, T0 + 30 * W),
                                detected_ts=T0 + 34 * W, fields=BIT["power_w"])
            for d in (HOT, "n7/gpu2")
        ]  # fmt: skip
        now = T0 + 60 * W  # a ticket goes out once the grouping window has passed
        corr.add(heat, now, counts)
        first = [(a.id, a.severity) for a in life.due(corr.incidents, now, counts)]
        later = T0 + 120 * W
        throttle = [
            _pt(HOT, "temp_c", 50.0, 86.0, later - 10 * W),
            _pt(HOT, "mfu", 0.52, 0.40, later, "conv"),
            _pt(HOT, "clock_mhz", 1840.0, 1500.0, later),
        ]
        corr.add(throttle, later + 3 * W, counts)
        after = life.due(corr.incidents, later + 4 * W, counts)
        after += life.due(corr.incidents, later + 5 * W, counts)
        return first, [(a.id, a.severity) for a in after if a.status == "firing"]

    first, after = ids(1.5)
    assert [s for _, s in first] == ["info"]
    assert "page" in {s for _, s in after}
    assert {i for i, _ in after} - {i for i, _ in first}
    first, after = ids(1.0)
    assert [s for _, s in first] == ["ticket"]
    assert not {i for i, _ in after} - {i for i, _ in first}
    assert (first[0][0], "page") in after

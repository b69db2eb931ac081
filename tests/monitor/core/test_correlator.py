"""Overload (queueing with per-layer efficiency unchanged) is a capacity record, not a page."""

from __future__ import annotations

import dataclasses

from monitor.config import AlertSettings
from monitor.core.advisor import Advisor, bottleneck_class
from monitor.core.correlator import AGGREGATE, LEAD_WINDOWS, ChangePoint, Correlator, Incident
from monitor.core.coverage import BIT
from monitor.core.lifecycle import AlertLifecycle, severity
from monitor.indicators import STAGE_OF
from monitor.wire import ChangeEvent, ChangeScope

T0, W = 1_000_000.0, 10.0
POOL, MODEL = "vision", "resnet@v5"


def _pt(device: str, metric: str, before: float, after: float, onset: float) -> ChangePoint:
    return ChangePoint(
        device=device, host=device.split("/", maxsplit=1)[0], pool=POOL, model=MODEL, layer=None,
        metric=metric, stage=STAGE_OF[metric], onset_ts=onset, detected_ts=onset + 2 * W,
        before=before, after=after, score=10.0, window_s=W,
    )  # fmt: skip


def _incident(req_after: float, n: int = 8):
    devs = [f"h{i}/gpu0" for i in range(n)]
    pts = [_pt(d, "req_rate", 100.0, req_after, T0) for d in devs]
    pts += [_pt(d, "queue_wait_ms", 5.0, 2500.0, T0) for d in devs]
    pts += [_pt(d, "lat_p99_ms", 40.0, 9000.0, T0) for d in devs]
    pts += [_pt(d, "temp_c", 50.0, 55.0, T0 + W) for d in devs]
    corr = Correlator()
    corr.add(pts, T0 + 3 * W, {(POOL, MODEL): 8})
    (inc,) = corr.incidents
    return inc


def _render(inc, changes=(), n_pool: int = 8):
    adv = Advisor()
    for c in changes:
        adv.add_change(c)
    return AlertLifecycle(AlertSettings(), adv).render(inc, T0 + 3 * W, n_pool, "firing")


def test_offered_load_kept_as_context_not_evidence() -> None:
    inc = _incident(req_after=220.0)
    assert len(inc.load) == 8
    assert all(p.metric == "req_rate" for p in inc.load)
    assert all(p.metric != "req_rate" for p in inc.evidence)
    assert abs(inc.load_ratio() - 2.2) < 1e-9
    assert inc.first_failing_stage() == "ingress"


def test_a_burst_between_a_late_found_onset_and_its_detection_is_its_load() -> None:
    """Waits found 30 windows late are dated two minutes before a burst that began 20
    windows before they were found: the onset is no better than the detection delay, so
    the burst counts as the load they moved with. A burst after the detection does not."""
    devs = [f"h{i}/gpu0" for i in range(8)]

    def ratio(burst_at: float) -> float:
        pts = [dataclasses.replace(_pt(d, "sync_frac", 0.2, 0.3, T0), layer="allreduce",
                                   detected_ts=T0 + 30 * W)
               for d in devs]  # fmt: skip
        pts += [_pt(d, "req_rate", 100.0, 150.0, burst_at) for d in devs]
        corr = Correlator()
        corr.add(pts, T0 + 35 * W, {(POOL, MODEL): 8})
        (inc,) = corr.incidents
        return inc.load_ratio()

    assert abs(ratio(T0 + 10 * W) - 1.5) < 1e-9
    assert ratio(T0 + 31 * W) == 1.0


def test_overload_is_a_capacity_record_at_info() -> None:
    alert = _render(_incident(req_after=220.0))
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"
    assert alert.suggestion.action == "mitigate"
    assert alert.suggestion.change_id is None
    assert "offered load x2.20 (capacity)" in alert.summary


def test_queueing_without_a_request_rate_rise_is_still_capacity() -> None:
    """A saturated pool reports the rate it served, capped at capacity: queueing with
    efficiency unchanged is capacity even when the reported rate did not rise."""
    alert = _render(_incident(req_after=101.0))
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"
    assert "capacity" in alert.summary


def _moved(metric: str, before: float, after: float, k: int = 8, *, layer: str | None = None,
           onset: float = T0) -> list[ChangePoint]:  # fmt: skip
    """The same move of one metric (on one layer) on the first `k` of `_incident`'s devices."""
    return [
        dataclasses.replace(_pt(f"h{i}/gpu0", metric, before, after, onset), layer=layer)
        for i in range(k)
    ]


def _overload_with_collective_waits(req_after: float):
    """Queueing on all 8 devices, and an expert all-to-all's waits up on 2 of them."""
    inc = _incident(req_after)
    inc.evidence += _moved("sync_frac", 0.22, 0.41, 2, layer="allreduce", onset=T0 + W)
    return inc


def test_collective_waits_that_rose_with_the_offered_load_stay_overload() -> None:
    """A burst feeding an expert all-to-all raises its waits: with the offered load up by
    more than the overload ratio they follow the traffic, and the queue is capacity."""
    alert = _render(_overload_with_collective_waits(req_after=260.0))
    assert "sync_frac" in {e.indicator for e in alert.evidence}
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"


def test_a_queue_that_grew_while_the_served_rate_rose_is_load_whatever_the_ratio() -> None:
    """A pool near capacity serves 16 % more while its queue grows 500x: the offered load
    rose by more than it could serve (a slower service serves less, not more), so the
    all-to-all's waits that rose with it follow the traffic. Capacity, named at ingress;
    under the 1.25 ratio alone these waits made it a synchronisation page (`fleet_day`
    seed 155 at 64 devices: `serve-moe` at a burst, its served rate up 1.16-1.29x)."""
    inc = _overload_with_collective_waits(req_after=116.0)
    alert = _render(inc)
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"
    assert alert.first_failing_stage == "ingress"


def test_collective_waits_without_a_load_rise_are_a_mechanism() -> None:
    """The same waits with the offered load flat are a mechanism of their own: no overload."""
    alert = _render(_overload_with_collective_waits(req_after=101.0))
    assert alert.bottleneck != "overload"


def test_a_mechanism_moving_is_not_overload() -> None:
    assert bottleneck_class("ingress", {"queue_wait_ms", "clock_mhz"}) != "overload"
    assert bottleneck_class("ingress", {"queue_wait_ms", "temp_c", "device_mfu"}) == ("overload")
    assert bottleneck_class("execution", {"mfu", "lat_p99_ms"}) != "overload"


def test_a_fitting_change_turns_overload_back_into_a_rollback_page() -> None:
    chg = ChangeEvent(
        v=1, ts=T0 - 5.0, id="chg-1", kind="traffic_policy", scope=ChangeScope(pool=POOL),
        from_="a", to="b",
    )  # fmt: skip
    alert = _render(_incident(req_after=220.0), [chg])
    assert alert.suggestion.action == "rollback"
    assert alert.suggestion.change_id == "chg-1"
    assert alert.bottleneck == "ingress"
    assert alert.severity == "page"


def _after_routing_change(change_id: str, ts: float, to: str) -> Advisor:
    """An advisor that knows of one `traffic_policy` change on the pool, weight 1.0 -> `to`."""
    adv = Advisor()
    adv.add_change(ChangeEvent(
        v=1, ts=ts, id=change_id, kind="traffic_policy", scope=ChangeScope(pool=POOL),
        from_="weight=1.0", to=to,
    ))  # fmt: skip
    return adv


def _queue_after_a_change(earlier_peak: float):
    """A queue at a request rate of 220 per second, a routing change 5 s before it, after
    an hour whose bursts peaked at `earlier_peak` per second."""
    adv = _after_routing_change("chg-3", T0 - 5.0, "weight=1.3")
    for k in range(360):
        adv.exposure.observe(POOL, T0 - 3600.0 + 10.0 * k, earlier_peak if k % 120 < 20 else 100.0)
    for k in range(6):
        adv.exposure.observe(POOL, T0 + 10.0 * k, 220.0)
    return AlertLifecycle(AlertSettings(), adv).render(_incident(220.0), T0 + 3 * W, 8, "firing")


def test_a_queue_at_a_load_the_pool_never_ran_is_capacity_even_after_a_change() -> None:
    """A routing change raised a bursting pool's load 1.2x past its highest earlier burst,
    and the queue exploded: near capacity a queue grows as rho / (1 - rho), so no earlier
    burst says what this load does to it, and the queue alone cannot tell the change from
    the load. A capacity record naming the change (`deploy_without_regression` seed 8
    paged it). Had the pool run at that load before, the change explains the queue."""
    alert = _queue_after_a_change(earlier_peak=183.0)
    _assert_capacity_naming(alert, "chg-3")
    assert "capacity" in alert.summary
    assert "traffic_policy" in alert.summary
    _assert_ingress_page(_queue_after_a_change(earlier_peak=225.0))


def _assert_capacity_naming(alert, change_id: str) -> None:
    """An `info` capacity record that still names the change as its rollback."""
    assert (alert.bottleneck, alert.severity) == ("overload", "info"), alert.summary
    assert alert.suggestion.change_id == change_id


def _assert_ingress_page(alert) -> None:
    """A regression page at `ingress`: the change explains the queue."""
    assert (alert.bottleneck, alert.severity) == ("ingress", "page"), alert.summary


def _queue_after_a_routing_change(wait_now: float, early: bool = False):
    """A routing change sent x1.3 the calm load (100 per device) to a pool a minute after a
    burst at x1.83 ended; its devices' queue wait grew from 5 ms to `wait_now` as the pool
    aggregate's did. The hour's bursts at x1.83 queued 60 ms."""
    adv = _after_routing_change("chg-4", T0 - 5.0, "weight=1.3")
    for k in range(360 + 18):
        ts = T0 - 3600.0 + 10.0 * k
        burst = (k < 330 and k % 120 < 20) or 330 <= k < 354
        load, wait = (183.0, 60.0) if burst else (130.0, wait_now) if k >= 360 else (100.0, 5.0)
        adv.exposure.observe(POOL, ts, load)
        adv.exposure.observe_backlog((POOL, MODEL), ts, load, (wait, wait / 100, 0, 0, 0, 0))
    devs = [f"h{i}/gpu0" for i in range(8)]
    # the load detectors found the burst's end, not the routing change's step
    pts = [_pt(d, "req_rate", 183.0, 100.0, T0 - 60.0) for d in devs]
    pts += [_pt(d, "queue_wait_ms", 5.0, wait_now, T0) for d in devs]
    if early:  # one device's queue found at the burst, before the change moved the rest
        pts[-1] = dataclasses.replace(pts[-1], onset_ts=T0 - 200.0, detected_ts=T0 - 180.0)
    corr = Correlator()
    corr.add(pts, T0 + 3 * W, {(POOL, MODEL): 8})
    (inc,) = corr.incidents
    assert inc.load_ratio() < 1.0
    assert (inc.found_ts < inc.onset_ts) == early
    return AlertLifecycle(AlertSettings(), adv).render(inc, T0 + 3 * W, 8, "firing")


def test_a_queue_no_longer_than_at_a_higher_load_before_is_the_load_a_change_sent() -> None:
    """A routing change that only sent more load leaves the queue within what the pool
    showed at a higher load (a queue grows with the load): capacity, the change named
    (`deploy_without_regression` seeds 14 and 15 paged it). Read window by window, the
    load rose against the minute before the onset, though the detectors' latest step was
    the burst's end. A queue longer than at that higher load is not the load's: a page."""
    alert = _queue_after_a_routing_change(wait_now=25.0)
    _assert_capacity_naming(alert, "chg-4")
    assert "x1.30" in alert.summary
    assert "60 at a higher load" in alert.summary
    _assert_ingress_page(_queue_after_a_routing_change(wait_now=90.0))


def test_a_device_found_before_the_onset_leaves_the_load_read_from_the_onset() -> None:
    """One device's queue found at a burst before the routing change moved the rest: the
    incident's first detection lies before its (median) onset, and its load and levels
    are still read from the onset (the long healthy fleet's tuning seed 27 paged such a
    change as the load's span came out empty)."""
    alert = _queue_after_a_routing_change(wait_now=25.0, early=True)
    _assert_capacity_naming(alert, "chg-4")
    _assert_ingress_page(_queue_after_a_routing_change(wait_now=90.0, early=True))


def _backlog_as_a_burst_ends(wait_now: float):
    """A routing change raised a burst's load x1.2 (170 to 204 per device) 45 s before
    the burst ended; the devices' queue wait, 5 ms in calm, was `wait_now` as the load
    fell to x1.2 the calm rate (120). The hour's bursts at 210 queued 300 ms."""
    adv = _after_routing_change("chg-5", T0 - 45.0, "weight=1.2")
    for k in range(360 + 6):
        ts = T0 - 3600.0 + 10.0 * k
        if k >= 360:
            load, wait = 120.0, wait_now
        elif k >= 356:
            load, wait = 204.0, 30.0
        elif k >= 330:
            load, wait = 170.0, 20.0
        else:
            load, wait = (210.0, 300.0) if k % 120 < 20 else (100.0, 5.0)
        adv.exposure.observe(POOL, ts, load)
        adv.exposure.observe_backlog((POOL, MODEL), ts, load, (wait, wait / 100, 0, 0, 0, 0))
    devs = [f"h{i}/gpu0" for i in range(8)]
    # the load detectors found the burst's end, with the queue
    pts = [_pt(d, "req_rate", 204.0, 120.0, T0) for d in devs]
    pts += [_pt(d, "queue_wait_ms", 5.0, wait_now, T0) for d in devs]
    corr = Correlator()
    corr.add(pts, T0 + 3 * W, {(POOL, MODEL): 8})
    (inc,) = corr.incidents
    assert inc.load_ratio() < 1.0
    return AlertLifecycle(AlertSettings(), adv).render(inc, T0 + 3 * W, 8, "firing")


def test_a_backlog_found_as_the_load_falls_is_bounded_by_the_load_it_was_built_at() -> None:
    """A queue found as a burst ends is the backlog of the load before the fall: a routing
    change that raised that load leaves it within what the pool queued at a higher load
    before (the long healthy fleet's tuning seed 26 paged it, the load read as falling).
    A queue longer than the pool ever showed at that load is not the load's: a page."""
    alert = _backlog_as_a_burst_ends(wait_now=150.0)
    _assert_capacity_naming(alert, "chg-5")
    assert "300 at a higher load" in alert.summary
    _assert_ingress_page(_backlog_as_a_burst_ends(wait_now=450.0))


def test_a_traffic_change_long_before_a_bursts_queue_does_not_explain_it() -> None:
    """A traffic-weight change 27 minutes before a burst's queue is no rollback: the burst
    is capacity, like every burst before it (a healthy fleet paged on exactly this)."""
    chg = ChangeEvent(
        v=1, ts=T0 - 1605.0, id="chg-2", kind="traffic_policy", scope=ChangeScope(pool=POOL),
        from_="weight=1.0", to="weight=1.2",
    )  # fmt: skip
    alert = _render(_incident(req_after=220.0), [chg])
    assert alert.suggestion.change_id is None
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"


def test_loss_of_an_up_is_bad_metric_is_bounded() -> None:
    """One device whose p99 went x225 (its queue backed up) in a pool of 56 is not a page."""
    assert severity("lat_p99_ms", 10.0, 2250.0, 22400.0, 1 / 56, "ingress", 0.1) == "info"
    assert severity("lat_p99_ms", 10.0, 2250.0, 22400.0, 1.0, "ingress", 0.1) == "page"


def test_latency_only_validation_incident_is_contention_not_quality() -> None:
    """Quality is the class only when quality moved; a p99 rise alone is capacity."""
    assert bottleneck_class("validation", {"lat_p99_ms", "lat_p95_ms"}) == "overload"
    assert bottleneck_class("validation", {"quality", "lat_p99_ms"}) == "quality"


def test_an_overload_incident_headed_by_device_mfu_is_still_overload() -> None:
    """Device MFU follows load, like queueing: when it heads an overload incident (it moved
    on every device), the incident stays a capacity record. It was judged without the
    offered load and paged (`fleet_day`, seed 6, at a later burst's end)."""

    def headed_by_device_mfu(req_after: float):
        inc = _incident(req_after=req_after)
        inc.points += _moved("device_mfu", 0.5, 0.41)
        return inc

    inc = headed_by_device_mfu(220.0)
    assert inc.primary_metric == "device_mfu"
    alert = _render(inc)
    assert alert.metric == "device_mfu"
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"
    # A per-layer metric moving with it is a mechanism: no longer overload.
    inc = headed_by_device_mfu(101.0)
    inc.evidence += _moved("mfu", 0.5, 0.4)
    assert _render(inc).bottleneck != "overload"


def _slower_service(load_after: float):
    """Eight devices whose per-layer efficiency fell (a placement change), their queues and
    p99 growing in the same window; the offered load going from 100 to `load_after`."""
    devs = [f"h{i}/gpu0" for i in range(8)]
    pts = [_layer_pt(d, "mfu", 0.22, 0.17) for d in devs]
    pts += [_layer_pt(d, "sram_hit", 0.82, 0.66) for d in devs]
    pts += [_pt(d, "queue_wait_ms", 30.0, 43.0, T0) for d in devs]
    pts += [_pt(d, "queue_depth", 0.6, 0.9, T0) for d in devs]
    pts += [_pt(d, "lat_p99_ms", 7900.0, 8900.0, T0) for d in devs]
    pts += [_pt(d, "req_rate", 100.0, load_after, T0) for d in devs]
    corr = Correlator()
    corr.add(pts, T0 + 3 * W, {(POOL, MODEL): 8})
    (inc,) = corr.incidents
    return inc


def _layer_pt(device: str, metric: str, before: float, after: float) -> ChangePoint:
    return dataclasses.replace(_pt(device, metric, before, after, T0), layer="attention")


def test_a_queue_that_grew_because_service_slowed_does_not_name_ingress() -> None:
    """Queueing rose in the same window as attention's efficiency fell and nothing about
    what arrives changed: the queue is the slower service's consequence, so the first
    failing stage is where efficiency failed (scheduling), not ingress."""
    assert _slower_service(load_after=102.0).first_failing_stage() == "scheduling"


def test_a_queue_under_a_load_surge_still_names_ingress() -> None:
    """When the offered load rose by more than the overload ratio, the queue may be the
    arrivals' doing: ingress keeps its claim as the most upstream stage that moved."""
    assert _slower_service(load_after=200.0).first_failing_stage() == "ingress"


def test_collective_waits_headlining_an_overload_stay_overload() -> None:
    """The all-to-all's waits can head the incident (sync fraction ranks before queueing
    among primary metrics): with the offered load up they still follow the traffic. They
    paged as a host-scope synchronisation fault at a burst (`healthy_with_bursts`, seed 8)."""

    def headed_by_waits(req_after: float):
        inc = _incident(req_after)
        inc.points += _moved("sync_frac", 0.37, 0.62, layer="allreduce")
        return inc

    inc = headed_by_waits(190.0)
    assert inc.primary_metric == "sync_frac"
    alert = _render(inc)
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"
    # The same waits with the offered load flat are the collective's own: a page.
    alert = _render(headed_by_waits(101.0))
    assert alert.bottleneck == "synchronisation"
    assert alert.severity == "page"


def _overload_with_efficiency_on(k: int, req_after: float = 180.0):
    """Queueing on all 8 devices at a burst, and the conv layer's MFU down on `k` of them."""
    inc = _incident(req_after)
    inc.evidence += _moved("mfu", 0.89, 0.55, k, layer="conv")
    return inc


def test_an_efficiency_move_on_a_few_devices_does_not_explain_a_pools_queue() -> None:
    """Offered load up x1.8, every device queues, and 2 of 8 lost conv MFU: what makes all
    eight queue is the load; the two, if real, are an incident of their own. This paged a
    pool's first burst as an ingress regression (`fleet_day`, seeds 9 and 13)."""
    alert = _render(_overload_with_efficiency_on(2))
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"


def test_an_efficiency_move_on_half_the_devices_is_a_mechanism() -> None:
    """On half of the devices (the rule that picks the primary metric), or with the load
    flat, the same MFU drop is the mechanism and the incident is no overload."""
    assert _render(_overload_with_efficiency_on(4)).bottleneck != "overload"
    assert _render(_overload_with_efficiency_on(2, req_after=101.0)).bottleneck != "overload"


def test_a_backlog_draining_after_a_burst_is_not_a_few_devices_mechanism() -> None:
    """The offered load fell to x0.49 (a burst ended) and latency rose on four devices as
    the backlog drained; a window later one of them stepped its stall share back to its
    pre-burst level. That one device is not why all four wait: capacity, not a
    `memory_locality` page (`fleet_day` tuning seed 32). A mechanism on half of them is
    still the mechanism, and with the load flat (above) so is one on a few devices."""

    def draining(k: int, req_after: float = 49.0):
        inc = _incident(req_after, n=4)
        inc.points += _moved("stall_frac", 0.39, 0.45, k, layer="conv", onset=T0 + W)
        return _render(inc)

    alert = draining(1)
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"
    assert draining(2).bottleneck == "memory_locality"
    assert draining(1, req_after=101.0).bottleneck == "memory_locality"


def test_a_mechanism_on_one_of_the_devices_found_queueing_in_a_queueing_pool_is_the_loads() -> None:
    """A burst x1.8 over an 8-device pool: its queue found on two devices so far, and one
    of them stepped its MLP stall share up. Half of the devices found, but where the
    pool's aggregate queues the whole pool does: one device is not why eight queue, the
    load is (`fleet_day` tuning seed 242 paged such a burst at stage `ingress`). Without
    the aggregate's queue, one of two is half the incident: the mechanism."""

    def one_of_two(pool_queues: bool):
        inc = _incident(180.0, n=2)
        inc.evidence += _moved("stall_frac", 0.38, 0.43, 1, layer="mlp")
        if pool_queues:
            pooled = _pt(AGGREGATE + POOL, "queue_wait_ms", 10.0, 17.0, T0)
            inc.evidence.append(dataclasses.replace(pooled, host=None))
        return _render(inc)

    alert = one_of_two(pool_queues=True)
    assert (alert.bottleneck, alert.severity) == ("overload", "info")
    assert one_of_two(pool_queues=False).bottleneck != "overload"


def _after_bursts(inc, earlier_peak: float):
    """`_render` with the pool's request rate known: an hour at 100 per second whose bursts
    peaked at `earlier_peak`, then 180 from the incident's onset."""
    adv = Advisor()
    for k in range(360):
        adv.exposure.observe(POOL, T0 - 3600.0 + 10.0 * k, earlier_peak if k % 120 < 20 else 100.0)
    for k in range(6):
        adv.exposure.observe(POOL, T0 + 10.0 * k, 180.0)
    return AlertLifecycle(AlertSettings(), adv).render(inc, T0 + 3 * W, 8, "firing")


def test_an_efficiency_move_at_a_load_the_pool_never_ran_does_not_explain_its_queue() -> None:
    """Burst against burst: half the devices lost conv MFU at a burst 1.6x above any the
    pool ran before. What MFU should be at that load is an extrapolation, so it does not
    make the queue a regression (`fleet_day` seed 50 paged such a first burst). At a
    burst as large as earlier ones it does."""
    alert = _after_bursts(_overload_with_efficiency_on(4), earlier_peak=110.0)
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"
    alert = _after_bursts(_overload_with_efficiency_on(4), earlier_peak=170.0)
    assert alert.bottleneck != "overload"


def test_a_mechanism_that_began_well_after_an_overloads_queue_does_not_explain_it() -> None:
    """Queueing at a burst, and 21 windows later MLP's stall share up on every device: what
    began after the queue cannot be why it grew (a cause comes first, as a change must to
    explain a queue). It made a burst's capacity record a pool page at stage `execution`
    (`fleet_day`, seed 25). Within `LEAD_WINDOWS` of the queue it is the mechanism."""
    late = _incident(180.0)
    late.evidence += _moved("stall_frac", 0.40, 0.44, layer="mlp", onset=T0 + 21 * W)
    alert = _render(late)
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"
    assert alert.first_failing_stage == "ingress"
    soon = _incident(180.0)
    soon.evidence += _moved("stall_frac", 0.40, 0.52, layer="mlp", onset=T0)
    assert _render(soon).bottleneck != "overload"


def test_the_queue_that_opened_an_overload_still_counts_once_later_devices_date_it_later() -> None:
    """A burst's queue grows on 3 devices first, then p99 rises on 7 others over the next
    minutes: the onset (the median of p99's first wave) comes later with each device
    that joins, past `LEAD_WINDOWS` after the first waits. The waits are the incident's
    own points, so they still count, and it stays an overload `info` record rather than
    an unclassified ticket on p99 alone (long healthy fleet, seed 9)."""
    waits = [_pt(f"q{i}/gpu0", "queue_wait_ms", 3.0, 6.0, T0 + k * W)
             for i, k in enumerate((0, 12, 22))]  # fmt: skip
    p99 = [_pt(f"h{i}/gpu0", "lat_p99_ms", 20.0, 45.0, T0 + k * W)
           for i, k in enumerate((10, 13, 15, 24, 26, 26, 28))]  # fmt: skip
    corr = Correlator()
    corr.add(waits + p99, T0 + 30 * W, {(POOL, MODEL): 64})
    (inc,) = corr.incidents
    inc.metric = "lat_p99_ms"  # its headline since its first record
    assert inc.onset_ts - LEAD_WINDOWS * W > T0 + 12 * W  # the first two waits lie before
    assert ("ingress", "queue_wait_ms", None) in inc.supporting()
    alert = _render(inc, n_pool=64)
    assert alert.bottleneck == "overload"
    assert alert.severity == "info"
    # Failures dated before its first point, that joined it later, did not open it: as
    # evidence beside it they lead its onset by too much (`fallback_in_overload` 10).
    inc.points += [_pt(f"h{i}/gpu0", "error_rate", 0.0, 0.3, T0 - 20 * W) for i in range(4)]
    assert not any(k[1] == "error_rate" for k in inc.supporting())


def test_the_primary_metric_supports_its_incident_on_however_few_devices() -> None:
    """An incident is about its primary metric, fixed at its first page, even once other
    indicators moved on more of the devices it grew to: its stage counts among the
    stages that moved (here ingress, first), not only theirs."""
    inc = _incident(180.0, n=1)
    inc.metric = "queue_wait_ms"  # paged while it held one device
    inc.points += _moved("stall_frac", 0.40, 0.44, layer="mlp", onset=T0 + 21 * W)
    assert len(inc.devices) == 8
    assert ("ingress", "queue_wait_ms", None) in inc.supporting()
    assert inc.first_failing_stage() == "ingress"


def _mfu_drop_at_a_burst(earlier_peak: float, earlier_mfu: float | None = None) -> tuple[str, str]:
    """Per-layer MFU -15 % on the whole pool as its request rate rose from 100 to 250 per
    second, after an hour whose bursts peaked at `earlier_peak` (with the pool's MLP MFU
    at `earlier_mfu` during them, if given): (severity, summary)."""
    devs = [f"h{i}/gpu0" for i in range(8)]
    onset = T0 + 3600.0
    pts = [dataclasses.replace(_pt(d, "mfu", 0.6, 0.51, onset), layer="mlp") for d in devs]
    pts += [_pt(d, "req_rate", 100.0, 250.0, onset) for d in devs]
    corr = Correlator()
    corr.add(pts, onset + 3 * W, {(POOL, MODEL): 8})
    (inc,) = corr.incidents
    adv = Advisor()
    for k in range(360):
        ts = T0 + 10.0 * k
        burst = k % 120 < 20
        adv.exposure.observe(POOL, ts, earlier_peak if burst else 100.0)
        if earlier_mfu is not None:
            rate, mfu = (earlier_peak, earlier_mfu) if burst else (100.0, 0.6)
            adv.exposure.observe_levels((POOL, MODEL, "mlp"), ts, rate, (mfu, 0.2, 50.0, 0.5))
    for k in range(360, 366):
        adv.exposure.observe(POOL, T0 + 10.0 * k, 250.0)
    alert = AlertLifecycle(AlertSettings(), adv).render(inc, onset + 3 * W, 8, "firing")
    return alert.severity, alert.summary


def test_an_efficiency_drop_at_a_load_the_pool_never_ran_is_a_capacity_record() -> None:
    """Burst is judged against burst: the pool's earlier bursts peaked at 110 requests per
    second, this one at 250, so what MFU should be there is an extrapolation. An info
    record that says so; the same drop at a burst as large as earlier ones pages."""
    sev, text = _mfu_drop_at_a_burst(earlier_peak=110.0)
    assert sev == "info"
    assert "x2.27 the highest offered load" in text
    sev, text = _mfu_drop_at_a_burst(earlier_peak=240.0)
    assert sev == "page"
    assert "highest offered load" not in text


def test_an_efficiency_drop_at_a_burst_like_earlier_ones_is_what_the_load_does() -> None:
    """Burst against burst at a load the pool ran at: an hour after its last burst the load
    model has forgotten it, and MLP MFU reads -15 % against calm. Earlier bursts at that
    load ran at 0.52, as now: the load's doing, an info record that says so (`fleet_day`
    seed 14 paged it). Had they run at 0.60, this burst is worse than those: it pages."""
    sev, text = _mfu_drop_at_a_burst(earlier_peak=240.0, earlier_mfu=0.52)
    assert sev == "info"
    assert "MFU then 0.52 at that load" in text
    sev, text = _mfu_drop_at_a_burst(earlier_peak=240.0, earlier_mfu=0.60)
    assert sev == "page"
    assert "at that load" not in text
    # a burst far larger than this one says nothing of this load
    sev, _ = _mfu_drop_at_a_burst(earlier_peak=400.0, earlier_mfu=0.45)
    assert sev == "page"


def test_stages_a_window_apart_are_a_tie_that_goes_upstream() -> None:
    """An admission rule's queue dated a window after the tail latency it causes (a change
    inside a window shows in the p95 before the mean wait): ingress, upstream, failed
    first (`fleet_day` seeds 42 and 64 named validation and lost the rollback). Two
    windows apart the order is the estimate's, not a tie."""

    def stage(lag_windows: int) -> str:
        devs = [f"h{i}/gpu0" for i in range(8)]
        pts = [_pt(d, "queue_wait_ms", 60.0, 300.0, T0 + lag_windows * W) for d in devs]
        pts += [_pt(d, "lat_p95_ms", 7400.0, 8400.0, T0) for d in devs]
        corr = Correlator()
        corr.add(pts, T0 + 6 * W, {(POOL, MODEL): 8})
        (inc,) = corr.incidents
        return inc.first_failing_stage()

    assert stage(1) == "ingress"
    assert stage(2) == "validation"


def _mfu_on_some(k: int, pool_shift: float | None):
    """Attention MFU 0.50 -> 0.43 on `k` of a pool of 24, its aggregate down by `pool_shift`."""
    devs = [f"h{i // 8}/gpu{i % 8}" for i in range(k)]
    pts = [dataclasses.replace(_pt(d, "mfu", 0.50, 0.43, T0), layer="attention") for d in devs]
    if pool_shift is not None:
        agg = _pt("pool:vision", "mfu", 0.50, 0.50 - pool_shift, T0)
        pts.append(dataclasses.replace(agg, host=None, layer="attention", detected_ts=T0 + 6 * W))
    corr = Correlator()
    corr.add(pts, T0 + 6 * W, {(POOL, MODEL): 24})
    (inc,) = corr.incidents
    return inc


def test_a_pool_whose_mean_moved_as_far_as_its_devices_is_the_incidents_scope() -> None:
    """Nine of 24 devices showed a pool-wide kernel regression one by one (young streams),
    and the pool's mean moved as far as they did: the pool moved (`pool_regression` seed 9
    was a device ticket without its rollback). A mean that moved by their share of the pool
    is those devices' fault."""
    inc = _mfu_on_some(9, pool_shift=0.065)
    assert inc.aggregate_share() > 0.9
    assert inc.scope_level(24, 0.5) == "pool"
    inc = _mfu_on_some(9, pool_shift=0.07 * 9 / 24)
    assert abs(inc.aggregate_share() - 9 / 24) < 1e-9
    assert inc.scope_level(24, 0.5) == "device"
    assert _mfu_on_some(9, pool_shift=None).scope_level(24, 0.5) == "device"


def test_a_quarter_of_the_pool_spread_over_its_hosts_is_the_pool() -> None:
    """Nine of 32 devices, two or three on each of four hosts, their quality stepping down
    after a model deploy: the share that confirms scattered devices is the pool changing
    (`quality_drop` seed 5 first paged at device scope, without the deploy's rollback).
    Most of them on one host, or an aggregate that moved by just their share, are theirs."""

    def incident(hosts: list[int], agg_shift: float | None = None) -> Incident:
        pts = [_pt(f"h{h}/gpu{i}", "quality", 0.999, 0.99, T0) for i, h in enumerate(hosts)]
        if agg_shift is not None:
            agg = _pt("pool:vision", "quality", 0.999, 0.999 - agg_shift, T0)
            pts.append(dataclasses.replace(agg, host=None, detected_ts=T0 + 6 * W))
        corr = Correlator()
        corr.add(pts, T0 + 6 * W, {(POOL, MODEL): 32})
        (inc,) = corr.incidents
        return inc

    spread = [0, 0, 1, 1, 2, 2, 2, 3, 3]
    assert incident(spread).scope_level(32, 0.5) == "pool"
    assert incident(spread[:7]).scope_level(32, 0.5) == "device"  # under a quarter
    assert incident([0, 0, 0, 0, 0, 1, 2, 3, 3]).scope_level(32, 0.5) == "device"
    assert incident(spread, agg_shift=0.009 * 9 / 32).scope_level(32, 0.5) == "device"


def test_a_cause_on_most_of_the_pool_makes_two_devices_its_pool() -> None:
    """A kernel falls back on attention on all 24 devices of a young pool; attention MFU
    -14 % is found on two of them so far (`pool_regression` seed 9 was a device ticket
    without its rollback). The same cause costs every device the same: pool scope, and a
    page weighed on the pool. A fallback on those two devices alone is theirs."""

    def incident(fell_back: int) -> Incident:
        pts = [dataclasses.replace(_pt(f"h{i // 8}/gpu{i % 8}", "mfu", 0.50, 0.43, T0),
                                   layer="attention") for i in (0, 9)]  # fmt: skip
        pts += [dataclasses.replace(_pt(f"h{i // 8}/gpu{i % 8}", "fallback_frac", 0.0, 0.4, T0),
                                    layer="attention", stage="lowering")
                for i in range(fell_back)]  # fmt: skip
        corr = Correlator()
        corr.add(pts, T0 + 3 * W, {(POOL, MODEL): 24})
        (inc,) = corr.incidents
        return inc

    pool = incident(24)
    assert pool.cause_share(24) == 1.0
    assert pool.scope_level(24, 0.5) == "pool"
    life = AlertLifecycle(AlertSettings(), Advisor())
    assert life.render(pool, T0 + 4 * W, 24, "firing").severity == "page"
    own = incident(2)
    assert own.scope_level(24, 0.5) == "device"
    assert life.render(own, T0 + 4 * W, 24, "firing").severity != "page"


def test_a_burst_that_ends_while_the_change_is_found_is_the_load_it_began_under() -> None:
    """A queue grew 26 windows before it was found, during a burst (x1.8) that ended two
    windows before that: the load it began under is the burst's, not the fall after it
    (`deploy_without_regression` seed 57: read as x0.56, the queue was no overload and
    paged with the routing change that landed in the burst). A burst that ended before
    the onset still counts down."""

    def ratio(fall_at: float) -> float:
        devs = [f"h{i}/gpu0" for i in range(8)]
        pts = [dataclasses.replace(_pt(d, "queue_wait_ms", 80.0, 10000.0, T0),
                                   detected_ts=T0 + 26 * W) for d in devs]  # fmt: skip
        pts += [_pt(d, "req_rate", 19.0, 34.0, T0 - 10 * W) for d in devs]
        pts += [_pt(d, "req_rate", 34.0, 19.0, fall_at) for d in devs]
        corr = Correlator()
        corr.add(pts, T0 + 30 * W, {(POOL, MODEL): 8})
        (inc,) = corr.incidents
        return inc.load_ratio()

    assert abs(ratio(T0 + 24 * W) - 34.0 / 19.0) < 1e-9
    assert abs(ratio(T0 - 3 * W) - 19.0 / 34.0) < 1e-9


def _mfu_with_partition_means(k: int, parts: dict[int, tuple[int, float]]):
    """Attention MFU 0.50 -> 0.43 on `k` devices of one host in a pool of 64; per input
    partition p, its aggregate over `members` devices down by `shift`."""
    pts = [dataclasses.replace(_pt(f"h0/gpu{i}", "mfu", 0.50, 0.43, T0), layer="attention")
           for i in range(k)]  # fmt: skip
    for part, (members, shift) in parts.items():
        agg = _pt("pool:vision", "mfu", 0.50, 0.50 - shift, T0)
        pts.append(dataclasses.replace(agg, host=None, layer="attention", row=3,
                                       partition=part, members=members))  # fmt: skip
    corr = Correlator()
    corr.add(pts, T0 + 6 * W, {(POOL, MODEL): 64})
    (inc,) = corr.incidents
    return inc


def test_a_partitions_mean_over_a_few_devices_is_not_the_pool() -> None:
    """Records are keyed by device, so each input partition aggregates its own share of a
    pool. One whose two devices are both on the faulty host moved as far as they did; the
    pool did not (16 partitions: fleet_day seed 4 ticketed a host's waits as the whole
    job). Every partition's mean moving as far is the pool."""
    host = _mfu_with_partition_means(4, {5: (2, 0.07)})
    assert abs(host.aggregate_share(64) - 0.07 * 2 / (0.07 * 64)) < 1e-9
    assert host.scope_level(64, 0.5) == "host"
    pool = _mfu_with_partition_means(4, dict.fromkeys(range(4), (16, 0.07)))
    assert pool.aggregate_share(64) > 0.99
    assert pool.scope_level(64, 0.5) == "pool"
    # Unknown devices behind an aggregate (an older checkpoint's point): its shift alone.
    old = _mfu_with_partition_means(4, {5: (0, 0.07)})
    assert old.aggregate_share(64) > 0.99


def test_a_pool_that_moved_is_weighed_by_its_mean_not_the_devices_found_yet() -> None:
    """Attention MFU -14 % found on 4 devices of 64 while every partition's mean moved as
    far: the pool moved, and the page weighs the whole pool (`pool_regression` seed 1
    stayed a ticket at 29 of about 45 devices found). The same 4 devices with no mean
    moving are weighed by themselves: no page."""
    lc = AlertLifecycle(AlertSettings(), Advisor())
    pool = _mfu_with_partition_means(4, dict.fromkeys(range(4), (16, 0.07)))
    alert = lc.render(pool, T0 + 6 * W, 64, "firing", level="pool")
    assert (alert.scope.level, alert.severity) == ("pool", "page")
    alone = _mfu_with_partition_means(4, {})
    assert lc.render(alone, T0 + 6 * W, 64, "firing", level="pool").severity != "page"


def test_a_host_scope_summary_names_the_host_holding_most_of_the_devices() -> None:
    """Five devices of h9 and a stray one of h1 (which sorts first): host h9 is named."""
    devs = ["h1/gpu0", *(f"h9/gpu{i}" for i in range(5))]
    corr = Correlator()
    corr.add([_pt(d, "device_mfu", 0.4, 0.3, T0) for d in devs], T0 + 3 * W, {(POOL, MODEL): 64})
    (inc,) = corr.incidents
    assert inc.main_host() == "h9"
    lc = AlertLifecycle(AlertSettings(), Advisor())
    lc.host_sizes = {"h1": 8, "h9": 8}
    alert = lc.render(inc, T0 + 3 * W, 64, "firing")
    assert alert.scope.level == "host"
    assert "on host h9 (6 devices)" in alert.summary


def test_heat_found_late_is_explained_by_a_burst_before_its_detection() -> None:
    """A die's rise found 30 windows late is dated 20 windows before a burst its pool's
    request rate shows: the onset is no better than the detection delay, so the burst
    may be what heated it, and no cooling incident opens. A burst seen only after the
    heat was found explains nothing: a cooling fault opens its incident."""

    def incidents(burst_at: float) -> int:
        heat = dataclasses.replace(
            _pt("h0/gpu0", "temp_c", 50.0, 56.0, T0), detected_ts=T0 + 30 * W,
            fields=BIT["power_w"],
        )  # fmt: skip
        corr = Correlator()
        sizes = {(POOL, MODEL): 8}
        corr.add([heat, _pt("h1/gpu0", "req_rate", 100.0, 150.0, burst_at)], T0 + 33 * W, sizes)
        corr.add([], T0 + (31 + LEAD_WINDOWS) * W, sizes)
        return len(corr.incidents)

    assert incidents(T0 + 20 * W) == 0
    assert incidents(T0 + 31 * W) == 1


def test_heat_no_more_than_the_work_served_brings_is_no_cooling_ticket() -> None:
    """Two dies of a host +12 % (a ticket's worth of cooling lost at the same power)
    while their pool served x1.5 the requests it served before (a burst its detectors,
    re-learning after the last one, did not show as a change): x1.5 the work draws at
    most x1.5 the power, so the heat says nothing of the cooling: an info record that
    says why. The same heat at the same load is a ticket."""

    def render(burst: float):
        heat = [
            dataclasses.replace(_pt(d, "temp_c", 50.0, 56.0, T0 + 30 * W),
                                detected_ts=T0 + 34 * W, fields=BIT["power_w"])
            for d in ("h0/gpu0", "h0/gpu1")
        ]  # fmt: skip
        corr = Correlator()
        sizes = {(POOL, MODEL): 8}
        corr.add(heat, T0 + 35 * W, sizes)
        corr.add([], T0 + (35 + LEAD_WINDOWS) * W, sizes)
        (inc,) = corr.incidents
        adv = Advisor()
        for w in range(45):
            adv.exposure.observe(POOL, T0 + w * W, 100.0 * (burst if w >= 30 else 1.0))
        return AlertLifecycle(AlertSettings(), adv).render(inc, T0 + 45 * W, 8, "firing")

    calm = render(1.0)
    assert (calm.metric, calm.severity) == ("temp_c", "ticket")
    burst = render(1.5)
    assert (burst.metric, burst.severity) == ("temp_c", "info")
    assert "served x1.50 the requests" in burst.summary


def test_a_cooling_fault_is_judged_on_its_whole_climb() -> None:
    """A die climbs in steps over its cooling's time constant. Its first step fell within
    a grouping window of a burst (explained, so no incident); the next, past that window,
    is heat nothing explains. The cooling lost is judged from the level before the climb's
    first step (50 °C, a ticket's worth at 69 °C), not from the last step's own before
    (64 °C: 7 %, an info record), as a climb first found late by its detector would be."""
    sizes = {(POOL, MODEL): 8}
    steps = [(50.0, 60.0, 25), (64.0, 69.0, 32)]
    corr = Correlator()
    corr.add([_pt("h1/gpu0", "req_rate", 100.0, 150.0, T0)], T0 + 2 * W, sizes)
    for before, after, at in steps:
        heat = dataclasses.replace(
            _pt("h0/gpu0", "temp_c", before, after, T0 + at * W), fields=BIT["power_w"]
        )
        corr.add([heat], T0 + (at + 2) * W, sizes)
        corr.add([], T0 + (at + 2 + LEAD_WINDOWS) * W, sizes)
    (inc,) = corr.incidents
    assert [(p.before, p.after) for p in inc.points] == [(50.0, 69.0)]
    assert inc.onset_ts == T0 + 32 * W
    alert = AlertLifecycle(AlertSettings(), Advisor()).render(inc, T0 + 40 * W, 8, "firing")
    assert (alert.metric, alert.severity) == ("temp_c", "ticket")


def test_a_hosts_link_is_sure_on_min_devices_waiting_with_less_work_on_one() -> None:
    """Three of a host's eight devices wait longer at their all-reduce and one of them does
    less work from the same window: two counters agree on the host, sure when both are
    found, though three of eight is not most of the host. Waits alone are not; nor is a
    wait that began long before the others (another device's drift)."""
    sizes = {f"h{i}": 8 for i in range(4)}

    def wait(device: str, onset: float, found: float) -> ChangePoint:
        p = _pt(device, "sync_frac", 0.2, 0.45, onset)
        return dataclasses.replace(p, layer="allreduce", detected_ts=found)

    def sure(points: list[ChangePoint]) -> float | None:
        inc = Incident(POOL, MODEL, T0, T0 + 2 * W, W, points=points)
        return inc.confirmed_at(32, 3, 0.1, sizes)

    waits = [wait("h0/gpu1", T0, T0 + 4 * W), wait("h0/gpu2", T0, T0 + 9 * W),
             wait("h0/gpu5", T0 + W, T0 + 30 * W)]  # fmt: skip
    less = dataclasses.replace(_pt("h0/gpu2", "device_mfu", 0.44, 0.40, T0), detected_ts=T0 + 3 * W)
    assert sure([*waits, less]) == T0 + 30 * W
    assert sure(waits) is None
    drifted = [wait("h0/gpu1", T0 - 20 * W, T0 + 4 * W), *waits[1:]]
    assert sure([*drifted, less]) is None


def test_a_spike_that_stepped_back_before_it_was_sent_does_not_date_what_comes_next() -> None:
    """One device's collective waits spike for two minutes and fall back; a minute later
    its host's fault raises every device's waits. The spike's incident, never sent, closes
    when the spike steps back, so the fault opens its own, dated by itself. A step back
    that undoes less than half the move leaves the move in its incident."""
    devs = [f"h0/gpu{i}" for i in range(8)]

    def sync(d: str, before: float, after: float, onset: float) -> ChangePoint:
        return dataclasses.replace(_pt(d, "sync_frac", before, after, onset), layer="allreduce")

    corr = Correlator()
    corr.add([sync(devs[4], 0.03, 0.25, T0)], T0 + 2 * W, {(POOL, MODEL): 8})
    assert len(corr.incidents) == 1
    corr.add([sync(devs[4], 0.25, 0.18, T0 + 5 * W)], T0 + 7 * W)  # part way back: still on
    assert len(corr.incidents) == 1
    assert len(corr.incidents[0].points) == 1
    corr.add([sync(devs[4], 0.18, 0.03, T0 + 12 * W)], T0 + 14 * W)
    assert corr.incidents == []
    fault = T0 + 20 * W
    corr.add([sync(d, 0.03, 0.9, fault) for d in devs], fault + 2 * W, {(POOL, MODEL): 8})
    (inc,) = corr.incidents
    assert inc.onset_ts == fault
    assert inc.devices == set(devs)

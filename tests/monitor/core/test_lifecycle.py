"""Alert lifecycle: which pool size an open incident is confirmed and weighed against."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np

from monitor.config import AlertSettings
from monitor.core.advisor import Advisor
from monitor.core.correlator import ChangePoint, Correlator
from monitor.core.coverage import BIT
from monitor.core.lifecycle import AlertLifecycle, heat_severity, severity
from monitor.indicators import STAGE_OF
from monitor.wire import Alert, ChangeEvent, ChangeScope

T0, W = 1_000_000.0, 10.0
POOL, OLD, NEW = "serve-a", "llama-8b@v3", "llama-8b@v4"


def _mfu_drop(
    device: str, onset: float = T0, before: float = 0.68, after: float = 0.6426
) -> ChangePoint:
    """MLP MFU on one device of the old model (by default -5.5%)."""
    return ChangePoint(
        device=device, host=device.split("/", maxsplit=1)[0], pool=POOL, model=OLD,
        layer="mlp", metric="mfu", stage=STAGE_OF["mfu"], onset_ts=onset,
        detected_ts=onset + 2 * W, before=before, after=after, score=1.1, window_s=W,
    )  # fmt: skip


def _three_devices_then(counts_after: dict[tuple[str | None, str | None], int]):
    """Three scattered devices of a 168-device pool regress; the next wave has these counts."""
    corr = Correlator()
    corr.add(
        [_mfu_drop(f"node-{i:03d}/gpu0") for i in (19, 20, 23)], T0 + 3 * W, {(POOL, OLD): 168}
    )
    corr.add([], T0 + 4 * W, counts_after)
    life = AlertLifecycle(AlertSettings(), Advisor())
    return corr, life.due(corr.incidents, T0 + 4 * W, counts_after)


def test_three_scattered_devices_of_a_large_pool_do_not_alert() -> None:
    _, alerts = _three_devices_then({(POOL, OLD): 168})
    assert alerts == []


def test_a_model_rollout_does_not_shrink_the_pool_an_open_incident_is_judged_against() -> None:
    """Every device reports the new model after the rollout, so the old (pool, model) has
    none: judged against 0 devices, three noisy ones confirmed it at the whole pool's weight
    (a ticket in `deploy_without_regression`, seed 7)."""
    corr, alerts = _three_devices_then({(POOL, NEW): 168})
    assert alerts == []
    (inc,) = corr.incidents
    assert inc.pool_size == 168
    life = AlertLifecycle(AlertSettings(), Advisor())
    alert = life.render(inc, T0 + 4 * W, inc.pool_devices({(POOL, NEW): 168}), "firing")
    assert alert.severity == "info"


def test_a_pool_that_small_still_alerts() -> None:
    """The same three devices are the whole of a three-device pool: confirmed, and weighed
    as all of it."""
    corr = Correlator()
    pts = [_mfu_drop(f"node-{i:03d}/gpu0") for i in (19, 20, 23)]
    corr.add(pts, T0 + 3 * W, {(POOL, OLD): 3})
    life = AlertLifecycle(AlertSettings(), Advisor())
    # A ticket goes out once the incident's grouping window has passed.
    assert life.due(corr.incidents, T0 + 4 * W, {(POOL, OLD): 3}) == []
    (alert,) = life.due(corr.incidents, T0 + 30 * W, {(POOL, OLD): 3})
    assert alert.severity == "ticket"
    assert alert.scope.device_count == 3


def _pool_drop(pool: str, onset: float, hosts: range) -> list[ChangePoint]:
    """Device MFU -18% on every device of `hosts` (8 devices each) in `pool`."""
    return [
        ChangePoint(
            device=f"{pool}-{h}/gpu{g}",
            host=f"{pool}-{h}",
            pool=pool,
            model="m@v1",
            layer=None,
            metric="device_mfu",
            stage=STAGE_OF["device_mfu"],
            onset_ts=onset,
            detected_ts=onset + 3 * W,
            before=0.5,
            after=0.41,
            score=1.2,
            window_s=W,
        )
        for h in hosts
        for g in range(8)
    ]


def _alerts_for_onsets(gap_windows: int) -> list:
    """A pool-wide drop on pool a, and one host of pool b dropping `gap_windows` later."""
    counts = {("a", "m@v1"): 16, ("b", "m@v1"): 112}
    corr = Correlator()
    life = AlertLifecycle(AlertSettings(), Advisor())
    out = []
    t_b = T0 + gap_windows * W
    for now in np.arange(T0 + 3 * W, t_b + 12 * W, W):
        pts = [p for p in _pool_drop("a", T0, range(2)) + _pool_drop("b", t_b, range(1))
               if p.detected_ts == now]  # fmt: skip
        corr.add(pts, float(now), counts)
        live = [i for i in corr.incidents if i.status == "open"]
        out += life.due(live, float(now), counts, {"a-0": 8, "a-1": 8, "b-0": 8})
    return out


def test_incidents_on_two_pools_at_once_are_one_fleet_alert() -> None:
    alerts = _alerts_for_onsets(1)
    assert {a.id for a in alerts} == {alerts[0].id}
    assert alerts[-1].scope.level == "fleet"
    assert alerts[-1].scope.device_count == 24


def test_a_host_incident_minutes_later_on_another_pool_keeps_its_own_alert() -> None:
    """30 windows apart is not one rollout: pool b's host incident pages on its own, not
    hidden as a child of pool a's alert (`fleet_day`, seed 6, missed it that way)."""
    alerts = _alerts_for_onsets(30)
    by_pool = {a.scope.pool: a for a in alerts}
    assert set(by_pool) == {"a", "b"}
    assert by_pool["b"].scope.level == "host"
    assert all(a.scope.level != "fleet" for a in alerts)


def test_a_deeper_drop_on_the_same_devices_is_re_sent_as_a_page() -> None:
    """No new device and no new scope, but the loss crossed the page bar: the record goes
    out now (before, only growth, scope or a rollback candidate re-sent an alert)."""
    counts = {(POOL, OLD): 8}
    corr = Correlator()
    life = AlertLifecycle(AlertSettings(), Advisor())
    devices = [f"node-{i:03d}/gpu0" for i in range(8)]
    corr.add([_mfu_drop(d) for d in devices], T0 + 3 * W, counts)
    (first,) = life.due(corr.incidents, T0 + 30 * W, counts)
    assert first.severity == "ticket"
    assert life.due(corr.incidents, T0 + 31 * W, counts) == []
    deeper = [_mfu_drop(d, onset=T0 + 30 * W, before=0.6426, after=0.50) for d in devices]
    corr.add(deeper, T0 + 32 * W, counts)
    (again,) = life.due(corr.incidents, T0 + 32 * W, counts)
    assert again.id == first.id
    assert again.severity == "page"
    assert again.scope.device_count == first.scope.device_count
    assert life.due(corr.incidents, T0 + 33 * W, counts) == []


def test_an_incident_keeps_the_metric_it_first_paged_with() -> None:
    """Evidence that arrives later may favour another metric; a paged alert keeps its
    metric, id and so its Alertmanager label set (two copies of one incident once stayed
    active)."""
    devs = [f"node-{i:03d}/gpu0" for i in range(4)]
    corr = Correlator()
    counts = {(POOL, OLD): 4}
    corr.add([replace(_mfu_drop(d, after=0.578), metric="device_mfu", layer=None)
              for d in devs], T0 + 3 * W, counts)  # fmt: skip
    life = AlertLifecycle(AlertSettings(), Advisor())
    (first,) = life.due(corr.incidents, T0 + 4 * W, counts)
    assert (first.metric, first.severity) == ("device_mfu", "page")
    corr.add([_mfu_drop(d, onset=T0 + W) for d in devs], T0 + 6 * W, counts)
    (inc,) = corr.incidents
    assert {p.metric for p in inc.points} == {"device_mfu", "mfu"}
    later = life.due(corr.incidents, T0 + 60 * W, counts)
    later.append(life.render(inc, T0 + 61 * W, 4, "firing"))
    assert all((a.metric, a.id) == ("device_mfu", first.id) for a in later)


def test_a_ticket_is_judged_on_the_layer_found_after_it_until_it_pages() -> None:
    """Device MFU -5.5 % on every device is a ticket; the attention MFU drop behind it
    (-15 %), found a few windows later, is the most telling metric: the record is re-sent
    as a page on it, under the same id (`fallback_in_overload` seed 4 stayed a ticket
    when the devices' own MFU was found first)."""
    devs = [f"node-{i:03d}/gpu0" for i in range(4)]
    corr = Correlator()
    counts = {(POOL, OLD): 4}
    corr.add([replace(_mfu_drop(d), metric="device_mfu", layer=None) for d in devs],
             T0 + 3 * W, counts)  # fmt: skip
    life = AlertLifecycle(AlertSettings(), Advisor())
    assert life.due(corr.incidents, T0 + 4 * W, counts) == []  # a ticket waits its window
    (first,) = life.due(corr.incidents, T0 + 30 * W, counts)
    assert (first.metric, first.severity) == ("device_mfu", "ticket")
    attention = [replace(_mfu_drop(d, after=0.578), layer="attention") for d in devs]
    corr.add(attention, T0 + 32 * W, counts)
    (paged,) = life.due(corr.incidents, T0 + 32 * W, counts)
    assert (paged.metric, paged.severity, paged.id) == ("mfu", "page", first.id)


def test_onset_never_after_detection_when_later_devices_join() -> None:
    """The incident's onset is the median over its devices; when later devices whose shift
    began after the first detection outnumber the first ones, the alert still never says
    the change was found before it began (onset <= detected)."""
    corr = Correlator()
    first = [_mfu_drop(f"node-000/gpu{i}", onset=T0) for i in range(2)]
    late = [_mfu_drop(f"node-001/gpu{i}", onset=T0 + 8 * W) for i in range(5)]
    corr.add([*first, *late], T0 + 12 * W, {(POOL, OLD): 8})
    (inc,) = corr.incidents
    assert inc.onset_ts > inc.detected_ts  # the median onset is a late device's
    alert = AlertLifecycle(AlertSettings(), Advisor()).render(inc, T0 + 12 * W, 8, "firing")
    assert alert.onset_ts <= alert.detected_ts


def _wait_rise(g: int) -> ChangePoint:
    """All-reduce waits x2.5 on device `g` of host node-011 (8 devices)."""
    return ChangePoint(
        device=f"node-011/gpu{g}", host="node-011", pool="train-a", model="m@v1",
        layer="allreduce", metric="sync_frac", stage=STAGE_OF["sync_frac"], onset_ts=T0,
        detected_ts=T0 + 2 * W, before=0.2, after=0.5, score=1.1, window_s=W,
    )  # fmt: skip


def _host_waits(pool_devices: int, devices: int) -> Correlator:
    """The waits of the first `devices` of host node-011 rise in a pool of `pool_devices`."""
    corr = Correlator()
    corr.add([_wait_rise(g) for g in range(devices)], T0 + 3 * W,
             {("train-a", "m@v1"): pool_devices})  # fmt: skip
    return corr


def test_a_whole_host_confirms_however_large_its_pool() -> None:
    """Eight devices of one host are most of that host: confirmed in a 200-device pool too,
    where 5 % of the pool is ten devices, more than a host has (`sync_contention` at 256
    devices never paged its bad host). A third of a host stays unconfirmed."""
    sizes = {"node-011": 8}
    for pool_devices in (32, 200, 1000):
        (inc,) = _host_waits(pool_devices, 8).incidents
        assert inc.confirmed_at(pool_devices, 3, 0.05, sizes) == T0 + 2 * W, pool_devices
    (inc,) = _host_waits(200, 3).incidents
    assert inc.confirmed_at(200, 3, 0.05, sizes) is None


def _step(
    metric: str, before: float, after: float, onset: float = T0, layer: str | None = None
) -> list[ChangePoint]:
    """A step of `metric` on pool a's aggregate and each of its 16 devices (node a-0, a-1)."""
    return [
        ChangePoint(
            device=device, host=None if device == "pool:a" else device.split("/")[0], pool="a",
            model="m@v1", layer=layer, metric=metric, stage=STAGE_OF[metric], onset_ts=onset,
            detected_ts=T0 + 2 * W, before=before, after=after, score=1.2, window_s=W,
        )
        for device in ("pool:a", *(f"a-{h}/gpu{g}" for h in range(2) for g in range(8)))
    ]  # fmt: skip


def _served_drop(*context: list[ChangePoint]) -> Alert:
    """Device MFU -18% on all 16 devices of pool a, found with `context` around it."""
    counts = {("a", "m@v1"): 16}
    corr = Correlator()
    corr.add([*(p for c in context for p in c), *_pool_drop("a", T0, range(2))], T0 + 3 * W,
             counts)  # fmt: skip
    (inc,) = corr.incidents
    return AlertLifecycle(AlertSettings(), Advisor()).render(inc, T0 + 4 * W, 16, "firing")


def test_device_mfu_that_fell_with_the_offered_load_is_no_regression() -> None:
    """Devices do the work they are given: their MFU -18% as the served rate halves (hosts
    joining the pool, traffic ebbing), with no per-layer efficiency or queue moved, is an
    info record saying so. The same drop with nothing around it pages, and so does one
    the load's fall cannot cover (x0.9 against -18%), or one that came with a per-layer
    efficiency's fall."""
    assert _served_drop().severity == "page"
    fell = _served_drop(_step("req_rate", 100.0, 50.0))
    assert fell.severity == "info"
    assert "offered load fell to x0.50" in fell.summary
    assert _served_drop(_step("req_rate", 100.0, 90.0)).severity == "page"
    less_efficient = _step("occupancy", 0.6, 0.45, layer="mlp")
    assert _served_drop(_step("req_rate", 100.0, 50.0), less_efficient).severity == "page"


def test_device_mfu_that_fell_as_the_queue_drained_is_no_regression() -> None:
    """A burst's backlog kept the devices busy; as it drains they slow to the offered rate,
    whatever the served rate's detector shows yet: info. So too when the drain, dated four
    windows before, was found two windows after the drop began (a change found late is
    dated no better than its detection delay). Not so when the queue drained ten windows
    before (found two windows later), nor when a per-layer efficiency fell with it."""
    drained = _served_drop(_step("queue_wait_ms", 400.0, 20.0))
    assert drained.severity == "info"
    assert "its queue drained" in drained.summary
    late = _step("queue_wait_ms", 400.0, 20.0, onset=T0 - 4 * W)
    assert _served_drop(late).severity == "info"
    early = [
        dataclasses.replace(p, detected_ts=T0 - 8 * W)
        for p in _step("queue_wait_ms", 400.0, 20.0, onset=T0 - 10 * W)
    ]
    assert _served_drop(early).severity == "page"
    less_efficient = _step("occupancy", 0.6, 0.45, layer="mlp")
    assert _served_drop(_step("queue_wait_ms", 400.0, 20.0), less_efficient).severity == "page"


def test_a_queue_that_drained_is_load_context_not_evidence() -> None:
    """A queue's step down is filed with the offered load (`Incident.drained`), never as
    evidence, and the offered load's ratio reads only the request rate."""
    counts = {("a", "m@v1"): 16}
    corr = Correlator()
    corr.add([*_step("queue_wait_ms", 400.0, 20.0), *_pool_drop("a", T0, range(2))], T0 + 3 * W,
             counts)  # fmt: skip
    (inc,) = corr.incidents
    assert inc.drained()
    assert inc.evidence == []
    assert inc.load_ratio() == 1.0


def _slow_host(fields: int, moved: tuple[tuple[str, str | None, float, float], ...] = (
    ("sync_frac", "allreduce", 0.43, 0.65), ("device_mfu", None, 0.32, 0.29),
), at: float = T0 + 4 * W, slower: int = 8, pool: int = 64, waiting: int = 8) -> Alert:  # fmt: skip
    """By default all-reduce waits 0.43 -> 0.65 and device MFU -9 % on the 8 devices of host
    h-0 in a `pool`-device pool, each device's newest record carrying `fields`
    (`coverage.BIT`); device MFU only on the first `slower` of them, waits on the first
    `waiting`."""
    pts = [
        ChangePoint(
            device=f"h-0/gpu{g}", host="h-0", pool="p", model="m@v1", layer=layer,
            metric=metric, stage=STAGE_OF[metric], onset_ts=T0, detected_ts=T0 + 2 * W,
            before=before, after=after, score=1.2, window_s=W, fields=fields,
        )
        for g in range(8)
        for metric, layer, before, after in moved
        if (metric != "device_mfu" or g < slower) and (metric != "sync_frac" or g < waiting)
    ]  # fmt: skip
    corr = Correlator()
    corr.add(pts, T0 + 3 * W, {("p", "m@v1"): pool})
    (inc,) = corr.incidents
    life = AlertLifecycle(AlertSettings(), Advisor())
    life.host_sizes = {"h-0": 8}
    return life.render(inc, at, pool, "firing")


def test_a_slow_link_pages_on_a_job_and_on_serving_replicas_alike() -> None:
    """Waits up and work down on one host's devices at a steady load: the collective's wait
    timer and the FLOPs done agree, a hardware fault (its link), which pages at host scope
    whatever its share of the pool, on a training job as on serving replicas. (Before,
    serving replicas were sized by their eighth of the pool: a ticket; in the simulator
    every training record carries its loader's rate too, so a slow training host was
    sized that way as well and paged in 4 of 8 `nic_slowdown` seeds.) The scope is one
    host's only once the grouping window has passed: before, waits found on other hosts
    a few minutes later could still make it the traffic's (the long healthy fleet's seed
    5: a `serve-moe` host first, then seven more)."""
    settled = T0 + 31 * W
    for fields in (BIT["power_w"], BIT["power_w"] | BIT["req_rate"]):
        alert = _slow_host(fields, at=settled)
        assert (alert.metric, alert.scope.level, alert.severity) == ("sync_frac", "host", "page")
        assert alert.bottleneck == "synchronisation"
        assert alert.suggestion.action != "rollback"
    assert _slow_host(BIT["power_w"] | BIT["req_rate"]).severity != "page"
    # A link slowed by a few per cent: the waits found on the whole host, the work's small
    # fall on two of its devices (the others' detectors have not yet found it).
    alert = _slow_host(BIT["power_w"] | BIT["req_rate"], at=settled, slower=2)
    assert (alert.scope.level, alert.severity) == ("host", "page")


def test_a_slow_link_pages_on_less_work_with_the_wait_found_on_one_of_its_devices() -> None:
    """A device's share of time in its collective is noisy, its FLOPs are not: the work's
    fall is found on four of the host's devices, the wait on one of them. Four devices
    of one host doing less work at the same compute speed, the wait timer saying where
    on one: the host's link, a page. Less work on two of them is not enough of the host
    (`alerts.min_devices`, 3)."""
    settled = T0 + 31 * W
    serving = BIT["power_w"] | BIT["req_rate"]
    alert = _slow_host(serving, at=settled, slower=4, waiting=1)
    assert (alert.scope.level, alert.bottleneck, alert.severity) == (
        "host", "synchronisation", "page",
    )  # fmt: skip
    assert alert.suggestion.action != "rollback"
    assert _slow_host(serving, at=settled, slower=2, waiting=1).severity != "page"


def _slower_steps(fields: int, at: float, extra: tuple[str, ...] = (), rate: float = 1.0) -> Alert:
    """Host h-0's 8 devices, half of a 16-device training pool: device MFU -27 % and step
    time (latency) +38 %, plus `extra` metrics moved, and the request rate x`rate`."""
    moved: list[tuple[str, str | None, float, float]] = [
        ("device_mfu", None, 0.55, 0.40),
        ("lat_p50_ms", None, 1740.0, 2400.0),
        ("lat_p99_ms", None, 1740.0, 2400.0),
        *((m, None, 0.15, 0.9) for m in extra),
    ]
    if rate != 1.0:
        moved.append(("req_rate", None, 10.0, 10.0 * rate))
    return _slow_host(fields, tuple(moved), at, pool=16)


def test_slower_steps_with_the_queue_held_are_a_fault_not_capacity() -> None:
    """A training host whose steps slow (a slow link whose waits were not yet found): step
    time up, work down, the loader's rate and its reported queue steady. Once the grouping
    window has passed without the queue moving, latency is time in service: not capacity
    (`info`) but a regression that pages. Before it, or where no queue is reported, or
    where the queue moved, or under a burst, it stays capacity."""
    queue = BIT["power_w"] | BIT["req_rate"] | BIT["queue_wait_ms"] | BIT["queue_depth"]
    settled = T0 + 31 * W
    alert = _slower_steps(queue, settled)
    assert (alert.bottleneck, alert.first_failing_stage, alert.severity) == (
        "unclassified", "execution", "page",
    )  # fmt: skip
    assert alert.suggestion.action != "rollback"
    assert _slower_steps(queue, T0 + 4 * W).bottleneck == "overload"
    assert _slower_steps(queue & ~BIT["queue_wait_ms"], settled).bottleneck == "overload"
    assert _slower_steps(queue, settled, ("queue_wait_ms",)).bottleneck == "overload"
    # Under a burst a bigger batch takes longer to serve: latency is not all queueing then.
    assert _slower_steps(queue, settled, rate=2.0).bottleneck == "overload"


def test_waits_alone_or_with_a_slower_member_are_no_link_fault() -> None:
    """Waits alone on serving replicas cost their own devices' work: no page. Waits and
    work down with a compute layer slower on the same devices are a slower member, not
    the link: sized by their devices, no page either."""
    waits = (("sync_frac", "allreduce", 0.43, 0.65),)
    serving = BIT["power_w"] | BIT["req_rate"]
    assert _slow_host(serving, waits, at=T0 + 31 * W).severity != "page"
    slower = (*waits, ("device_mfu", None, 0.32, 0.29), ("mfu", "mlp", 0.5, 0.44))
    assert _slow_host(serving, slower, at=T0 + 31 * W).severity != "page"


def test_a_wait_share_costs_through_the_time_per_collective() -> None:
    """A wait share 0.141 -> 0.208 makes each collective 8 % slower ((1 - 0.141) / (1 -
    0.208)), not 32 % (1 - 0.141 / 0.208): on 5 devices of 16 that is a ticket, not the
    page it was (`fleet_day` seed 140: a host's members waiting for one of their own)."""
    assert severity("sync_frac", 0.141, 0.208, 47.5, 5 / 16, "synchronisation", 0.1) == "ticket"
    assert severity("sync_frac", 0.141, 0.5, 255.0, 5 / 16, "synchronisation", 0.1) == "page"
    assert severity("lat_p99_ms", 0.141, 0.208, 47.5, 5 / 16, "ingress", 0.1) == "page"


def test_heat_severity_allows_what_the_work_served_brings() -> None:
    """x`served` the work draws at most x`served` the power, so only heat beyond that
    bound shows cooling lost; less work served excuses nothing."""
    assert heat_severity(50.0, 56.0, 0.1, "thermal_power") == "ticket"
    assert heat_severity(50.0, 56.0, 0.1, "thermal_power", served=1.2) == "info"
    assert heat_severity(50.0, 70.0, 0.1, "thermal_power", served=1.2) == "ticket"
    assert heat_severity(50.0, 56.0, 0.1, "thermal_power", served=0.5) == "ticket"


def _shedding(device: str, onset: float) -> ChangePoint:
    """Failed requests 1 % -> 28 % of one serving device's requests."""
    return ChangePoint(
        device=device, host=device.split("/", maxsplit=1)[0], pool=POOL, model=OLD,
        layer=None, metric="error_rate", stage=STAGE_OF["error_rate"], onset_ts=onset,
        detected_ts=onset + 3 * W, before=0.01, after=0.28, score=1.0, window_s=W,
    )  # fmt: skip


def test_failures_at_a_burst_no_load_detector_found_are_capacity() -> None:
    """A burst began two windows before the failures, a minute after the last one ended:
    the request rate's detectors, re-learning after that end, found that end and not the
    new burst's start, so their load reads as fallen (x0.66). Measured
    window by window around the onset the offered load rose x1.8, so the failures are
    what a full queue sheds: capacity (`info`), and it stays so once those windows age
    out. With the rate flat the same failures are a ticket."""

    counts = {(POOL, OLD): 16}

    def first(burst: float) -> tuple[Alert, AlertLifecycle, Correlator]:
        adv = Advisor()
        for w in range(60):
            rate = 29.0 * (burst if w >= 28 else 1.0)
            adv.exposure.observe(POOL, T0 + w * W, rate)
        onset = T0 + 30 * W
        corr = Correlator()
        devs = [f"node-{i // 8:03d}/gpu{i % 8}" for i in range(16)]
        corr.add([_shedding(d, onset) for d in devs], onset + 4 * W, counts)
        # The last step the rate's detectors found: the earlier burst's end.
        (inc,) = corr.incidents
        inc.load += [
            replace(_shedding(d, onset - 15 * W), metric="req_rate", stage=STAGE_OF["req_rate"],
                    before=44.0, after=29.0)
            for d in devs
        ]  # fmt: skip
        assert inc.load_ratio() < 1.0
        life = AlertLifecycle(AlertSettings(), adv)
        (alert,) = life.due(corr.incidents, onset + 60 * W, counts)
        return alert, life, corr

    alert, life, corr = first(1.8)
    assert (alert.severity, alert.bottleneck) == ("info", "overload"), alert.summary
    assert "x1.8" in alert.summary
    life.advisor.exposure.prune(T0 + 3 * 3600)  # the windows read are gone
    (again,) = life.restate(corr.incidents, T0 + 3 * 3600, counts)
    assert (again.id, again.severity, again.bottleneck) == (alert.id, "info", "overload")
    flat, _, _ = first(1.0)
    assert (flat.severity, flat.bottleneck) == ("ticket", "errors"), flat.summary


def test_a_ticket_waits_for_the_evidence_that_would_class_it_capacity() -> None:
    """Failures found before the offered-load step that explains them: judged at once they
    are a ticket (`errors`). The step is found 8 windows later, inside the incident's
    grouping window, and a ticket waits for that window: the first and only record is
    the capacity record, no ticket opened and closed. A page would not wait."""
    onset = T0 + 30 * W
    counts = {(POOL, OLD): 16}
    devs = [f"node-{i // 8:03d}/gpu{i % 8}" for i in range(16)]
    corr = Correlator()
    corr.add([_shedding(d, onset) for d in devs], onset + 4 * W, counts)
    life = AlertLifecycle(AlertSettings(), Advisor())
    (inc,) = corr.incidents
    early = life.render(inc, onset + 6 * W, 16, "firing")
    assert (early.severity, early.bottleneck) == ("ticket", "errors")
    sent = [a for w in range(6, 12) for a in life.due(corr.incidents, onset + w * W, counts)]
    inc.load += [
        replace(_shedding(d, onset - 2 * W), metric="req_rate", stage=STAGE_OF["req_rate"],
                before=29.0, after=53.0, detected_ts=onset + 12 * W)
        for d in devs
    ]  # fmt: skip
    sent += [a for w in range(12, 40) for a in life.due(corr.incidents, onset + w * W, counts)]
    assert sent
    assert {(a.severity, a.bottleneck) for a in sent} == {("info", "overload")}


def test_failures_a_pool_aggregate_dates_to_a_deploy_name_it() -> None:
    """A release fails 0.4 % of requests, one every few windows per device: each device's
    detector dates its first failures 8 windows after the deploy, by chance, and failures
    begun more than 6 windows after a change are not its (a burst sheds them too). The
    pool's aggregates, summing every device's failures, dated them on the deploy's next
    window: the deploy is the rollback. Without the aggregates it is not named."""
    counts = {(POOL, OLD): 16}
    deploy = T0 - 8 * W
    devs = [f"node-{i // 8:03d}/gpu{i % 8}" for i in range(16)]

    def rollback(aggregates: bool) -> str | None:
        adv = Advisor()
        adv.add_change(ChangeEvent(
            v=1, ts=deploy, id="chg-9", kind="model", scope=ChangeScope(pool=POOL),
            from_="llama-8b@v2", to=OLD,
        ))  # fmt: skip
        for w in range(-60, 60):
            adv.exposure.observe(POOL, T0 + w * W, 29.0)
        pts = [replace(_shedding(d, T0), before=0.0, after=0.004) for d in devs]
        if aggregates:
            pts += [
                replace(_shedding(f"pool:{POOL}#{k}", deploy + W), host="", before=0.0,
                        after=0.004, members=4)
                for k in range(4)
            ]  # fmt: skip
        corr = Correlator()
        corr.add(pts, T0 + 4 * W, counts)
        (alert,) = AlertLifecycle(AlertSettings(), adv).due(corr.incidents, T0 + 60 * W, counts)
        return alert.suggestion.change_id

    assert rollback(aggregates=True) == "chg-9"
    assert rollback(aggregates=False) is None


def test_failures_that_grow_in_an_overload_already_shedding_are_capacity() -> None:
    """A burst (x2) fills the queue to its admission limit: 16 % of requests are shed, an
    overload record (`info`). Twelve windows into it a model change lands, and with each
    request costing more the same burst sheds 21 %. The change came right before the
    failures' step, but they are the burst's shed, larger by the capacity the change took:
    a capacity record that names the change, and it stays one as the record is re-sent.
    Without the shedding overload before it the same step is the change's to roll back."""
    devs = [f"node-{i // 8:03d}/gpu{i % 8}" for i in range(16)]
    landed = T0 + 12 * W
    counts = {(POOL, OLD): 16, (POOL, NEW): 16}

    def new_model_failures(overload: bool) -> list[Alert]:
        adv = Advisor()
        adv.add_change(ChangeEvent(
            v=1, ts=landed, id="chg-7", kind="model", scope=ChangeScope(pool=POOL),
            from_=OLD, to=NEW,
        ))  # fmt: skip
        for w in range(-60, 80):  # an earlier burst at x2.1, then this one at x2
            burst = 2.0 if w >= 0 else 2.1 if -50 <= w < -38 else 1.0
            adv.exposure.observe(POOL, T0 + w * W, 29.0 * burst)
        corr, life = Correlator(), AlertLifecycle(AlertSettings(), adv)
        sent: list[Alert] = []
        if overload:
            shed = [replace(_shedding(d, T0 + W), before=0.0, after=0.16) for d in devs]
            queue = [
                replace(p, metric="queue_wait_ms", stage=STAGE_OF["queue_wait_ms"],
                        before=900.0, after=30000.0)
                for p in shed
            ]  # fmt: skip
            corr.add([*shed, *queue], T0 + 4 * W, counts)
            sent += life.due(corr.incidents, T0 + 11 * W, counts)
        grew = [replace(_shedding(d, landed + W), model=NEW, before=0.16, after=0.21) for d in devs]
        corr.add(grew, landed + 4 * W, counts)
        for w in range(11, 40):
            sent += life.due(corr.incidents, T0 + (w + 1) * W, counts)
        return [a for a in sent if a.scope.model == NEW]

    after = new_model_failures(overload=True)
    assert after
    assert {(a.severity, a.bottleneck) for a in after} == {("info", "overload")}
    assert {a.suggestion.change_id for a in after} == {"chg-7"}
    assert "shedding" in after[0].summary, after[0].summary
    alone = new_model_failures(overload=False)
    assert alone
    assert (alone[-1].severity, alone[-1].bottleneck) == ("page", "errors"), alone[-1].summary
    assert alone[-1].suggestion.change_id == "chg-7"

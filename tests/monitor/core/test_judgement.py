"""Judgement on scales and mechanisms relative floors get wrong (quality, collectives,
small hardware faults)."""

from __future__ import annotations

import numpy as np
import pytest
from factories import T0, msg, window

from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from monitor.wire import Alert


def _serving(
    windows: int, *, drop_at: int | None, seed: int = 0, dips: tuple[int, ...] = ()
) -> list[list[RawMessage]]:
    """16 serving devices whose answer quality sits near 0.999 (error rate 0.1 %, lognormal
    noise); from `drop_at` on, after a model deploy, the error rate is ten times that.
    From each of `dips`, for 60 windows, it is twice that again."""
    rng = np.random.default_rng(seed)
    out = []
    for w in range(windows):
        ts = T0 + 10.0 * (w + 1)
        batch = []
        if drop_at is not None and w == drop_at - 1:
            batch.append(msg({"v": 1, "ts": ts - 5.0, "id": "deploy-7", "kind": "model",
                              "scope": {"pool": "serve-a"}, "from": "m@1", "to": "m@2"},
                             topic="flopwatch.changes"))  # fmt: skip
        for d in range(16):
            err = 0.001 * rng.lognormal(0.0, 0.3)
            deployed = drop_at is not None and w >= drop_at
            if deployed:
                err *= 10
            if any(d <= w < d + 60 for d in dips):
                err *= 2
            rec = window(f"node-{d // 8:03d}/gpu{d % 8}", ts, pool="serve-a",
                         model="m@2" if deployed else "m@1",
                         mfu=0.45 * (1 + 0.02 * rng.standard_normal()),
                         stall=0.3 * (1 + 0.02 * rng.standard_normal()),
                         slo={"lat_p99_ms": 120.0 * (1 + 0.05 * rng.standard_normal()),
                              "quality": 1.0 - err})  # fmt: skip
            batch.append(msg(rec, partition=d % 4))
        out.append(batch)
    return out


def _alerts(batches: list[list[RawMessage]]) -> list[Alert]:
    p = Pipeline(Settings())
    return [a for b in batches for a in p.process(b).alerts]


def test_a_tenfold_error_rate_pages_with_the_deploy_as_rollback() -> None:
    """Quality 0.999 -> 0.990 is -0.9 % of quality, under any relative floor on quality
    itself, and ten times the failed answers: judged on the error rate it pages."""
    alerts = _alerts(_serving(90, drop_at=45))
    pages = [a for a in alerts if a.status == "firing" and a.severity == "page"]
    assert pages, [(a.metric, a.severity) for a in alerts]
    first = pages[0]
    assert first.metric == "quality"
    assert first.first_failing_stage == "validation"
    assert first.detected_ts - (T0 + 10.0 * 46) <= 10 * 10.0  # within ten windows
    assert len({a.id for a in pages}) == 1
    last = [a for a in alerts if a.id == first.id and a.status == "firing"][-1]
    assert last.scope.level == "pool"
    assert last.suggestion.change_id == "deploy-7"


def test_a_lasting_tenfold_error_rate_pages_once_and_stays_open() -> None:
    """After the deploy's page the error rate doubles again three times for ten minutes and
    comes back to ten times its old level: the devices' later points join the paged
    incident, starting from the degraded level. The incident is judged recovered against
    the level its devices left when it began, not that one: while the error rate stays
    ten times what it was, it neither resolves nor pages again under another id."""
    alerts = _alerts(_serving(600, drop_at=45, dips=(150, 300, 450), seed=1))
    pages = {a.id for a in alerts if a.status == "firing" and a.severity == "page"}
    assert len(pages) == 1, [(a.id, a.status, a.summary) for a in alerts]
    assert [a for a in alerts if a.status == "resolved"] == []


def test_error_rate_noise_alone_does_not_page() -> None:
    """The same pool without the deploy: lognormal noise on a 0.1 % error rate pages nothing."""
    assert [a for a in _alerts(_serving(90, drop_at=None, seed=3)) if a.severity == "page"] == []


def _failing(
    windows: int, *, deploy_at: int | None = None, burst: tuple[int, int] | None = None,
    seed: int = 0, announced: bool = True, bare: bool = False, change_at: int | None = None,
    rate_step: float = 1.0,
) -> list[list[RawMessage]]:  # fmt: skip
    """16 serving devices at about 100 requests per second (10 s windows) whose failed
    requests (`slo.errors`) are Poisson at 0.02 % of them. From `deploy_at` on, after a
    model deploy, 0.5 % fail. Over `burst` (first, last window) the offered load is 1.6x
    what the pool serves: it serves at capacity, its queue waits at the admission limit
    (20x), p99 triples, the die heats and a fifth of the requests are shed as errors.
    `announced=False`: the deploy sends no change event (a dependency failing, say);
    `change_at`: its change event comes at that window instead (long before, say), and
    from `deploy_at` the request rate is `rate_step` times what it was.
    `bare`: the devices report only their request rate and failures (no queue, latency or
    heat), and the rate they report is the offered one, 1.6x at the burst."""
    rng = np.random.default_rng(seed)
    out = []
    for w in range(windows):
        ts = T0 + 10.0 * (w + 1)
        batch = []
        sent = change_at if change_at is not None else (deploy_at or 0) - 1
        if announced and deploy_at is not None and w == sent:
            batch.append(msg({"v": 1, "ts": ts - 5.0, "id": "deploy-9", "kind": "model",
                              "scope": {"pool": "serve-a"}, "from": "m@1", "to": "m@2"},
                             topic="flopwatch.changes"))  # fmt: skip
        deployed = deploy_at is not None and w >= deploy_at
        hot = burst is not None and burst[0] <= w <= burst[1]
        for d in range(16):
            rate = 100.0 * (1 + 0.03 * rng.standard_normal())
            rate *= (1.6 if bare else 1.15) if hot else rate_step if deployed else 1.0
            share = 0.2 if hot else 0.005 if deployed else 0.0002
            errors = float(rng.poisson(share * rate * 10.0))
            rec = window(f"node-{d // 8:03d}/gpu{d % 8}", ts, pool="serve-a",
                         model="m@2" if deployed else "m@1",
                         mfu=0.45 * (1 + 0.02 * rng.standard_normal()),
                         stall=0.3 * (1 + 0.02 * rng.standard_normal()),
                         ingress={"req_rate": rate, "batch": 64.0 if hot else 32.0,
                                  "queue_wait_ms": (400.0 if hot else 20.0)
                                  * (1 + 0.05 * rng.standard_normal())},
                         device_stats={"clock_mhz": 1755.0, "power_w": 650.0,
                                       "temp_c": (78.0 if hot else 70.0) + rng.standard_normal()},
                         slo={"lat_p99_ms": (360.0 if hot else 120.0)
                              * (1 + 0.05 * rng.standard_normal()),
                              "quality": 0.999, "errors": errors})  # fmt: skip
            if bare:
                rec["ingress"] = {"req_rate": rate}
                rec["slo"] = {"errors": errors}
                del rec["device_stats"]
            batch.append(msg(rec, partition=d % 4))
        out.append(batch)
    return out


def test_failed_requests_page_per_request_with_the_deploy_as_rollback() -> None:
    """`slo.errors` is a count: judged per request of the window, 0.02 % -> 0.5 % of
    requests failing after a model deploy pages at stage validation with the deploy as
    its rollback, though quality, latency and MFU hold."""
    alerts = _alerts(_failing(90, deploy_at=45))
    pages = [a for a in alerts if a.status == "firing" and a.severity == "page"]
    assert pages, [(a.metric, a.severity, a.summary) for a in alerts]
    assert len({a.id for a in pages}) == 1
    last = [a for a in alerts if a.id == pages[0].id and a.status == "firing"][-1]
    assert last.metric == "error_rate"
    assert last.first_failing_stage == "validation"
    assert last.bottleneck == "errors"
    assert last.suggestion.change_id == "deploy-9"
    assert last.after == pytest.approx(0.005, rel=0.3)
    assert "failed-request rate from" in last.summary


def test_failures_with_no_change_to_blame_are_a_ticket() -> None:
    """The same failures with no change event and no backlog: nothing tells them from a
    queue at its admission limit since before its streams began. A ticket, not a page."""
    alerts = _alerts(_failing(90, deploy_at=45, announced=False))
    firing = [a for a in alerts if a.status == "firing" and a.metric == "error_rate"]
    assert firing, [(a.metric, a.severity, a.summary) for a in alerts]
    assert {a.severity for a in firing} == {"ticket"}
    assert firing[-1].bottleneck == "errors"


def test_failures_long_after_a_deploy_are_not_its_page() -> None:
    """Failures that began 80 windows after a model deploy, as the load rose to one the
    pool had not run at since (x1.15: not a load rise that sheds, no queue): a release
    that fails requests fails them from its first window, so the deploy is not their
    rollback, and without a change to blame they are a ticket."""
    alerts = _alerts(_failing(150, deploy_at=100, change_at=20, rate_step=1.15))
    firing = [a for a in alerts if a.status == "firing" and a.metric == "error_rate"]
    assert firing, [(a.metric, a.severity, a.summary) for a in alerts]
    assert {a.severity for a in firing} == {"ticket"}
    assert {a.suggestion.change_id for a in firing} == {None}


def test_failures_a_full_queue_sheds_are_capacity_not_a_page() -> None:
    """A burst past capacity from a pool's steady state: its queue waits at the admission
    limit and a fifth of its requests are shed, with nothing changed. The failures are the
    backlog's: no page, no ticket."""
    alerts = _alerts(_failing(150, burst=(90, 120), seed=2))
    assert [a for a in alerts if a.severity != "info"] == [], [
        (a.metric, a.severity, a.bottleneck, a.summary) for a in alerts
    ]


def test_failures_as_the_offered_load_rose_are_capacity_without_a_queue() -> None:
    """Devices that report no queue, latency or heat: failures that rose with the offered
    load (x1.6) are what a pool past capacity sheds. No page, no ticket."""
    alerts = _alerts(_failing(150, burst=(90, 120), seed=2, bare=True))
    assert [a for a in alerts if a.metric == "error_rate"], "the failures were found"
    assert [a for a in alerts if a.severity != "info"] == [], [
        (a.metric, a.severity, a.bottleneck, a.summary) for a in alerts
    ]


def test_failure_noise_alone_does_not_page() -> None:
    """Poisson counts of 0.2 failed requests per window and device page nothing."""
    assert [a for a in _alerts(_failing(150, seed=4)) if a.severity != "info"] == []


def _training(
    windows: int, *, at: int, hosts_bad: tuple[str, ...] = (), thermal: tuple[str, ...] = (),
    scattered_sync: tuple[str, ...] = (), seed: int = 0, unthrottled: int | None = None,
    cooled: int | None = None, straggling: bool = False, waits_only: tuple[str, ...] = (),
) -> list[list[RawMessage]]:  # fmt: skip
    """32 devices on four hosts of one training pool with an all-reduce layer. From `at`:
    the all-reduces of `hosts_bad` wait 2.5x as long (fewer steps: device MFU -5 %, per-layer
    MFU unchanged); the devices in
    `thermal` throttle (clock -15 %, temperature +19 %, MFU -12 %); `scattered_sync`
    devices' waits rise alone. From `unthrottled` the clock and MFU of `thermal` are
    back (a throttle cycling up); from `cooled` their temperature is back too.
    `straggling`: the job is synchronous, so while `thermal` throttle every member does
    5 % less work per window (device MFU -5 %, per-layer MFU unchanged), the others
    wait 1.5x as long at the all-reduce, the throttled ones hardly wait, and their
    power falls by a fifth with their clock. `waits_only` hosts wait 1.4x as long with
    their work unchanged."""
    rng = np.random.default_rng(seed)
    out = []
    for w in range(windows):
        ts = T0 + 10.0 * (w + 1)
        batch = []
        for d in range(32):
            name = f"node-{d // 8:03d}/gpu{d % 8}"
            late = w >= at
            host = name.split("/", maxsplit=1)[0]
            slow = late and host in hosts_bad
            idle = late and host in waits_only
            heated = late and name in thermal and (cooled is None or w < cooled)
            hot = heated and (unthrottled is None or w < unthrottled)
            scattered = late and name in scattered_sync
            wait = 0.2 * (2.5 if slow or scattered else 1.4 if idle else 1.0)
            waiting = (
                straggling and late and bool(thermal) and (unthrottled is None or w < unthrottled)
            )
            if waiting:
                wait = 0.02 if hot else 0.3
            mfu = 0.45 * (0.88 if hot else 1.0)
            rec = window(name, ts, pool="train-a", mfu=mfu * (1 + 0.02 * rng.standard_normal()),
                         stall=0.3 * (1 + 0.02 * rng.standard_normal()))  # fmt: skip
            if waiting or slow:
                # fewer steps in the window: each layer's work and time fall alike
                for layer in rec["layers"]:
                    layer["flops"] *= 0.95
                    layer["busy_s"] *= 0.95
            rec["layers"].append(
                {
                    "type": "allreduce",
                    "flops": 1e9,
                    "busy_s": 1.0,
                    "sync_wait_s": wait * (1 + 0.03 * rng.standard_normal()),
                }
            )
            rec["device_stats"] = {
                "clock_mhz": 1755.0 * (0.85 if hot else 1.0) * (1 + 0.002 * rng.standard_normal()),
                "temp_c": 70.0 * (1.19 if heated else 1.0) + 0.4 * rng.standard_normal(),
                "power_w": 650.0 * (0.8 if hot and straggling else 1.0)
                * (1 + 0.01 * rng.standard_normal()),
            }  # fmt: skip
            batch.append(msg(rec, partition=d % 4))
        out.append(batch)
    return out


def test_a_slow_link_on_one_host_pages_at_host_scope_without_rollback() -> None:
    """All-reduce waits x2.5 on the eight devices of one host: a collective is as slow as
    its slowest member, so the job loses the time; paged at host scope, stage execution,
    bottleneck synchronisation, and no change to roll back."""
    alerts = _alerts(_training(100, at=45, hosts_bad=("node-001",)))
    pages = [a for a in alerts if a.status == "firing" and a.severity == "page"]
    assert pages, [(a.metric, a.severity, a.scope.level) for a in alerts]
    assert len({a.id for a in pages}) == 1
    last = pages[-1]
    assert last.metric == "sync_frac"
    assert last.layers == ["allreduce"]
    assert last.scope.level == "host"
    assert last.scope.hosts == ["node-001"]
    assert last.first_failing_stage == "execution"
    assert last.bottleneck == "synchronisation"
    assert last.suggestion.action != "rollback"


def test_a_hosts_waits_with_its_work_unchanged_do_not_page() -> None:
    """Waits x1.4 on one host while its devices' work holds (device MFU flat): the job lost
    no work measurable yet, so the waits are sized by their 8 devices of 32, not by the
    whole job: a host-scope ticket, not a page. Such a rise paged on healthy training and
    serving pools whose members waited longer for one of their own (`thermal_throttle`
    and `fleet_day`, seed 22 at 128 devices)."""
    alerts = _alerts(_training(100, at=45, waits_only=("node-001",)))
    firing = [a for a in alerts if a.status == "firing" and a.metric == "sync_frac"]
    assert firing, [(a.metric, a.severity, a.scope.level) for a in alerts]
    assert firing[-1].scope.hosts == ["node-001"]
    assert firing[-1].severity == "ticket"
    assert [a for a in alerts if a.severity == "page"] == []


def test_waits_rising_on_scattered_devices_do_not_page() -> None:
    """The same rise on six devices spread over three hosts is no link fault: no page."""
    scattered = ("node-000/gpu1", "node-000/gpu6", "node-001/gpu2", "node-001/gpu5",
                 "node-003/gpu0", "node-003/gpu7")  # fmt: skip
    alerts = _alerts(_training(100, at=45, scattered_sync=scattered))
    assert [a for a in alerts if a.severity == "page"] == []


def test_two_throttling_devices_page_on_physical_corroboration() -> None:
    """Two devices of 32 throttle: clock down, temperature up, MFU down agree, so it
    pages whatever their share of the pool, as a thermal fault on those devices."""
    alerts = _alerts(_training(100, at=45, thermal=("node-000/gpu3", "node-001/gpu5")))
    pages = [a for a in alerts if a.status == "firing" and a.severity == "page"]
    assert pages, [(a.metric, a.severity, a.scope.level, a.bottleneck) for a in alerts]
    last = pages[-1]
    assert last.bottleneck == "thermal_power"
    assert set(last.scope.devices) == {"node-000/gpu3", "node-001/gpu5"}
    assert last.first_failing_stage == "execution"


def test_a_throttling_member_that_slows_the_whole_job_pages_once() -> None:
    """Two members of a synchronous job throttle (clock -15 %, +19 °C as their power
    falls) and every other member waits for them at the all-reduce (device MFU -5 % on
    all 32). A collective is as slow as its slowest member: one mechanism, one alert,
    a thermal page that names the throttling devices."""
    thermal = ("node-000/gpu3", "node-001/gpu5")
    alerts = _alerts(_training(120, at=45, thermal=thermal, straggling=True))
    firing = [a for a in alerts if a.status == "firing"]
    assert len({a.id for a in firing}) == 1, [(a.metric, a.severity, a.summary) for a in firing]
    pages = [a for a in firing if a.severity == "page"]
    assert pages, [(a.metric, a.severity, a.bottleneck) for a in firing]
    last = pages[-1]
    assert last.bottleneck == "thermal_power"
    assert last.first_failing_stage == "execution"
    assert last.suggestion.change_id is None
    assert all(d in last.summary for d in thermal), last.summary
    assert T0 + 10.0 * 38 <= last.onset_ts <= T0 + 10.0 * 51


def _heated(
    windows: int, *, at: int, cooled: tuple[str, ...] = (), powered: tuple[str, ...] = (),
    everyone: float = 1.0, powerless: bool = False, seed: int = 0, backlog: bool = False,
) -> list[list[RawMessage]]:  # fmt: skip
    """16 training devices on two hosts whose dies follow first-order heat: each window
    the temperature moves a sixth of the way to inlet (25 °C) + R * power. From `at`:
    `cooled` devices' thermal resistance R is x1.4 (a failing fan: +18 °C at the same
    power, clock and MFU as before); `powered` devices draw 30 % more power (their heat
    follows it); every device draws `everyone` times its power (a heavier job).
    `powerless`: the records carry no power. `backlog`: the devices serve requests, and
    from `at` on the queue in front of the `cooled` ones holds 12x as many (a backlog)."""
    rng = np.random.default_rng(seed)
    names = [f"node-{d // 8:03d}/gpu{d % 8}" for d in range(16)]
    temp = dict.fromkeys(names, 25.0 + 0.07 * 650.0)
    out = []
    for w in range(windows):
        ts = T0 + 10.0 * (w + 1)
        batch = []
        for d, name in enumerate(names):
            late = w >= at
            power = 650.0 * (1.3 if late and name in powered else 1.0) * (everyone if late else 1)
            resistance = 0.07 * (1.4 if late and name in cooled else 1.0)
            temp[name] += (1 - np.exp(-10.0 / 60.0)) * (25.0 + resistance * power - temp[name])
            rec = window(name, ts, pool="train-a", mfu=0.45 * (1 + 0.02 * rng.standard_normal()),
                         stall=0.3 * (1 + 0.02 * rng.standard_normal()))  # fmt: skip
            rec["device_stats"] = {
                "clock_mhz": 1755.0 * (1 + 0.002 * rng.standard_normal()),
                "temp_c": temp[name] + 0.4 * rng.standard_normal(),
                "power_w": power * (1 + 0.01 * rng.standard_normal()),
            }
            if powerless:
                del rec["device_stats"]["power_w"]
            if backlog:
                queued = late and name in cooled
                depth = 12.0 * (12.0 if queued else 1.0) * (1 + 0.05 * rng.standard_normal())
                rec["ingress"] = {"req_rate": 100.0 * (1 + 0.03 * rng.standard_normal()),
                                  "batch": 32.0, "queue_depth": depth}  # fmt: skip
            batch.append(msg(rec, partition=d % 4))
        out.append(batch)
    return out


def test_heat_that_no_power_explains_is_a_cooling_ticket() -> None:
    """Two devices' cooling fails (one chassis): +18 °C at the same power, nothing
    throttles yet. A ticket on those devices, headed by temperature, thermal, stage
    execution, no rollback, and no page (no work is lost yet)."""
    cooled = ("node-000/gpu3", "node-000/gpu5")
    alerts = _alerts(_heated(120, at=50, cooled=cooled))
    heat = [a for a in alerts if a.status == "firing" and a.metric == "temp_c"]
    assert heat, [(a.metric, a.severity, a.scope.devices) for a in alerts]
    assert len({a.id for a in heat}) == 1
    last = heat[-1]
    assert set(last.scope.devices) == set(cooled)
    assert last.severity == "ticket"
    assert last.bottleneck == "thermal_power"
    assert last.first_failing_stage == "execution"
    assert last.suggestion.change_id is None
    assert last.before < 72.0
    assert last.after > 78.0
    assert T0 + 10.0 * 49 <= last.onset_ts <= T0 + 10.0 * 56
    assert [a for a in alerts if a.severity == "page"] == []


def test_heat_that_rose_with_a_backlog_is_capacity_not_a_ticket() -> None:
    """The same dies heating as their queues back up 12x: the heat came with a backlog
    (overload), the work it brought, so an info capacity record, whatever its heat."""
    cooled = ("node-000/gpu3", "node-000/gpu5")
    alerts = _alerts(_heated(120, at=50, cooled=cooled, backlog=True))
    assert [a for a in alerts if a.metric == "temp_c" or "temp_c" in {e.indicator for e in
            a.evidence}], [(a.metric, a.severity) for a in alerts]  # fmt: skip
    assert [a for a in alerts if a.severity != "info"] == [], [
        (a.metric, a.severity, a.bottleneck, a.summary) for a in alerts
    ]


def test_heat_that_follows_power_is_no_incident() -> None:
    """The same climb where the devices draw 30 % more power, or where every device of
    the pool does (a heavier job): heat follows power, so nothing about temperature."""
    hot = ("node-000/gpu3", "node-001/gpu5")
    for batches in (_heated(120, at=50, powered=hot), _heated(120, at=50, everyone=1.3)):
        alerts = _alerts(batches)
        assert [a for a in alerts if a.metric == "temp_c"] == []
        assert [a for a in alerts if a.severity == "page"] == []


def test_heat_is_not_judged_on_devices_that_do_not_report_power() -> None:
    """Without power nothing tells heat that follows work from the cooling's: the same
    failing fans on records without `power_w` head no incident."""
    alerts = _alerts(_heated(120, at=50, cooled=("node-000/gpu3",), powerless=True))
    assert [a for a in alerts if a.metric == "temp_c"] == []


def test_heat_alike_on_a_share_of_the_pool_over_hosts_is_the_pools_load() -> None:
    """The same rise on a quarter of the pool over both hosts at once, with no load or
    power change seen: traffic reaches a pool's hosts alike (a burst whose rise its load
    streams did not show as a change), while a cooling fault is a few boards'. No
    incident; the same rise on one device of each host is a cooling fault."""
    share = ("node-000/gpu1", "node-000/gpu3", "node-001/gpu2", "node-001/gpu5")
    alerts = _alerts(_heated(120, at=50, cooled=share))
    assert [a for a in alerts if a.metric == "temp_c"] == []
    two = ("node-000/gpu3", "node-001/gpu5")
    heat = [a for a in _alerts(_heated(120, at=50, cooled=two)) if a.metric == "temp_c"]
    assert heat
    assert set(heat[-1].scope.devices) == set(two)


def test_a_throttle_that_cycles_up_while_its_heat_stays_is_not_resolved() -> None:
    """The throttled devices' clock and MFU come back while the dies stay hot (a
    throttle cycling as it cools a little): the fault is still there, so the page stays
    open; once the heat is gone too, it resolves."""
    thermal = ("node-000/gpu3", "node-001/gpu5")
    still_hot = _alerts(_training(200, at=45, thermal=thermal, unthrottled=90))
    assert [a for a in still_hot if a.severity == "page"]
    assert [a for a in still_hot if a.status == "resolved"] == []
    fixed = _alerts(_training(200, at=45, thermal=thermal, unthrottled=90, cooled=90))
    assert [a for a in fixed if a.status == "resolved"]

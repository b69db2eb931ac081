"""Judgement on scales and mechanisms relative floors get wrong (quality, collectives,
small hardware faults)."""

from __future__ import annotations

import numpy as np
from factories import T0, msg, window

from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from monitor.wire import Alert


def _serving(windows: int, *, drop_at: int | None, seed: int = 0) -> list[list[RawMessage]]:
    """16 serving devices whose answer quality sits near 0.999 (error rate 0.1 %, lognormal
    noise); from `drop_at` on, after a model deploy, the error rate is ten times that."""
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


def test_error_rate_noise_alone_does_not_page() -> None:
    """The same pool without the deploy: lognormal noise on a 0.1 % error rate pages nothing."""
    assert [a for a in _alerts(_serving(90, drop_at=None, seed=3)) if a.severity == "page"] == []


def _training(
    windows: int, *, at: int, hosts_bad: tuple[str, ...] = (), thermal: tuple[str, ...] = (),
    scattered_sync: tuple[str, ...] = (), seed: int = 0,
) -> list[list[RawMessage]]:  # fmt: skip
    """32 devices on four hosts of one training pool with an all-reduce layer. From `at`:
    the all-reduces of `hosts_bad` wait 2.5x as long (device MFU -5 %); the devices in
    `thermal` throttle (clock -15 %, temperature +19 %, MFU -12 %); `scattered_sync`
    devices' waits rise alone."""
    rng = np.random.default_rng(seed)
    out = []
    for w in range(windows):
        ts = T0 + 10.0 * (w + 1)
        batch = []
        for d in range(32):
            name = f"node-{d // 8:03d}/gpu{d % 8}"
            late = w >= at
            slow = late and name.split("/", maxsplit=1)[0] in hosts_bad
            hot = late and name in thermal
            wait = 0.2 * (2.5 if slow or (late and name in scattered_sync) else 1.0)
            mfu = 0.45 * (0.95 if slow else 0.88 if hot else 1.0)
            rec = window(name, ts, pool="train-a", mfu=mfu * (1 + 0.02 * rng.standard_normal()),
                         stall=0.3 * (1 + 0.02 * rng.standard_normal()))  # fmt: skip
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
                "temp_c": 70.0 * (1.19 if hot else 1.0) + 0.4 * rng.standard_normal(),
                "power_w": 650.0 * (1 + 0.01 * rng.standard_normal()),
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

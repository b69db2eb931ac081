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

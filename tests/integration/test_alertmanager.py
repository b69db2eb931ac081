"""Alerts reach a real Alertmanager (0.25) and its webhook receiver; resolve ends them."""

from __future__ import annotations

from conftest import Alertmanager
from factories import fleet

from monitor.config import AlertmanagerSettings, Settings
from monitor.core.pipeline import Pipeline
from monitor.sinks.alertmanager import AlertmanagerSink, labels_of
from monitor.wire import Alert


def _alerts() -> list[Alert]:
    """Firing then resolved records of one incident, from the pure pipeline."""
    p = Pipeline(Settings())
    out: list[Alert] = []
    for b in fleet(80, regress_at=40, change_at=39) + fleet(130, seed=9)[80:]:
        out.extend(p.process(b).alerts)
    return out


async def test_firing_then_resolved_reaches_oncall(alertmanager: Alertmanager) -> None:
    """The firing alert is stored with labels and runbook; the webhook sees firing then resolved."""
    records = _alerts()
    firing = [a for a in records if a.status == "firing"]
    resolved = [a for a in records if a.status == "resolved"]
    assert firing
    assert resolved
    sink = AlertmanagerSink(AlertmanagerSettings(urls=[alertmanager.url], resend_s=3600))
    await sink.start()
    try:
        await sink.send(firing)
        stored = [a for a in alertmanager.alerts(active="true")
                  if a["labels"].get("flopwatch_id") == firing[0].id]  # fmt: skip
        assert len(stored) == 1, stored
        got = stored[0]
        assert got["labels"] == labels_of(firing[-1])
        assert got["labels"]["severity"] == "critical"
        assert got["labels"]["pool"] == "train-a"
        assert got["annotations"]["runbook_url"] == "docs/runbook.md#kernel-selection"
        assert "rollback chg-1" in got["annotations"]["suggestion"]
        alertmanager.receiver.wait_for(
            lambda p: (
                p["status"] == "firing" and p["commonLabels"].get("flopwatch_id") == firing[0].id
            )
        )
        await sink.send(resolved)
        alertmanager.receiver.wait_for(
            lambda p: (
                p["status"] == "resolved" and p["commonLabels"].get("flopwatch_id") == firing[0].id
            )
        )
        still = [a for a in alertmanager.alerts(active="true")
                 if a["labels"].get("flopwatch_id") == firing[0].id]  # fmt: skip
        assert still == []
        assert sink.active == {}
    finally:
        await sink.close()


async def test_unreachable_instance_does_not_block_the_others(alertmanager: Alertmanager) -> None:
    """HA: one dead instance is logged and skipped; the live one still gets the alert."""
    firing = [a for a in _alerts() if a.status == "firing"][:1]
    sink = AlertmanagerSink(AlertmanagerSettings(
        urls=["http://127.0.0.1:9", alertmanager.url], timeout_s=2, resend_s=3600))  # fmt: skip
    await sink.send(firing)
    ids = {a["labels"].get("flopwatch_id") for a in alertmanager.alerts()}
    assert firing[0].id in ids
    await sink.close()

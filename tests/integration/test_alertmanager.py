"""Alerts reach a real Alertmanager (0.25) and its webhook receiver; resolve ends them."""

from __future__ import annotations

import asyncio
import json

import msgspec
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
        assert await sink.flush(10)
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
        assert await sink.flush(10)
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
    await sink.flush(10)
    ids = {a["labels"].get("flopwatch_id") for a in alertmanager.alerts()}
    assert firing[0].id in ids
    await sink.close()


def _open_label_sets(am: Alertmanager, aid: str) -> list[dict[str, str]]:
    """The label sets Alertmanager holds active for one flopwatch id."""
    return [a["labels"] for a in am.alerts(active="true")
            if a["labels"].get("flopwatch_id") == aid]  # fmt: skip


async def test_a_new_owner_ends_the_label_set_the_old_one_left_open(
    alertmanager: Alertmanager,
) -> None:
    """After a restart the re-sent page may carry other labels (severity, scope): the new
    process ends the old label set it adopted from the checkpoint, so Alertmanager keeps
    one copy of the incident (it used to keep both until `resolve_timeout`)."""
    first = next(a for a in _alerts() if a.status == "firing")
    page = msgspec.structs.replace(first, id="fw-adopt-labels")
    old = AlertmanagerSink(AlertmanagerSettings(urls=[alertmanager.url], resend_s=3600))
    await old.send([page])
    assert await old.flush(10)
    kept = old.delivery_state()
    await old.close()  # a crash: nothing ends the page
    assert [json.loads(k) for k in kept[page.id]] == [labels_of(page)]
    ticket = msgspec.structs.replace(page, severity="ticket")
    new = AlertmanagerSink(AlertmanagerSettings(urls=[alertmanager.url], resend_s=3600))
    new.adopt(page.id, kept[page.id])
    await new.send([ticket])
    assert await new.flush(10)
    assert _open_label_sets(alertmanager, page.id) == [labels_of(ticket)]
    await new.close()


async def test_an_end_left_unaccepted_is_posted_by_the_new_owner(
    alertmanager: Alertmanager,
) -> None:
    """An end the old process could not deliver (kept as "ending" in the checkpoint) is
    retried by the new one until Alertmanager takes it."""
    first = next(a for a in _alerts() if a.status == "firing")
    page = msgspec.structs.replace(first, id="fw-adopt-ending")
    old = AlertmanagerSink(AlertmanagerSettings(urls=[alertmanager.url], resend_s=3600))
    await old.send([page])
    assert await old.flush(10)
    await old.close()
    assert _open_label_sets(alertmanager, page.id) == [labels_of(page)]
    starts = old.delivery_state()[page.id]
    ending = {k: ["ending", v[1]] for k, v in starts.items()}
    new = AlertmanagerSink(AlertmanagerSettings(urls=[alertmanager.url], resend_s=0.2))
    await new.start()
    try:
        new.adopt(page.id, ending)
        assert new.delivery_state()[page.id] == ending
        async with asyncio.timeout(20):
            while new.pending[alertmanager.url]:  # noqa: ASYNC110 - the sink's own retry loop
                await asyncio.sleep(0.05)
        assert _open_label_sets(alertmanager, page.id) == []
        assert page.id not in new.delivery_state()
    finally:
        await new.close()

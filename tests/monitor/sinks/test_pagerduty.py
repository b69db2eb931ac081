"""The PagerDuty Events v2 sink against a real local receiver that checks each event."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from alert_records import firing, resolved
from factories import fleet
from receivers import Receiver, until
from structlog.testing import capture_logs

from monitor.config import PagerDutySettings, Settings, masked_dump
from monitor.core.pipeline import Pipeline
from monitor.daemon.runner import Runner
from monitor.sinks.pagerduty import PagerDutySink
from monitor.wire import Evidence

KEY = "R0UT1NGKEY0123456789abcdef012345"  # 32 characters, as PagerDuty's are


def events_v2_error(headers: dict[str, str], body: bytes) -> int | None:
    """400 for what the Events API v2 rejects (PagerDuty/api-schema events-v2), else None."""
    if len(body) > 512_000 or headers.get("Content-Type") != "application/json":
        return 400
    e = json.loads(body)
    if len(e.get("routing_key", "")) != 32 or e.get("event_action") not in {
        "trigger", "acknowledge", "resolve"}:  # fmt: skip
        return 400
    if e["event_action"] != "trigger":
        return None if 0 < len(e.get("dedup_key", "")) <= 255 else 400
    p = e.get("payload", {})
    if not p.get("summary") or len(p["summary"]) > 1024 or not p.get("source"):
        return 400
    if p.get("severity") not in {"critical", "error", "warning", "info"}:
        return 400
    if any(set(link) - {"href", "text"} or not link.get("href") for link in e.get("links", [])):
        return 400
    return None


def settings(r: Receiver, **kw: Any) -> PagerDutySettings:
    base: dict[str, Any] = {"routing_key": KEY, "url": r.url, "timeout_s": 2,
                            "backoff_s": 0.05, "backoff_max_s": 0.2}  # fmt: skip
    return PagerDutySettings(**{**base, **kw})


@pytest.fixture
async def pd():
    r = Receiver(check=events_v2_error)
    await r.start()
    yield r
    await r.stop()


async def test_trigger_then_resolve_with_links_and_details(pd: Receiver) -> None:
    """A page triggers with dedup_key = alert id, severity critical, runbook and incident
    links, evidence and suggestion; the resolve closes the same dedup_key."""
    sink = PagerDutySink(settings(pd, external_url="https://fw.example/",
                                  runbook_base_url="https://git.example/flopwatch/"))  # fmt: skip
    try:
        await sink.send([firing()])
        assert await sink.flush(10)
        await sink.send([resolved()])
        assert await sink.flush(10)
    finally:
        await sink.close()
    trigger, resolve = (r.json() for r in pd.accepted)
    a = firing()
    assert trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == a.id
    p = trigger["payload"]
    assert p["severity"] == "critical"
    assert p["summary"] == a.summary
    assert p["source"] == "train-a"
    assert p["class"] == "kernel_selection"
    assert trigger["links"] == [
        {"href": "https://git.example/flopwatch/docs/runbook.md#kernel-selection",
         "text": "runbook"},
        {"href": f"https://fw.example/alerts/{a.id}", "text": "flopwatch incident"},
    ]  # fmt: skip
    assert trigger["client_url"] == f"https://fw.example/alerts/{a.id}"
    details = p["custom_details"]
    assert details["suggestion"].startswith("rollback chg-1")
    assert len(details["evidence"]) == len(a.evidence) > 0
    assert details["first_failing_stage"] == a.first_failing_stage
    assert resolve == {"routing_key": KEY, "event_action": "resolve", "dedup_key": a.id}
    assert len(pd.requests) == 2  # nothing refused, nothing sent twice
    assert sink.delivery_state() == {}


@pytest.mark.parametrize(
    ("severity", "expected"), [("page", "critical"), ("ticket", "warning"), ("info", "info")]
)
async def test_severity_mapping(pd: Receiver, severity: str, expected: str) -> None:
    """page → critical, ticket → warning, info → info."""
    sink = PagerDutySink(settings(pd))
    try:
        await sink.send([msgspec.structs.replace(firing(), severity=severity)])
        assert await sink.flush(10)
    finally:
        await sink.close()
    (event,) = (r.json() for r in pd.accepted)
    assert event["payload"]["severity"] == expected


async def test_429_and_5xx_are_retried_until_accepted_once(pd: Receiver) -> None:
    """429, 500, 503: backed off and retried; the event is accepted exactly once, and the
    sink reports failing only until then."""
    pd.refuse = [429, 500, 503]
    sink = PagerDutySink(settings(pd, backoff_s=0.2, backoff_max_s=0.4))
    with capture_logs() as logs:
        try:
            await sink.send([firing()])
            await until(lambda: sink.failing_since() is not None)
            await pd.wait_for(lambda r: len(r.accepted) == 1)
            await until(lambda: sink.failing_since() is None)
        finally:
            await sink.close()
    assert [r.status for r in pd.requests] == [429, 500, 503, 202]
    retries = [e for e in logs if e["event"] == "delivery failed, retrying"]
    assert [e["error"][:8] for e in retries] == ["HTTP 429", "HTTP 500", "HTTP 503"]
    # Backoff doubles from backoff_s up to the cap, each delay jittered within its upper half.
    assert [0.1 <= e["retry_in_s"] <= 0.2 for e in retries[:1]] == [True]
    assert all(0.2 <= e["retry_in_s"] <= 0.4 for e in retries[1:])
    assert len({r.body for r in pd.requests}) == 1  # the same event each time


async def test_400_is_not_retried_and_counted(pd: Receiver) -> None:
    """An event PagerDuty calls invalid is dropped (logged, counted), never retried, and the
    routing key never reaches the log even when the refusal quotes it."""
    pd.refuse = [400]
    sink = PagerDutySink(settings(pd))
    with capture_logs() as logs:
        try:
            await sink.send([firing()])
            await pd.wait_for(lambda r: len(r.requests) == 1)
            await until(lambda: sink.queue.rejected == 1)
            await sink.send([resolved()])  # the receiver still answers: the next one goes
            await pd.wait_for(lambda r: len(r.requests) == 2)
        finally:
            await sink.close()
    assert [r.status for r in pd.requests] == [400, 202]
    assert sink.failing_since() is None  # it answered: refusing an event is not being down
    assert KEY not in repr(logs)
    assert any(e["event"].startswith("receiver rejected") for e in logs)
    assert masked_dump(Settings(sinks={"pagerduty": {"routing_key": KEY}}))["sinks"][
        "pagerduty"]["routing_key"] == "**********"  # fmt: skip


async def test_refusal_quoting_the_key_is_redacted(pd: Receiver) -> None:
    """A 4xx body that echoes the routing key is logged with the key masked."""
    pd.refuse = [403]
    sink = PagerDutySink(settings(pd))
    sink.http.post = _echo_key  # type: ignore[method-assign]
    with capture_logs() as logs:
        try:
            await sink.send([firing()])
            await until(lambda: sink.queue.rejected == 1)
        finally:
            await sink.close()
    assert KEY not in repr(logs)
    assert "***" in repr(logs)


async def _echo_key(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
    from monitor.errors import SinkRejected  # noqa: PLC0415

    raise SinkRejected(f"HTTP 400: {json.loads(body)['routing_key']} is not a valid key")


async def test_an_oversized_alert_is_cut_to_the_event_limit(pd: Receiver) -> None:
    """Thousands of evidence entries: the event stays under 512 KB (checked by the
    receiver), keeps the first entries and says how many were cut."""
    a = firing()
    many = [msgspec.structs.replace(a.evidence[0], indicator=f"indicator-{i:05d}" + "x" * 200)
            for i in range(4000)]  # fmt: skip
    sink = PagerDutySink(settings(pd))
    try:
        await sink.send([msgspec.structs.replace(a, evidence=many)])
        assert await sink.flush(10)
    finally:
        await sink.close()
    (req,) = pd.accepted
    assert len(req.body) <= 512_000
    details = req.json()["payload"]["custom_details"]
    assert 0 < len(details["evidence"]) < 4000
    assert details["evidence_truncated"] == 4000 - len(details["evidence"])
    assert details["evidence"][0]["indicator"].startswith("indicator-00000")
    assert isinstance(many[0], Evidence)


async def test_a_resolve_queued_at_a_crash_is_sent_by_the_next_owner(pd: Receiver) -> None:
    """The trigger went out, then PagerDuty went away and the resolve stayed queued; the
    delivery state (what the checkpoint carries) lets a new process resolve it once
    PagerDuty is back. The routing key is not part of that state."""
    old = PagerDutySink(settings(pd))
    await old.send([firing()])
    assert await old.flush(10)
    await pd.stop()
    await old.send([resolved()])
    assert not await old.flush(5)
    kept = old.delivery_state()
    await old.close()  # a crash: the queue is lost with the process
    aid = firing().id
    assert kept == {aid: {aid: ["ending", ""]}}
    assert KEY not in json.dumps(kept)
    await pd.start()
    new = PagerDutySink(settings(pd))
    try:
        new.adopt(aid, kept[aid])
        await pd.wait_for(lambda r: len(r.accepted) == 2)
        await until(lambda: new.delivery_state() == {})
    finally:
        await new.close()
    assert [r.json()["event_action"] for r in pd.accepted] == ["trigger", "resolve"]


async def test_an_adopted_trigger_stays_open_until_resolved(pd: Receiver) -> None:
    """A page the old process triggered is still reported open by the new one (so a second
    restart keeps it), and leaves the state once its resolve is accepted."""
    aid = firing().id
    sink = PagerDutySink(settings(pd))
    try:
        sink.adopt(aid, {aid: ["firing"]})
        assert sink.delivery_state() == {aid: {aid: ["firing"]}}
        await sink.send([resolved()])
        assert await sink.flush(10)
        assert sink.delivery_state() == {}
    finally:
        await sink.close()


class _Source:
    """Fixed batches, nothing to commit."""

    def __init__(self, batches: list) -> None:
        self._batches = batches

    async def batches(self):
        for b in self._batches:
            yield b

    async def commit(self) -> None:
        return None

    async def close(self) -> None:
        return None


async def test_what_pagerduty_still_owes_travels_in_the_checkpoint(pd: Receiver) -> None:
    """PagerDuty down for the whole incident: the resolve the process still owes is in the
    alert state the checkpoint carries; the process restored from it resolves the page."""
    await pd.stop()
    batches = fleet(80, regress_at=40, change_at=39) + fleet(130, seed=9)[80:]
    first = Pipeline(Settings())
    old = PagerDutySink(settings(pd))
    try:
        await Runner(_Source(batches), first, [old], drain_s=0.2).run()
    finally:
        await old.close()
    aid = firing().id
    assert first.lifecycle.states[aid].delivery["pagerduty"] == {aid: ["ending", ""]}
    second = Pipeline(Settings())
    second.restore_incidents(first.snapshot_incidents())
    await pd.start()
    new = PagerDutySink(settings(pd))
    try:
        await Runner(_Source(fleet(140, seed=9)[130:131]), second, [new], drain_s=5).run()
    finally:
        await new.close()
    assert [(r.json()["event_action"], r.json()["dedup_key"]) for r in pd.accepted] == [
        ("resolve", aid)]  # fmt: skip
    assert "pagerduty" not in second.lifecycle.states[aid].delivery

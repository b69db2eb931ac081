"""The signed webhook sink against a real local receiver running the documented check."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from alert_records import firing, resolved
from receivers import Receiver, until

from monitor.config import WebhookSettings
from monitor.errors import ConfigError
from monitor.sinks.webhook import WebhookSink
from monitor.wire import Alert

DOCS = Path(__file__).resolve().parents[3] / "docs" / "alerts.md"
NEW, OLD = b"new-key-0123456789", b"old-key-9876543210"


def documented_verify() -> Any:
    """The `verify` function of the Python snippet in docs/alerts.md, as users copy it."""
    text = DOCS.read_text()
    after = text[text.index("Verification in Python") :]
    code = re.search(r"```python\n(.*?)```", after, re.S)
    assert code is not None
    scope: dict[str, Any] = {}
    exec(compile(code.group(1), str(DOCS), "exec"), scope)  # noqa: S102 - our own docs
    return scope["verify"]


verify = documented_verify()


def receiver_holding(*keys: bytes) -> Receiver:
    """A receiver that answers 401 to anything `verify` refuses with these keys."""
    return Receiver(
        ok_status=200,
        check=lambda headers, body: None if verify(list(keys), headers, body) else 401,
    )


def settings(r: Receiver, **kw: Any) -> WebhookSettings:
    base: dict[str, Any] = {"url": r.url, "key": NEW.decode(), "timeout_s": 2,
                            "backoff_s": 0.05, "backoff_max_s": 0.2}  # fmt: skip
    return WebhookSettings(**{**base, **kw})


def record(req: Any) -> Alert:
    return msgspec.json.decode(req.body, type=Alert)


async def test_records_arrive_signed_and_verify() -> None:
    """Each record arrives as the contract JSON, signed; the documented check accepts it and
    refuses it replayed outside the window, altered, or checked with another key."""
    hook = receiver_holding(NEW)
    await hook.start()
    sink = WebhookSink(settings(hook))
    try:
        await sink.send([firing()])
        assert await sink.flush(10)
        await sink.send([resolved()])
        assert await sink.flush(10)
    finally:
        await sink.close()
        await hook.stop()
    assert [r.status for r in hook.requests] == [200, 200]
    assert [record(r) for r in hook.requests] == [firing(), resolved()]
    req = hook.requests[0]
    assert re.fullmatch(r"v1=[0-9a-f]{64}", req.headers["X-Flopwatch-Signature"])
    ts = int(req.headers["X-Flopwatch-Timestamp"])
    assert abs(time.time() - ts) < 60
    assert verify([NEW], req.headers, req.body)
    assert not verify([NEW], req.headers, req.body, now=ts + 301)  # a replay, later
    assert not verify([NEW], req.headers, req.body + b" ")
    assert not verify([OLD], req.headers, req.body)
    forged = {**req.headers, "X-Flopwatch-Timestamp": str(ts + 1)}
    assert not verify([NEW], forged, req.body)


@pytest.mark.parametrize("held", [(NEW,), (OLD,), (OLD, NEW)])
async def test_a_rotation_is_accepted_by_receivers_holding_either_key(held: tuple) -> None:
    """With the new key first and the old one as previous_key, a receiver holding the old
    key, the new one or both accepts every request."""
    hook = receiver_holding(*held)
    await hook.start()
    sink = WebhookSink(settings(hook, previous_key=OLD.decode()))
    try:
        await sink.send([firing()])
        assert await sink.flush(10)
    finally:
        await sink.close()
        await hook.stop()
    (req,) = hook.requests
    assert req.status == 200
    assert req.headers["X-Flopwatch-Signature"].count("v1=") == 2


async def test_a_receiver_with_a_wrong_key_refuses_and_nothing_is_retried() -> None:
    """401 is a refusal, not an outage: the record is counted as rejected, not retried."""
    hook = receiver_holding(OLD)
    await hook.start()
    sink = WebhookSink(settings(hook))
    try:
        await sink.send([firing()])
        await until(lambda: sink.queue.rejected == 1)
    finally:
        await sink.close()
        await hook.stop()
    assert [r.status for r in hook.requests] == [401]


async def test_the_receiver_away_then_back_gets_the_resolve() -> None:
    """The receiver goes away after the page: the resolve is retried (refused connections,
    then 503s) and arrives, verified, once; nothing is delivered twice."""
    hook = receiver_holding(NEW)
    await hook.start()
    sink = WebhookSink(settings(hook))
    try:
        await sink.send([firing()])
        assert await sink.flush(10)
        await hook.stop()
        await sink.send([resolved()])
        await until(lambda: sink.queue._failures >= 3)  # refused connections meanwhile
        assert sink.failing_since() is not None
        assert sink.delivery_state() == {
            firing().id: {firing().id: ["ending", msgspec.json.encode(resolved()).decode()]}
        }
        hook.refuse = [503, 503]
        await hook.start()
        await hook.wait_for(lambda r: len(r.accepted) == 2)
        await until(lambda: sink.failing_since() is None)
    finally:
        await sink.close()
        await hook.stop()
    assert [r.status for r in hook.requests] == [200, 503, 503, 200]
    assert [record(r).status for r in hook.accepted] == ["firing", "resolved"]
    assert sink.delivery_state() == {}


def test_a_webhook_without_a_key_is_refused_at_load() -> None:
    """An unsigned webhook is a configuration error, not a silent default."""
    from monitor.config import load_settings  # noqa: PLC0415

    with pytest.raises(ConfigError, match=r"sinks.webhook.url needs sinks.webhook.key"):
        load_settings(sinks={"webhook": {"url": "http://127.0.0.1:1/hook"}})

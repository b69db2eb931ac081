"""The composition root: every configured HTTP sink on one client, closed on exit."""

from __future__ import annotations

from contextlib import AsyncExitStack

from factories import ListSource, fleet
from prometheus_client import CollectorRegistry
from receivers import Receiver

from monitor.config import Settings
from monitor.daemon.assemble import Wiring, assemble
from monitor.daemon.prometheus import register_metrics
from monitor.sinks.alertmanager import AlertmanagerSink
from monitor.sinks.memory import ListSink
from monitor.sinks.pagerduty import PagerDutySink
from monitor.sinks.webhook import WebhookSink


async def test_every_http_sink_on_one_client_closed_on_exit() -> None:
    """`[sinks]` turns on Alertmanager, PagerDuty and the webhook; they share one aiohttp
    session, deliver the incident (a clean stop drains their queues), show in /metrics,
    and the session is closed when the daemon's stack unwinds."""
    am, pd, hook = Receiver(ok_status=200), Receiver(), Receiver(ok_status=200)
    for r in (am, pd, hook):
        await r.start()
    settings = Settings(sinks={
        "console": False,
        "alertmanager": {"urls": [am.base]},
        "pagerduty": {"routing_key": "k" * 32, "url": pd.url},
        "webhook": {"url": hook.url, "key": "secret"},
    })  # fmt: skip
    batches = fleet(80, regress_at=40, change_at=39) + fleet(130, seed=9)[80:]
    try:
        async with AsyncExitStack() as stack:
            daemon = await assemble(stack, settings, Wiring(source=ListSource(batches),
                                                            http_host=None))  # fmt: skip
            kinds = [type(s) for s in daemon.sinks]
            assert kinds == [AlertmanagerSink, PagerDutySink, WebhookSink]
            assert len({id(s.http) for s in daemon.sinks}) == 1  # type: ignore[attr-defined]
            shared = daemon.sinks[0].http  # type: ignore[attr-defined]
            await daemon.runner.run()
            registry = register_metrics(CollectorRegistry(), daemon.runner, None, None,
                                        lambda: True, None)  # fmt: skip
            for name in ("alertmanager", "pagerduty", "webhook"):
                assert registry.get_sample_value("flopwatch_sink_queue_depth", {"sink": name}) == 0
                assert registry.get_sample_value("flopwatch_sink_dropped_total",
                                                 {"sink": name}) == 0  # fmt: skip
            assert shared._session is not None
        assert shared._session is None  # closed with the stack
    finally:
        for r in (am, pd, hook):
            await r.stop()
    assert [r.path for r in am.accepted][-1] == "/api/v2/alerts"
    assert any("endsAt" in a for a in am.accepted[-1].json())  # the resolve went out
    assert pd.accepted[-1].json()["event_action"] == "resolve"
    assert hook.accepted[-1].json()["status"] == "resolved"
    assert "X-Flopwatch-Signature" in hook.accepted[-1].headers


async def test_a_recording_links_its_pools_itself_whatever_the_fleet_stage_setting() -> None:
    """`kafka.fleet_stage` is for replicas on Kafka: a recording (or the simulator) is one
    process reading every pool, with no change-point topic, so it sends the fleet alert."""
    settings = Settings(kafka={"fleet_stage": True}, sinks={"console": False})
    batches = fleet(90, regress_at=49, change_at=48, regress_pool="*", change_kind="driver",
                    change_scope={}, kernel_fallback=False)  # fmt: skip
    sink = ListSink()
    async with AsyncExitStack() as stack:
        daemon = await assemble(stack, settings, Wiring(source=ListSource(batches),
                                                        sinks=[sink], http_host=None))  # fmt: skip
        assert daemon.pipeline.fleet is None
        assert daemon.runner.publish_report is None
        await daemon.runner.run()
    assert {a.scope.level for a in sink.alerts} == {"fleet"}

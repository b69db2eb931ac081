"""End to end on a real broker: simulator → Kafka → daemon → alerts topic (read by kcat)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from conftest import Kcat
from kafka_helpers import kcat_read, run_daemon

from monitor.config import KafkaSettings, Settings, Topics
from monitor.daemon.embedded import EmbeddedBroker
from sim.kafka import produce
from sim.run import simulate

pytestmark = pytest.mark.integration


async def test_simulated_pool_regression_alerts_only_that_pool(
    broker: EmbeddedBroker, kcat: Kcat
) -> None:
    """The injected regression's alert is on the topic: right pool, layer, metric, change."""
    run = uuid.uuid4().hex[:8]
    topics = Topics(samples=f"s-{run}", changes=f"c-{run}", alerts=f"a-{run}", dlq=f"d-{run}",
                    state=f"st-{run}")  # fmt: skip
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=broker.bootstrap,
                                            group_id=f"g-{run}", topics=topics,
                                            poll_timeout_ms=300))  # fmt: skip
    simulation = simulate("pool_regression", devices=64, duration_s=900.0, seed=11)
    truth = simulation.labels["incidents"]
    assert len(truth) == 1

    async def feed() -> None:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=10)
        await p.start()
        try:
            # Paced as a live fleet sends (100x event time: 9 s), so the member reads the
            # partitions in step. A whole recording on the broker before the member joins
            # is a backlog read in fetch order, one partition's 15 minutes before another's
            # first, and the devices found by the end then vary with that order
            # (docs/operations.md, "Catching up on a backlog").
            await produce(simulation, p, topics.samples, topics.changes, 100.0)
        finally:
            await p.stop()

    pipeline = await run_daemon(settings, feed)
    assert pipeline.stats.records_in == 64 * 90

    alerts = [v for _, v in kcat_read(kcat, broker.bootstrap, topics.alerts)]
    assert alerts, "no alert reached the alerts topic"
    assert {a["id"] for a in alerts} == {alerts[0]["id"]}, "one incident, one id"
    last = alerts[-1]
    inc = truth[0]
    assert last["scope"]["pool"] == inc["scope"]["pool"] == "train-a"
    assert last["layers"] == ["attention"]
    assert last["metric"] == "mfu"
    assert last["first_failing_stage"] == inc["first_failing_stage"]
    assert last["suggestion"]["change_id"] == inc["change_id"]
    regressed = set(inc["scope"]["devices"])
    for a in alerts:
        assert set(a["scope"]["devices"]) <= regressed, "an alert named a healthy device"
    assert last["scope"]["device_count"] >= 0.8 * len(inc["scope"]["devices"])


def test_flopwatch_up_prints_the_alert_and_exits() -> None:
    """`flopwatch up` (embedded broker + simulator + daemon) prints the rollback alert, exit 0."""
    out = subprocess.run(
        [sys.executable, "-m", "monitor", "up", "--devices", "64", "--speed", "max",
         "--sim-duration", "15m", "--log-format", "json"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    firing = [line for line in out.stdout.splitlines() if line.startswith("[FIRING")]
    assert firing, out.stdout
    assert "attention MFU" in firing[-1]
    assert "pool train-a" in firing[-1]
    assert "rollback chg-" in firing[-1]
    assert "train-b" not in out.stdout


class _Receiver:
    """A threaded local HTTP server keeping every POST (path, headers, body); answers 202."""

    def __init__(self) -> None:
        import http.server  # noqa: PLC0415
        import threading  # noqa: PLC0415

        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        posts = self.posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                posts.append((self.path, dict(self.headers), body))
                self.send_response(202)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_flopwatch_up_honours_sinks_and_repartition(tmp_path) -> None:
    """`up` is `run`'s daemon: `[sinks]` and `kafka.repartition` apply to it as well.

    With repartition on, the group reads the by-pool copy, so an alert proves the copy
    stage ran; the JSONL sink receives it, console output is off as configured, and
    Alertmanager, PagerDuty and the signed webhook each get the page.
    """
    import hashlib  # noqa: PLC0415
    import hmac  # noqa: PLC0415
    import json  # noqa: PLC0415
    import os  # noqa: PLC0415

    jsonl = tmp_path / "alerts.jsonl"
    am, pd, hook = _Receiver(), _Receiver(), _Receiver()
    env = {
        **os.environ,
        "FLOPWATCH_KAFKA__REPARTITION": "true",
        "FLOPWATCH_SINKS__JSONL_PATH": str(jsonl),
        "FLOPWATCH_SINKS__CONSOLE": "false",
        "FLOPWATCH_SINKS__ALERTMANAGER__URLS": json.dumps([am.url]),
        "FLOPWATCH_SINKS__PAGERDUTY__ROUTING_KEY": "k" * 32,
        "FLOPWATCH_SINKS__PAGERDUTY__URL": f"{pd.url}/v2/enqueue",
        "FLOPWATCH_SINKS__WEBHOOK__URL": f"{hook.url}/hook",
        "FLOPWATCH_SINKS__WEBHOOK__KEY": "webhook-key",
    }
    try:
        out = subprocess.run(
            [sys.executable, "-m", "monitor", "up", "--devices", "64", "--speed", "max",
             "--sim-duration", "15m", "--log-format", "json"],
            capture_output=True, text=True, timeout=240, env=env,
        )  # fmt: skip
    finally:
        for r in (am, pd, hook):
            r.close()
    assert out.returncode == 0, out.stderr[-2000:]
    assert "re-keyed by pool" in out.stderr
    assert not [line for line in out.stdout.splitlines() if line.startswith("[FIRING")]
    alerts = [json.loads(line) for line in jsonl.read_text().splitlines()]
    firing = [a for a in alerts if a["status"] == "firing"]
    assert firing, out.stderr[-2000:]
    assert firing[-1]["scope"]["pool"] == "train-a"
    assert firing[-1]["suggestion"]["action"] == "rollback"
    ids = {a["id"] for a in firing}
    posted = [a for path, _, body in am.posts for a in json.loads(body)]
    assert {path for path, _, _ in am.posts} == {"/api/v2/alerts"}
    assert {a["labels"]["flopwatch_id"] for a in posted} == ids
    events = [json.loads(body) for _, _, body in pd.posts]
    assert {e["dedup_key"] for e in events} == ids
    assert {e["event_action"] for e in events} <= {"trigger", "resolve"}
    assert hook.posts
    for _, headers, body in hook.posts:
        ts = headers["X-Flopwatch-Timestamp"]
        mac = hmac.new(b"webhook-key", ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        assert headers["X-Flopwatch-Signature"] == f"v1={mac}"
    assert {json.loads(body)["id"] for _, _, body in hook.posts} == ids

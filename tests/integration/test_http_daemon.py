"""/healthz, /readyz and /metrics of a daemon on the real broker, read as Prometheus would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO

import pytest
from daemon_helpers import DEVICES, Daemon, fast_settings, until
from factories import fleet, msg
from kafka_helpers import isolated_settings, produce
from prometheus_client.parser import text_string_to_metric_families

from monitor.daemon.embedded import EmbeddedBroker, ensure_topics, free_port

pytestmark = pytest.mark.integration

NEGATIVE = json.dumps({"v": 1, "ts": 5.0, "window_s": 10, "device": "x",
                       "layers": [{"type": "mlp", "busy_s": -1}]}).encode()  # fmt: skip


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback test URL
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


async def get(url: str) -> tuple[int, bytes]:
    """GET from a thread, so the daemon's loop serves it as it would a real scrape."""
    return await asyncio.to_thread(_get, url)


async def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """All samples of /metrics, parsed by prometheus_client's own parser."""
    status, body = await get(f"{base}/metrics")
    assert status == 200
    families = text_string_to_metric_families(body.decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in families for s in fam.samples}  # fmt: skip


async def test_readiness_and_metrics_of_a_running_daemon(broker: EmbeddedBroker) -> None:
    """503 before the assignment, 200 after; bad and good records move the right counters."""
    settings = fast_settings(broker)
    await ensure_topics(settings.kafka)
    samples = settings.kafka.topics.samples
    d = await Daemon(settings).setup(http=True)
    assert d.http is not None
    base = f"http://127.0.0.1:{d.http.port}"
    try:
        assert (await get(f"{base}/healthz"))[0] == 200
        assert (await get(f"{base}/readyz"))[0] == 503
        m = await scrape(base)
        assert m["flopwatch_ready", ()] == 0
        assert m["flopwatch_records_total", (("outcome", "accepted"),)] == 0

        await d.start()
        ready = False
        deadline = time.monotonic() + 30
        while not ready:
            assert time.monotonic() < deadline, "never ready"
            ready = (await get(f"{base}/readyz"))[0] == 200

        batches = fleet(10)
        batches[3] = [*batches[3], msg(b'{"v":1,"ts":'), msg(NEGATIVE), msg(NEGATIVE)]
        await produce(settings, batches)
        await until(lambda: d.records == 10 * DEVICES, "10 windows")
        await until(lambda: sum(d.runner.rejected.values()) == 3, "the bad records")
        m = await scrape(base)
        assert m["flopwatch_ready", ()] == 1
        assert m["flopwatch_records_total", (("outcome", "accepted"),)] == 10 * DEVICES
        assert m["flopwatch_records_total", (("outcome", "invalid"),)] == 3
        assert m["flopwatch_dead_letters_total", (("reason", "layers[0].busy_s"),)] == 2
        assert m["flopwatch_streams", (("kind", "device"),)] == DEVICES
        assert m["flopwatch_assigned_partitions", (("topic", samples),)] == 4
        lags = {k: v for k, v in m.items() if k[0] == "flopwatch_consumer_lag_records"}
        assert lags
        assert all(v == 0 for v in lags.values())
        assert m["flopwatch_checkpoint_restores_total", (("kind", "partition"),)] == 0

        # The clean stop writes checkpoints; their size and age are exposed.
        d.runner.stop.set()
        await asyncio.wait_for(d.task, 30)
        m = await scrape(base)
        assert m["flopwatch_checkpoint_writes_total", ()] == 5  # 4 partitions + incidents
        assert m["flopwatch_checkpoint_written_bytes_total", ()] > 0
        for p in range(4):
            assert m["flopwatch_checkpoint_bytes", (("partition", str(p)),)] > 0
            assert 0 <= m["flopwatch_checkpoint_age_seconds", (("partition", str(p)),)] < 30
    finally:
        if not d.task.done():
            d.task.cancel()
        await d._close()


def _listening_ports(pid: int) -> set[int]:
    """TCP ports the process listens on (its socket inodes in LISTEN state, from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def _daemon(
    broker: EmbeddedBroker, port: int, log: BinaryIO, host: str | None = None
) -> subprocess.Popen[bytes]:
    s = isolated_settings(broker)
    k, t = s.kafka, s.kafka.topics
    env = {**os.environ, "FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap,
           "FLOPWATCH_CHECKPOINT__KEY": "test-checkpoint-key",
           "FLOPWATCH_KAFKA__GROUP_ID": k.group_id, "FLOPWATCH_KAFKA__TOPICS__SAMPLES": t.samples,
           "FLOPWATCH_KAFKA__TOPICS__CHANGES": t.changes, "FLOPWATCH_KAFKA__TOPICS__STATE": t.state,
           "FLOPWATCH_SINKS__CONSOLE": "false", "FLOPWATCH_LOG_FORMAT": "json",
           "FLOPWATCH_HTTP_PORT": str(port)}  # fmt: skip
    if host:
        env["FLOPWATCH_HTTP_HOST"] = host
    asyncio.run(ensure_topics(k))
    return subprocess.Popen([sys.executable, "-m", "monitor", "run"], env=env,
                            stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip


def test_flopwatch_run_serves_on_http_port_and_port_zero_serves_nothing(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """`flopwatch run` listens on FLOPWATCH_HTTP_PORT (and only on FLOPWATCH_HTTP_HOST when
    set); with port 0 it opens no listening socket."""
    port = free_port()
    with (tmp_path / "on.log").open("wb") as on_log, (tmp_path / "off.log").open("wb") as off_log:
        on = _daemon(broker, port, on_log, host="127.0.0.1")
        off = _daemon(broker, 0, off_log)
        _check_both(port, on, off, tmp_path)


def _check_both(
    port: int, on: subprocess.Popen[bytes], off: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    try:
        deadline = time.monotonic() + 60
        while True:
            assert on.poll() is None, (tmp_path / "on.log").read_text()[-2000:]
            try:
                if _get(f"http://127.0.0.1:{port}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "flopwatch run never became ready"
            time.sleep(0.1)
        assert _listening_ports(on.pid) == {port}
        # Bound to 127.0.0.1 only: another loopback address is refused.
        with pytest.raises(urllib.error.URLError, match="refused"):
            _get(f"http://127.0.0.2:{port}/readyz")
        status, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert b"flopwatch_build_info{" in body

        while b'"event": "started"' not in (tmp_path / "off.log").read_bytes():
            assert off.poll() is None, (tmp_path / "off.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "flopwatch run (port 0) never started"
            time.sleep(0.1)
        assert _listening_ports(off.pid) == set()
    finally:
        for proc in (on, off):
            proc.send_signal(signal.SIGTERM)
        for proc in (on, off):
            assert proc.wait(30) == 0


def test_flopwatch_run_serves_the_incident_page_of_an_alert_that_paged(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """`flopwatch run` on the real broker: a kernel_lib regression pages; /alerts lists its
    id and /alerts/<id> (Alertmanager's generatorURL, the console link) is its page."""
    s = isolated_settings(broker)
    k, t = s.kafka, s.kafka.topics
    port, alerts = free_port(), tmp_path / "alerts.jsonl"
    env = {**os.environ, "FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap,
           "FLOPWATCH_CHECKPOINT__KEY": "test-checkpoint-key",
           "FLOPWATCH_KAFKA__GROUP_ID": k.group_id, "FLOPWATCH_KAFKA__TOPICS__SAMPLES": t.samples,
           "FLOPWATCH_KAFKA__TOPICS__CHANGES": t.changes, "FLOPWATCH_KAFKA__TOPICS__STATE": t.state,
           "FLOPWATCH_KAFKA__TOPICS__ALERTS": t.alerts, "FLOPWATCH_SINKS__CONSOLE": "false",
           "FLOPWATCH_SINKS__JSONL_PATH": str(alerts), "FLOPWATCH_LOG_FORMAT": "json",
           "FLOPWATCH_HTTP_HOST": "127.0.0.1", "FLOPWATCH_HTTP_PORT": str(port)}  # fmt: skip
    asyncio.run(ensure_topics(k))
    base = f"http://127.0.0.1:{port}"
    with (tmp_path / "run.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "monitor", "run"], env=env,
                                stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, (tmp_path / "run.log").read_text()[-2000:]
                with contextlib.suppress(OSError):
                    if _get(f"{base}/readyz")[0] == 200:
                        break
                assert time.monotonic() < deadline, "flopwatch run never became ready"
                time.sleep(0.1)
            assert _get(f"{base}/alerts")[0] == 200
            asyncio.run(produce(s, fleet(80, regress_at=40, change_at=39)))
            # The 80 windows arrive at once, and the change topic is read beside the samples,
            # not before them: the first record may page before the change is known, and the
            # update that names it follows. Wait for that record, then for the page.
            paged = _wait_for_page(alerts, deadline=time.monotonic() + 90, change="chg-1")
            # The pages take a batch once every sink has it: the JSONL file may be first.
            while b"chg-1" not in _get(f"{base}/alerts/{paged}")[1]:
                assert time.monotonic() < deadline + 90, "the page never named the change"
                time.sleep(0.1)
            status, body = _get(f"{base}/alerts/{paged}")
            html = body.decode()
            assert status == 200, html
            assert f'<section class="incident" id="{paged}">' in html
            assert '<svg class="plot"' in html
            assert "<polyline" in html  # the pool's level, kept before the page
            assert "chg-1" in html  # the change on the timeline and in the suggestion
            assert "&larr; first failing" in html
            assert _get(f"{base}/alerts/fw-000000000000")[0] == 404
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0


def _wait_for_page(alerts: Path, deadline: float, change: str | None = None) -> str:
    """The id of the first alert record with severity page in the daemon's JSONL sink (one
    whose suggestion names `change`, if given)."""
    while time.monotonic() < deadline:
        if alerts.exists():
            for line in alerts.read_text().splitlines():
                rec = json.loads(line)
                named = change is None or rec["suggestion"].get("change_id") == change
                if rec["severity"] == "page" and named:
                    return str(rec["id"])
        time.sleep(0.2)
    raise AssertionError("nothing paged" if change is None else f"no page named {change}")

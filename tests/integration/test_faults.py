"""Faults on the real broker and a real Alertmanager: `flopwatch run` killed, the broker
paused, Alertmanager failing or restarted empty, poison records, a long changes topic.

Each test checks what on-call would see at the end: the alerts topic (one id per incident,
every page resolved) and Alertmanager's own state (exactly the open incidents, one label set
each). Time is compressed with short intervals (re-posts and checkpoints every second), not
waited out; only the broker pause lasts as long as the fault it stands for.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Kcat
from factories import window
from fault_helpers import (
    AlertmanagerProcess,
    Expected,
    Feed,
    Flopwatch,
    Incident,
    alert_records,
    assert_alerts_topic,
    assert_ends_resolved,
    assert_never_refired,
    produce_now,
    transitions,
)
from kafka_helpers import isolated_settings, kcat_read

from monitor.config import Settings
from monitor.core.types import RawMessage
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics
from monitor.sinks.alertmanager import labels_of
from monitor.wire import Codec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CODEC = Codec()

# Alertmanager's outages, compressed: at a re-post every second (the daemon's retry backoff
# is capped there too), 5 s is five failed rounds, more than a 60 s outage is at the
# default `resend_s` of 60 s.
AM_OUTAGE_S = 5.0
BROKER_PAUSE_S = 30.0


@pytest.fixture
def am(tmp_path: Path) -> Iterator[AlertmanagerProcess]:
    a = AlertmanagerProcess(tmp_path)
    yield a
    a.close()


class Run:
    """One test's incident, its expected alerts, fresh topics, and the daemon (not started)."""

    def __init__(self, broker: EmbeddedBroker, kcat: Kcat, am: AlertmanagerProcess,
                 logs: Path, **extra: str) -> None:  # fmt: skip
        self.inc = Incident.recent()
        self.batches = self.inc.batches()
        self.exp = Expected.of(self.batches)
        self.settings: Settings = isolated_settings(broker)
        asyncio.run(ensure_topics(self.settings.kafka))
        self.broker, self.kcat, self.am = broker, kcat, am
        self.fw = Flopwatch(self.settings, logs, am.proxy.url, extra)
        self.feed = Feed(self.fw, self.batches, self.inc)

    def records(self) -> list[dict]:
        return alert_records(self.kcat, self.broker.bootstrap, self.settings.kafka.topics.alerts)

    def current_labels(self) -> dict[str, str]:
        """Alertmanager labels of the newest firing record on the alerts topic."""
        last = [r for r in self.records() if r["status"] == "firing"][-1]
        return labels_of(CODEC.decode_alert(json.dumps(last).encode()))

    def restart(self, checkpoint_interval_s: str | None = None) -> None:
        """SIGKILL, start again (with this checkpoint interval, else the short one), and
        check that every partition came back from the state topic."""
        fw = self.fw
        fw.kill()
        fw.extra.pop("CHECKPOINT__INTERVAL_S", None)
        if checkpoint_interval_s is not None:
            fw.extra["CHECKPOINT__INTERVAL_S"] = checkpoint_interval_s
        fw.start()
        fw.wait_ready()
        assert fw.metric("flopwatch_checkpoint_restores_total", kind="partition") == 4

    def finish(self) -> None:
        """Feed the rest; the resolve reaches on-call and Alertmanager holds nothing."""
        self.feed.through(self.inc.windows - 1, step=8)
        am, aid = self.am, self.exp.id

        def state() -> object:
            return {"alertmanager": am.alerts(), "on-call": am.notifications(aid),
                    "topic": [r["status"] for r in self.records()]}  # fmt: skip

        self.fw.wait(lambda: am.alerts() == [], "Alertmanager to hold no alert", show=state)
        self.fw.wait(lambda: am.notifications(aid) and all(
            s[-1] == "resolved" for s in am.notifications(aid).values()),
            "the resolve at on-call's receiver", show=state)  # fmt: skip
        assert_alerts_topic(self.records(), self.exp)
        for labels, statuses in self.am.proxy.accepted(self.exp.id).items():
            assert_never_refired(statuses, f"Alertmanager's {labels}")
        for severity, statuses in self.am.notifications(self.exp.id).items():
            assert_ends_resolved(statuses, f"on-call's {severity} notifications")
        assert self.fw.stop() == 0, self.fw.log()


def test_sigkill_at_five_points_of_an_incident(
    broker: EmbeddedBroker, kcat: Kcat, am: AlertmanagerProcess, tmp_path: Path
) -> None:
    """Killed before the alarm, between alarm and page, right after the page, while it
    fires and is re-posted, and between the fix and the resolve: after each restart (from
    the state topic) the incident keeps its id, and it ends resolved everywhere."""
    run = Run(broker, kcat, am, tmp_path)
    exp, fw, feed = run.exp, run.fw, run.feed
    feed.send(exp.detected - 8)
    fw.start()
    try:
        fw.wait_ready()
        feed.through(exp.detected - 8)
        # A clean stop stores every partition: each kill below finds a checkpoint of each
        # (a kill before that is test_sigkill_before_the_first_checkpoint).
        assert fw.stop() == 0
        fw.start()
        fw.wait_ready()
        # 1. Before the first alarm.
        feed.through(exp.detected - 3)
        run.restart()
        # 2. Detected, not paged yet (a page needs the next window to settle).
        feed.through(exp.detected)
        fw.wait(lambda: fw.metric("flopwatch_incidents_open", paged="false") >= 1, "the alarm")
        assert run.records() == []
        run.restart(checkpoint_interval_s="60")
        # 3. Right after the page reached the alerts topic, before any checkpoint had it:
        # the restart replays it from a state that never paged, under the same id.
        feed.send(exp.paged)
        fw.wait(run.records, "the page on the alerts topic")
        run.restart()
        # 4. While it fires (a ticket) and is re-posted to Alertmanager.
        feed.through(exp.upgraded - 2)
        since = time.monotonic()
        fw.wait(lambda: len(am.proxy.posted(since, 200)) >= 2, "two re-posts")
        ticket = run.current_labels()
        assert ticket["severity"] == "warning"
        assert am.label_sets(exp.id) == [ticket]
        run.restart()
        # The page (severity up) replaces the ticket's label set in Alertmanager.
        feed.through(exp.upgraded)
        fw.wait(lambda: run.current_labels()["severity"] == "critical", "the page")
        fw.wait(lambda: am.label_sets(exp.id) == [run.current_labels()], "one label set")
        # 5. Fixed, not resolved yet: three windows short of the uninterrupted run's
        # resolve. After these restarts the daemon has resolved one window before that
        # run does (6 runs of 8; not without restarts), for a reason not traced yet; how
        # records were batched no longer moves it (test_pipeline's resolve tests).
        assert exp.resolved - 3 > run.inc.heal
        feed.through(exp.resolved - 3)
        assert "resolved" not in {r["status"] for r in run.records()}
        run.restart()
        run.finish()
    finally:
        fw.stop()


def test_sigkill_right_after_the_resolve(
    broker: EmbeddedBroker, kcat: Kcat, am: AlertmanagerProcess, tmp_path: Path
) -> None:
    """Killed after the resolve went out, before a checkpoint recorded it: the restart
    must not page on-call again for an incident that is fixed."""
    run = Run(broker, kcat, am, tmp_path)
    exp, fw, feed = run.exp, run.fw, run.feed
    feed.send(exp.detected - 8)
    fw.start()
    try:
        fw.wait_ready()
        feed.through(exp.resolved - 2, step=8)
        fw.wait(lambda: am.label_sets(exp.id) == [run.current_labels()], "the page")
        assert fw.stop() == 0  # a clean stop: its checkpoint holds the open incident
        fw.extra["CHECKPOINT__INTERVAL_S"] = "60"  # and no other is written before the kill
        fw.start()
        fw.wait_ready()
        feed.send(exp.resolved)
        fw.wait(lambda: "resolved" in {r["status"] for r in run.records()}, "the resolve")
        run.restart()
        run.finish()
    finally:
        fw.stop()


@pytest.mark.xfail(
    strict=True,
    reason="a partition killed before its first checkpoint resumes at its committed offset "
    "with fresh detectors: its history is lost and the incident is not paged",
)
def test_sigkill_before_the_first_checkpoint(
    broker: EmbeddedBroker, kcat: Kcat, am: AlertmanagerProcess, tmp_path: Path
) -> None:
    """Killed inside its first checkpoint interval (say, a crash loop): the restart must
    still know every record it committed, so the incident pages as it would have."""
    run = Run(broker, kcat, am, tmp_path, CHECKPOINT__INTERVAL_S="60")
    fw, feed = run.fw, run.feed
    feed.send(run.exp.detected - 8)
    fw.start()
    try:
        fw.wait_ready()
        feed.through(run.exp.detected - 3, step=8)
        fw.kill()
        fw.start()
        fw.wait_ready()
        feed.through(run.exp.paged + 2)
        fw.wait(run.records, "the page on the alerts topic", within=5)
        run.finish()
    finally:
        fw.stop()


def test_broker_paused_for_30_seconds(kcat: Kcat, am: AlertmanagerProcess, tmp_path: Path) -> None:
    """The broker stops answering for 30 s (SIGSTOP: a partition; a restarted in-memory
    Tansu would come back empty) while a page update is in flight: the daemon lives,
    /readyz says 503 meanwhile and 200 after, and no record is lost or sent twice."""
    own = EmbeddedBroker()
    own.start_sync()
    try:
        run = Run(own, kcat, am, tmp_path, KAFKA__PROBE_S="1", KAFKA__STALL_S="10")
        exp, fw, feed = run.exp, run.fw, run.feed
        feed.send(exp.detected - 8)
        fw.start()
        try:
            fw.wait_ready()
            feed.through(exp.paged)
            fw.wait(run.records, "the page on the alerts topic")
            feed.send(exp.upgraded)  # the update may be fetched, processed, or neither
            seen = _pause(own, fw)
            assert 503 in seen, seen
            assert seen[-1] == 503, seen
            fw.wait(lambda: fw.readyz() == 200, "/readyz 200 after the pause")
            run.finish()
            assert transitions(run.records()) == transitions([a for _, a in exp.alerts])
        finally:
            fw.stop()
    finally:
        own.stop_sync()


def _pause(broker: EmbeddedBroker, fw: Flopwatch) -> list[int | None]:
    """SIGSTOP the broker for BROKER_PAUSE_S; the /readyz statuses seen meanwhile."""
    proc = broker._proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    seen: list[int | None] = []
    try:
        end = time.monotonic() + BROKER_PAUSE_S
        while time.monotonic() < end:  # the fault's own duration, watched throughout
            assert fw.dead() is None, fw.dead()
            status = fw.readyz()
            if not seen or seen[-1] != status:
                seen.append(status)
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGCONT)
    return seen


def test_alertmanager_failing_and_restarted_empty(
    broker: EmbeddedBroker, kcat: Kcat, am: AlertmanagerProcess, tmp_path: Path
) -> None:
    """Alertmanager answers 503 through the first page, through the page that replaces
    it, and through the resolve, and is restarted empty in between: each time it ends up
    holding exactly the open incident's current label set, and the resolve arrives."""
    run = Run(broker, kcat, am, tmp_path)
    exp, fw, feed = run.exp, run.fw, run.feed
    feed.send(exp.detected - 8)  # a backlog: the daemon starts behind, as after a deploy
    fw.start()
    try:
        fw.wait_ready()
        feed.through(exp.paged - 1)
        with am.proxy.outage(AM_OUTAGE_S):
            feed.through(exp.paged + 1)
            fw.wait(run.records, "the page on the alerts topic")
        assert am.label_sets(exp.id) == []  # nothing got through meanwhile
        ticket = run.current_labels()
        fw.wait(lambda: am.label_sets(exp.id) == [ticket], "the page after the outage")
        with am.proxy.outage(AM_OUTAGE_S):
            feed.through(exp.upgraded)
            fw.wait(lambda: run.current_labels() != ticket, "new labels (severity up)")
        page = run.current_labels()
        fw.wait(lambda: am.label_sets(exp.id) == [page], "only the new label set")
        # On-call hears the old label set end before Alertmanager is wiped: an end it
        # accepted and lost before notifying is past what a client can see.
        old = ticket["severity"]
        fw.wait(lambda: am.notifications(exp.id).get(old, [])[-1:] == ["resolved"],
                "the old label set resolved at on-call")  # fmt: skip
        am.restart_empty()
        fw.wait(lambda: am.label_sets(exp.id) == [page], "the page in the new Alertmanager")
        with am.proxy.outage(AM_OUTAGE_S) as since:
            feed.through(exp.resolved)
            fw.wait(lambda: "resolved" in {r["status"] for r in run.records()}, "the resolve")
        ends = [a for a in am.proxy.posted(since, 503) if "endsAt" in a]
        assert len(ends) >= 2, "the refused resolve was not retried"
        run.finish()
    finally:
        fw.stop()


VICTIM = "node-000/gpu0"  # a device of the host that regresses first


def _poison(ts: float) -> list[tuple[str, bytes]]:
    """Records that once stopped the daemon or blinded a partition, each with a pattern
    its dead letter's reason must match."""
    deep = b"[" * 1000 + b"]" * 1000
    ms = window(VICTIM, ts * 1000)
    ahead = window(VICTIM, time.time() + 86400)
    layers = window(VICTIM, ts)
    layers["layers"] = [{"type": "mlp", "busy_s": 1.0}] * 20_000
    return [
        (r"malformed JSON: nested too deep|record: ", deep),
        (r"malformed JSON: nested too deep|ts: ", b'{"v":1,"ts":' + deep + b"}"),
        (r"malformed JSON: ", b"\xff\xfe" * 400_000),
        (r"ts: expected Unix seconds", json.dumps(ms).encode()),
        (r"future: ", json.dumps(ahead).encode()),
        (r"layers: 20000 entries", json.dumps(layers).encode()),
    ]


def _letter_of(value: bytes, letters: list[dict]) -> dict:
    """The dead letter that carries `value` (whole, or its SHA-256 when truncated)."""
    sha = hashlib.sha256(value).hexdigest()
    text = value.decode(errors="replace")
    found = [x for x in letters if x.get("value_sha256") == sha
             or (not x.get("truncated") and x["value"] == text)]  # fmt: skip
    assert len(found) == 1, (value[:60], [x["reason"] for x in letters])
    return found[0]


def test_poison_records_are_dead_lettered_and_the_page_unchanged(
    broker: EmbeddedBroker, kcat: Kcat, am: AlertmanagerProcess, tmp_path: Path
) -> None:
    """Deep nesting, 800 KB of non-UTF-8, ts in milliseconds, a record dated a day ahead
    and 20,000 layers, under a regressing device's key, just before the alarm: each is
    dead-lettered with its reason, and the incident's records are those of a clean run."""
    run = Run(broker, kcat, am, tmp_path)
    exp, fw, feed = run.exp, run.fw, run.feed
    feed.send(exp.detected - 8)
    fw.start()
    try:
        fw.wait_ready()
        feed.through(exp.detected - 3)
        poison = _poison(run.inc.ts(exp.detected - 3))
        samples = run.settings.kafka.topics.samples
        produce_now(run.settings, [[RawMessage(samples, 0, -1, VICTIM.encode(), v)
                                    for _, v in poison]])  # fmt: skip
        feed.through(exp.detected + 2)
        dlq = run.settings.kafka.topics.dlq
        letters = fw.wait(lambda: len(got := kcat_read(kcat, broker.bootstrap, dlq)) >= len(poison)
                          and got, "the dead letters")  # fmt: skip
        assert fw.readyz() == 200
        assert len(letters) == len(poison)
        assert {k for k, _ in letters} == {VICTIM}
        for pattern, value in poison:
            letter = _letter_of(value, [x for _, x in letters])
            assert re.match(pattern, letter["reason"]), (pattern, letter["reason"])
            assert letter.get("truncated", False) == (len(value) > 64 * 1024)
        run.finish()
        assert transitions(run.records()) == transitions([a for _, a in exp.alerts])
    finally:
        fw.stop()


CHANGES = 100_000
# Start to /readyz 200 is ~4 s with an empty changes topic here; before the change index
# (#20), 40k events alone blocked the loop for 87 s.
STARTUP_BOUND_S = 30.0


def test_start_with_100k_change_events(
    broker: EmbeddedBroker, kcat: Kcat, am: AlertmanagerProcess, tmp_path: Path
) -> None:
    """100k change events (other pools, the last 5 hours) wait on the changes topic: the
    daemon is ready within a bound, and the page names the one change that fits."""
    run = Run(broker, kcat, am, tmp_path)
    exp, fw, feed = run.exp, run.fw, run.feed
    t0 = run.inc.t0
    lines = "".join(
        f"pool:other-{i % 1000}\t" + json.dumps({
            "v": 1, "ts": t0 - 18_000 + 18_000 * i / CHANGES, "id": f"bulk-{i}", "kind": "driver",
            "scope": {"pool": f"other-{i % 1000}"}, "from": "1", "to": "2"}) + "\n"
        for i in range(CHANGES)
    )  # fmt: skip
    subprocess.run(
        [kcat.path, "-P", "-b", broker.bootstrap, "-t", run.settings.kafka.topics.changes,
         "-K", "\t"], input=lines, text=True, env=kcat.env, check=True, timeout=120,
    )  # fmt: skip
    feed.send(exp.detected - 8)
    fw.start()
    try:
        startup = fw.wait_ready(within=120)
        print(f"\nstart-up with {CHANGES} change events: {startup:.1f} s")
        assert fw.metric("flopwatch_change_events_total") >= CHANGES
        assert startup < STARTUP_BOUND_S
        feed.through(exp.paged)
        page = fw.wait(run.records, "the page on the alerts topic")
        assert page[0]["suggestion"]["change_id"] == "chg-1"
        run.finish()
    finally:
        fw.stop()

"""The runner loop: sinks before commit, one warning per unknown-hardware device."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import msgspec
import pytest
from factories import T0, fleet, msg, window
from structlog.testing import capture_logs

from monitor.config import AlertmanagerSettings, Settings
from monitor.core.pipeline import Pipeline
from monitor.core.stream_table import StreamTable
from monitor.core.types import RawMessage
from monitor.daemon.runner import Runner
from monitor.sinks.alertmanager import AlertmanagerSink


class ListSource:
    """Yields fixed batches and records when it was asked to commit."""

    def __init__(self, batches: list[list[RawMessage]], log: list[str]) -> None:
        self._batches = batches
        self.log = log

    async def batches(self) -> AsyncIterator[list[RawMessage]]:
        for b in self._batches:
            self.log.append("batch")
            yield b

    async def commit(self) -> None:
        self.log.append("commit")

    async def close(self) -> None:
        return None


class ListSink:
    """Records each send in the shared log."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def send(self, alerts) -> None:
        self.log.append(f"send {len(alerts)}")

    async def close(self) -> None:
        return None


async def test_unknown_hardware_warned_once_per_device() -> None:
    """Ten windows of two mystery devices give exactly two warnings, naming each device."""
    batches = [
        [msg(window(f"n/gpu{d}", T0 + 10 * w, hw="mystery-9000")) for d in range(2)]
        for w in range(10)
    ]
    events: list[str] = []
    with capture_logs() as logs:
        await Runner(ListSource(batches, events), Pipeline(Settings()), []).run()
    warnings = [e for e in logs if e["event"].startswith("unknown hardware")]
    assert sorted(e["device"] for e in warnings) == ["n/gpu0", "n/gpu1"]
    assert all(e["hw"] == "mystery-9000" for e in warnings)
    assert events.count("commit") == 10


async def test_commit_only_after_sinks_took_the_alerts() -> None:
    """At-least-once: a batch that produced alerts is committed after every sink sent them."""
    events: list[str] = []
    batches = fleet(70, regress_at=40, change_at=39)
    await Runner(ListSource(batches, events), Pipeline(Settings()), [ListSink(events)]).run()
    sends = [i for i, e in enumerate(events) if e.startswith("send")]
    assert sends
    for i in sends:
        # batch -> send -> commit: the offset moves only once the sink has the alerts.
        assert events[i - 1 : i + 2] == ["batch", events[i], "commit"]


class FlakySink:
    """Fails its first `failures` sends, then records each send in the shared log."""

    name = "flaky"

    def __init__(self, log: list[str], failures: int) -> None:
        self.log, self.failures = log, failures
        self.failed_five = asyncio.Event()

    async def send(self, alerts) -> None:
        if self.failures:
            self.failures -= 1
            self.log.append("fail")
            if self.log.count("fail") >= 5:
                self.failed_five.set()
            raise ConnectionError("receiver down")
        self.log.append(f"send {len(alerts)}")

    async def close(self) -> None:
        return None


async def test_failing_sink_is_retried_until_it_takes_the_alerts() -> None:
    """A sink error never stops the daemon: the batch waits, retried, and is committed
    only once the sink took it."""
    events: list[str] = []
    sink = FlakySink(events, failures=3)
    runner = Runner(ListSource(fleet(70, regress_at=40, change_at=39), events),
                    Pipeline(Settings()), [sink], retry_s=0.001)  # fmt: skip
    await runner.run()
    first = events.index("fail")
    assert events[first : first + 5] == ["fail", "fail", "fail", events[first + 3], "commit"]
    assert events[first + 3].startswith("send ")
    assert runner.send_errors["flaky"] == 3
    assert runner.sent["flaky", "firing"] >= 1
    assert runner.failing_since == {}


async def test_stop_while_a_sink_fails_commits_nothing() -> None:
    """Asked to stop while a sink still fails, the runner raises instead of committing or
    checkpointing the undelivered batch; meanwhile it reports how long the sink fails."""
    events: list[str] = []
    sink = FlakySink(events, failures=10**9)
    runner = Runner(ListSource(fleet(70, regress_at=40, change_at=39), events),
                    Pipeline(Settings()), [sink], retry_s=0.001)  # fmt: skip
    task = asyncio.create_task(runner.run())
    await asyncio.wait_for(sink.failed_five.wait(), 60)
    assert runner.sink_failing_s() > 0
    commits = events.count("commit")
    runner.stop.set()
    with pytest.raises(ConnectionError):
        await task
    assert events.count("commit") == commits
    assert events[-1] == "fail"


async def test_a_record_that_breaks_the_pipeline_is_dead_lettered_alone(monkeypatch) -> None:
    """A bug one record triggers after decode costs that record (dead-lettered as
    `internal`), not the batch: the other records' alerts are those of a run without it."""
    batches = fleet(70, regress_at=40, change_at=39)
    clean = Pipeline(Settings())
    want = [a for b in batches for a in clean.process(b).alerts]
    poison = msg(window("zz/poison", T0 + 10 * 45, pool="other"))
    poisoned = [*batches[45][:7], poison, *batches[45][7:]]

    collect = StreamTable._collect

    def broken(self, accepted):
        if any(rec.device == "zz/poison" for rec, _ in accepted):
            raise ValueError("a bug this record triggers")
        return collect(self, accepted)

    monkeypatch.setattr(StreamTable, "_collect", broken)
    p = Pipeline(Settings())
    got, dead = [], []
    for i, b in enumerate(batches):
        out = p.process(poisoned if i == 45 else b)
        got.extend(out.alerts)
        dead.extend(out.dead)
    assert [d.reason for d in dead] == ["internal: ValueError: a bug this record triggers"]
    assert dead[0].message is poison
    assert p.stats.internal_errors == 1
    # The same pages: the batch ran in pieces, so a pool aggregate of that window is an
    # average of pieces and post-change levels may move in the fourth digit.
    assert [_decision(a) for a in got] == [_decision(a) for a in want]
    for a, b in zip(got, want, strict=True):
        assert a.after == pytest.approx(b.after, rel=0.01)
    assert p.stats.records_in == sum(len(b) for b in batches) - p.stats.changes_in


def _decision(a) -> tuple:
    return (a.id, a.status, a.severity, msgspec.json.encode(a.scope), a.metric, a.layers,
            a.first_failing_stage, msgspec.json.encode(a.suggestion))  # fmt: skip


def _recording_am(posted: list[list[dict]]) -> AlertmanagerSink:
    """An Alertmanager sink whose posts are recorded instead of sent (all accepted)."""
    sink = AlertmanagerSink(AlertmanagerSettings(urls=["http://127.0.0.1:9"], resend_s=3600))

    async def record(url: str, batch: list[dict]) -> None:
        posted.append(batch)

    sink._post = record  # type: ignore[method-assign]
    return sink


async def test_what_alertmanager_holds_travels_in_the_checkpoint() -> None:
    """The label sets a sink left open are part of the alert state the checkpoint carries;
    the process restored from it ends the one the re-sent page no longer uses."""
    batches = fleet(80, regress_at=40, change_at=39)
    posted: list[list[dict]] = []
    old_sink = _recording_am(posted)
    first = Pipeline(Settings())
    await Runner(ListSource(batches[:60], []), first, [old_sink]).run()
    (aid,) = old_sink.active
    assert first.lifecycle.states[aid].delivery["alertmanager"] == old_sink.delivery_state()[aid]
    blobs = {p: first.snapshot_partition(p) for p in first.partitions}
    incidents = first.snapshot_incidents()

    second = Pipeline(Settings())
    for p, blob in blobs.items():
        second.restore_partition(p, blob)
    second.restore_incidents(incidents)
    held = second.lifecycle.states[aid].delivery["alertmanager"]
    assert held == old_sink.delivery_state()[aid]
    # As if the old process had paged under another label set than the one re-sent now.
    ((key, (status, starts)),) = held.items()
    stale = {**json.loads(key), "severity": "warning"}
    held.clear()
    held[json.dumps(stale, sort_keys=True)] = [status, starts]
    reposted: list[list[dict]] = []
    new_sink = _recording_am(reposted)
    await Runner(ListSource(batches[60:61], []), second, [new_sink]).run()
    ends = [a for batch in reposted for a in batch if "endsAt" in a]
    assert [e["labels"] for e in ends] == [stale]
    assert ends[0]["startsAt"] == starts
    firing = [a for batch in reposted for a in batch if "endsAt" not in a]
    assert [a["labels"]["flopwatch_id"] for a in firing] == [aid]
    assert second.lifecycle.states[aid].delivery["alertmanager"] == {
        json.dumps(firing[0]["labels"], sort_keys=True): ["firing", firing[0]["startsAt"]]
    }

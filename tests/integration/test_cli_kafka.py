"""`flopwatch run`, `record` and `sim --kafka` as real processes against the real broker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Kcat
from factories import fleet
from kafka_helpers import isolated_settings, kcat_read, produce

from monitor.config import Settings
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics

pytestmark = pytest.mark.integration


def _env(settings: Settings) -> dict[str, str]:
    """Environment that points the CLI at these settings (FLOPWATCH_* nested with __)."""
    k, t = settings.kafka, settings.kafka.topics
    return {
        **os.environ,
        "FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers or "",
        "FLOPWATCH_CHECKPOINT__KEY": "test-checkpoint-key",
        "FLOPWATCH_KAFKA__GROUP_ID": k.group_id,
        "FLOPWATCH_KAFKA__TOPICS__SAMPLES": t.samples,
        "FLOPWATCH_KAFKA__TOPICS__CHANGES": t.changes,
        "FLOPWATCH_KAFKA__TOPICS__ALERTS": t.alerts,
        "FLOPWATCH_KAFKA__TOPICS__DLQ": t.dlq,
        "FLOPWATCH_KAFKA__TOPICS__STATE": t.state,
        "FLOPWATCH_SINKS__CONSOLE": "false",
        "FLOPWATCH_LOG_FORMAT": "json",
    }


async def _produce(settings: Settings, windows: int) -> None:
    await ensure_topics(settings.kafka)
    await produce(settings, fleet(windows, regress_at=45, change_at=44))


def test_flopwatch_run_publishes_alert_and_stops_on_sigterm(
    broker: EmbeddedBroker, kcat: Kcat
) -> None:
    """The daemon process consumes, publishes the alert, and exits 0 on SIGTERM."""
    settings = isolated_settings(broker)
    asyncio.run(_produce(settings, 80))
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "run"], env=_env(settings),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        alerts: list = []
        while time.monotonic() < deadline and not alerts:
            alerts = kcat_read(kcat, broker.bootstrap, settings.kafka.topics.alerts)
            if not alerts:
                time.sleep(0.5)  # polling an external process's output, bounded by deadline
        assert alerts, "the daemon published no alert within 90 s"
        assert alerts[0][1]["scope"]["pool"] == "train-a"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert '"event": "stopped"' in err


def test_record_then_replay_matches(broker: EmbeddedBroker, tmp_path: Path) -> None:
    """`flopwatch record` captures both topics; replaying the file finds the same incident."""
    settings = isolated_settings(broker)
    asyncio.run(_produce(settings, 80))
    out = tmp_path / "cap.jsonl.gz"
    rec = subprocess.run(
        [sys.executable, "-m", "monitor", "record", "--out", str(out), "--idle-timeout", "3s"],
        env=_env(settings), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert rec.returncode == 0, rec.stderr
    assert f"recorded {80 * 32 + 1} records" in rec.stderr
    replay = subprocess.run(
        [sys.executable, "-m", "monitor", "replay", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    alerts = [json.loads(line) for line in replay.stdout.splitlines()]
    assert alerts
    assert alerts[-1]["scope"]["pool"] == "train-a"
    assert alerts[-1]["suggestion"]["change_id"] == "chg-1"

"""Outputs: the dirty stream, the Kafka producer (pacing and a real broker) and the CLI."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from monitor.errors import DecodeError
from monitor.wire import Codec
from sim.cli import add_arguments, main
from sim.kafka import produce
from sim.run import Simulation, simulate
from sim.testing import Decoded

RunCache = Callable[[str], tuple[Simulation, Decoded]]
CODEC = Codec()


def test_dirty_stream_injects_what_its_labels_count(scenario_run: RunCache) -> None:
    """Duplicates, late records, host gaps and malformed lines, exactly as counted in the labels."""
    sim, _ = scenario_run("dirty_stream")
    bad: list[tuple[float, str]] = []
    seen: Counter[bytes] = Counter()
    late = 0
    n_ok = 0
    for w in sim.windows():
        for key, value in w.records:
            try:
                rec = CODEC.decode_window(value)
            except DecodeError:
                bad.append((w.ts, key.decode()))
                continue
            n_ok += 1
            seen[value] += 1
            assert rec.ts <= w.ts
            late += rec.ts < w.ts
    stats = sim.labels["stream_faults"]
    assert stats["malformed"] == len(bad) > 0
    assert {(m["ts"], m["device"]) for m in stats["malformed_records"]} == set(bad)
    assert {m["kind"] for m in stats["malformed_records"]} >= {"truncated", "not_json"}
    assert stats["duplicates"] == sum(c - 1 for c in seen.values()) > 0
    assert stats["late"] == late > 0
    assert stats["gap_records"] > 0
    expected = sim.devices * sim.n_windows - stats["gap_records"] + stats["duplicates"]
    assert n_ok + len(bad) == expected
    # the incident is still there under the noise
    assert sim.labels["incidents"][0]["first_failing_stage"] == "lowering"


def test_faults_flag_dirties_any_scenario() -> None:
    """`faults=True` adds stream faults to a clean scenario; the default stays clean."""
    clean = simulate("pool_regression", devices=256, duration_s=300.0, seed=2)
    dirty = simulate("pool_regression", devices=256, duration_s=300.0, seed=2, faults=True)
    n_clean = sum(len(w.records) for w in clean.windows())
    n_dirty = sum(len(w.records) for w in dirty.windows())
    assert "stream_faults" not in clean.labels
    assert n_clean == 256 * 30
    stats = dirty.labels["stream_faults"]
    assert n_dirty == n_clean - stats["gap_records"] + stats["duplicates"]
    assert stats["duplicates"] + stats["late"] + stats["malformed"] > 0


class FakeProducer:
    """Records sends and flushes (an in-process stand-in with aiokafka's producer API)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes, float]] = []
        self.flushes: list[float] = []

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[None]:
        self.sent.append((topic, key, value, time.monotonic()))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    async def flush(self) -> None:
        self.flushes.append(time.monotonic())


async def test_produce_as_fast_as_possible_flushes_per_window() -> None:
    """speed=None sends everything, keyed, one flush per window, changes before the samples."""
    sim = simulate("pool_regression", devices=16, duration_s=100.0, seed=1)
    prod = FakeProducer()
    n = await produce(sim, prod, "s", "c", None)
    assert n == 16 * 10
    assert len(prod.flushes) == 10
    samples = [x for x in prod.sent if x[0] == "s"]
    changes = [x for x in prod.sent if x[0] == "c"]
    assert len(samples) == n
    assert len(changes) == 1
    assert changes[0][1] == b"pool=train-a"
    assert all(msgspec.json.decode(v)["device"] == k.decode() for _, k, v, _ in samples)
    change_ts = msgspec.json.decode(changes[0][2])["ts"]
    first_after = next(i for i, x in enumerate(prod.sent) if x[0] == "c")
    assert all(msgspec.json.decode(x[2])["ts"] >= change_ts for x in prod.sent[first_after + 1 :])


async def test_produce_paces_by_event_time() -> None:
    """speed=N releases window k at k*window/N seconds of wall time, not earlier."""
    sim = simulate("pool_regression", devices=16, duration_s=40.0, seed=1)
    prod = FakeProducer()
    t0 = time.monotonic()
    await produce(sim, prod, "s", "c", 100.0)  # 10 s windows -> one every 0.1 s
    rel = [f - t0 for f in prod.flushes]
    assert len(rel) == 4
    for k, t in enumerate(rel):
        assert t >= 0.1 * (k + 1) - 0.005
    assert rel[-1] < 2.0


async def test_produce_rejects_bad_speed() -> None:
    """A non-positive speed is an error, not a busy loop."""
    sim = simulate("pool_regression", devices=16, duration_s=20.0, seed=1)
    with pytest.raises(ValueError, match="speed"):
        await produce(sim, FakeProducer(), "s", "c", 0.0)


async def _consume(bootstrap: str, topic: str, expect: int) -> list[Any]:
    from aiokafka import AIOKafkaConsumer  # noqa: PLC0415

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=None,
        enable_auto_commit=False,
    )
    await consumer.start()
    out: list[Any] = []
    try:
        deadline = time.monotonic() + 30
        while len(out) < expect and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for msgs in batch.values():
                out.extend(msgs)
    finally:
        await consumer.stop()
    return out


@pytest.mark.integration
async def test_produce_to_a_real_broker(broker: Any) -> None:
    """Records and change events arrive on their topics, keyed by device and by scope."""
    from aiokafka import AIOKafkaProducer  # noqa: PLC0415

    sim = simulate("pool_regression", devices=24, duration_s=100.0, seed=4)
    suffix = str(time.monotonic_ns())
    samples, changes = f"sim.samples.{suffix}", f"sim.changes.{suffix}"
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    await producer.start()
    try:
        n = await produce(sim, producer, samples, changes, None)
    finally:
        await producer.stop()
    got = await _consume(broker.bootstrap, samples, n)
    assert len(got) == n == 24 * 10
    assert {m.key for m in got} == {k for w in sim.windows() for k, _ in w.records}
    for m in got:
        assert CODEC.decode_window(m.value).device.encode() == m.key
    got_c = await _consume(broker.bootstrap, changes, 1)
    assert [m.key for m in got_c] == [b"pool=train-a"]
    assert CODEC.decode_change(got_c[0].value).kind == "kernel_lib"


# --- CLI -----------------------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


async def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    """--list prints every scenario with a one-line description."""
    assert await main(_args("--list")) == 0
    out = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in out]
    assert "pool_regression" in names
    assert "fleet_day" in names
    assert all(len(line.split(maxsplit=1)) == 2 for line in out)


async def test_cli_writes_recording_and_labels(tmp_path: Path) -> None:
    """--out DIR writes DIR/<scenario>.jsonl.gz and DIR/<scenario>.labels.json."""
    rc = await main(
        _args(
            "--scenario",
            "pool_regression",
            "--devices",
            "16",
            "--duration",
            "2m",
            "--seed",
            "3",
            "--out",
            str(tmp_path),
        )
    )
    assert rc == 0
    lines = gzip.decompress((tmp_path / "pool_regression.jsonl.gz").read_bytes()).splitlines()
    assert len(lines) == 16 * 12 + 1  # plus the kernel_lib change event
    labels = json.loads((tmp_path / "pool_regression.labels.json").read_text())
    assert labels["seed"] == 3
    assert labels["duration_s"] == 120.0


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--scenario", "nope", "--out", "x"), "unknown scenario 'nope'"),
        (("--scenario", "pool_regression", "--duration", "5q", "--out", "x"), "bad duration"),
        (
            (
                "--scenario",
                "pool_regression",
            ),
            "--out DIR or --kafka",
        ),
        (("--out", "x"), "--scenario is required"),
        (("--scenario", "pool_regression", "--kafka", "h:1", "--speed", "0"), "speed"),
        (("--scenario", "pool_regression", "--devices", "0", "--out", "x"), "--devices"),
    ],
)
async def test_cli_errors_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], needle: str
) -> None:
    """Usage errors print one `flopwatch sim: error:` line and exit with status 2."""
    with pytest.raises(SystemExit) as info:
        await main(_args(*argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("flopwatch sim: error: ")
    assert needle in err


@pytest.mark.integration
async def test_cli_produces_to_kafka(broker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """--kafka BOOTSTRAP --speed max produces the run to the given topics."""
    topic = f"cli.samples.{time.monotonic_ns()}"
    rc = await main(
        _args(
            "--scenario",
            "pool_regression",
            "--devices",
            "16",
            "--duration",
            "30s",
            "--kafka",
            broker.bootstrap,
            "--speed",
            "max",
            "--samples-topic",
            topic,
        )
    )
    assert rc == 0
    assert "produced 48 records" in capsys.readouterr().out
    assert len(await _consume(broker.bootstrap, topic, 48)) == 48


async def test_cli_wide_draws_the_physics(tmp_path: Path) -> None:
    """--wide: the labels say so, and the records differ from the classic run's."""
    common = ("--scenario", "pool_regression", "--devices", "16", "--duration", "1m")
    assert await main(_args(*common, "--out", str(tmp_path / "c"))) == 0
    assert await main(_args(*common, "--wide", "--out", str(tmp_path / "w"))) == 0
    classic = json.loads((tmp_path / "c" / "pool_regression.labels.json").read_text())
    wide = json.loads((tmp_path / "w" / "pool_regression.labels.json").read_text())
    assert "wide" not in classic
    assert wide["wide"] is True
    rec_c = (tmp_path / "c" / "pool_regression.jsonl.gz").read_bytes()
    rec_w = (tmp_path / "w" / "pool_regression.jsonl.gz").read_bytes()
    assert rec_c != rec_w

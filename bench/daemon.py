"""The daemon as its own process against the real broker: throughput, alert latency, memory.

    python -m bench.daemon --json out/bench/daemon.json [--devices 100000] [--windows 3]
        [--latency-devices 1000] [--pools 8] [--history 40] [--live-windows 325]

Everything runs against the bundled Tansu broker on loopback, and the daemon is
`flopwatch run` in a child process with the default settings (4 partitions, checkpoints
signed and on, the Kafka alert sink), so what is measured is what a replica does.

Drain: `--windows` windows of `--devices` devices (6 layer types per record, bench.memory's
records) are produced first; then the daemon starts and drains that backlog. Its /metrics
(records taken, any outcome) and /proc (CPU time of all its threads, RSS) are read every
0.2 s. Throughput counts the windows after the first (the first creates every stream),
per second of wall time and per second of the daemon's CPU time (records/s per core).
RSS per stream is the RSS once the backlog is in, less the RSS before the first record
was taken (imports done, group joined), over devices x 6 layer streams. Catch-up is
the drain rate over the live rate of that fleet at 10 s windows (devices / 10 per s).

Latency: a fleet of `--latency-devices` devices in `--pools` pools; `--history` windows
(past burn-in) are drained first, then `--live-windows` windows are produced at half the
measured drain rate, each window's records in one burst. From live window 5 on, one pool
after another regresses (MFU -15% with a kernel fallback) for 25 windows and recovers; the
next one 40 windows later, past the correlator's grouping window, so each is its own
incident: the pages, their updates and the resolutions are the samples. Each alert
record on the alerts topic names the window that produced it (`ts`); its latency is its
broker timestamp less the moment that window's records were all acknowledged by the
broker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from bench.decode import LAYERS
from bench.memory import _templates
from monitor.config import AlertSettings, CheckpointSettings, KafkaSettings, Topics
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics, free_port

ROOT = Path(__file__).resolve().parents[1]
WINDOW_S = 10.0
POLL_S = 0.2
# Live window of the first regression; windows between regressions: past the correlator's
# grouping window, so each pool is its own incident; windows each lasts (then it recovers).
REGRESS_FROM = 5
REGRESS_EVERY = int(AlertSettings().group_window_s / WINDOW_S) + 10
REGRESS_FOR = REGRESS_EVERY - 15
TARGETS = {"e2e_records_per_s": 50_000, "alert_latency_p99_s": 1.0,
           "rss_bytes_per_stream": 1536, "catch_up_speedup": 5.0}  # fmt: skip
_TICK = os.sysconf("SC_CLK_TCK")


class Fleet:
    """Encoded window records of `devices` devices spread over `pools` pools."""

    def __init__(self, devices: int, pools: int = 1) -> None:
        self.devices, self.pools = devices, pools
        names = [f"pool-{k}" for k in range(pools)]
        self.healthy = [_templates(n) for n in names]
        self.regressed = [_templates(n, 0.85, kernel="fa3_fallback", fallback=0.4)
                          for n in names]  # fmt: skip

    def window(self, w: int, ts: float, bad: frozenset[int] = frozenset()
               ) -> Iterator[tuple[bytes, bytes]]:  # fmt: skip
        """(key, value) of every device's record at window `w` (event time `ts`); the pools
        in `bad` regressed."""
        stamp = f"{ts:.1f}".encode()
        for d in range(self.devices):
            pool = d % self.pools
            variants = (self.regressed if pool in bad else self.healthy)[pool]
            host, gpu = f"node-{d // 8:05d}".encode(), f"gpu{d % 8}".encode()
            value = variants[(d + w) % len(variants)]
            yield host + b"/" + gpu, (value.replace(b"HOST", host).replace(b"GPU", gpu)
                                      .replace(b"TS", stamp))  # fmt: skip


@dataclass
class Sample:
    """One look at the daemon: wall time, CPU seconds, RSS bytes, records taken (every
    outcome), checkpoint writes."""

    t: float
    cpu_s: float
    rss: int
    records: float
    checkpoints: float


@dataclass
class DaemonProcess:
    """`flopwatch run` in a child process, watched through /metrics and /proc."""

    kafka: KafkaSettings
    checkpoint_interval_s: float = CheckpointSettings().interval_s
    port: int = field(default_factory=free_port)
    samples: list[Sample] = field(default_factory=list)
    proc: subprocess.Popen[bytes] = field(init=False)
    log: Any = field(init=False)

    def start(self) -> DaemonProcess:
        t = self.kafka.topics
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS": str(self.kafka.bootstrap_servers),
            "FLOPWATCH_KAFKA__GROUP_ID": self.kafka.group_id,
            **{f"FLOPWATCH_KAFKA__TOPICS__{k.upper()}": v for k, v in t.model_dump().items()},
            "FLOPWATCH_CHECKPOINT__KEY": uuid.uuid4().hex,
            "FLOPWATCH_CHECKPOINT__INTERVAL_S": str(self.checkpoint_interval_s),
            "FLOPWATCH_HTTP_HOST": "127.0.0.1",
            "FLOPWATCH_HTTP_PORT": str(self.port),
            "FLOPWATCH_SINKS__CONSOLE": "false",
            "FLOPWATCH_LOG_LEVEL": "warning",
            "FLOPWATCH_LOG_FORMAT": "json",
        }
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen([sys.executable, "-m", "monitor", "run"], env=env, cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=self.log)  # fmt: skip
        return self

    def _proc(self, name: str) -> str:
        return Path(f"/proc/{self.proc.pid}/{name}").read_text()

    def cpu_s(self) -> float:
        """User + system CPU seconds of every thread of the daemon so far."""
        fields = self._proc("stat").rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK

    def rss(self) -> int:
        """Resident set size in bytes."""
        line = next(x for x in self._proc("status").splitlines() if x.startswith("VmRSS:"))
        return int(line.split()[1]) * 1024

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics summed by name (labels dropped); empty while not serving."""
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[s.name] = out.get(s.name, 0.0) + s.value
        return out

    def fail(self, why: str) -> NoReturn:
        self.log.seek(0)
        tail = self.log.read().decode(errors="replace")[-2000:]
        raise RuntimeError(f"{why}; daemon exit {self.proc.poll()}: {tail}")

    async def watch_until(self, records: float, timeout_s: float) -> Sample:
        """Sample every POLL_S until `records` were taken; the last sample."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.fail("the daemon stopped")
            m = await asyncio.to_thread(self.metrics)
            s = Sample(time.monotonic(), self.cpu_s(), self.rss(),
                       m.get("flopwatch_records_total", 0.0),
                       m.get("flopwatch_checkpoint_writes_total", 0.0))  # fmt: skip
            if m:
                self.samples.append(s)
            if s.records >= records:
                return s
            await asyncio.sleep(POLL_S)
        return self.fail(f"{records:,.0f} records not taken within {timeout_s:.0f} s")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s (a large checkpoint on the way out is not timed)."""
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def kafka_settings(broker: EmbeddedBroker) -> KafkaSettings:
    """Fresh topics and group on the broker."""
    run = uuid.uuid4().hex[:8]
    topics = Topics(samples=f"s-{run}", changes=f"c-{run}", alerts=f"a-{run}", dlq=f"d-{run}",
                    state=f"st-{run}", by_pool=f"bp-{run}")  # fmt: skip
    return KafkaSettings(bootstrap_servers=broker.bootstrap, group_id=f"g-{run}", topics=topics)


async def produce_window(prod: AIOKafkaProducer, topic: str, records: Iterator[tuple[bytes, bytes]]
                         ) -> int:  # fmt: skip
    """Send one window's records and wait for the broker's acks; how many."""
    n = 0
    for key, value in records:
        await prod.send(topic, key=key, value=value)
        n += 1
    await prod.flush()
    return n


def _producer(kafka: KafkaSettings) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, linger_ms=5,
                            max_batch_size=1 << 20)  # fmt: skip


async def measure_drain(broker: EmbeddedBroker, devices: int, windows: int,
                        checkpoint_interval_s: float) -> dict[str, Any]:  # fmt: skip
    """Throughput, CPU, RSS per stream and catch-up draining a backlog of `windows` windows."""
    kafka = kafka_settings(broker)
    await ensure_topics(kafka)
    fleet = Fleet(devices)
    prod = _producer(kafka)
    await prod.start()
    t0 = int(time.time() - WINDOW_S * windows)  # the newest window is now: never `future`
    try:
        for w in range(windows):
            await produce_window(prod, kafka.topics.samples, fleet.window(w, t0 + WINDOW_S * w))
    finally:
        await prod.stop()
    daemon = DaemonProcess(kafka, checkpoint_interval_s).start()
    try:
        end = await daemon.watch_until(devices * windows, timeout_s=300 + windows * devices / 500)
    finally:
        daemon.stop()
    before = [s for s in daemon.samples if s.records == 0]
    if not before:
        raise RuntimeError("no sample before the first record: raise --devices")
    base = before[-1]
    first = next(s for s in daemon.samples if s.records >= devices)  # stream creation done
    records, wall, cpu = end.records - first.records, end.t - first.t, end.cpu_s - first.cpu_s
    if records <= 0 or wall <= 0 or cpu <= 0:
        raise RuntimeError("too few samples in the steady part: raise --windows")
    wall_rate = records / wall
    live_rate = devices / WINDOW_S
    return {
        "devices": devices, "windows": windows, "streams": devices * len(LAYERS),
        "checkpoint_interval_s": checkpoint_interval_s,
        "e2e_records_per_s": round(records / cpu),
        "e2e_wall_records_per_s": round(wall_rate),
        "daemon_cores": round(cpu / wall, 2),
        "steady_records": int(records),
        "steady_wall_s": round(wall, 1),
        "checkpoint_writes_in_steady_part": int(end.checkpoints - first.checkpoints),
        "baseline_rss_bytes": base.rss,
        "rss_bytes": end.rss,
        "rss_bytes_per_stream": round((end.rss - base.rss) / (devices * len(LAYERS))),
        "live_records_per_s": live_rate,
        "catch_up_speedup": round(wall_rate / live_rate, 2),
    }  # fmt: skip


@dataclass
class LatencyRun:
    """What the latency phase saw: when each live window was acknowledged, and the alerts."""

    acked: dict[float, float] = field(default_factory=dict)  # window ts -> wall time
    alerts: list[tuple[dict[str, Any], float]] = field(default_factory=list)  # (alert, ts)


async def _collect_alerts(kafka: KafkaSettings, run: LatencyRun, stop: asyncio.Event) -> None:
    """Every record of the alerts topic with its broker timestamp (CreateTime)."""
    consumer = AIOKafkaConsumer(kafka.topics.alerts, bootstrap_servers=kafka.bootstrap_servers,
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                group_id=None)  # fmt: skip
    await consumer.start()
    try:
        while not stop.is_set():
            got = await consumer.getmany(timeout_ms=100)
            for msgs in got.values():
                run.alerts.extend((json.loads(m.value), m.timestamp / 1000) for m in msgs)
    finally:
        await consumer.stop()


def regressed_pools(i: int, pools: int) -> frozenset[int]:
    """Pools regressed at live window `i`: pool k from REGRESS_FROM + k * REGRESS_EVERY
    for REGRESS_FOR windows."""
    k, into = divmod(i - REGRESS_FROM, REGRESS_EVERY)
    return frozenset({k}) if i >= REGRESS_FROM and k < pools and into < REGRESS_FOR else frozenset()


async def _live(kafka: KafkaSettings, fleet: Fleet, t0: float, first: int, windows: int,
                rate: float, run: LatencyRun) -> None:  # fmt: skip
    """Produce `windows` live windows at `rate` records/s, regressing pool after pool."""
    prod = _producer(kafka)
    await prod.start()
    period = fleet.devices / rate
    start = time.monotonic()
    try:
        for i in range(windows):
            await asyncio.sleep(max(0.0, start + i * period - time.monotonic()))
            bad = regressed_pools(i, fleet.pools)
            ts = t0 + WINDOW_S * (first + i)
            await produce_window(prod, kafka.topics.samples, fleet.window(first + i, ts, bad))
            run.acked[ts] = time.time()
    finally:
        await prod.stop()


async def measure_latency(broker: EmbeddedBroker, devices: int, pools: int, history: int,
                          live: int, rate: float) -> dict[str, Any]:  # fmt: skip
    """Alert latency at `rate` records/s after `history` windows drained."""
    kafka = kafka_settings(broker)
    await ensure_topics(kafka)
    fleet = Fleet(devices, pools)
    t0 = int(time.time() - WINDOW_S * (history + live))
    prod = _producer(kafka)
    await prod.start()
    try:
        for w in range(history):
            await produce_window(prod, kafka.topics.samples, fleet.window(w, t0 + WINDOW_S * w))
    finally:
        await prod.stop()
    run, stop = LatencyRun(), asyncio.Event()
    daemon = DaemonProcess(kafka).start()
    collector = asyncio.create_task(_collect_alerts(kafka, run, stop))
    try:
        await daemon.watch_until(devices * history, timeout_s=300 + history * devices / 500)
        await _live(kafka, fleet, t0, history, live, rate, run)
        await daemon.watch_until(devices * (history + live), timeout_s=300)
        await asyncio.sleep(2.0)  # the last batch's alerts are acknowledged before its commit
    finally:
        stop.set()
        await collector
        daemon.stop()
    return latency_summary(run, fleet, rate, live)


def latency_summary(run: LatencyRun, fleet: Fleet, rate: float, live: int) -> dict[str, Any]:
    """Percentiles of alert record latency, and which pools paged."""
    lat = [at - run.acked[a["ts"]] for a, at in run.alerts if a["ts"] in run.acked]
    paged = sorted({a["scope"].get("pool") or "" for a, _ in run.alerts})
    regressed = sorted({f"pool-{k}" for i in range(live) for k in regressed_pools(i, fleet.pools)})
    out: dict[str, Any] = {
        "latency_devices": fleet.devices, "latency_pools": fleet.pools,
        "live_rate_records_per_s": round(rate), "live_windows": live,
        "pools_regressed": regressed, "pools_paged": paged,
        "alert_records": len(run.alerts),
        "alert_ids": len({a["id"] for a, _ in run.alerts}),
        "alert_statuses": dict(Counter(a["status"] for a, _ in run.alerts)),
        "alert_latency_samples": len(lat),
        "alert_records_outside_live_windows": len(run.alerts) - len(lat),
    }  # fmt: skip
    if lat:
        p50, p99 = np.percentile(lat, [50, 99])
        out |= {"alert_latency_p50_s": round(float(p50), 3),
                "alert_latency_p99_s": round(float(p99), 3),
                "alert_latency_max_s": round(max(lat), 3)}  # fmt: skip
    return out


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Drain, then latency at half the drain rate, on one broker."""
    async with EmbeddedBroker() as broker:
        result = await measure_drain(broker, args.devices, args.windows,
                                     args.checkpoint_interval)  # fmt: skip
        if args.latency_devices:
            rate = args.load * result["e2e_wall_records_per_s"]
            result |= await measure_latency(broker, args.latency_devices, args.pools,
                                            args.history, args.live_windows, rate)  # fmt: skip
    return result


def verdicts(result: dict[str, Any]) -> dict[str, str]:
    """Met / missed against each target, with the figure."""
    out = {}
    for key, target in TARGETS.items():
        if key not in result:
            continue
        value = result[key]
        better_high = key in ("e2e_records_per_s", "catch_up_speedup")
        met = value >= target if better_high else value <= target
        ratio = value / target if better_high else target / value if value else float("inf")
        out[key] = f"{'met' if met else 'missed'} ({ratio:.2f}x the target {target:,})"
    return out


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Arguments; misuse prints one line and exits 2."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.error = lambda message: ap.exit(2, f"bench.daemon: error: {message}\n")  # type: ignore[method-assign]
    ap.add_argument("--json", type=Path)
    ap.add_argument("--devices", type=_positive, default=100_000)
    ap.add_argument("--windows", type=int, default=3, choices=range(3, 1000), metavar="3..999")
    ap.add_argument("--latency-devices", type=int, default=1000,
                    help="0 skips the latency phase")  # fmt: skip
    ap.add_argument("--pools", type=_positive, default=8)
    ap.add_argument(
        "--history",
        type=_positive,
        default=40,
        help="windows drained before the live ones (past the detectors' burn-in)",
    )
    ap.add_argument(
        "--live-windows",
        type=_positive,
        default=REGRESS_FROM + 8 * REGRESS_EVERY,
        help="windows produced live (default: every pool of 8 regresses once)",
    )
    ap.add_argument("--load", type=float, default=0.5, help="live rate / measured drain rate")
    ap.add_argument(
        "--checkpoint-interval",
        type=float,
        default=CheckpointSettings().interval_s,
        help="checkpoint.interval_s of the draining daemon (default: the daemon's)",
    )
    args = ap.parse_args(argv)
    if not 0 < args.load <= 1:
        ap.error(f"--load must be in (0, 1], got {args.load}")
    if args.latency_devices < 0:
        ap.error(f"--latency-devices must be >= 0, got {args.latency_devices}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the bench, print a table, optionally write JSON."""
    args = parse_args(argv)
    result = asyncio.run(bench(args))
    result["verdicts"] = verdicts(result)
    width = max(map(len, result))
    print(f"{'key':<{width}}  value")
    for k, v in result.items():
        if k == "verdicts":
            continue
        shown = f"{v:,}" if isinstance(v, int | float) and not isinstance(v, bool) else str(v)
        print(f"{k:<{width}}  {shown:>14}  {result['verdicts'].get(k, '')}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())

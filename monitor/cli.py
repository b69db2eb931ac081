"""The `flopwatch` command: up, run, sim, replay, record, detect, schema, config."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import logging
import math
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from monitor import __version__
from monitor.config import (
    ConfigError,
    DetectorSettings,
    Settings,
    first_error,
    load_settings,
    masked_dump,
)
from monitor.logging import configure_logging, get_logger
from monitor.sources.file import RecordingError, RecordingSource
from monitor.wire import json_schemas

PROG = "flopwatch"


class UsageError(Exception):
    """Misuse of the CLI: one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports misuse in one line (no usage block) and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _duration(text: str) -> float:
    """Seconds from '90', '90s', '20m', '2h'."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (use 90s, 20m, 2h)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"duration must be > 0, got {text!r}")
    return value


def _speed(text: str) -> float | None:
    if text.lower() in ("max", "inf"):
        return None
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid speed {text!r} (a factor, or 'max')") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"speed must be > 0, got {text!r}")
    return v


def detector_param(text: str) -> tuple[str, float]:
    """A NAME=VALUE detector parameter (the value a number)."""
    name, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not sep or not name.strip() or not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"invalid parameter {text!r} (use NAME=NUMBER)")
    return name.strip(), number


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with all subcommands."""
    common = _Parser(add_help=False)
    common.add_argument("--config", type=Path, help="TOML config file (env FLOPWATCH_* wins)")
    common.add_argument("--log-format", choices=["auto", "json", "console"], default=None)

    p = _Parser(prog=PROG, description="Streaming MFU and memory-stall regression monitor.")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    up = sub.add_parser("up", parents=[common], help="embedded demo: broker + simulator + daemon")
    up.add_argument("--scenario", default="pool_regression")
    up.add_argument("--devices", type=int, default=256)
    up.add_argument("--sim-duration", type=_duration, default=1200.0,
                    help="event time to simulate (default 20m)")  # fmt: skip
    up.add_argument("--speed", type=_speed, default=25.0, help="event-time speed-up, or 'max'")
    up.add_argument("--seed", type=int, default=7)
    up.add_argument(
        "--in-process",
        action="store_true",
        help="no broker: feed the simulator straight into the pipeline",
    )
    up.add_argument(
        "--duration",
        type=_duration,
        default=None,
        help="stop after this wall time (default: when the simulation is consumed)",
    )

    sub.add_parser("run", parents=[common], help="the daemon against the configured Kafka")

    sim = sub.add_parser("sim", parents=[common], help="simulate a fleet to a file or Kafka")
    with contextlib.suppress(ImportError):
        from sim.cli import add_arguments  # noqa: PLC0415

        add_arguments(sim)

    rp = sub.add_parser("replay", parents=[common], help="run the monitor over a recording")
    rp.add_argument("file", type=Path)
    rp.add_argument("--alerts-out", type=Path, help="write alert JSONL here instead of stdout")
    rp.add_argument("--dead-letters", type=Path, help="write rejected lines with reasons here")
    rp.add_argument("--batch-size", type=int, default=5000)

    rec = sub.add_parser("record", parents=[common], help="capture topics to a recording")
    rec.add_argument("--out", type=Path, required=True, help=".jsonl or .jsonl.gz")
    rec.add_argument("--topic", action="append", help="default: the samples and changes topics")
    rec.add_argument("--max-records", type=int, default=None)
    rec.add_argument("--idle-timeout", type=_duration, default=5.0,
                     help="stop after this long without new records")  # fmt: skip

    det = sub.add_parser("detect", parents=[common],
                         help="univariate: numbers on stdin -> change-point indices")  # fmt: skip
    det.add_argument("--kind", default=None, help="detector kind (default: configured)")
    det.add_argument("--param", type=detector_param, action="append", default=[],
                     metavar="NAME=VALUE",
                     help="detector parameter for this run, over the configured ones "
                          "(repeatable), e.g. min_rel_change=0")  # fmt: skip
    det.add_argument("--details", action="store_true",
                     help="one JSON object per change point: onset, detected (sample index), "
                          "before, after, score")  # fmt: skip

    sc = sub.add_parser("schema", parents=[common], help="print the JSON Schema of each record")
    sc.add_argument("--record", choices=["window_record", "change_event", "alert"], default=None)

    sub.add_parser("config", parents=[common], help="print the effective configuration")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config)
        if args.log_format:
            settings = settings.model_copy(update={"log_format": args.log_format})
        configure_logging(settings.log_format, settings.log_level)
        return _dispatch(args, settings)
    except (UsageError, ConfigError, RecordingError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _detect_settings(
    settings: Settings, kind: str | None, params: dict[str, float]
) -> DetectorSettings:
    """The configured detector with the command line's kind and parameters on top, checked."""
    d = settings.detector
    data = d.model_dump()
    if kind is not None and kind != d.kind:
        # The configured parameters belong to the configured kind: start from none.
        data.update(kind=kind, params={}, h=None)
    params = dict(params)
    if "h" in params:
        data["h"] = params.pop("h")  # detector.h would win over a params entry
    data["params"] = {**data["params"], **params}
    try:
        return DetectorSettings.model_validate(data)
    except ValidationError as exc:
        raise UsageError(first_error(exc, "detector")) from None


def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    cmd = args.command
    if cmd == "schema":
        schemas = json_schemas()
        out = schemas[args.record] if args.record else schemas
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    if cmd == "config":
        print(json.dumps(masked_dump(settings), indent=2, sort_keys=True))
        return 0
    if cmd == "replay":
        return asyncio.run(_replay(args, settings))
    if cmd == "detect":
        from monitor.detect.univariate import main_stdin  # noqa: PLC0415

        d = _detect_settings(settings, args.kind, dict(args.param))
        code: int = main_stdin(
            sys.stdin, sys.stdout, kind=d.kind, params=d.engine_params(), details=args.details
        )
        return code
    if cmd == "sim":
        from sim.cli import main as sim_main  # noqa: PLC0415

        sim_code: int = asyncio.run(sim_main(args))
        return sim_code
    if cmd == "record":
        return asyncio.run(_record(args, settings))
    if cmd == "run":
        if not settings.kafka.bootstrap_servers:
            raise UsageError("no Kafka configured: set FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS "
                             "(or use `flopwatch up` for the embedded demo)")  # fmt: skip
        return asyncio.run(_serve(settings))
    if cmd == "up":
        from monitor.up import up  # noqa: PLC0415

        return asyncio.run(up(args, settings))
    raise UsageError(f"unknown command {cmd!r}")


async def _replay(args: argparse.Namespace, settings: Settings) -> int:
    from monitor.app import Runner  # noqa: PLC0415
    from monitor.pipeline import DeadLetter, Pipeline  # noqa: PLC0415
    from monitor.sinks.files import JsonlSink  # noqa: PLC0415

    if not args.file.is_file():
        raise UsageError(f"recording not found: {args.file}")
    if args.batch_size < 1:
        raise UsageError("--batch-size must be >= 1")
    source = RecordingSource(args.file, settings.kafka.topics, batch_size=args.batch_size)
    pipeline = Pipeline(settings)
    sink = JsonlSink(args.alerts_out)
    dead_file = args.dead_letters.open("w") if args.dead_letters else None
    alerts: Counter[str] = Counter()

    class _Count:
        async def send(self, batch: Sequence[Any]) -> None:
            alerts.update(a.status for a in batch)

        async def close(self) -> None:
            return None

    async def dead(items: Sequence[DeadLetter]) -> None:
        if dead_file:
            for d in items:
                dead_file.write(json.dumps({"line": d.message.offset, "reason": d.reason}) + "\n")

    runner = Runner(source, pipeline, [sink, _Count()], dead_letters=dead)
    t0 = time.perf_counter()
    try:
        await runner.run()
    finally:
        await sink.close()
        if dead_file:
            dead_file.close()
    dt = time.perf_counter() - t0
    c = pipeline.counters
    used = c["records_in"]
    rejected = sum(runner.rejected.values())
    reasons = ", ".join(f"{k}: {v}" for k, v in runner.rejected.most_common(5))
    print(
        f"replayed {source.lines} lines in {dt:.2f}s "
        f"({source.lines / max(dt, 1e-9):,.0f} lines/s): "
        f"{used} window records used, {c['changes_in']} change events, "
        f"{c['records_duplicate']} duplicates dropped, {rejected} rejected"
        f"{' (' + reasons + ')' if reasons else ''}; "
        f"alerts: {alerts['firing']} firing, {alerts['resolved']} resolved",
        file=sys.stderr,
    )
    return 0


async def _record(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka import AIOKafkaConsumer  # noqa: PLC0415

    if not settings.kafka.bootstrap_servers:
        raise UsageError("no Kafka configured: set FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS")
    if args.out.suffix not in (".jsonl", ".gz"):
        raise UsageError(f"--out must end in .jsonl or .jsonl.gz, got {args.out.name}")
    topics = args.topic or [settings.kafka.topics.samples, settings.kafka.topics.changes]
    consumer = AIOKafkaConsumer(
        *topics, **settings.kafka.client_kwargs(), group_id=None,
        auto_offset_reset="earliest", enable_auto_commit=False,
    )  # fmt: skip
    await consumer.start()
    rows: list[tuple[float, int, bytes]] = []
    seq = 0
    try:
        idle_since = time.monotonic()
        while args.max_records is None or len(rows) < args.max_records:
            got = await consumer.getmany(timeout_ms=200, max_records=5000)
            if not got:
                if time.monotonic() - idle_since > args.idle_timeout:
                    break
                continue
            idle_since = time.monotonic()
            for msgs in got.values():
                for m in msgs:
                    if m.value is None:
                        continue
                    # Sort key: event time where the record has one, else broker time.
                    try:
                        ts = float(json.loads(m.value).get("ts", m.timestamp / 1000))
                    except (ValueError, AttributeError, TypeError):
                        ts = m.timestamp / 1000
                    rows.append((ts, seq, m.value))
                    seq += 1
    finally:
        await consumer.stop()
    rows.sort(key=lambda r: (r[0], r[1]))
    if args.max_records is not None:
        rows = rows[: args.max_records]
    opener = gzip.open if args.out.suffix == ".gz" else open
    with opener(args.out, "wb") as f:
        for _, _, value in rows:
            f.write(value.rstrip(b"\n") + b"\n")
    print(f"recorded {len(rows)} records from {', '.join(topics)} to {args.out}", file=sys.stderr)
    return 0


async def _finish(task: asyncio.Task[None]) -> BaseException | None:
    """Wait for a background stage; its exception, if it failed."""
    try:
        await task
    except Exception as exc:  # noqa: BLE001 - reported by the caller
        return exc
    return None


async def _serve(settings: Settings) -> int:
    """The production daemon: Kafka in, alerts to the configured sinks."""
    from aiokafka.errors import KafkaError  # noqa: PLC0415
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from monitor.app import Runner  # noqa: PLC0415
    from monitor.checkpoint import CheckpointError, open_checkpointer  # noqa: PLC0415
    from monitor.http import serve_http  # noqa: PLC0415
    from monitor.pipeline import Pipeline  # noqa: PLC0415
    from monitor.repartition import Repartitioner  # noqa: PLC0415
    from monitor.sinks.base import Sink  # noqa: PLC0415
    from monitor.sinks.files import ConsoleSink, JsonlSink  # noqa: PLC0415
    from monitor.sinks.kafka import KafkaSink  # noqa: PLC0415
    from monitor.sources.kafka import KafkaSource  # noqa: PLC0415
    from monitor.telemetry import register_metrics  # noqa: PLC0415

    log = get_logger("daemon")
    rep = Repartitioner(settings.kafka) if settings.kafka.repartition else None
    source = KafkaSource(settings.kafka)
    pipeline = Pipeline(settings)
    kafka_sink = KafkaSink(settings.kafka)
    checkpointer = None
    # aiokafka logs each failed connection itself; at startup our one line says it all.
    aiokafka_log = logging.getLogger("aiokafka")
    level = aiokafka_log.level
    aiokafka_log.setLevel(logging.CRITICAL)
    try:
        checkpointer = await open_checkpointer(source, pipeline, settings.checkpoint)
        if rep is not None:
            await rep.start()
        await source.start()
        await kafka_sink.start()
    except (CheckpointError, KafkaError) as exc:
        # One line and exit 2, not a traceback: an unreachable or misnamed cluster is a
        # setting to fix (the supervisor restarts the pod either way).
        for part in (checkpointer, rep, source, kafka_sink):
            if part is not None:
                with contextlib.suppress(Exception):
                    await part.close()
        where = settings.kafka.bootstrap_servers
        raise UsageError(f"cannot start against Kafka at {where}: {exc}") from None
    finally:
        aiokafka_log.setLevel(level)
    sinks: list[Sink] = []
    if settings.sinks.kafka:
        sinks.append(kafka_sink)
    if settings.sinks.console:
        sinks.append(ConsoleSink())
    if settings.sinks.jsonl_path:
        sinks.append(JsonlSink(settings.sinks.jsonl_path))
    if settings.sinks.alertmanager.urls:
        from monitor.sinks.alertmanager import AlertmanagerSink  # noqa: PLC0415

        am = AlertmanagerSink(settings.sinks.alertmanager)
        await am.start()
        sinks.append(am)
    runner = Runner(source, pipeline, sinks, dead_letters=kafka_sink.send_dead,
                    checkpointer=checkpointer)  # fmt: skip
    registry = register_metrics(CollectorRegistry(), runner, source, checkpointer,
                                lambda: source.ready, rep)  # fmt: skip
    # All interfaces: the kubelet's probes and Prometheus reach the pod from outside.
    http = await serve_http(settings.http_port, registry, lambda: source.ready,
                            host="0.0.0.0")  # noqa: S104  # fmt: skip
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runner.stop.set)
    log.info("started", bootstrap=settings.kafka.bootstrap_servers, group=settings.kafka.group_id,
             http_port=http.port if http else None, repartition=rep is not None)  # fmt: skip
    rep_failed: BaseException | None = None
    rep_task = asyncio.create_task(rep.run()) if rep is not None else None
    if rep_task is not None:
        # A failed copy stage would starve the detectors: stop, and let the supervisor restart.
        rep_task.add_done_callback(lambda t: runner.stop.set() if not t.cancelled() else None)
    try:
        await runner.run()
    except CheckpointError as exc:
        # The state topic is unreadable: exit so the supervisor retries, rather than run
        # without history and overwrite the good checkpoints with fresh state.
        log.exception("cannot restore checkpoints", error=str(exc))
        return 1
    finally:
        if http is not None:
            await http.close()
        if rep is not None and rep_task is not None:
            rep.stop.set()
            rep_failed = await _finish(rep_task)
            await rep.close()
            if rep_failed is not None:
                log.error("repartition stage failed", error=repr(rep_failed))
        await source.close()
        if checkpointer is not None:
            await checkpointer.close()
        for s in sinks:
            if s is not kafka_sink:
                await s.close()
        await kafka_sink.close()
        log.info("stopped", **dict(runner.pipeline.counters))
    return 1 if rep_failed is not None else 0

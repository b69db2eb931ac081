"""The `flopwatch` command: up, run, sim, replay, report, test, cut, record, ingest, detect,
schema, config."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from monitor import __version__
from monitor.config import DetectorSettings, Settings, first_error, load_settings, masked_dump
from monitor.errors import FlopwatchError, UsageError
from monitor.log import configure_logging
from monitor.units import parse_duration, parse_speed
from monitor.wire import json_schemas

PROG = "flopwatch"


class _Parser(argparse.ArgumentParser):
    """argparse that reports misuse in one line (no usage block) and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _duration(text: str) -> float:
    """argparse type: seconds from '90', '90s', '20m', '2h', '1d'."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _speed(text: str) -> float | None:
    """argparse type: an event-time speed-up factor ('10', '10x'), or None for 'max'."""
    try:
        return parse_speed(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    rp.add_argument("--batch-size", type=int, default=None,
                    help="records per batch (default: kafka.max_batch_records)")  # fmt: skip

    _add_report(sub.add_parser("report", parents=[common],
                help="a recording's incidents as one self-contained HTML page"))  # fmt: skip

    ts = sub.add_parser("test", parents=[common],
                        help="replay spec files and check what must (not) page")  # fmt: skip
    from monitor.spec.cli import add_arguments as add_test  # noqa: PLC0415

    add_test(ts)

    cut = sub.add_parser(
        "cut",
        parents=[common],
        help="a slice of a recording by time and scope, optionally anonymized",
    )
    from monitor.daemon.cut import add_arguments as add_cut  # noqa: PLC0415

    add_cut(cut)

    rec = sub.add_parser("record", parents=[common], help="capture topics to a recording")
    rec.add_argument("--out", type=Path, required=True, help=".jsonl, .jsonl.gz or .jsonl.zst")
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
    det.add_argument("--finite", action="store_true",
                     help="the series ends: read stdin to its end, then one online pass "
                          "with burn-in and threshold sized to its length (for histories "
                          "of 50-5,000 points; not the daemon's engine)")  # fmt: skip

    ing = sub.add_parser("ingest", help="real telemetry (profiler traces, DCGM) -> window records")
    from monitor.ingest.commands import add_arguments as add_ingest  # noqa: PLC0415

    add_ingest(ing, common, _duration)

    sc = sub.add_parser("schema", parents=[common], help="print the JSON Schema of each record")
    sc.add_argument("--record", choices=["window_record", "change_event", "alert"], default=None)

    sub.add_parser("config", parents=[common], help="print the effective configuration")
    return p


def _add_report(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("input", type=Path, metavar="RECORDING", help=".jsonl or .jsonl.gz")
    rp.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    rp.add_argument("--alerts", type=Path, default=None,
                    help="its alert JSONL (default: replay it to find them)")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config)
        if args.log_format:
            settings = settings.model_copy(update={"log_format": args.log_format})
        configure_logging(settings.log_format, settings.log_level)
        return _dispatch(args, settings)
    except FlopwatchError as exc:
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


def _detect(args: argparse.Namespace, settings: Settings) -> int:
    """`flopwatch detect`: stdin through the configured engine, or through finite mode."""
    from monitor.detect.univariate import main_stdin  # noqa: PLC0415

    if args.finite and (args.kind is not None or args.param):
        # Finite mode sizes itself to the series; engine settings would be ignored.
        raise UsageError("--finite takes no --kind or --param")
    d = _detect_settings(settings, args.kind, dict(args.param))
    code: int = main_stdin(
        sys.stdin, sys.stdout, kind=d.kind, params=d.engine_params(), details=args.details,
        finite=args.finite,
    )  # fmt: skip
    return code


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
    if cmd == "detect":
        return _detect(args, settings)
    if cmd == "ingest":
        from monitor.ingest.commands import run as run_ingest  # noqa: PLC0415

        return run_ingest(args, settings)
    if cmd == "sim":
        from sim.cli import main as sim_main  # noqa: PLC0415

        sim_code: int = asyncio.run(sim_main(args))
        return sim_code
    if cmd == "test":
        from monitor.spec.cli import main as test_main  # noqa: PLC0415

        return test_main(args, settings)
    if cmd == "cut":
        from monitor.daemon.cut import cut  # noqa: PLC0415

        return cut(args)
    # The daemon commands load aiokafka and the engine: only when one is asked for.
    if cmd == "run":
        from monitor.daemon.assemble import serve  # noqa: PLC0415

        return asyncio.run(serve(settings))
    return asyncio.run(_daemon_command(cmd)(args, settings))


def _daemon_command(
    cmd: str,
) -> Callable[[argparse.Namespace, Settings], Coroutine[None, None, int]]:
    """The coroutine of a daemon command that takes (args, settings)."""
    if cmd == "replay":
        from monitor.daemon.replay import replay  # noqa: PLC0415

        return replay
    if cmd == "report":
        from monitor.daemon.report import report  # noqa: PLC0415

        return report
    if cmd == "record":
        from monitor.daemon.record import record  # noqa: PLC0415

        return record
    if cmd == "up":
        from monitor.daemon.up import up  # noqa: PLC0415

        return up
    raise UsageError(f"unknown command {cmd!r}")

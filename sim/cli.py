"""`flopwatch sim`: list scenarios, write a recording with labels, or produce to Kafka."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NoReturn

from monitor.progress import Progress
from monitor.units import parse_duration, parse_speed
from sim.kafka import produce
from sim.recording import labels_path, write_recording
from sim.run import DEFAULT_START_TS, Simulation, simulate
from sim.scenarios import SCENARIOS, UnknownScenario


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's options to `parser` (the `flopwatch sim` subcommand)."""
    parser.add_argument("--list", action="store_true", help="list scenarios and exit")
    parser.add_argument("--scenario", help="scenario name (see --list)")
    parser.add_argument("--devices", type=int, help="fleet size (default: the scenario's)")
    parser.add_argument("--duration", help="event time to simulate: 90s, 20m, 2h or seconds")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    parser.add_argument("--window", default="10s", help="window length (default 10s)")
    parser.add_argument(
        "--start-ts", type=float, default=DEFAULT_START_TS, help="event time of the run's start"
    )
    parser.add_argument(
        "--faults",
        action="store_true",
        help="add duplicates, late records, host gaps and malformed lines",
    )
    parser.add_argument(
        "--wide",
        action="store_true",
        help="draw noise, traffic, headroom and pool sizes per seed (the wide pack always does)",
    )
    dest = parser.add_mutually_exclusive_group()
    dest.add_argument("--out", type=Path, help="write DIR/<scenario>.jsonl.gz and its labels")
    dest.add_argument("--kafka", metavar="BOOTSTRAP", help="produce to this Kafka bootstrap")
    parser.add_argument(
        "--gzip",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compress the recording (default on)",
    )
    parser.add_argument(
        "--zstd", action="store_true", help="compress with zstd instead: <scenario>.jsonl.zst"
    )
    parser.add_argument(
        "--speed", default="max", help="Kafka pacing: max, 1 (real time) or a factor like 60"
    )
    parser.add_argument("--samples-topic", default="flopwatch.samples")
    parser.add_argument("--changes-topic", default="flopwatch.changes")


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"flopwatch sim: error: {message}\n")
    raise SystemExit(2)


def _build(args: argparse.Namespace) -> Simulation:
    if not args.scenario:
        _fail("--scenario is required (see --list)")
    try:
        duration = parse_duration(args.duration) if args.duration else None
        window = parse_duration(args.window)
    except ValueError as exc:
        _fail(str(exc))
    if args.devices is not None and args.devices <= 0:
        _fail(f"--devices must be > 0, got {args.devices}")
    try:
        return simulate(
            args.scenario,
            devices=args.devices,
            duration_s=duration,
            seed=args.seed,
            window_s=window,
            start_ts=args.start_ts,
            faults=args.faults,
            wide=args.wide,
        )
    except UnknownScenario as exc:
        _fail(str(exc))
    except ValueError as exc:
        _fail(str(exc))


async def main(args: argparse.Namespace) -> int:
    """Run the subcommand; errors print one line and raise SystemExit(2)."""
    if args.list:
        width = max(len(n) for n in SCENARIOS)
        for name, sc in SCENARIOS.items():
            sys.stdout.write(f"{name:<{width}}  {sc.description}\n")
        return 0
    if args.out is None and args.kafka is None:
        _fail("one of --out DIR or --kafka BOOTSTRAP is required (or --list)")
    try:
        speed = parse_speed(args.speed)
    except ValueError as exc:
        _fail(str(exc))
    sim = _build(args)
    t0 = time.monotonic()
    if args.out is not None:
        suffix = ".zst" if args.zstd else ".gz" if args.gzip else ""
        path = Path(args.out) / f"{sim.scenario.name}.jsonl{suffix}"
        with Progress("sim", sim.n_windows, "records") as bar:
            n = write_recording(sim, path, bar.update)
        sys.stdout.write(
            f"wrote {n} records, {len(sim.plan.changes)} change events to {path} "
            f"(labels: {labels_path(path)}) in {time.monotonic() - t0:.1f}s\n"
        )
        return 0
    from aiokafka import AIOKafkaProducer  # noqa: PLC0415 - only the Kafka path needs it

    producer = AIOKafkaProducer(
        bootstrap_servers=args.kafka,
        linger_ms=20,
        max_batch_size=1 << 20,
        max_request_size=8 << 20,
    )
    try:
        await producer.start()
    except Exception as exc:  # noqa: BLE001 - any connect failure is a usage error here
        await producer.stop()
        _fail(f"cannot connect to Kafka at {args.kafka}: {exc}")
    try:
        with Progress("sim", sim.n_windows, "records") as bar:
            n = await produce(
                sim,
                producer,
                args.samples_topic,
                args.changes_topic,
                speed,
                bar.update,
            )
    finally:
        await producer.stop()
    sys.stdout.write(
        f"produced {n} records to {args.samples_topic} and {len(sim.plan.changes)} change "
        f"events to {args.changes_topic} in {time.monotonic() - t0:.1f}s\n"
    )
    return 0

"""`flopwatch up`: the embedded default — broker, simulator producer and daemon in one process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry

from monitor.app import Runner
from monitor.checkpoint import open_checkpointer
from monitor.cli import UsageError
from monitor.config import Settings
from monitor.embedded import BrokerError, EmbeddedBroker, ensure_topics
from monitor.http import serve_http
from monitor.pipeline import Pipeline
from monitor.sinks.files import ConsoleSink
from monitor.sinks.kafka import KafkaSink
from monitor.sources.kafka import KafkaSource
from monitor.sources.simulated import SimulatorSource
from monitor.telemetry import register_metrics

if TYPE_CHECKING:
    from sim.run import Simulation


async def up(args: argparse.Namespace, settings: Settings) -> int:
    """Run broker (unless one is configured), simulator and daemon until done or stopped."""
    from sim.kafka import produce  # noqa: PLC0415
    from sim.run import simulate  # noqa: PLC0415
    from sim.scenarios import SCENARIOS  # noqa: PLC0415

    if args.scenario not in SCENARIOS:
        raise UsageError(
            f"unknown scenario {args.scenario!r}; choose from {', '.join(sorted(SCENARIOS))}"
        )
    if args.devices < 1:
        raise UsageError(f"--devices must be >= 1, got {args.devices}")
    simulation = simulate(
        args.scenario, devices=args.devices, duration_s=args.sim_duration, seed=args.seed
    )
    if args.in_process:
        return await _in_process(args, settings, simulation)
    broker: EmbeddedBroker | None = None
    if not settings.kafka.bootstrap_servers:
        broker = EmbeddedBroker()
        try:
            await broker.start()
        except BrokerError as exc:
            print(f"flopwatch up: error: {exc}", file=sys.stderr)
            return 1
        kafka = settings.kafka.model_copy(update={"bootstrap_servers": broker.bootstrap})
        settings = settings.model_copy(update={"kafka": kafka})
    kafka = settings.kafka
    speed = "as fast as possible" if args.speed is None else f"x{args.speed:g}"
    print(
        f"flopwatch up: broker {kafka.bootstrap_servers}"
        f"{' (embedded)' if broker else ''}; scenario {args.scenario}, {args.devices} devices, "
        f"{args.sim_duration:g}s of event time at {speed}; alerts print below",
        file=sys.stderr,
    )
    try:
        await ensure_topics(kafka)
        producer = AIOKafkaProducer(**kafka.client_kwargs(), linger_ms=10)
        source = KafkaSource(kafka)
        pipeline = Pipeline(settings)
        checkpointer = await open_checkpointer(
            source, pipeline, settings.checkpoint, private_broker=broker is not None
        )
        sink = KafkaSink(kafka)
        await producer.start()
        await source.start()
        await sink.start()
        done = asyncio.Event()
        runner = Runner(
            source, pipeline, [sink, ConsoleSink()],
            dead_letters=sink.send_dead, stop_when_idle=done.is_set, checkpointer=checkpointer,
        )  # fmt: skip
        registry = register_metrics(CollectorRegistry(), runner, source, checkpointer,
                                    lambda: source.ready)  # fmt: skip
        # Loopback only: the demo runs on a workstation.
        http = await serve_http(settings.http_port, registry, lambda: source.ready, "127.0.0.1")
        if http is not None:
            print(f"flopwatch up: metrics on http://127.0.0.1:{http.port}/metrics",
                  file=sys.stderr)  # fmt: skip
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.stop.set)

        async def feed() -> None:
            sent = await produce(simulation, producer, kafka.topics.samples,
                                 kafka.topics.changes, args.speed)  # fmt: skip
            print(f"flopwatch up: simulator sent {sent} records", file=sys.stderr)
            done.set()

        t0 = time.monotonic()
        feeder = asyncio.create_task(feed())
        if args.duration:
            # A stop, not a cancellation: the runner finishes its batch and checkpoints.
            loop.call_later(args.duration, runner.stop.set)
        try:
            await runner.run()
        finally:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
            if http is not None:
                await http.close()
            await source.close()
            if checkpointer is not None:
                await checkpointer.close()
            await sink.close()
            await producer.stop()
        c = runner.pipeline.counters
        print(
            f"flopwatch up: {c['records_in']} records in {time.monotonic() - t0:.1f}s, "
            f"{c['alerts_out']} alert records, {sum(runner.rejected.values())} rejected",
            file=sys.stderr,
        )
    finally:
        if broker is not None:
            await broker.stop()
    return 0


async def _in_process(args: argparse.Namespace, settings: Settings, simulation: Simulation) -> int:
    """Simulator → pipeline → console, with no broker in between."""
    source = SimulatorSource(simulation, settings.kafka.topics, speed=args.speed)
    runner = Runner(source, Pipeline(settings), [ConsoleSink()])
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runner.stop.set)
    print(f"flopwatch up: in process, scenario {args.scenario}, {args.devices} devices",
          file=sys.stderr)  # fmt: skip
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(runner.run(), args.duration)
    c = runner.pipeline.counters
    print(f"flopwatch up: {c['records_in']} records, {c['alerts_out']} alert records",
          file=sys.stderr)  # fmt: skip
    return 0

"""`flopwatch up`: the embedded default — broker, simulator producer and daemon in one process.

The daemon is `flopwatch run`'s, built by the same `assemble` from the same settings
(`[sinks]`, `kafka.repartition`, checkpoints, HTTP); `up` adds the broker (unless one is
configured) and the simulator feeding it, and stops once the simulation is consumed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaProducer
from pydantic import SecretStr

from monitor.config import Settings
from monitor.daemon.assemble import Daemon, Wiring, assemble, run_daemon
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics
from monitor.errors import BrokerError, UsageError
from monitor.kafka_client import client_kwargs
from monitor.sinks.console import ConsoleSink
from monitor.sources.simulated import SimulatorSource

if TYPE_CHECKING:
    from sim.run import Simulation


def _say(text: str) -> None:
    print(f"flopwatch up: {text}", file=sys.stderr)


def simulation_of(args: argparse.Namespace) -> Simulation:
    """The simulation `up` feeds, from its command-line options (UsageError if invalid)."""
    from sim.run import simulate  # noqa: PLC0415 - only `up` and `sim` need the simulator
    from sim.scenarios import SCENARIOS  # noqa: PLC0415

    if args.scenario not in SCENARIOS:
        raise UsageError(
            f"unknown scenario {args.scenario!r}; choose from {', '.join(sorted(SCENARIOS))}"
        )
    if args.devices < 1:
        raise UsageError(f"--devices must be >= 1, got {args.devices}")
    return simulate(
        args.scenario, devices=args.devices, duration_s=args.sim_duration, seed=args.seed
    )


async def up(args: argparse.Namespace, settings: Settings) -> int:
    """Run broker (unless one is configured), simulator and daemon until done or stopped."""
    simulation = simulation_of(args)
    if args.in_process:
        return await _in_process(args, settings, simulation)
    async with AsyncExitStack() as stack:
        private = not settings.kafka.bootstrap_servers
        if private:
            broker = EmbeddedBroker()
            try:
                await broker.start()
            except BrokerError as exc:
                print(f"flopwatch up: error: {exc}", file=sys.stderr)
                return 1
            stack.push_async_callback(broker.stop)
            kafka = settings.kafka.model_copy(update={"bootstrap_servers": broker.bootstrap})
            settings = settings.model_copy(update={"kafka": kafka})
        if settings.checkpoint.key is None:
            # The demo signs its checkpoints too, with a key of its own for this run.
            key = SecretStr(secrets.token_hex(32))
            checkpoint = settings.checkpoint.model_copy(update={"key": key})
            settings = settings.model_copy(update={"checkpoint": checkpoint})
        kafka = settings.kafka
        speed = "as fast as possible" if args.speed is None else f"x{args.speed:g}"
        _say(f"broker {kafka.bootstrap_servers}{' (embedded)' if private else ''}; scenario "
             f"{args.scenario}, {args.devices} devices, {args.sim_duration:g}s of event time at "
             f"{speed}; alerts print below")  # fmt: skip
        await ensure_topics(kafka)
        producer = AIOKafkaProducer(**client_kwargs(kafka), linger_ms=10)
        await producer.start()
        stack.push_async_callback(producer.stop)
        done = asyncio.Event()
        # Loopback only: the demo runs on a workstation.
        wiring = Wiring(http_host="127.0.0.1", private_broker=private, stop_when_idle=done.is_set)
        daemon = await assemble(stack, settings, wiring)
        _announce_http(daemon, settings)
        if daemon.repartitioner is not None:
            _say(f"samples re-keyed by pool onto {kafka.topics.by_pool}")

        async def feed() -> None:
            from sim.kafka import produce  # noqa: PLC0415

            sent = await produce(simulation, producer, kafka.topics.samples,
                                 kafka.topics.changes, args.speed)  # fmt: skip
            _say(f"simulator sent {sent} records")
            done.set()

        t0 = time.monotonic()
        feeder = asyncio.create_task(feed())
        if args.duration:
            # A stop, not a cancellation: the runner finishes its batch and checkpoints.
            asyncio.get_running_loop().call_later(args.duration, daemon.runner.stop.set)
        try:
            code = await run_daemon(daemon, stack)
        finally:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
        c = daemon.pipeline.stats
        _say(f"{c.records_in} records in {time.monotonic() - t0:.1f}s, {c.alerts_out} "
             f"alert records, {sum(daemon.runner.rejected.values())} rejected")  # fmt: skip
    return code


def _announce_http(daemon: Daemon, settings: Settings) -> None:
    """Say where the metrics and the incident pages are; the console lines link there."""
    if daemon.http is None:
        return
    base = f"http://{settings.http_host or '127.0.0.1'}:{daemon.http.port}"
    _say(f"metrics on {base}/metrics, incidents on {base}/alerts")
    for sink in daemon.sinks:
        if isinstance(sink, ConsoleSink) and sink.link_base is None:
            sink.link_base = base


async def _in_process(args: argparse.Namespace, settings: Settings, simulation: Simulation) -> int:
    """Simulator → pipeline → the configured sinks (the console by default; Kafka's needs
    a broker), with no broker in between."""
    source = SimulatorSource(simulation, settings.kafka.topics, speed=args.speed)
    async with AsyncExitStack() as stack:
        daemon = await assemble(stack, settings, Wiring(source=source, http_host=None))
        _say(f"in process, scenario {args.scenario}, {args.devices} devices")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run_daemon(daemon, stack), args.duration)
        c = daemon.pipeline.stats
        _say(f"{c.records_in} records, {c.alerts_out} alert records")
    return 0

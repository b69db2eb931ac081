"""The ceiling on records/s per core: what reading and parsing the wire format costs alone.

    python -m bench.ceiling --json out/bench/ceiling.json [--devices 20000] [--windows 3]
        [--repeat 3]

No change to the pipeline can make a record cost less CPU than taking it off the broker
and parsing its JSON, so 1 / (consume + parse) bounds `e2e_records_per_s` from above
for this wire format and client. The records are bench.daemon's (6 layer types each,
every field set, keyed by device over 4 partitions of the bundled Tansu broker). Each
row is CPU time of this process only (`time.process_time`; the broker is another
process), over every record, the median of `--repeat` runs:

- consume: an aiokafka consumer assigned every partition reads the topic from the start
  with `getmany` (5,000 records at most, as the daemon asks) and drops what it gets;
  from `assign` to the last record, connection set-up excluded;
- parse typed: `msgspec.json.Decoder(WindowRecord)`, the project's record structs with
  their type and bound checks (msgspec does those while it parses) and nothing else;
  each batch of 5,000 is kept until the next, as the pipeline keeps it;
- parse untyped: `msgspec.json.decode` to dicts and lists, batches kept alike;
- decode: the pipeline's whole decoder (`Codec.decode_windows`: the typed parse plus the
  record and layer checks), for comparison.

`ceiling_records_per_s` = 1 / (consume + parse typed): an upper bound, since it leaves out
everything the daemon must do after the parse (stream table, detectors, commits).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.daemon import WINDOW_S, Fleet
from monitor.config import KafkaSettings, Topics
from monitor.daemon.embedded import EmbeddedBroker, ensure_topics
from monitor.wire import Codec, WindowRecord
from tests.factories import T0

BATCH = 5000
TARGET = 50_000  # issue 24's e2e_records_per_s
ROWS = ("consume", "parse_typed", "parse_untyped", "decode")


def fleet_records(devices: int, windows: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of every record of `windows` windows of a `devices`-device fleet."""
    fleet = Fleet(devices)
    return [kv for w in range(windows) for kv in fleet.window(w, T0 + WINDOW_S * (w + 1))]


def cpu_per_record(parse: Callable[[bytes], Any], values: Sequence[bytes]) -> float:
    """CPU seconds per value of `parse`, batch by batch, each batch's results kept alive
    until the next one is parsed (as the pipeline holds a batch)."""
    held: list[Any] = []
    t = time.process_time()
    for i in range(0, len(values), BATCH):
        held = [parse(v) for v in values[i : i + BATCH]]
    spent = time.process_time() - t
    del held
    return spent / len(values)


def decode_per_record(values: Sequence[bytes]) -> float:
    """CPU seconds per value of the pipeline's decoder, in batches as the pipeline calls it."""
    codec = Codec()
    held: list[Any] = []
    t = time.process_time()
    for i in range(0, len(values), BATCH):
        held = codec.decode_windows(values[i : i + BATCH])
    spent = time.process_time() - t
    del held
    return spent / len(values)


async def produce(bootstrap: str, topic: str, data: Sequence[tuple[bytes, bytes]]) -> None:
    """Every (key, value) onto `topic`, acknowledged."""
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await prod.start()
    try:
        for key, value in data:
            await prod.send(topic, key=key, value=value)
        await prod.flush()
    finally:
        await prod.stop()


async def consume_per_record(bootstrap: str, topic: str, n: int) -> float:
    """CPU seconds per record of an aiokafka consumer reading `n` records and nothing else."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")  # fmt: skip
    await consumer.start()
    try:
        await consumer.topics()  # a metadata round trip: the topic was just made
        parts = consumer.partitions_for_topic(topic) or set()
        got = 0
        t = time.process_time()
        consumer.assign([TopicPartition(topic, p) for p in sorted(parts)])
        while got < n:
            batch = await consumer.getmany(timeout_ms=500, max_records=BATCH)
            got += sum(len(msgs) for msgs in batch.values())
        return (time.process_time() - t) / got
    finally:
        await consumer.stop()


async def measure(devices: int, windows: int, repeat: int) -> dict[str, Any]:
    """The table's rows (µs per record, medians of `repeat` runs) and the ceiling."""
    data = fleet_records(devices, windows)
    values = [v for _, v in data]
    typed = msgspec.json.Decoder(WindowRecord)
    runs: dict[str, list[float]] = {k: [] for k in ROWS}
    async with EmbeddedBroker() as broker:
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap,
                              topics=Topics(samples=f"ceil-{uuid.uuid4().hex[:6]}"))  # fmt: skip
        await ensure_topics(kafka)
        await produce(broker.bootstrap, kafka.topics.samples, data)
        for _ in range(repeat):
            runs["consume"].append(
                await consume_per_record(broker.bootstrap, kafka.topics.samples, len(data))
            )
            runs["parse_typed"].append(cpu_per_record(typed.decode, values))
            runs["parse_untyped"].append(cpu_per_record(msgspec.json.decode, values))
            runs["decode"].append(decode_per_record(values))
    us = {k: round(1e6 * statistics.median(v), 2) for k, v in runs.items()}
    spread = {k: [round(1e6 * min(v), 2), round(1e6 * max(v), 2)] for k, v in runs.items()}
    ceiling = 1e6 / (us["consume"] + us["parse_typed"])
    return {
        "devices": devices,
        "records": len(data),
        "record_bytes_mean": round(sum(map(len, values)) / len(values)),
        "layers_per_record": 6,
        "repeat": repeat,
        "us_per_record": us,
        "us_per_record_range": spread,
        "ceiling_records_per_s": round(ceiling),
        "untyped_ceiling_records_per_s": round(1e6 / (us["consume"] + us["parse_untyped"])),
        "target_records_per_s": TARGET,
        "ceiling_over_target": round(ceiling / TARGET, 2),
    }


def main() -> int:
    """Run, print a table, optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--devices", type=int, default=20_000)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if min(args.devices, args.windows, args.repeat) < 1:
        ap.error("--devices, --windows and --repeat must be >= 1")
    r = asyncio.run(measure(args.devices, args.windows, args.repeat))
    print(f"{r['records']:,} records of {r['record_bytes_mean']:,} B, median of {r['repeat']}")
    print(f"{'row':<14} {'µs/record':>10} {'range':>16} {'records/s':>11}")
    for k, v in r["us_per_record"].items():
        lo, hi = r["us_per_record_range"][k]
        print(f"{k:<14} {v:>10.2f} {f'{lo:.2f}-{hi:.2f}':>16} {round(1e6 / v):>11,}")
    print(f"ceiling = 1 / (consume + parse typed): {r['ceiling_records_per_s']:,} records/s "
          f"per core, {r['ceiling_over_target']}x the target of {TARGET:,}")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`flopwatch ingest dcgm`: a saved scrape, a dmon CSV, or a live exporter as a sidecar."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import structlog

from monitor.config import KafkaSettings, Settings, catalog_from
from monitor.errors import IngestError, UsageError
from monitor.ingest import output
from monitor.ingest.dcgm import Device, Naming, parse_exposition, read_dmon, record, records_from
from monitor.ingest.rules import from_settings

log = structlog.get_logger(__name__)
MAX_BACKOFF_S = 60.0


def _naming(args: argparse.Namespace, settings: Settings) -> Naming:
    _, aliases = from_settings(settings.ingest)
    return Naming(aliases=aliases, catalog=catalog_from(settings), dtype=args.dtype.lower(),
                  pool=args.pool, pools=settings.ingest.pools, model=args.model,
                  hw=args.hw)  # fmt: skip


def run_dcgm(args: argparse.Namespace, settings: Settings) -> int:
    """`--file`, `--dmon` or `--url`; the first two write or produce once, the third loops."""
    naming = _naming(args, settings)
    if args.url:
        kafka = output.kafka_settings(settings.kafka, args.kafka)
        interval = args.interval or 10.0
        try:
            sent = asyncio.run(sidecar(args.url, interval, kafka, naming, args.host,
                                       args.pool_label, args.duration))  # fmt: skip
        except KeyboardInterrupt:
            return 130
        print(f"{sent} records -> topic {kafka.topics.samples}", file=sys.stderr)
        return 0
    if args.file:
        path: Path = args.file
        text = _read_text(path)
        devices = parse_exposition(text, args.host, args.pool_label)
        if not devices:
            raise IngestError(f"{path}: no DCGM series with a gpu label")
        records = records_from(
            devices.values(), path.stat().st_mtime, args.interval or 30.0, naming
        )
    else:
        host = args.host or args.dmon.name.removesuffix(".csv")
        rows = read_dmon(args.dmon, host, args.interval or 10.0)
        records = [record(dev, ts, w, naming) for ts, w, dev in rows]
    where = output.emit(args, settings, records)
    print(f"{len(records)} records -> {where}", file=sys.stderr)
    return 0


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise IngestError(f"{path}: {exc}") from None


def scrape(url: str, timeout_s: float) -> str:
    """One GET of the exporter's text."""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--url must be http(s)://..., got {url!r}")
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - scheme checked
        body: bytes = resp.read()
    return body.decode()


async def sidecar(
    url: str,
    interval_s: float,
    kafka: KafkaSettings,
    naming: Naming,
    host: str | None = None,
    pool_label: str | None = None,
    duration_s: float | None = None,
) -> int:
    """Scrape every `interval_s`, difference counters against the previous scrape, produce
    one record per device; exporter or broker outages are retried with backoff.

    Returns the number of records produced (when `duration_s` ends the loop).
    """
    deadline = None if duration_s is None else time.monotonic() + duration_s
    prev: dict[str, tuple[float, Device]] = {}
    producer: output.Producer | None = None
    backoff, sent = 1.0, 0
    next_tick = time.monotonic()
    try:
        while deadline is None or time.monotonic() < deadline:
            try:
                text = await asyncio.to_thread(scrape, url, min(interval_s, 10.0))
                now = time.time()
                devices = parse_exposition(text, host, pool_label)
                records = _scrape_records(devices, now, interval_s, naming, prev)
                producer = producer or await _connect(kafka)
                await producer.send(records)
            except (OSError, urllib.error.URLError, IngestError) as exc:
                log.warning("dcgm_scrape_failed", url=url, error=str(exc), retry_s=backoff)
            except Exception as exc:  # aiokafka's errors: reconnect with backoff
                if type(exc).__module__.split(".")[0] != "aiokafka":
                    raise
                log.warning("dcgm_produce_failed", error=str(exc), retry_s=backoff)
                await _drop(producer)
                producer = None
            else:
                sent += len(records)
                prev = {d.device: (now, d) for d in devices.values()}
                backoff = 1.0
                next_tick += interval_s
                await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
                continue
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
            next_tick = time.monotonic()
    finally:
        await _drop(producer)
    return sent


def _scrape_records(
    devices: dict[str, Device],
    now: float,
    interval_s: float,
    naming: Naming,
    prev: dict[str, tuple[float, Device]],
) -> list[dict[str, Any]]:
    out = []
    for dev_id in sorted(devices):
        last = prev.get(dev_id)
        window = now - last[0] if last else interval_s
        out.append(record(devices[dev_id], now, window, naming, last[1] if last else None,
                          last[0] if last else None))  # fmt: skip
    return out


async def _connect(kafka: KafkaSettings) -> output.Producer:
    producer = output.Producer(kafka)
    try:
        await producer.start()
    except BaseException:
        await _drop(producer)
        raise
    return producer


async def _drop(producer: output.Producer | None) -> None:
    if producer is not None:
        try:
            await producer.close()
        except Exception as exc:  # noqa: BLE001 - closing a broken connection may fail too
            log.debug("dcgm_producer_close_failed", error=str(exc))

"""`flopwatch ingest torch-trace | dcgm`: argument parsing and the runs behind them."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from monitor.config import Settings, catalog_from
from monitor.errors import UsageError
from monitor.ingest import output
from monitor.ingest.rules import from_settings
from monitor.ingest.torch_trace import Identity, TraceStats, ingest_traces


def add_arguments(
    parser: argparse.ArgumentParser,
    common: argparse.ArgumentParser,
    duration: Callable[[str], float],
) -> None:
    """The `ingest` subcommands on `parser` (each also takes `common`'s options)."""
    sub = parser.add_subparsers(dest="adapter", required=True, parser_class=type(parser))
    where = argparse.ArgumentParser(add_help=False)
    dest = where.add_mutually_exclusive_group()
    dest.add_argument("--out", type=Path, help=".jsonl or .jsonl.gz (default: JSONL on stdout)")
    dest.add_argument("--kafka", metavar="HOST:PORT",
                      help="produce to the samples topic instead (key = device)")  # fmt: skip
    where.add_argument("--host", help="host name for device ids (default: from the input)")
    where.add_argument("--pool", help="pool (default: ingest.pools[host], else none)")
    where.add_argument("--model", help="workload identity (default: from the input, if named)")
    where.add_argument("--hw", help="hardware catalog key (default: from the device name)")

    tt = sub.add_parser("torch-trace", parents=[common, where],
                        help="PyTorch profiler (Kineto) traces -> window records")  # fmt: skip
    tt.add_argument("traces", type=Path, nargs="+", metavar="TRACE.json[.gz]")
    tt.add_argument("--steps", type=int, default=1,
                    help="profiler steps per window (default 1; a step is never cut)")  # fmt: skip


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Dispatch `flopwatch ingest ADAPTER`."""
    if args.adapter == "torch-trace":
        return _torch_trace(args, settings)
    raise UsageError(f"unknown ingest adapter {args.adapter!r}")


def _pool(args: argparse.Namespace, settings: Settings, host: str | None) -> str | None:
    return args.pool or (settings.ingest.pools.get(host) if host else None)


def emit(args: argparse.Namespace, settings: Settings, records: Sequence[dict[str, Any]]) -> str:
    """Write or produce the records; returns where they went, for the summary line."""
    if args.kafka is not None:
        kafka = output.kafka_settings(settings.kafka, args.kafka)
        asyncio.run(output.produce(kafka, records))
        return f"topic {kafka.topics.samples} at {kafka.bootstrap_servers}"
    if args.out is not None:
        output.write_records(args.out, records)
        return str(args.out)
    for rec in records:
        sys.stdout.buffer.write(output.encode(rec) + b"\n")
    sys.stdout.flush()
    return "stdout"


def _summary(st: TraceStats) -> str:
    share_t = st.linked_time_s / st.kernel_time_s if st.kernel_time_s else 0.0
    line = (
        f"{st.path}: {st.events} events, {st.kernels} kernels, {st.linked_share:.0%} linked "
        f"to an op ({share_t:.0%} of kernel time), {st.outside_steps} outside profiler steps; "
        f"{st.windows} windows -> {st.records} records"
    )
    if st.unknown_devices:
        line += f"; no catalog entry for {', '.join(st.unknown_devices)} (no MFU; use --hw)"
    return line


def _torch_trace(args: argparse.Namespace, settings: Settings) -> int:
    if args.steps < 1:
        raise UsageError("--steps must be >= 1")
    missing = [str(p) for p in args.traces if not p.is_file()]
    if missing:
        raise UsageError(f"trace not found: {missing[0]}")
    rules, aliases = from_settings(settings.ingest)
    ident = Identity(
        host=args.host,
        pool=_pool(args, settings, args.host),
        model=args.model,
        hw=args.hw,
        steps_per_window=args.steps,
    )
    records, stats = ingest_traces(args.traces, rules, aliases, catalog_from(settings), ident)
    if ident.pool is None and settings.ingest.pools:
        for rec in records:
            pool = settings.ingest.pools.get(rec.get("host", ""))
            if pool:
                rec["pool"] = pool
    where = emit(args, settings, records)
    for st in stats:
        print(_summary(st), file=sys.stderr)
    print(f"{len(records)} records -> {where}", file=sys.stderr)
    return 0

"""`flopwatch ingest torch-trace | dcgm`: argument parsing and the runs behind them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from monitor.config import Settings, catalog_from
from monitor.errors import UsageError
from monitor.ingest import output
from monitor.ingest.rules import from_settings
from monitor.ingest.torch_trace import Identity, TraceStats, ingest_traces
from monitor.progress import Progress


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

    dc = sub.add_parser("dcgm", parents=[common, where],
                        help="dcgm-exporter (live or saved) or dmon CSV -> records")  # fmt: skip
    src = dc.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="a live exporter, e.g. http://host:9400/metrics (sidecar)")
    src.add_argument("--file", type=Path, help="saved exposition text (one scrape)")
    src.add_argument("--dmon", type=Path, help="1 Hz CSV (EntityId,GRACT,...,TimeStamp)")
    dc.add_argument("--interval", type=duration, default=None,
                    help="window length: scrape period for --url (default 10s), the exporter's "
                         "collect interval for --file (default 30s), samples per window for "
                         "--dmon (default 10s)")  # fmt: skip
    dc.add_argument(
        "--dtype",
        default="bf16",
        help="precision the tensor pipes run at, for the FLOP estimate (default bf16)",
    )
    dc.add_argument(
        "--pool-label", default=None, help="exporter label whose value is the pool (e.g. namespace)"
    )
    dc.add_argument(
        "--duration",
        type=duration,
        default=None,
        help="--url: stop after this long (default: run until stopped)",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Dispatch `flopwatch ingest ADAPTER`."""
    if args.adapter == "torch-trace":
        return _torch_trace(args, settings)
    from monitor.ingest.dcgm_cli import run_dcgm  # noqa: PLC0415 - prometheus parser on demand

    code: int = run_dcgm(args, settings)
    return code


def _pool(args: argparse.Namespace, settings: Settings, host: str | None) -> str | None:
    return args.pool or (settings.ingest.pools.get(host) if host else None)


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
    total = sum(p.stat().st_size for p in args.traces)
    with Progress("ingest", total, "records") as bar:
        records, stats = ingest_traces(args.traces, rules, aliases, catalog_from(settings), ident,
                                       bar.update)  # fmt: skip
    if ident.pool is None and settings.ingest.pools:
        for rec in records:
            pool = settings.ingest.pools.get(rec.get("host", ""))
            if pool:
                rec["pool"] = pool
    where = output.emit(args, settings, records)
    for st in stats:
        print(_summary(st), file=sys.stderr)
    print(f"{len(records)} records -> {where}", file=sys.stderr)
    return 0

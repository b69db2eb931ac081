"""`flopwatch test SPEC...`: replay each spec's input and check its expectations.

Exit 0 when every expectation is met, 1 when one is not, 2 for misuse (a spec that
does not validate, a recording that is not there): every spec is checked before
any replay starts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from monitor.config import Settings
from monitor.errors import UsageError
from monitor.spec.schema import json_schema

SPEC_GLOB = "*.flopwatch.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `flopwatch test`."""
    parser.add_argument(
        "specs",
        type=Path,
        nargs="*",
        metavar="SPEC",
        help=f"spec files, or directories of {SPEC_GLOB} files",
    )
    parser.add_argument("--junit", type=Path, metavar="PATH", help="write JUnit XML here")
    parser.add_argument("--schema", action="store_true", help="print the spec's JSON Schema")


def spec_files(paths: list[Path]) -> list[Path]:
    """The spec files named, directories expanded to their spec files (sorted)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(p.rglob(SPEC_GLOB))
            if not found:
                raise UsageError(f"{p}: no {SPEC_GLOB} files")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise UsageError(f"spec not found: {p}")
    return out


def main(args: argparse.Namespace, settings: Settings) -> int:
    """Run the specs; print a report per spec and a summary."""
    if args.schema:
        print(json.dumps(json_schema(), indent=2, sort_keys=True))
        return 0
    if not args.specs:
        raise UsageError("give one or more spec files (or --schema)")
    # The replay machinery (aiokafka, the engine) loads only when a spec is to run.
    from monitor.spec.junit import junit_xml  # noqa: PLC0415
    from monitor.spec.runner import prepare, report, run_spec  # noqa: PLC0415

    prepared = [prepare(p, settings) for p in spec_files(args.specs)]
    results = []
    for prep in prepared:
        result = run_spec(prep)
        print(report(result), flush=True)
        results.append(result)
    if args.junit is not None:
        try:
            args.junit.write_bytes(junit_xml(results))
        except OSError as exc:
            raise UsageError(f"--junit {args.junit}: {exc.strerror or exc}") from None
    failed = sum(not r.ok for r in results)
    n = len(results)
    print(f"{n} spec{'' if n == 1 else 's'}: {n - failed} passed, {failed} failed", file=sys.stderr)
    return 1 if failed else 0

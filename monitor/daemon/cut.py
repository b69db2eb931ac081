"""`flopwatch cut`: a slice of a recording (time, pools, hosts, devices), optionally with
its names replaced, so that a recording can be shared or kept as a test fixture.

Window records are kept by their window's end `ts` and their scope; a change event is
kept when it lands before `--to` and its scope matches a kept stream (an empty scope is
fleet-wide and always matches), so a rollback can still be suggested. Lines stay in
their order. `--anonymize` renames hosts, devices, pools and models with a keyed hash
(HMAC-SHA256 under `--salt`, a random one by default), the same name always to the same
new name, in records and in change scopes alike (a `model` change's `from`/`to` too),
and drops change authors and URLs. Hardware, dtype, kernels and numbers are kept: the
replay needs them, and they name no one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import hmac
import re
import secrets
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from monitor.errors import RecordingError, UsageError
from monitor.sources.recording import RECORDING_SUFFIXES, create_recording, is_change_line
from monitor.sources.recording import iter_lines as read_lines
from monitor.units import parse_duration

_dec = msgspec.json.Decoder()
_enc = msgspec.json.Encoder()
# Unix seconds from here on; below, an offset from the recording's start.
_UNIX = 1e9
_PREFIX = {"pool": "pool", "host": "host", "device": "dev", "model": "model"}
Identity = tuple[str | None, str | None, str | None, str | None]  # pool, host, device, model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `flopwatch cut`."""
    parser.add_argument("file", type=Path, help="a .jsonl, .jsonl.gz or .jsonl.zst recording")
    parser.add_argument("--out", type=Path, required=True, help="the cut recording (by suffix)")
    parser.add_argument(
        "--from",
        dest="start",
        metavar="TIME",
        help="keep windows ending at or after: an offset from the recording's "
        "start (90s, 15m), Unix seconds, or an ISO-8601 time with zone",
    )
    parser.add_argument("--to", dest="end", metavar="TIME", help="keep windows ending up to")
    parser.add_argument("--pool", action="append", help="keep these pools (repeatable)")
    parser.add_argument("--host", action="append", help="keep these hosts (repeatable)")
    parser.add_argument("--device", action="append", help="keep these devices (repeatable)")
    parser.add_argument(
        "--anonymize",
        action="store_true",
        help="rename hosts, devices, pools and models with a keyed hash",
    )
    parser.add_argument(
        "--salt",
        help="the hash key (default: random, so names cannot be "
        "guessed back; give one to rename the same way twice)",
    )


def parse_time(text: str, start: float) -> float:
    """Unix seconds of a --from/--to value (ValueError if it is none of the three forms)."""
    t = text.strip()
    if re.match(r"^\d{4}-\d\d-\d\d", t):
        when = dt.datetime.fromisoformat(t)
        if when.tzinfo is None:
            raise ValueError(f"{text!r} needs a zone (Z or +00:00)")
        return when.timestamp()
    try:
        number = float(t)
    except ValueError:
        return start + parse_duration(t.removeprefix("+"))
    return number if number >= _UNIX else start + number


class Renamer:
    """Names to keyed-hash names, one mapping per kind, consistent within a salt."""

    def __init__(self, salt: bytes) -> None:
        self.salt = salt
        self.seen: dict[str, set[str]] = {k: set() for k in _PREFIX}

    def __call__(self, kind: str, name: str) -> str:
        self.seen[kind].add(name)
        digest = hmac.new(self.salt, f"{kind}\0{name}".encode(), hashlib.sha256).hexdigest()
        return f"{_PREFIX[kind]}-{digest[:12]}"


@dataclass
class Cut:
    """What to keep; `start`/`end` are Unix seconds or None (open)."""

    start: float | None
    end: float | None
    pools: set[str] | None
    hosts: set[str] | None
    devices: set[str] | None

    def keeps_window(self, rec: dict[str, Any]) -> bool:
        """A window record in the time range and the scope."""
        ts = rec.get("ts")
        if not isinstance(ts, float | int):
            return False
        in_time = (self.start is None or ts >= self.start) and (self.end is None or ts <= self.end)
        return in_time and all(
            want is None or rec.get(key) in want
            for key, want in (("pool", self.pools), ("host", self.hosts), ("device", self.devices))
        )

    def keeps_change(self, ev: dict[str, Any], kept: set[Identity]) -> bool:
        """A change event before the end whose scope matches a kept stream."""
        ts = ev.get("ts")
        if not isinstance(ts, float | int) or (self.end is not None and ts > self.end):
            return False
        raw = ev.get("scope")
        scope: dict[str, Any] = raw if isinstance(raw, dict) else {}
        keys = [
            (i, scope[k])
            for i, k in enumerate(("pool", "host", "device", "model"))
            if scope.get(k) is not None
        ]
        return any(all(ident[i] == v for i, v in keys) for ident in kept)


def _identity(rec: dict[str, Any]) -> Identity:
    return rec.get("pool"), rec.get("host"), rec.get("device"), rec.get("model")


def _decoded(path: Path) -> Iterator[tuple[bytes, dict[str, Any] | None, bool]]:
    """(line, its object or None if unreadable, is a change event) for every line."""
    for _, line in read_lines(path):
        try:
            obj = _dec.decode(line)
        except msgspec.DecodeError:
            obj = None
        yield line, obj if isinstance(obj, dict) else None, is_change_line(line)


def _start_ts(path: Path) -> float:
    """The start of the first window record: its `ts` less its `window_s`."""
    for _, obj, change in _decoded(path):
        if obj is not None and not change:
            try:
                return float(obj["ts"]) - float(obj["window_s"])
            except (KeyError, TypeError, ValueError):
                continue
    raise RecordingError(f"{path}: no window record to place --from/--to against")


def _rename(obj: dict[str, Any], change: bool, rename: Renamer) -> dict[str, Any]:
    out = dict(obj)
    if change:
        scope = out.get("scope")
        if isinstance(scope, dict):
            out["scope"] = {
                k: rename(k, v) if k in _PREFIX and isinstance(v, str) else v
                for k, v in scope.items()
            }
        if out.get("kind") == "model":
            for k in ("from", "to"):
                if isinstance(out.get(k), str):
                    out[k] = rename("model", out[k])
        out.pop("author", None)
        out.pop("url", None)
        return out
    for k in _PREFIX:
        if isinstance(out.get(k), str):
            out[k] = rename(k, out[k])
    return out


def cut(args: argparse.Namespace) -> int:
    """Write the cut; a summary on stderr."""
    cutter, rename = _plan(args)
    kept: set[Identity] = set()
    for _, obj, change in _decoded(args.file):
        if obj is not None and not change and cutter.keeps_window(obj):
            kept.add(_identity(obj))
    counts: Counter[str] = Counter()
    with create_recording(args.out) as out:
        for line, obj, change in _decoded(args.file):
            if obj is None:
                counts["unreadable"] += 1
                continue
            keep = cutter.keeps_change(obj, kept) if change else cutter.keeps_window(obj)
            if not keep:
                continue
            counts["change events" if change else "window records"] += 1
            out.write((_enc.encode(_rename(obj, change, rename)) if rename else line) + b"\n")
    renamed = ""
    if rename is not None:
        n = ", ".join(f"{len(v)} {k}s" for k, v in rename.seen.items())
        renamed = f"; renamed {n}" + ("" if args.salt else " (random salt, not kept)")
    print(
        f"cut {args.file} to {args.out}: {counts['window records']} window records, "
        f"{counts['change events']} change events ({counts['unreadable']} unreadable lines "
        f"dropped){renamed}",
        file=sys.stderr,
    )
    return 0


def _plan(args: argparse.Namespace) -> tuple[Cut, Renamer | None]:
    """The checked arguments (UsageError: one line naming the flag)."""
    if not args.file.is_file():
        raise UsageError(f"recording not found: {args.file}")
    if not args.out.name.endswith(RECORDING_SUFFIXES):
        raise UsageError(f"--out must end in {', '.join(RECORDING_SUFFIXES)}, got {args.out.name}")
    if args.out.resolve() == args.file.resolve():
        raise UsageError("--out must not be the recording being cut")
    if args.salt is not None and not args.anonymize:
        raise UsageError("--salt needs --anonymize")
    if args.salt == "":
        raise UsageError("--salt must not be empty")
    lo, hi = _bounds(args)
    sets = [set(v) if v else None for v in (args.pool, args.host, args.device)]
    salt = args.salt.encode() if args.salt else secrets.token_bytes(32)
    return Cut(lo, hi, *sets), Renamer(salt) if args.anonymize else None


def _bounds(args: argparse.Namespace) -> tuple[float | None, float | None]:
    """--from and --to as Unix seconds (None: open), checked."""
    bounds: list[float | None] = [None, None]
    if args.start is None and args.end is None:
        return None, None
    start = _start_ts(args.file)
    for i, (flag, text) in enumerate((("--from", args.start), ("--to", args.end))):
        if text is not None:
            try:
                bounds[i] = parse_time(text, start)
            except ValueError as exc:
                raise UsageError(f"{flag}: {exc}") from None
    lo, hi = bounds
    if lo is not None and hi is not None and lo > hi:
        raise UsageError(f"--from ({args.start}) is after --to ({args.end})")
    return lo, hi

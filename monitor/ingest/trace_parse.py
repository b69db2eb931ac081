"""Read a PyTorch profiler (Kineto) Chrome trace into kernels, launches, ops and modules.

Handles the current schema (`kernel`/`cpu_op`/`cuda_runtime`, `External id`) and the
older one (`Kernel`/`Operator`/`Runtime`, `external id`), plain or gzip-compressed.
"""

from __future__ import annotations

import gzip
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from monitor.errors import IngestError

_RUNTIME = frozenset({"cuda_runtime", "cuda_driver", "runtime"})
_OPS = frozenset({"cpu_op", "operator", "user_annotation"})
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_MODULE_PREFIX = "nn.Module: "
_MODULE_INDEX = re.compile(r"_\d+$")
_HIERARCHY = re.compile(r"\(([^()]+)\)")
_BACKWARD = "autograd::engine::evaluate_function: "


def _ext(args: dict[str, Any]) -> int:
    value = args.get("External id", args.get("external id", 0))
    return value if isinstance(value, int) else 0


@dataclass(slots=True)
class Ops:
    """CPU-side ranges (operators and record_function annotations), in file order."""

    ts: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    tid: list[str] = field(default_factory=list)
    args: list[dict[str, Any]] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)  # enclosing op on the thread, or -1
    module: list[int] = field(default_factory=list)  # innermost nn.Module range, or -1
    by_ext: dict[int, int] = field(default_factory=dict)
    by_tid: dict[str, tuple[list[float], list[int]]] = field(default_factory=dict)

    def add(self, ev: dict[str, Any], tid: str) -> None:
        """Append one op event."""
        args = ev.get("args") or {}
        ts = float(ev["ts"])
        self.ts.append(ts)
        self.end.append(ts + float(ev.get("dur", 0.0)))
        self.name.append(str(ev.get("name", "")))
        self.tid.append(tid)
        self.args.append(args)
        ext = _ext(args)
        if ext:
            self.by_ext.setdefault(ext, len(self.ts) - 1)

    def enclosing(self, tid: str, t: float) -> int:
        """Innermost op on thread `tid` whose range contains `t`, or -1 (time nesting)."""
        starts, idx = self.by_tid.get(tid, ([], []))
        j = bisect_right(starts, t) - 1
        i = idx[j] if j >= 0 else -1
        while i >= 0 and self.end[i] < t:
            i = self.parent[i]
        return i


@dataclass(slots=True)
class Modules:
    """nn.Module ranges from the Python tracer: class name and enclosing module."""

    ts: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    tid: list[str] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)

    def chain(self, i: int) -> tuple[str, ...]:
        """Class names from module `i` outwards."""
        out = []
        while i >= 0:
            out.append(self.name[i])
            i = self.parent[i]
        return tuple(out)


@dataclass(slots=True)
class Trace:
    """The parts of one trace that ingest links; times in trace microseconds."""

    path: Path
    base_s: float  # add to ts/1e6 for Unix seconds
    devices: dict[int, tuple[str, int | None]]  # device id -> (name, SM/CU count)
    meta: dict[str, Any]
    k_ts: list[float] = field(default_factory=list)
    k_dur: list[float] = field(default_factory=list)
    k_name: list[str] = field(default_factory=list)
    k_device: list[int] = field(default_factory=list)
    k_corr: list[int] = field(default_factory=list)
    k_ext: list[int] = field(default_factory=list)
    k_flops: list[float] = field(default_factory=list)  # the kernel's own `flops`, or 0
    runtime: dict[int, tuple[float, str, int]] = field(default_factory=dict)  # corr -> ts,tid,ext
    ops: Ops = field(default_factory=Ops)
    modules: Modules = field(default_factory=Modules)
    steps: list[tuple[float, float, int]] = field(default_factory=list)  # CPU ranges
    gpu_steps: list[tuple[float, float, int]] = field(default_factory=list)
    events: int = 0


def _load(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise IngestError(f"{path}: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise IngestError(f"{path}: bad gzip data ({exc})") from None
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise IngestError(f"{path}: not a PyTorch profiler trace (not JSON: {exc})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise IngestError(f"{path}: not a PyTorch profiler trace (no traceEvents list)")
    return doc


def _devices(doc: dict[str, Any]) -> dict[int, tuple[str, int | None]]:
    out: dict[int, tuple[str, int | None]] = {}
    for i, p in enumerate(doc.get("deviceProperties") or []):
        if isinstance(p, dict) and p.get("name"):
            sms = p.get("numSms")
            out[int(p.get("id", i))] = (str(p["name"]), sms if isinstance(sms, int) else None)
    return out


def read_trace(path: Path) -> Trace:
    """Parse one trace file; raises IngestError when it is not a Kineto trace with kernels."""
    doc = _load(path)
    base_ns = doc.get("baseTimeNanoseconds")
    tr = Trace(
        path=path,
        base_s=float(base_ns) / 1e9 if isinstance(base_ns, int | float) else 0.0,
        devices=_devices(doc),
        meta=meta if isinstance(meta := doc.get("metadata"), dict) else {},
    )
    for ev in doc["traceEvents"]:
        if isinstance(ev, dict) and ev.get("ph") == "X" and "ts" in ev:
            tr.events += 1
            _take(tr, ev)
    if not tr.k_ts:
        raise IngestError(f"{path}: not a PyTorch profiler trace with GPU kernels (none found)")
    _nest(tr)
    tr.steps.sort()
    tr.gpu_steps.sort()
    return tr


def _take(tr: Trace, ev: dict[str, Any]) -> None:
    """File one complete event under what it is."""
    cat = str(ev.get("cat", "")).lower()
    name = str(ev.get("name", ""))
    args = ev.get("args") or {}
    tid = f"{ev.get('pid')}:{ev.get('tid')}"
    if cat == "kernel":
        tr.k_ts.append(float(ev["ts"]))
        tr.k_dur.append(float(ev.get("dur", 0.0)))
        tr.k_name.append(name)
        tr.k_device.append(int(args.get("device", 0) or 0))
        corr = args.get("correlation")
        tr.k_corr.append(corr if isinstance(corr, int) else -1)
        tr.k_ext.append(_ext(args))
        flops = args.get("flops")
        tr.k_flops.append(float(flops) if isinstance(flops, int | float) else 0.0)
    elif cat in _RUNTIME:
        corr = args.get("correlation")
        if isinstance(corr, int):
            tr.runtime[corr] = (float(ev["ts"]), tid, _ext(args))
    elif (m := _STEP.match(name)) and cat in (*_OPS, "gpu_user_annotation"):
        step = (float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0.0)), int(m.group(1)))
        (tr.gpu_steps if cat == "gpu_user_annotation" else tr.steps).append(step)
    elif cat in _OPS:
        tr.ops.add(ev, tid)
    elif cat == "python_function" and name.startswith(_MODULE_PREFIX):
        mods = tr.modules
        ts = float(ev["ts"])
        mods.ts.append(ts)
        mods.end.append(ts + float(ev.get("dur", 0.0)))
        mods.name.append(_MODULE_INDEX.sub("", name.removeprefix(_MODULE_PREFIX)))
        mods.tid.append(tid)


def _nest(tr: Trace) -> None:
    """Parent op and innermost module of every op, by time nesting per thread."""
    ops, mods = tr.ops, tr.modules
    ops.parent = [-1] * len(ops.ts)
    ops.module = [-1] * len(ops.ts)
    mods.parent = [-1] * len(mods.ts)
    # Per thread, ranges by start; at equal starts the longer (outer) first, modules first.
    items: dict[str, list[tuple[float, float, int, int]]] = {}
    for i in range(len(mods.ts)):
        items.setdefault(mods.tid[i], []).append((mods.ts[i], -mods.end[i], 0, i))
    for i in range(len(ops.ts)):
        items.setdefault(ops.tid[i], []).append((ops.ts[i], -ops.end[i], 1, i))
    for tid, rows in items.items():
        rows.sort()
        op_stack: list[int] = []
        mod_stack: list[int] = []
        for ts, _neg_end, kind, i in rows:
            while op_stack and ops.end[op_stack[-1]] <= ts:
                op_stack.pop()
            while mod_stack and mods.end[mod_stack[-1]] <= ts:
                mod_stack.pop()
            if kind == 0:
                mods.parent[i] = mod_stack[-1] if mod_stack else -1
                mod_stack.append(i)
            else:
                ops.parent[i] = op_stack[-1] if op_stack else -1
                ops.module[i] = mod_stack[-1] if mod_stack else -1
                op_stack.append(i)
        op_rows = [(ts, i) for ts, _e, kind, i in rows if kind == 1]
        ops.by_tid[tid] = ([ts for ts, _ in op_rows], [i for _, i in op_rows])


def hierarchy_chain(args: dict[str, Any]) -> tuple[str, ...] | None:
    """Class names, innermost first, from an op's `Module Hierarchy` (older traces)."""
    text = args.get("Module Hierarchy")
    if not isinstance(text, str) or not text:
        return None
    return tuple(reversed(_HIERARCHY.findall(text))) or None


def is_backward(name: str) -> bool:
    """Whether the op is an autograd node's backward evaluation."""
    return name.startswith(_BACKWARD)

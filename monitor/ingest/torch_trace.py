"""`flopwatch ingest torch-trace`: PyTorch profiler traces -> window records (contract §1).

Each kernel is linked to the operator that launched it (`correlation` -> runtime launch ->
`External id` -> op; time nesting on the launching thread where ids are missing) and to
that op's nn.Module scope; backward ops inherit their forward op's scope through the
autograd `Sequence number`. The layer type comes from the rules table (`rules.py`).
Windows follow `ProfilerStep#N`: one record per device per N steps, never part of a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from monitor.arrays import F64, I64
from monitor.hardware import Catalog
from monitor.ingest import flops as fl
from monitor.ingest.rules import (
    BATCHED_ACTIVATION_GEMM,
    COLLECTIVE,
    FUSED_ATTENTION,
    GEMM_LIKE,
    SIMT_GEMM,
    SOFTMAX,
    TF32_KERNEL,
    HwAliases,
    LayerRules,
    dtype_of,
    short_kernel_name,
)
from monitor.ingest.trace_parse import Trace, hierarchy_chain, is_backward, read_trace

SOURCE = "torch-profiler"


@dataclass(frozen=True, slots=True)
class Identity:
    """What the trace cannot tell: where it ran and what it was (flags override)."""

    host: str | None = None
    pool: str | None = None
    model: str | None = None
    hw: str | None = None
    steps_per_window: int = 1


@dataclass(slots=True)
class TraceStats:
    """What one trace yielded, for the summary line and the tests."""

    path: Path
    events: int = 0
    kernels: int = 0
    linked: int = 0
    linked_time_s: float = 0.0
    kernel_time_s: float = 0.0
    outside_steps: int = 0
    windows: int = 0
    records: int = 0
    unknown_devices: list[str] = field(default_factory=list)

    @property
    def linked_share(self) -> float:
        """Share of kernels linked to a launching op."""
        return self.linked / self.kernels if self.kernels else 0.0


@dataclass(slots=True)
class _Links:
    """Per-kernel results of linking, as columns."""

    op: I64
    layer: list[str]
    via_bmm: np.ndarray
    flops: F64
    counted: np.ndarray  # the kernel's op had its FLOPs counted
    dtype: list[str | None]
    estimated: bool


class _Linker:
    """Kernel -> op -> module scope, layer type and FLOPs; memoised per op."""

    def __init__(self, tr: Trace, rules: LayerRules) -> None:
        self.tr, self.rules = tr, rules
        ops = tr.ops
        self._own_chain: dict[int, tuple[str, ...] | None] = {}
        self._chain: dict[int, tuple[tuple[str, ...], tuple[str, ...], int, bool]] = {}
        self._scope: dict[int, str | None] = {}
        self._by_name: dict[str, tuple[str | None, str | None]] = {}
        # Forward ops by autograd sequence number, so backward ops find their module scope.
        self._fwd_by_seq: dict[int, int] = {}
        for i, args in enumerate(ops.args):
            seq = args.get("Sequence number")
            if isinstance(seq, int) and not is_backward(ops.name[i]):
                self._fwd_by_seq.setdefault(seq, i)

    def launch_op(self, k: int) -> int:
        """The op that launched kernel `k`, or -1."""
        tr = self.tr
        rt = tr.runtime.get(tr.k_corr[k])
        ext = tr.k_ext[k] or (rt[2] if rt else 0)
        op = tr.ops.by_ext.get(ext, -1) if ext else -1
        if op < 0 and rt is not None:
            op = tr.ops.enclosing(rt[1], rt[0])
        return op

    def _own_modules(self, i: int) -> tuple[str, ...] | None:
        if i in self._own_chain:
            return self._own_chain[i]
        ops = self.tr.ops
        chain: tuple[str, ...] | None = None
        if ops.module[i] >= 0:
            chain = self.tr.modules.chain(ops.module[i])
        else:
            chain = hierarchy_chain(ops.args[i])
            seq = ops.args[i].get("Sequence number")
            if chain is None and is_backward(ops.name[i]) and isinstance(seq, int):
                fwd = self._fwd_by_seq.get(seq, -1)
                chain = self._own_modules(fwd) if fwd >= 0 else None
        self._own_chain[i] = chain
        return chain

    def chain(self, op: int) -> tuple[tuple[str, ...], tuple[str, ...], int, bool]:
        """(module names, op names, op whose FLOPs count, GEMM of two activations) of `op`."""
        got = self._chain.get(op)
        if got is not None:
            return got
        ops = self.tr.ops
        names: list[str] = []
        modules: tuple[str, ...] | None = None
        flop_op, via_bmm, i = -1, False, op
        while i >= 0:
            name = ops.name[i]
            names.append(name)
            if modules is None:
                modules = self._own_modules(i)
            if flop_op < 0 and (fl.has_formula(name) or "flops" in ops.args[i]):
                flop_op = i
                via_bmm = bool(BATCHED_ACTIVATION_GEMM.search(name))
            i = ops.parent[i]
        got = (modules or (), tuple(names), flop_op, via_bmm)
        self._chain[op] = got
        return got

    def layer(self, op: int, kernel: str) -> str:
        """Layer type of a kernel launched by `op` (-1: unlinked, kernel-name rules only).

        In the table's order (`LayerRules`), memoised per kernel name and per op: a trace
        has thousands of kernels but far fewer distinct names and launching ops.
        """
        named = self._by_name.get(kernel)
        if named is None:
            named = (self.rules.by_kernel_first(kernel), self.rules.by_kernel(kernel))
            self._by_name[kernel] = named
        if named[0]:
            return named[0]
        scope: str | None = None
        if op >= 0:
            if op not in self._scope:
                modules, names, _, _ = self.chain(op)
                self._scope[op] = self.rules.by_scope(modules, names)
            scope = self._scope[op]
        return scope or named[1] or "other"


def _link(tr: Trace, rules: LayerRules) -> _Links:
    """Link every kernel; FLOPs of each counted op land on its first kernel."""
    linker = _Linker(tr, rules)
    n = len(tr.k_ts)
    op_of = np.full(n, -1, dtype=np.int64)
    layers: list[str] = []
    via_bmm = np.zeros(n, dtype=bool)
    kflops = np.zeros(n)
    dtypes: list[str | None] = [None] * n
    first_kernel: dict[int, int] = {}
    flop_op_of = np.full(n, -1, dtype=np.int64)
    tf32_ops: set[int] = set()
    estimated = False
    for k in range(n):
        op = linker.launch_op(k)
        op_of[k] = op
        layers.append(linker.layer(op, tr.k_name[k]))
        if op < 0:
            continue
        _, _, flop_op, bmm = linker.chain(op)
        via_bmm[k] = bmm
        if flop_op < 0:
            continue
        flop_op_of[k] = flop_op
        if TF32_KERNEL.search(tr.k_name[k]):
            tf32_ops.add(flop_op)
        if flop_op not in first_kernel:
            first_kernel[flop_op] = k
    known: set[int] = set()
    for flop_op, k in first_kernel.items():
        value, est = fl.op_flops(tr.ops.name[flop_op], tr.ops.args[flop_op])
        if value is None:
            continue
        known.add(flop_op)
        estimated |= est
        kflops[k] = value
        dtypes[k] = _op_dtype(tr.ops.args[flop_op], flop_op in tf32_ops)
    counted = np.isin(flop_op_of, np.array(sorted(known), dtype=np.int64))
    own = (np.asarray(tr.k_flops) > 0) & (flop_op_of < 0)
    kflops[own] = np.asarray(tr.k_flops)[own]  # the kernel's own count, when no op had one
    counted |= own
    return _Links(op_of, layers, via_bmm, kflops, counted, dtypes, estimated)


def _op_dtype(args: dict[str, Any], tf32: bool) -> str | None:
    """Precision of an op's FLOPs: its first tensor input's type; fp32 on TF32 kernels is tf32."""
    types = args.get("Input type") or []
    dtype = next((d for d in map(dtype_of, types) if d is not None), None)
    if tf32 and dtype in (None, "fp32"):
        return "tf32"
    return dtype


def _union_s(start: F64, end: F64) -> float:
    """Length of the union of [start, end) intervals, in the input's units."""
    if start.size == 0:
        return 0.0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    seg_end = np.maximum.reduceat(e, idx)
    # A segment's end is the furthest any of its intervals reaches.
    return float(np.sum(seg_end - s[idx]))


def _step_of(tr: Trace, ranges: list[tuple[float, float, int]], t: F64) -> I64:
    """Index into `tr.steps` of the step range (CPU or GPU side) containing each time."""
    if not ranges:
        return np.full(t.size, -1, dtype=np.int64)
    order = {n: i for i, (_, _, n) in enumerate(tr.steps)}
    starts = np.array([s for s, _, _ in ranges])
    ends = np.array([e for _, e, _ in ranges])
    index = np.array([order.get(n, -1) for _, _, n in ranges])
    j = np.searchsorted(starts, t, side="right") - 1
    jj = np.clip(j, 0, None)
    return np.where((j >= 0) & (t < ends[jj]), index[jj], -1)


def _windows(tr: Trace, launch_ts: F64, launched: np.ndarray, k_start: F64, per: int) -> I64:
    """Window index of each kernel (-1: outside every step).

    A kernel belongs to the step that launched it. One with no launch record was queued
    before the profiler started (an earlier step draining into this one's CPU range), so
    it counts only where it ran inside a GPU-side step range, or a CPU one if the trace
    marks none.
    """
    if not tr.steps:
        return np.zeros(k_start.size, dtype=np.int64)
    step = _step_of(tr, tr.steps, launch_ts)
    orphan = _step_of(tr, tr.gpu_steps or tr.steps, k_start)
    step = np.where(launched, step, orphan)
    return np.where(step >= 0, step // per, -1)


def ingest_trace(
    path: Path, rules: LayerRules, aliases: HwAliases, catalog: Catalog, ident: Identity
) -> tuple[list[dict[str, Any]], TraceStats]:
    """Window records of one trace file, in time order, and what it yielded."""
    tr = read_trace(path)
    links = _link(tr, rules)
    kinds = _Kinds.of(tr.k_name)
    k_start = np.asarray(tr.k_ts)
    k_end = k_start + np.asarray(tr.k_dur)
    launch = np.array(
        [
            tr.runtime[c][0] if c in tr.runtime else t
            for c, t in zip(tr.k_corr, tr.k_ts, strict=True)
        ]
    )
    launched = np.array([c in tr.runtime for c in tr.k_corr], dtype=bool)
    win = _windows(tr, launch, launched, k_start, ident.steps_per_window)
    stats = TraceStats(path, events=tr.events, kernels=len(tr.k_ts))
    linked = links.op >= 0
    stats.linked = int(linked.sum())
    stats.kernel_time_s = float((k_end - k_start).sum()) / 1e6
    stats.linked_time_s = float((k_end - k_start)[linked].sum()) / 1e6
    stats.outside_steps = int((win < 0).sum())
    host = ident.host or _default_host(path)
    model = ident.model or _model_of(tr)
    n_win = int(win.max()) + 1 if win.size and win.max() >= 0 else 0
    ends = _window_ends(tr, win, k_start, k_end, n_win, ident.steps_per_window)
    records: list[dict[str, Any]] = []
    dev = np.asarray(tr.k_device)
    for w in range(n_win):
        for d in sorted(set(dev[win == w].tolist())):
            sel = np.flatnonzero((win == w) & (dev == d))
            name, sms = _device(tr, d)
            hw = ident.hw or aliases.resolve(name, sms)
            if hw is None:
                stats.unknown_devices.append(name or f"device {d}")
            rec = _record(links, kinds, sel, k_start, k_end, hw, catalog)
            start = ends[w - 1] if w else ends[-1]
            rec.update(
                ts=tr.base_s + ends[w] / 1e6,
                window_s=(ends[w] - start) / 1e6,
                device=f"{host}/gpu{d}",
                host=host,
            )
            if ident.pool:
                rec["pool"] = ident.pool
            if model:
                rec["model"] = model
            records.append({k: rec[k] for k in _ORDER if k in rec})
    stats.windows = n_win
    stats.records = len(records)
    stats.unknown_devices = sorted(set(stats.unknown_devices))
    return records, stats


_ORDER = ("v", "ts", "window_s", "device", "host", "pool", "model", "hw", "dtype",
          "source", "flops_estimated", "layers")  # fmt: skip


def _window_ends(
    tr: Trace, win: I64, k_start: F64, k_end: F64, n_win: int, per: int
) -> list[float]:
    """End of each window (its last step's CPU end or last kernel end, whichever is later),
    then the first window's start as the last element (so `ends[-1]` opens window 0)."""
    ends: list[float] = []
    for w in range(n_win):
        sel = win == w
        k_last = float(k_end[sel].max()) if sel.any() else 0.0
        steps = tr.steps[w * per : (w + 1) * per]
        ends.append(max(k_last, max((e for _, e, _ in steps), default=0.0)))
    first = win == 0
    k_first = float(k_start[first].min()) if first.any() else 0.0
    start0 = min(k_first, tr.steps[0][0]) if tr.steps else k_first
    return [*ends, start0]


@dataclass(slots=True)
class _Kinds:
    """Per kernel: what its name says (computed once per distinct name)."""

    gemm: np.ndarray
    simt: np.ndarray
    fused: np.ndarray
    softmax: np.ndarray
    comm: np.ndarray
    short: list[str]  # per distinct name
    name_id: I64

    @classmethod
    def of(cls, names: Sequence[str]) -> _Kinds:
        """Classify every distinct kernel name once."""
        uniq, inv = np.unique(np.asarray(names, dtype=object), return_inverse=True)

        def flag(pattern: Any) -> np.ndarray:
            return np.array([bool(pattern.search(n)) for n in uniq], dtype=bool)[inv]

        return cls(
            gemm=flag(GEMM_LIKE), simt=flag(SIMT_GEMM), fused=flag(FUSED_ATTENTION),
            softmax=flag(SOFTMAX), comm=flag(COLLECTIVE),
            short=[short_kernel_name(n) for n in uniq], name_id=inv.reshape(-1),
        )  # fmt: skip


def _record(
    links: _Links,
    kinds: _Kinds,
    sel: I64,
    k_start: F64,
    k_end: F64,
    hw: str | None,
    catalog: Catalog,
) -> dict[str, Any]:
    """One device-window's record body: the layers, and the precision MFU is judged at."""
    layers: list[dict[str, Any]] = []
    types = np.asarray([links.layer[k] for k in sel], dtype=object)
    dur = k_end[sel] - k_start[sel]
    comm = kinds.comm[sel]
    flops_by_dtype: dict[str, float] = {}
    for k in sel[links.flops[sel] > 0]:
        dt = links.dtype[k]
        if dt:
            flops_by_dtype[dt] = flops_by_dtype.get(dt, 0.0) + float(links.flops[k])
    for layer in sorted(set(types.tolist())):
        m = types == layer
        ks = sel[m]
        body: dict[str, Any] = {"type": layer}
        flops = float(links.flops[ks].sum())
        if flops > 0 and _covered(kinds, links, ks):
            body["flops"] = flops
        body["busy_s"] = _union_s(k_start[ks], k_end[ks]) / 1e6
        if layer == "allreduce" and comm[m].any():
            # Collective time no compute kernel overlapped: what the device spent waiting.
            exposed = _union_s(k_start[sel], k_end[sel]) - _union_s(
                k_start[sel[~comm]], k_end[sel[~comm]]
            )
            body["sync_wait_s"] = max(exposed, 0.0) / 1e6
        body["kernel"] = _dominant(kinds, ks, dur[m])
        frac = _fallback(layer, kinds, ks, links.via_bmm[ks], dur[m])
        if frac is not None:
            body["fallback_frac"] = frac
        layers.append(body)
    rec: dict[str, Any] = {"v": 1, "source": SOURCE, "layers": layers}
    if hw:
        rec["hw"] = hw
    dtype = _record_dtype(flops_by_dtype, hw, catalog)
    if dtype:
        rec["dtype"] = dtype
    if any("flops" in la for la in layers):
        rec["flops_estimated"] = links.estimated
    return rec


def _record_dtype(flops_by_dtype: dict[str, float], hw: str | None, catalog: Catalog) -> str | None:
    """The fastest precision that carried FLOPs in the window.

    A record has one precision; judging every layer at the fastest one the window used
    makes MFU a lower bound whatever the mix (fp32 peaks on TF32 GEMMs would exceed 1).
    """
    if not flops_by_dtype:
        return None
    spec = catalog.get(hw)
    if spec is not None:
        known = {d: spec.peak(d) for d in flops_by_dtype if spec.peak(d)}
        if known:
            return max(known, key=lambda d: known[d] or 0.0)
    return max(flops_by_dtype, key=lambda d: flops_by_dtype[d])


def _covered(kinds: _Kinds, links: _Links, ks: I64) -> bool:
    """Whether every GEMM/convolution/attention kernel of a layer belongs to a counted op.

    FLOPs known for part of a layer's compute would make its MFU an arbitrary fraction
    of the truth (compiled regions and ops recorded without shapes have no count): then
    the layer's FLOPs are not measured.
    """
    core = kinds.gemm[ks] | kinds.fused[ks]
    return bool(links.counted[ks][core].all())


def _dominant(kinds: _Kinds, ks: I64, dur: F64) -> str:
    """The kernel (short name) with the most time."""
    totals: dict[str, float] = {}
    for nid, d in zip(kinds.name_id[ks].tolist(), dur.tolist(), strict=True):
        short = kinds.short[nid]
        totals[short] = totals.get(short, 0.0) + d
    return max(totals, key=lambda n: totals[n])


def _fallback(layer: str, kinds: _Kinds, ks: I64, via_bmm: np.ndarray, dur: F64) -> float | None:
    """Share of the layer's compute-kernel time (GEMM, convolution, attention core) spent
    on fallback kernels: GEMMs off the tensor cores, and in attention the unfused core
    (separate softmax and activation-by-activation GEMMs) instead of a fused kernel."""
    gemm, simt = kinds.gemm[ks], kinds.simt[ks]
    if layer == "attention":
        soft = kinds.softmax[ks]
        core = gemm | kinds.fused[ks] | soft
        fallback = simt | soft | (gemm & via_bmm)
    else:
        core, fallback = gemm, simt
    total = float(dur[core].sum())
    if total <= 0:
        return None
    return float(dur[core & fallback].sum()) / total


def _device(tr: Trace, d: int) -> tuple[str | None, int | None]:
    """Name and SM count of device `d`; where the ids do not match (a container that sees
    physical GPU 2 as device 0) but every listed device is the same model, that model."""
    if d in tr.devices:
        return tr.devices[d]
    models = set(tr.devices.values())
    return next(iter(models)) if len(models) == 1 else (None, None)


def _default_host(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return name or "trace"


def _model_of(tr: Trace) -> str | None:
    exp = tr.meta.get("experiment")
    repo = exp.get("repo_id") if isinstance(exp, dict) else None
    return str(repo) if repo else None


def ingest_traces(
    paths: Sequence[Path],
    rules: LayerRules,
    aliases: HwAliases,
    catalog: Catalog,
    ident: Identity,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[dict[str, Any]], list[TraceStats]]:
    """Records of every trace, merged in (ts, device) order; `progress` is called after
    each trace with (bytes of the traces read, records so far)."""
    records: list[dict[str, Any]] = []
    stats: list[TraceStats] = []
    read = 0
    for path in paths:
        recs, st = ingest_trace(path, rules, aliases, catalog, ident)
        records.extend(recs)
        stats.append(st)
        read += path.stat().st_size
        if progress is not None:
            progress(read, len(records))
    records.sort(key=lambda r: (r["ts"], r["device"]))
    return records, stats

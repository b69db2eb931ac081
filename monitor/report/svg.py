"""Inline SVG plots for the incident pages: the timeline and the headline stream (pure)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from monitor.report.series import Series
from monitor.wire import Alert, ChangeEvent

WIDTH = 720  # viewBox units; the SVG scales to the page width
_FRACTIONS = frozenset(
    {
        "mfu",
        "stall_frac",
        "device_mfu",
        "quality",
        "error_rate",
        "occupancy",
        "sram_hit",
        "fallback_frac",
        "sync_frac",
        "spill_frac",
    }
)
SEVERITY_COLOUR = {"page": "#c62828", "ticket": "#ef6c00", "info": "#546e7a"}
ONSET, DETECTED, RESOLVED = "#ef6c00", "#c62828", "#2e7d32"


def fmt_value(metric: str, v: float) -> str:
    """A metric's value as people read it: shares in percent, the rest with units."""
    if not math.isfinite(v):
        return "n/a"
    if metric in _FRACTIONS:
        return f"{100 * v:.2f}%" if metric in ("quality", "error_rate") else f"{100 * v:.1f}%"
    if metric.endswith("_ms"):
        return f"{v:.1f} ms"
    return f"{v:.3g}"


def clock(ts: float) -> str:
    """UTC wall-clock time of an event time, to the second."""
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def stamp(ts: float) -> str:
    """UTC date and time of an event time."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


@dataclass(frozen=True, slots=True)
class _Axes:
    """Maps data (time, value) into the plot's viewBox."""

    t0: float
    t1: float
    v0: float
    v1: float
    left: float
    right: float
    top: float
    bottom: float

    def x(self, t: float) -> float:
        span = self.t1 - self.t0 or 1.0
        return round(self.left + (t - self.t0) / span * (self.right - self.left), 1)

    def y(self, v: float) -> float:
        span = self.v1 - self.v0 or 1.0
        return round(self.bottom - (v - self.v0) / span * (self.bottom - self.top), 1)


def _svg(height: int, body: list[str], label: str) -> str:
    return (
        f'<svg class="plot" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="{escape(label)}">' + "".join(body) + "</svg>"
    )


def _text(x: float, y: float, text: str, cls: str = "", anchor: str = "start") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<text x="{x}" y="{y}" text-anchor="{anchor}"{c}>{escape(text)}</text>'


def _vline(
    ax: _Axes, t: float, colour: str, label: str, dash: str = "", line: int = 0
) -> list[str]:
    x = ax.x(t)
    d = f' stroke-dasharray="{dash}"' if dash else ""
    anchor = "end" if x > (ax.left + ax.right) / 2 else "start"
    dx = -3 if anchor == "end" else 3
    return [
        f'<line x1="{x}" x2="{x}" y1="{ax.top}" y2="{ax.bottom}" stroke="{colour}" '
        f'stroke-width="1.5"{d}/>',
        f'<text x="{x + dx}" y="{ax.top + 11 + 13 * line}" text-anchor="{anchor}" fill="{colour}" '
        f'class="mark">{escape(label)}</text>',
    ]


def _time_ticks(ax: _Axes, n: int = 5) -> list[str]:
    out = [f'<line x1="{ax.left}" x2="{ax.right}" y1="{ax.bottom}" y2="{ax.bottom}" class="axis"/>']
    for i in range(n + 1):
        t = ax.t0 + (ax.t1 - ax.t0) * i / n
        anchor = "start" if i == 0 else "end" if i == n else "middle"
        out.append(_text(ax.x(t), ax.bottom + 14, clock(t), "tick", anchor))
    return out


def _polylines(ax: _Axes, ts: Sequence[float], vs: Sequence[float], cls: str) -> list[str]:
    """One polyline per run of finite values (a gap in the data is a gap in the line)."""
    out, run = [], []
    for t, v in zip(ts, vs, strict=True):
        if math.isfinite(v):
            run.append(f"{ax.x(t)},{ax.y(v)}")
            continue
        if run:
            out.append(run)
        run = []
    if run:
        out.append(run)
    return [
        f'<polyline class="{cls}" points="{" ".join(r)}"/>'
        if len(r) > 1
        else f'<circle class="{cls}" cx="{r[0].split(",")[0]}" cy="{r[0].split(",")[1]}" r="2"/>'
        for r in out
    ]


def baseline_band(series: Series | None, onset_ts: float) -> tuple[float, float] | None:
    """The 10th-90th percentile of the level before the onset: the watched devices' median
    where at least three windows precede it, else the pool's level; None without either."""
    if series is None:
        return None
    for ts, vs in ((series.ts, series.mid), (series.pool_ts, series.pool)):
        before = sorted(
            v for t, v in zip(ts, vs, strict=True) if t <= onset_ts and math.isfinite(v)
        )
        if len(before) >= 3:
            k = len(before) - 1
            return before[round(0.1 * k)], before[round(0.9 * k)]
    return None


def headline_plot(alert: Alert, series: Series | None, resolved_ts: float | None) -> str:
    """The headline stream before and after, with the baseline band, onset and detection."""
    s = series
    band = baseline_band(s, alert.onset_ts)
    times = [alert.onset_ts, alert.detected_ts, alert.ts]
    values = [alert.before, alert.after, *(band or ())]
    if s is not None:
        times += s.ts + s.pool_ts
        values += s.lo + s.hi + s.mid + s.pool
    if resolved_ts is not None:
        times.append(resolved_ts)
    finite = [v for v in values if math.isfinite(v)] or [0.0, 1.0]
    t0, t1 = min(times), max(times)
    window = max((alert.detected_ts - alert.onset_ts) / 4, 10.0)
    v0, v1 = min(finite), max(finite)
    pad = (v1 - v0) * 0.12 or abs(v1) * 0.1 or 1.0
    ax = _Axes(t0 - window, t1 + window, v0 - pad, v1 + pad, 62, WIDTH - 96, 18, 232)
    body = [
        f'<rect x="{ax.left}" y="{ax.top}" width="{ax.right - ax.left}" '
        f'height="{ax.bottom - ax.top}" class="frame"/>'
    ]
    if band is not None:
        y_hi, y_lo = ax.y(band[1]), ax.y(band[0])
        body.append(
            f'<rect class="band" x="{ax.left}" y="{y_hi}" width="{ax.right - ax.left}" '
            f'height="{max(y_lo - y_hi, 1.0)}"><title>baseline band (p10-p90 before the '
            "onset)</title></rect>"
        )
    for i in range(5):
        v = ax.v0 + (ax.v1 - ax.v0) * i / 4
        body.append(_text(ax.left - 4, ax.y(v) + 4, fmt_value(alert.metric, v), "tick", "end"))
    if s is not None and s.ts:
        pts = [f"{ax.x(t)},{ax.y(v)}" for t, v in zip(s.ts, s.hi, strict=True)]
        pts += [f"{ax.x(t)},{ax.y(v)}" for t, v in zip(s.ts[::-1], s.lo[::-1], strict=True)]
        body.append(f'<polygon class="spread" points="{" ".join(pts)}"/>')
    if s is not None:
        body += _polylines(ax, s.pool_ts, s.pool, "pool")
        body += _polylines(ax, s.ts, s.mid, "mid")
    for level, name in ((alert.before, "before"), (alert.after, "after")):
        if math.isfinite(level):
            y = ax.y(level)
            body.append(f'<line class="level" x1="{ax.left}" x2="{ax.right}" y1="{y}" y2="{y}"/>')
            body.append(
                _text(ax.right + 4, y + 4, f"{name} {fmt_value(alert.metric, level)}", "tick")
            )
    body += _vline(ax, alert.onset_ts, ONSET, f"onset {clock(alert.onset_ts)}", "4 3")
    # Each mark's label on its own line: onset and detection are often a few windows apart.
    body += _vline(ax, alert.detected_ts, DETECTED, f"detected {clock(alert.detected_ts)}", "", 1)
    if resolved_ts is not None:
        body += _vline(ax, resolved_ts, RESOLVED, f"resolved {clock(resolved_ts)}", "2 2", 2)
    body += _time_ticks(ax)
    return _svg(250, body, f"{alert.metric} before and after the onset")


def timeline(
    incidents: Sequence[tuple[Alert, float | None]],
    changes: Sequence[ChangeEvent],
    span: tuple[float, float],
) -> str:
    """Incidents as bars from onset to resolution (or the end), change events as ticks."""
    row, top = 24, 34
    height = top + row * max(len(incidents), 1) + 24
    ax = _Axes(span[0], span[1], 0, 1, 12, WIDTH - 12, top - 6, height - 22)
    body: list[str] = []
    for i, ch in enumerate(changes):
        x = ax.x(ch.ts)
        anchor = "end" if x > WIDTH / 2 else "start"
        body.append(
            f'<line class="change" x1="{x}" x2="{x}" y1="{top - 6}" y2="{ax.bottom}">'
            f"<title>{escape(_change_text(ch))}</title></line>"
        )
        body.append(
            _text(
                x + (-3 if anchor == "end" else 3),
                11 + 12 * (i % 2),
                f"{ch.id} {ch.kind}",
                "change-label",
                anchor,
            )
        )
    for i, (a, resolved) in enumerate(incidents):
        y = top + i * row
        x0, x1 = ax.x(a.onset_ts), ax.x(resolved if resolved is not None else span[1])
        colour = SEVERITY_COLOUR.get(a.severity, "#546e7a")
        body.append(
            f'<a href="#{escape(a.id)}"><rect x="{x0}" y="{y + 8}" '
            f'width="{max(x1 - x0, 2.0)}" height="10" fill="{colour}" rx="2">'
            f"<title>{escape(a.summary)}</title></rect></a>"
        )
        body.append(f'<circle cx="{ax.x(a.detected_ts)}" cy="{y + 13}" r="3.5" class="detect"/>')
        anchor = "end" if x0 > WIDTH * 0.6 else "start"
        body.append(
            _text(
                x0 + (-3 if anchor == "end" else 0),
                y + 5,
                f"{a.id} {a.summary}"[:90],
                "bar-label",
                anchor,
            )
        )
    body += _time_ticks(ax)
    return _svg(height, body, f"timeline of {len(incidents)} incidents and {len(changes)} changes")


def _fit(text: str, width: float, char_w: float = 7.0) -> str:
    """`text` cut to about `width` viewBox units at the plots' 11 px font."""
    n = max(int(width / char_w), 8)
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def _change_text(ch: ChangeEvent) -> str:
    scope = ", ".join(
        f"{k}={v}"
        for k, v in (
            ("pool", ch.scope.pool),
            ("host", ch.scope.host),
            ("device", ch.scope.device),
            ("model", ch.scope.model),
        )
        if v
    )
    return f"{ch.id} {ch.kind} {ch.from_}->{ch.to} at {stamp(ch.ts)} ({scope or 'everywhere'})"

"""Incident pages as one self-contained HTML document (pure: strings in, a string out).

The same view serves `flopwatch report` (every incident of a recording, one file) and the
daemon's live pages (`/alerts`, `/alerts/<id>`). Nothing is fetched: styles are inline,
plots are inline SVG, and there is no script. The layout is one column that wraps to the
page width, and prints (`@media print`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape

from monitor.core.coverage import where
from monitor.report.series import Series
from monitor.report.svg import (
    SEVERITY_COLOUR,
    fmt_value,
    headline_plot,
    stamp,
    timeline,
)
from monitor.wire import STAGES, Alert, ChangeEvent

_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2327;
 margin:0 auto;padding:16px;max-width:1000px;overflow-wrap:anywhere}
h1{font-size:20px;margin:4px 0 8px}h2{font-size:17px;margin:0 0 6px}
h3{font-size:14px;margin:14px 0 4px;color:#37474f}
.meta{color:#546e7a;font-size:12px}
section.incident{border:1px solid #cfd8dc;border-radius:6px;padding:12px 14px;margin:16px 0}
.badge{display:inline-block;border-radius:3px;padding:0 6px;color:#fff;font-size:12px;
 font-weight:600;vertical-align:middle}
.firing{background:#c62828}.resolved{background:#2e7d32}
svg.plot{width:100%;height:auto;display:block;font-size:11px}
svg .frame{fill:#fafafa;stroke:#cfd8dc}svg .band{fill:#c8e6c9;opacity:.7}
svg .spread{fill:#ffcdd2;opacity:.6}svg .mid{fill:none;stroke:#c62828;stroke-width:2}
svg .pool{fill:none;stroke:#78909c;stroke-width:1.5}svg .level{stroke:#455a64;
 stroke-dasharray:6 4}svg .axis{stroke:#90a4ae}svg .tick{fill:#546e7a}
svg .change{stroke:#6a1b9a;stroke-dasharray:3 3}svg .change-label{fill:#6a1b9a}
svg .detect{fill:#fff;stroke:#1d2327;stroke-width:1.5}svg .bar-label{fill:#1d2327}
svg .mark{font-weight:600}
.legend span{margin-right:14px;white-space:nowrap}
.sw{display:inline-block;width:18px;height:8px;margin-right:4px;vertical-align:middle}
table{border-collapse:collapse;width:100%;font-size:13px}
td,th{border-bottom:1px solid #eceff1;padding:3px 6px;text-align:left;vertical-align:top}
tr.first td{background:#fff3e0}tr.quiet td{color:#90a4ae}
.strip{display:flex;flex-wrap:wrap;gap:2px 10px}
.host{display:flex;align-items:center;gap:2px;font-size:12px}
.host b{font-weight:500;margin-right:3px}
.dev{display:inline-block;width:11px;height:11px;border-radius:2px;background:#cfd8dc}
.dev.hit{background:#c62828}
.suggest{background:#f1f8e9;border-left:4px solid #7cb342;padding:6px 10px}
nav a{margin-right:10px}
@media print{body{max-width:none;padding:0;font-size:11px}nav{display:none}
 section.incident{break-inside:avoid-page;border:none;padding:0}
 .badge{color:#000;border:1px solid #000}}
"""


@dataclass(frozen=True, slots=True)
class IncidentView:
    """What one incident's section shows."""

    alert: Alert  # its newest record
    first_ts: float  # event time of its first record
    resolved_ts: float | None
    records: int  # alert records sent for it
    series: Series | None = None
    # Every known device of each listed host (the blast-radius strip); empty: listed only.
    hosts: dict[str, list[str]] = field(default_factory=dict)


def incident_views(alerts: Iterable[Alert]) -> list[IncidentView]:
    """One view per alert id, in order of first appearance, from its records in order
    (no series or hosts yet: `dataclasses.replace` adds them)."""
    seen: dict[str, IncidentView] = {}
    for a in alerts:
        v = seen.get(a.id)
        if v is None:
            resolved = a.ts if a.status == "resolved" else None
            seen[a.id] = IncidentView(a, a.ts, resolved, 1)
            continue
        resolved = a.ts if a.status == "resolved" else None
        seen[a.id] = IncidentView(a, v.first_ts, resolved, v.records + 1)
    return list(seen.values())


def _page(title: str, body: str, refresh_s: int | None = None) -> str:
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        # An empty inline icon: a browser would otherwise fetch /favicon.ico.
        '<link rel="icon" href="data:,">'
        f"{refresh}<title>{escape(title)}</title><style>{_CSS}</style></head>"
        f"<body>{body}</body></html>"
    )


def _badge(a: Alert) -> str:
    colour = SEVERITY_COLOUR.get(a.severity, "#546e7a")
    return (
        f'<span class="badge {a.status}">{a.status}</span> '
        f'<span class="badge" style="background:{colour}">{escape(a.severity)}</span>'
    )


def _legend(v: IncidentView) -> str:
    s = v.series
    parts = [
        '<span><i class="sw" style="background:#c8e6c9"></i>baseline band (p10-p90 before '
        "the onset)</span>",
    ]
    if s is not None and s.ts:
        parts.append(
            f'<span><i class="sw" style="background:#c62828;height:2px"></i>median of '
            f"{s.devices} listed devices</span>"
        )
        parts.append('<span><i class="sw" style="background:#ffcdd2"></i>their p10-p90</span>')
    if s is not None and s.pool:
        parts.append(
            '<span><i class="sw" style="background:#78909c;height:2px"></i>pool aggregate</span>'
        )
    parts.append(
        '<span><i class="sw" style="background:#455a64;height:1px"></i>before / after levels</span>'
    )
    return f'<p class="legend meta">{"".join(parts)}</p>'


def _evidence(a: Alert) -> str:
    rows = []
    blind = {i.stage: i for i in a.not_judged}
    for stage in STAGES:
        found = [e for e in a.evidence if e.stage == stage]
        first = stage == a.first_failing_stage
        mark = " <b>&larr; first failing</b>" if first else ""
        nj = blind.get(stage)
        # A stage its devices could not show failing: say so, and which fields were missing.
        unseen = (
            f"not judged{where(nj, a.scope.device_count)}: no {escape(', '.join(nj.missing))}"
            if nj
            else ""
        )
        if not found:
            partly = nj is None or where(nj, a.scope.device_count)
            text = unseen if not partly else "; ".join(t for t in ("no change found", unseen) if t)
            rows.append(
                f'<tr class="{"first" if first else "quiet"}"><td>{stage}{mark}</td>'
                f'<td colspan="4">{text}</td></tr>'
            )
            continue
        if unseen:
            rows.append(f'<tr class="quiet"><td></td><td colspan="4">{unseen}</td></tr>')
        for i, e in enumerate(sorted(found, key=lambda e: e.onset_ts)):
            name = escape(e.indicator + (f" @ {e.layer}" if e.layer else ""))
            delta = (e.after - e.before) / abs(e.before) * 100 if e.before else math.nan
            rows.append(
                f'<tr class="{"first" if first else ""}"><td>{stage + mark if i == 0 else ""}</td>'
                f"<td>{name}</td><td>{fmt_value(e.indicator, e.before)} &rarr; "
                f"{fmt_value(e.indicator, e.after)}"
                f"{f' ({delta:+.1f}%)' if math.isfinite(delta) else ''}</td>"
                f"<td>{e.onset_ts - a.onset_ts:+.0f} s</td><td>{e.score:.3g}</td></tr>"
            )
    return (
        "<table><thead><tr><th>stage (flow order)</th><th>indicator</th><th>before "
        "&rarr; after</th><th>onset vs incident</th><th>score</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _blast_radius(v: IncidentView) -> str:
    sc = v.alert.scope
    hit = set(sc.devices)
    hosts = sorted(set(sc.hosts) | set(v.hosts))
    by_host: dict[str, list[str]] = {h: list(v.hosts.get(h, ())) for h in hosts}
    loose: list[str] = []
    for d in sc.devices:
        host = next((h for h in hosts if d in by_host[h] or d.startswith(h + "/")), None)
        if host is None:
            loose.append(d)
        elif d not in by_host[host]:
            by_host[host].append(d)
    cells = []
    for h in hosts:
        devs = "".join(
            f'<i class="dev{" hit" if d in hit else ""}" title="{escape(d)}"></i>'
            for d in sorted(by_host[h])
        )
        cells.append(f'<span class="host"><b>{escape(h)}</b>{devs}</span>')
    if loose:
        cells.append(
            '<span class="host"><b>(no host)</b>'
            + "".join(f'<i class="dev hit" title="{escape(d)}"></i>' for d in loose)
            + "</span>"
        )
    note = (
        f"{sc.device_count} devices at {sc.level} level"
        f"{f', pool {escape(sc.pool)}' if sc.pool else ''}"
        f"{f', model {escape(sc.model)}' if sc.model else ''}; {len(sc.devices)} listed, "
        f"{len(sc.hosts)} hosts listed (red: listed as regressed; grey: the host's other "
        "devices, or regressed ones beyond the list)"
    )
    return f'<p class="meta">{note}</p><div class="strip">{"".join(cells)}</div>'


def _suggestion(a: Alert) -> str:
    s = a.suggestion
    head = escape(s.action)
    if s.change_id:
        head += escape(f" {s.change_id} ({s.kind} {s.from_} -> {s.to})")
    scope = ""
    if s.scope is not None:
        parts = [
            f"{k}={v}"
            for k, v in (
                ("pool", s.scope.pool),
                ("host", s.scope.host),
                ("device", s.scope.device),
                ("model", s.scope.model),
            )
            if v
        ]
        scope = f" on {escape(', '.join(parts))}" if parts else ""
    return (
        f'<div class="suggest"><b>next: {head}</b>{scope} '
        f'<span class="meta">(confidence {s.confidence:.0%})</span><br>'
        f"guardrail: {escape(s.guardrail)}<br>"
        f'runbook: <a href="{escape(a.runbook)}">{escape(a.runbook)}</a></div>'
    )


def incident_section(v: IncidentView) -> str:
    """One incident: headline, plot, evidence in flow order, blast radius, next step."""
    a = v.alert
    when = (
        f"onset {stamp(a.onset_ts)}, detected {a.detected_ts - a.onset_ts:+.0f} s later, "
        f"first record {stamp(v.first_ts)}, last {stamp(a.ts)} ({v.records} records)"
    )
    if v.resolved_ts is not None:
        when += f", resolved {stamp(v.resolved_ts)}"
    layer = f" @ {', '.join(a.layers)}" if a.layers else ""
    return (
        f'<section class="incident" id="{escape(a.id)}">'
        f"<h2>{_badge(a)} {escape(a.id)}: {escape(a.summary)}</h2>"
        f'<p class="meta">{when}</p>'
        f"<h3>{escape(a.metric)}{escape(layer)}: {fmt_value(a.metric, a.before)} &rarr; "
        f"{fmt_value(a.metric, a.after)} ({a.delta_pct:+.1f}%)</h3>"
        f"{headline_plot(a, v.series, v.resolved_ts)}{_legend(v)}"
        f"<h3>Evidence by stage (first failing: {escape(a.first_failing_stage)}, bottleneck "
        f"{escape(a.bottleneck)})</h3>{_evidence(a)}"
        f"<h3>Blast radius</h3>{_blast_radius(v)}"
        f"<h3>Suggestion</h3>{_suggestion(a)}</section>"
    )


def _span(views: Sequence[IncidentView], changes: Sequence[ChangeEvent]) -> tuple[float, float]:
    times = [t for v in views for t in (v.alert.onset_ts, v.alert.ts)]
    times += [c.ts for c in changes]
    for v in views:
        if v.series is not None:
            times += v.series.ts[:1] + v.series.ts[-1:] + v.series.pool_ts[:1]
            times += v.series.pool_ts[-1:]
    if not times:
        return 0.0, 1.0
    return min(times), max(times)


def _timeline(
    views: Sequence[IncidentView], changes: Sequence[ChangeEvent], span: tuple[float, float] | None
) -> str:
    lo, hi = span or _span(views, changes)
    shown = [c for c in changes if lo <= c.ts <= hi]
    plot = timeline([(v.alert, v.resolved_ts) for v in views], shown, (lo, hi))
    rows = "".join(
        f"<tr><td>{stamp(c.ts)}</td><td>{escape(c.id)}</td><td>{escape(c.kind)}</td>"
        f"<td>{escape(str(c.from_))} &rarr; {escape(str(c.to))}</td>"
        f"<td>{escape(_scope_text(c))}</td></tr>"
        for c in shown
    )
    table = (
        (
            "<table><thead><tr><th>change at</th><th>id</th><th>kind</th><th>from &rarr; to"
            f"</th><th>scope</th></tr></thead><tbody>{rows}</tbody></table>"
        )
        if rows
        else ""
    )
    return f"{plot}{table}"


def _scope_text(c: ChangeEvent) -> str:
    s = c.scope
    parts = [
        f"{k}={v}"
        for k, v in (("pool", s.pool), ("host", s.host), ("device", s.device), ("model", s.model))
        if v
    ]
    return ", ".join(parts) or "everywhere"


def report_html(
    views: Sequence[IncidentView],
    changes: Sequence[ChangeEvent],
    title: str,
    span: tuple[float, float] | None = None,
) -> str:
    """The whole report: a timeline of every incident and change, then one section each."""
    pages = sum(v.alert.severity == "page" for v in views)
    head = (
        f'<h1>{escape(title)}</h1><p class="meta">{len(views)} incidents ({pages} paged), '
        f"{len(changes)} change events</p>"
    )
    toc = "".join(f'<a href="#{escape(v.alert.id)}">{escape(v.alert.id)}</a>' for v in views)
    body = f"{head}<nav>{toc}</nav><h2>Timeline</h2>{_timeline(views, changes, span)}" + "".join(
        incident_section(v) for v in views
    )
    if not views:
        body += "<p>No incident in this recording.</p>"
    return _page(title, body)


def incident_html(v: IncidentView, changes: Sequence[ChangeEvent], refresh_s: int | None) -> str:
    """One incident's live page (`/alerts/<id>`), with a timeline of its changes."""
    nav = '<nav><a href="/alerts">all incidents</a></nav>'
    body = f"{nav}{_timeline([v], changes, None)}{incident_section(v)}"
    return _page(f"{v.alert.id}: {v.alert.summary}", body, refresh_s)


def index_html(views: Sequence[IncidentView], refresh_s: int | None) -> str:
    """The live list (`/alerts`): open incidents first, then recent ones."""
    order = sorted(views, key=lambda v: (v.alert.status != "firing", -v.alert.ts))
    rows = "".join(
        f'<tr><td><a href="/alerts/{escape(v.alert.id)}">{escape(v.alert.id)}</a></td>'
        f"<td>{_badge(v.alert)}</td><td>{escape(v.alert.summary)}</td>"
        f"<td>{stamp(v.alert.onset_ts)}</td><td>{stamp(v.alert.ts)}</td></tr>"
        for v in order
    )
    firing = sum(v.alert.status == "firing" for v in views)
    body = (
        f'<h1>flopwatch incidents</h1><p class="meta">{firing} open, '
        f"{len(views) - firing} recently resolved</p>"
        "<table><thead><tr><th>id</th><th>status</th><th>summary</th><th>onset</th>"
        f"<th>last record</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    if not views:
        body += "<p>No incident has paged since this daemon started.</p>"
    return _page("flopwatch incidents", body, refresh_s)

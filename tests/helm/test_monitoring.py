"""The chart's self-monitoring: the PrometheusRule and the Grafana dashboard.

The rules go through `promtool check rules` and `promtool test rules` (Debian's
`prometheus` package, installed by .ci/run); the dashboard's queries through promtool's
parser too, and both may only name metrics that monitor/daemon/prometheus.py exports.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from prometheus_client import ProcessCollector

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "flopwatch"
DASHBOARD = CHART / "dashboards" / "flopwatch.json"
RELEASE, NAMESPACE = "fw", "monitoring"
JOB = f"{RELEASE}-flopwatch"  # the Service name: the job label a ServiceMonitor gives
ON = {
    "prometheusRule": {"enabled": True, "alertLabels": {"team": "ml-infra"}, "lagRecords": 1000,
                       "runbookBaseUrl": "https://git.example/fw/blob/main/docs/operations.md/"},
    "grafanaDashboard": {"enabled": True},
    "sinks": {"retryBudgetSeconds": 120},
}  # fmt: skip
# Every alert the rule defines; a new one needs a line in the promtool test below.
ALERTS = {
    "FlopwatchConsumerLagGrowing", "FlopwatchRepartitionLagGrowing", "FlopwatchDeadLetters",
    "FlopwatchSinkFailing", "FlopwatchCheckpointStale", "FlopwatchNoRecords",
    "FlopwatchStreamsAtCap", "FlopwatchInternalErrors", "FlopwatchNotReady",
}  # fmt: skip
METRIC = re.compile(r"\b(?:flopwatch|process)_[a-z0-9_]+\b")


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as c:
        yield c


def render(chart: helm.Chart, values: dict[str, Any] | None) -> list[dict[str, Any]]:
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [d for path, text in sorted(out.items()) if not path.endswith(".txt")
            for d in yaml.safe_load_all(text) if d]  # fmt: skip


@pytest.fixture(scope="module")
def rule(chart: helm.Chart) -> dict[str, Any]:
    (doc,) = (d for d in render(chart, ON) if d["kind"] == "PrometheusRule")
    return doc


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


def exported_metrics() -> set[str]:
    """Names /metrics can carry: every string constant in prometheus.py that is a whole
    flopwatch_* name, and the standard process collector's samples."""
    tree = ast.parse((ROOT / "monitor" / "daemon" / "prometheus.py").read_text())
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str)]  # fmt: skip
    ours = {s for s in strings if re.fullmatch(r"flopwatch_[a-z0-9_]+", s)}
    process = {s.name for m in ProcessCollector(registry=None).collect() for s in m.samples}
    assert len(ours) > 40
    assert "process_cpu_seconds_total" in process
    return ours | process


def dashboard_exprs(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def as_promql(expr: str) -> str:
    """A dashboard query with Grafana's variables replaced by values PromQL accepts."""
    for var, value in (("$__rate_interval", "5m"), ("$namespace", NAMESPACE), ("$job", JOB),
                       ("$pool", ".*"), ("$layer", ".*")):  # fmt: skip
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def test_off_by_default(chart: helm.Chart) -> None:
    """Neither the rule (a CRD) nor the dashboard ConfigMap renders unless asked for."""
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render(chart, None)}
    assert not any(k == "PrometheusRule" for k, _ in kinds)
    assert ("ConfigMap", f"{JOB}-dashboard") not in kinds


def test_rule_names_this_release_and_its_budget(rule: dict[str, Any]) -> None:
    """Every alert selects this release's series; the sink alert fires at the retry budget
    the Deployment gives the daemon; labels and runbook links are added to each."""
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    for r in rules:
        assert f'job="{JOB}", namespace="{NAMESPACE}"' in r["expr"], r["alert"]
        assert r["labels"]["severity"] in {"warning", "critical"}
        assert r["labels"]["team"] == "ml-infra"
        url = r["annotations"]["runbook_url"]
        assert url.startswith("https://git.example/fw/blob/main/docs/operations.md#")
        heading = url.partition("#")[2]
        assert heading in anchors(ROOT / "docs" / "operations.md"), url
    (sink,) = (r for r in rules if r["alert"] == "FlopwatchSinkFailing")
    assert sink["expr"].strip().endswith("> 120")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return out


def test_rules_pass_promtool_check(rule: dict[str, Any], tmp_path: Path) -> None:
    """Prometheus's own parser and rule checks accept the rendered groups."""
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    """An input series of this release for `promtool test rules`."""
    every = {"job": JOB, "namespace": NAMESPACE, "pod": "fw-0", **labels}
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(every.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def fires(rule: dict[str, Any], alert: str, at: str, labels: dict[str, str] | None = None,
          filled: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """An alert_rule_test: `alert` fires at `at` with these labels and its annotations, their
    templates `filled` as given; labels None: it does not fire."""
    if labels is None:
        return {"eval_time": at, "alertname": alert, "exp_alerts": []}
    every = {"job": JOB, "namespace": NAMESPACE, "team": "ml-infra", **labels}
    notes = annotations_of(rule, alert, filled or {})
    return {"eval_time": at, "alertname": alert,
            "exp_alerts": [{"exp_labels": every, "exp_annotations": notes}]}  # fmt: skip


def run_rule_tests(rule: dict[str, Any], tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    (tmp_path / "test.yml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}))  # fmt: skip
    done = subprocess.run([promtool(), "test", "rules", str(tmp_path / "test.yml")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def annotations_of(rule: dict[str, Any], alert: str, filled: dict[str, str]) -> dict[str, str]:
    """The alert's annotations with each `{{ template }}` in `filled` replaced by its value."""
    (r,) = (r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == alert)
    out = {}
    for key, text in r["annotations"].items():
        done = text
        for template, value in filled.items():
            done = done.replace("{{ " + template + " }}", value)
        out[key] = done
    return out


def test_sink_and_record_alerts_fire_when_they_should(rule: dict[str, Any], tmp_path: Path
                                                      ) -> None:  # fmt: skip
    """A sink failing past its 120 s budget pages, not before; records that stop for 10
    minutes page, 10 minutes after the last one; a replica reading records does not."""
    sink = [series("flopwatch_sink_failing_seconds", "0+60x10", sink="pagerduty")]
    stops = [series("flopwatch_records_total", "0+600x10 6000x20", outcome="accepted")]
    busy = [series("flopwatch_records_total", "100+600x30", outcome="accepted")]
    page = {"severity": "critical"}
    run_rule_tests(rule, tmp_path, [
        {"interval": "1m", "input_series": sink, "alert_rule_test": [
            fires(rule, "FlopwatchSinkFailing", "2m"),
            fires(rule, "FlopwatchSinkFailing", "3m", {**page, "pod": "fw-0", "sink": "pagerduty"},
                  {"$labels.sink": "pagerduty", "$labels.pod": "fw-0",
                   "$value | humanizeDuration": "3m 0s"})]},
        {"interval": "1m", "input_series": stops, "alert_rule_test": [
            fires(rule, "FlopwatchNoRecords", "19m"),
            fires(rule, "FlopwatchNoRecords", "20m", page)]},
        {"interval": "1m", "input_series": busy, "alert_rule_test": [
            fires(rule, "FlopwatchNoRecords", "25m")]},
    ])  # fmt: skip


def test_capacity_lag_and_dead_letter_alerts(rule: dict[str, Any], tmp_path: Path) -> None:
    """Streams near their cap (a per-partition gauge against a per-kind limit), lag that
    grows past the threshold (but not lag that is high and flat), and 2% dead letters."""
    at_cap = [series("flopwatch_partition_streams", "9700x30", partition="3", kind="layer"),
              series("flopwatch_partition_streams", "100x30", partition="2", kind="layer"),
              series("flopwatch_streams_limit", "10000x30", kind="layer")]  # fmt: skip
    growing = [series("flopwatch_consumer_lag_records", "0+200x40", topic="s", partition="0")]
    flat = [series("flopwatch_consumer_lag_records", "5000x40", topic="s", partition="0")]
    dead = [series("flopwatch_records_total", "0+1000x40", outcome="accepted"),
            series("flopwatch_dead_letters_total", "0+20x40", reason="ts")]  # fmt: skip
    warn = {"severity": "warning"}
    run_rule_tests(rule, tmp_path, [
        {"interval": "1m", "input_series": at_cap, "alert_rule_test": [
            fires(rule, "FlopwatchStreamsAtCap", "14m"),
            fires(rule, "FlopwatchStreamsAtCap", "16m",
                  {**warn, "pod": "fw-0", "partition": "3", "kind": "layer"},
                  {"$labels.partition": "3", "$labels.kind": "layer",
                   "$value | humanizePercentage": "97%"})]},
        # Above 1,000 from minute 6, growing, for 15 minutes: firing from minute 21.
        {"interval": "1m", "input_series": growing, "alert_rule_test": [
            fires(rule, "FlopwatchConsumerLagGrowing", "20m"),
            fires(rule, "FlopwatchConsumerLagGrowing", "25m", {**warn, "topic": "s"},
                  {"$labels.topic": "s", "$value | humanize": "5k"})]},
        {"interval": "1m", "input_series": flat, "alert_rule_test": [
            fires(rule, "FlopwatchConsumerLagGrowing", "30m")]},
        {"interval": "1m", "input_series": dead, "alert_rule_test": [
            fires(rule, "FlopwatchDeadLetters", "24m", warn,
                  {"$value | humanizePercentage": "2%"})]},
    ])  # fmt: skip


def test_rules_and_dashboard_name_only_exported_metrics(rule: dict[str, Any]) -> None:
    """A rule or panel that names a metric prometheus.py does not export (a typo, a rename)
    would show nothing and never fire: fail here instead."""
    exported = exported_metrics()
    dash = json.loads(DASHBOARD.read_text())
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    exprs += dashboard_exprs(dash)
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used - exported == set()
    assert {"flopwatch_pool_mfu_ratio", "flopwatch_pool_stall_ratio", "flopwatch_alerts_firing",
            "flopwatch_consumer_lag_records", "flopwatch_sink_failing_seconds"} <= used  # fmt: skip
    assert METRIC.findall("rate(flopwatch_recrods_total[5m])")[0] not in exported


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Every panel query, variables filled in, is PromQL that Prometheus parses."""
    exprs = dashboard_exprs(json.loads(DASHBOARD.read_text()))
    rules = [{"record": f"dashboard:query{i}", "expr": as_promql(e)} for i, e in enumerate(exprs)]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


PANEL_TYPES = {"row", "timeseries", "stat"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def test_dashboard_follows_grafanas_json_model() -> None:
    """The keys Grafana's dashboard model requires; panels on the 24-column grid without
    overlaps, with unique ids and refIds; every query on the templated Prometheus data
    source; every variable used is defined."""
    dash = json.loads(DASHBOARD.read_text())
    for key in ("uid", "title", "schemaVersion", "panels", "templating", "time", "version"):
        assert key in dash, key
    assert isinstance(dash["schemaVersion"], int)
    assert dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        assert p["type"] in PANEL_TYPES, p["type"]
        g = p["gridPos"]
        assert g["x"] >= 0, p["title"]
        assert g["w"] >= 1, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]
        assert g["h"] >= 1, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == DATASOURCE
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE
            used = set(re.findall(r"\$(\w+)", t["expr"])) - {"__rate_interval"}
            assert used <= variables.keys(), used - variables.keys()
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == DATASOURCE
            assert set(re.findall(r"\$(\w+)", v["definition"])) <= variables.keys()


def test_dashboard_configmap_carries_the_file(chart: helm.Chart) -> None:
    """The ConfigMap holds the dashboard byte for byte, with the sidecar's label."""
    on = {"enabled": True, "namespace": "grafana", "annotations": {"grafana_folder": "ML"}}
    docs = render(chart, {"grafanaDashboard": on})
    (cm,) = (d for d in docs if d["kind"] == "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "ML"}
    assert json.loads(cm["data"]["flopwatch.json"]) == json.loads(DASHBOARD.read_text())

"""The Helm chart: lint, render, validate against Kubernetes schemas, agree with the code.

Rendering uses Helm's own Go SDK (helm-python-sdk, no helm binary); kubernetes-validate
checks each manifest against the API schemas of the oldest Kubernetes the chart allows
and of the newest it knows. The consistency checks feed the Deployment's FLOPWATCH_*
variables to `monitor.config.load_settings`, so a misspelt variable or a value the
daemon rejects fails here rather than in a CrashLoopBackOff.
"""

from __future__ import annotations

import base64
import os
import re
import tomllib
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from kubernetes_validate import utils as kv
from pydantic import BaseModel

from monitor.cli import build_parser
from monitor.config import DetectorSettings, KafkaSettings, Settings, Topics, load_settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "flopwatch"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DOCKERFILE = (ROOT / "Dockerfile").read_text()
RELEASE = "fw"
NAMESPACE = "monitoring"
PREFIX = "FLOPWATCH_"
# kubernetes-validate ships no schemas for custom resources: these are checked by hand below.
CRD_KINDS = {"ServiceMonitor", "ScaledObject", "TriggerAuthentication", "PrometheusRule"}
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.25.0", kv.latest_version())

# Everything on: several replicas, SASL over TLS with secrets, a config file, KEDA, a
# ServiceMonitor, a PrometheusRule, the Grafana dashboard, Alertmanager, PagerDuty, a signed
# webhook, detector overrides and an extra variable.
ALL_ON: dict[str, Any] = {
    "replicaCount": 3,
    "kafka": {
        "bootstrapServers": "b-1.kafka.example:9096,b-2.kafka.example:9096",
        "groupId": "flopwatch-prod",
        "topics": {"samples": "fleet.samples", "changes": "fleet.changes",
                   "alerts": "fleet.alerts", "dlq": "fleet.dlq", "state": "fleet.state"},
        "autoOffsetReset": "latest",
        "securityProtocol": "SASL_SSL",
        "sasl": {"mechanism": "SCRAM-SHA-512", "username": "flopwatch",
                 "existingSecret": "fw-kafka-sasl", "passwordKey": "kafka-password"},
        "tls": {"existingSecret": "fw-kafka-tls", "caKey": "ca.crt", "certKey": "tls.crt",
                "keyKey": "tls.key", "keyPasswordKey": "tls-key-password"},
    },
    "checkpoint": {"existingSecret": "fw-checkpoint", "keyKey": "hmac"},
    "alertmanager": {
        "urls": ["http://alertmanager-0.am:9093", "http://alertmanager-1.am:9093"],
        "externalUrl": "https://grafana.example/d/flopwatch",
    },
    "pagerduty": {"existingSecret": "fw-pagerduty", "externalUrl": "https://fw.example",
                  "runbookBaseUrl": "https://git.example/flopwatch/"},
    "webhook": {"url": "https://hooks.example/flopwatch", "existingSecret": "fw-webhook",
                "keyKey": "hmac", "previousKeyKey": "hmac-old"},
    "sinks": {"kafka": True, "console": False, "retryBudgetSeconds": 120},
    "detector": {"kind": "cusum", "h": 12.5},
    "log": {"format": "json", "level": "debug"},
    "configFile": {
        "enabled": True,
        "content": (
            '[alerts]\ngroup_window_s = 120.0\nmin_devices = 5\n\n[kafka]\ngroup_id = "from-file"\n'
        ),
    },
    "extraEnv": [{"name": "FLOPWATCH_ALERTS__PAGE_LOSS", "value": "0.2"}],
    "serviceMonitor": {
        "enabled": True,
        "additionalLabels": {"release": "kube-prometheus-stack"},
        "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"],
                         "targetLabel": "node"}],
        "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "go_.*",
                               "action": "drop"}],
    },
    "keda": {"enabled": True, "minReplicaCount": 2, "maxReplicaCount": 12},
    "prometheusRule": {
        "enabled": True,
        "additionalLabels": {"release": "kube-prometheus-stack"},
        "alertLabels": {"team": "ml-infra"},
        "runbookBaseUrl": "https://git.example/flopwatch/blob/main/docs/operations.md",
        "lagRecords": 1000,
    },
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "ML"}},
    "podAnnotations": {"example.com/team": "ml-infra"},
}  # fmt: skip
VALUE_SETS = {"default": None, "all_on": ALL_ON}

Manifest = dict[str, Any]


# -- rendering -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as c:
        yield c


def render(chart: helm.Chart, values: dict[str, Any] | None) -> list[Manifest]:
    """Every object the chart renders with these values (NOTES.txt left out)."""
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[Manifest] = []
    for path, text in sorted(out.items()):
        if path.endswith(".txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


@pytest.fixture(scope="module")
def rendered(chart: helm.Chart) -> dict[str, list[Manifest]]:
    return {key: render(chart, values) for key, values in VALUE_SETS.items()}


def one(docs: list[Manifest], kind: str) -> Manifest:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_spec(docs: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def daemon(docs: list[Manifest]) -> dict[str, Any]:
    (container,) = pod_spec(docs)["containers"]
    return dict(container)


# -- env -> Settings -------------------------------------------------------------------------


def settings_path(env_name: str) -> tuple[str, ...]:
    """The Settings field path a FLOPWATCH_* variable sets; KeyError if it sets none.

    pydantic-settings ignores unknown top-level variables (FLOPWATCH_LOG_FORMATT), so
    loading alone would not catch a misspelling there.
    """
    if not env_name.startswith(PREFIX) or env_name != env_name.upper():
        raise KeyError(f"{env_name}: not an upper-case {PREFIX} variable")
    parts = env_name.removeprefix(PREFIX).lower().split("__")
    model: type[BaseModel] = Settings
    for i, part in enumerate(parts):
        info = model.model_fields.get(part)
        if info is None:
            raise KeyError(f"{env_name}: {model.__name__} has no field {part!r}")
        if i == len(parts) - 1:
            return tuple(parts)
        ann = info.annotation
        if isinstance(ann, types.UnionType) or typing.get_origin(ann) is typing.Union:
            ann = next(a for a in typing.get_args(ann) if a is not type(None))
        if typing.get_origin(ann) is dict:
            return tuple(parts)  # free-form keys (hardware.<key>, detector.params.<name>)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            raise KeyError(f"{env_name}: {'.'.join(parts[: i + 1])} has no sub-fields")
        model = ann
    raise AssertionError("unreachable")


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """Variables as the kubelet would set them; referenced values become placeholders."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        name = item["name"]
        assert name not in env, f"{name} is set twice (the last one silently wins)"
        if "value" in item:
            assert isinstance(item["value"], str), f"{name}: env values must be strings"
            env[name] = item["value"]
            continue
        source = item["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[name] = f"secret:{ref['name']}/{ref['key']}"
        elif "fieldRef" in source:
            env[name] = f"field:{source['fieldRef']['fieldPath']}"
        else:
            raise AssertionError(f"{name}: unexpected valueFrom {source}")
    return env


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No FLOPWATCH_* variable from the caller's shell leaks into Settings."""
    for name in list(os.environ):
        if name.upper().startswith(PREFIX):
            monkeypatch.delenv(name)
    return monkeypatch


def settings_from_pod(
    docs: list[Manifest], env: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[Settings, dict[str, str]]:
    """Load Settings the way the pod would: its args, its FLOPWATCH_* env, its config file."""
    container = daemon(docs)
    variables = container_env(container)
    for name, value in variables.items():
        if name.startswith(PREFIX):
            env.setenv(name, value)
    args = build_parser().parse_args(container["args"])
    assert args.command == "run"
    config = None
    if args.config is not None:
        config = tmp_path / args.config.name
        config.write_text(mounted_file(docs, args.config))
    return load_settings(config), variables


def mounted_file(docs: list[Manifest], path: Path) -> str:
    """Content of a file the pod sees at `path`, from the ConfigMap volume mounted there."""
    spec = pod_spec(docs)
    for mount in daemon(docs)["volumeMounts"]:
        if path.parent == Path(mount["mountPath"]):
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            item = next(i for i in volume["configMap"]["items"] if i["path"] == path.name)
            name = volume["configMap"]["name"]
            (cm,) = (d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)
            content: str = cm["data"][item["key"]]
            return content
    raise AssertionError(f"nothing is mounted at {path.parent}")


# -- lint and schemas ----------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_strict(values: dict[str, Any] | None) -> None:
    """`helm lint --strict` reports no warning or error (an info about the icon is fine)."""
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE,
                       kube_version=f"v{KUBE_VERSIONS[0]}")  # fmt: skip
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"], report["errors"]
    assert not problems, problems


def test_chart_versions() -> None:
    """appVersion is the project's version, so the default image tag is the release."""
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["appVersion"] == PYPROJECT["project"]["version"]


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("key", VALUE_SETS)
def test_manifests_pass_kubernetes_validate(
    key: str, kube: str, rendered: dict[str, list[Manifest]]
) -> None:
    """Every built-in object is valid for Kubernetes (strict: unknown fields are errors)."""
    checked = set()
    for doc in rendered[key]:
        if doc["kind"] in CRD_KINDS:
            continue  # no schema in kubernetes-validate; see test_custom_resources
        try:
            kv.validate(doc, kube, strict=True)
        except kv.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']} {where}: {exc.message}")
        except kv.SchemaNotFoundError as exc:
            pytest.fail(exc.message)
        checked.add(doc["kind"])
    assert {"Deployment", "Service", "ServiceAccount"} <= checked
    if key == "all_on":
        assert {"ConfigMap", "PodDisruptionBudget"} <= checked


def test_every_object_has_the_recommended_labels(rendered: dict[str, list[Manifest]]) -> None:
    """name, instance, version, managed-by and helm.sh/chart on every object and the pods."""
    version = PYPROJECT["project"]["version"]
    for docs in rendered.values():
        pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
        for labels in [d["metadata"]["labels"] for d in docs] + [pod_labels]:
            assert labels["app.kubernetes.io/name"] == "flopwatch"
            assert labels["app.kubernetes.io/instance"] == RELEASE
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["app.kubernetes.io/version"] == version
            assert labels["helm.sh/chart"] == f"flopwatch-{version}"
        selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels.items()
        assert "app.kubernetes.io/version" not in selector  # selectors are immutable


# -- the Deployment --------------------------------------------------------------------------


@pytest.mark.parametrize("key", VALUE_SETS)
def test_restricted_pod_security(key: str, rendered: dict[str, list[Manifest]]) -> None:
    """PSS restricted on every container, read-only root with emptyDirs for /tmp and HOME."""
    spec = pod_spec(rendered[key])
    pod_sc = spec.get("securityContext", {})
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert not sc["capabilities"].get("add")
        assert not sc.get("privileged")
        assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile"))
        assert seccomp == {"type": "RuntimeDefault"}
        assert sc["readOnlyRootFilesystem"] is True
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        assert uid not in (None, 0)
        # The image's own user, so files it owns (HOME) stay writable as expected.
        assert str(uid) == re.findall(r"^USER\s+(\d+)", DOCKERFILE, re.MULTILINE)[-1]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        home = re.findall(r"HOME=(\S+)", DOCKERFILE)[-1]
        empty_dirs = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        assert mounts["/tmp"] in empty_dirs
        assert mounts[home] in empty_dirs
    for forbidden in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(forbidden)
    allowed = {"emptyDir", "configMap", "secret", "projected", "downwardAPI",
               "persistentVolumeClaim", "ephemeral", "csi"}  # fmt: skip
    for v in spec["volumes"]:
        assert set(v) - {"name"} <= allowed, f"volume {v['name']} is not allowed by restricted"
    assert spec["enableServiceLinks"] is False  # would inject FLOPWATCH_SERVICE_HOST & co.
    assert spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize("key", VALUE_SETS)
def test_probes_and_ports_match_the_http_port(
    key: str, rendered: dict[str, list[Manifest]], clean_env: pytest.MonkeyPatch
) -> None:
    """Startup and liveness /healthz, readiness /readyz, all on the port the daemon serves."""
    docs = rendered[key]
    c = daemon(docs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    default_port = Settings().http_port
    assert ports == {"http": default_port}
    probes = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in probes.items():
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == default_port
    # Liveness waits out a first restore from the state topic before it can kill the pod.
    startup = c["startupProbe"]
    window = (
        startup.get("initialDelaySeconds", 0)
        + startup["periodSeconds"] * startup["failureThreshold"]
    )
    assert window > Settings().checkpoint.load_timeout_s
    assert container_env(c)[f"{PREFIX}HTTP_PORT"] == str(default_port)
    # Bound to the pod IP, where the kubelet's probes and Prometheus connect.
    (host,) = [e for e in c["env"] if e["name"] == f"{PREFIX}HTTP_HOST"]
    assert host["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    (svc_port,) = one(docs, "Service")["spec"]["ports"]
    assert ports.get(svc_port["targetPort"], svc_port["targetPort"]) == default_port
    assert (
        one(docs, "Service")["spec"]["selector"]
        == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    )


@pytest.mark.parametrize(
    ("values", "replicas", "pdb"),
    [
        ({}, 1, False),
        ({"replicaCount": 2}, 2, True),
        ({"replicaCount": 3}, 3, True),
        ({"replicaCount": 3, "keda": {"enabled": True, "minReplicaCount": 1}}, None, False),
        ({"replicaCount": 1, "keda": {"enabled": True, "minReplicaCount": 2}}, None, True),
    ],
)
def test_replicas_and_pod_disruption_budget(
    chart: helm.Chart, values: dict[str, Any], replicas: int | None, pdb: bool
) -> None:
    """A PDB only when more than one replica runs; with KEDA the HPA owns `replicas`."""
    docs = render(chart, values)
    assert one(docs, "Deployment")["spec"].get("replicas") == replicas
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert len(budgets) == int(pdb)
    if budgets:
        selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
        assert budgets[0]["spec"]["selector"]["matchLabels"] == selector
        assert budgets[0]["spec"]["maxUnavailable"] == 1


def test_topology_spread_selects_this_release(rendered: dict[str, list[Manifest]]) -> None:
    """Each spread constraint counts this release's pods, over nodes and zones."""
    docs = rendered["default"]
    selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    constraints = pod_spec(docs)["topologySpreadConstraints"]
    keys = {c["topologyKey"] for c in constraints}
    assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for c in constraints:
        assert c["labelSelector"] == {"matchLabels": selector}


def test_grace_period_covers_shutdown(rendered: dict[str, list[Manifest]]) -> None:
    """Room for the final batch, alert delivery, checkpoint and offset commit after SIGTERM."""
    for docs in rendered.values():
        grace = pod_spec(docs)["terminationGracePeriodSeconds"]
        assert grace >= 30
        sinks = Settings.model_fields["sinks"].default
        timeout = max(sinks.alertmanager.timeout_s, sinks.pagerduty.timeout_s,
                      sinks.webhook.timeout_s)  # fmt: skip
        assert grace > sinks.drain_s + 4 * timeout


# -- consistency with monitor.config ---------------------------------------------------------


@pytest.mark.parametrize("key", VALUE_SETS)
def test_every_env_var_is_a_settings_field(key: str, rendered: dict[str, list[Manifest]]) -> None:
    """Each FLOPWATCH_* variable the Deployment sets names a real field path of Settings."""
    names = [n for n in container_env(daemon(rendered[key])) if n.startswith(PREFIX)]
    assert len(names) >= 10
    for name in names:
        settings_path(name)


@pytest.mark.parametrize(
    "name",
    [
        "FLOPWATCH_LOG_FORMATT",  # ignored by pydantic-settings: only this check catches it
        "FLOPWATCH_KAFKA_BOOTSTRAP_SERVERS",  # one underscore: not nested
        "FLOPWATCH_KAFKA__BOOTSTRAP_SERVRES",
        "FLOPWATCH_HTTP_PORT__X",
        "FLOPWATCH_kafka__group_id",
    ],
)
def test_misspelt_env_var_is_rejected(name: str) -> None:
    """The field-path check rejects names Settings would ignore or fail on."""
    with pytest.raises(KeyError):
        settings_path(name)


def test_settings_path_accepts_nested_and_free_form_names() -> None:
    """Nested models, optional fields and dict-valued fields resolve."""
    assert settings_path("FLOPWATCH_KAFKA__TOPICS__SAMPLES") == ("kafka", "topics", "samples")
    assert settings_path("FLOPWATCH_KAFKA__SSL_CAFILE") == ("kafka", "ssl_cafile")
    assert settings_path("FLOPWATCH_DETECTOR__PARAMS__K") == ("detector", "params", "k")
    assert settings_path("FLOPWATCH_SINKS__ALERTMANAGER__URLS") == ("sinks", "alertmanager", "urls")


def test_default_values_load_into_settings(
    rendered: dict[str, list[Manifest]], clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The default release's env parses, and each value lands on the intended field."""
    s, env = settings_from_pod(rendered["default"], clean_env, tmp_path)
    assert s.kafka.bootstrap_servers == "kafka:9092"
    assert s.kafka.group_id == "flopwatch"
    assert s.kafka.client_id == "field:metadata.name"  # the pod's own name
    assert s.kafka.topics == Topics()
    assert s.kafka.security_protocol == "PLAINTEXT"
    assert s.sinks.kafka is True
    assert s.sinks.console is False
    assert s.sinks.alertmanager.urls == []
    assert s.sinks.retry_budget_s == Settings().sinks.retry_budget_s
    assert s.log_format == "json"
    assert s.http_port == 9108
    assert (s.limits.max_devices, s.limits.max_streams, s.limits.max_groups) == (
        10_000, 60_000, 2_000)  # fmt: skip
    assert not any("PASSWORD" in n for n in env)


# From `python -m bench.memory` (docs/benchmarks.md#memory): the process, RSS per layer
# stream held (the top of the measured range), one partition's checkpoint in flight.
BASELINE_BYTES, STREAM_BYTES, CHECKPOINT_BYTES_PER_STREAM = 190 * 2**20, 3_900, 8_000


def test_the_memory_limit_holds_the_stream_caps(rendered: dict[str, list[Manifest]]) -> None:
    """The default limit covers a replica holding the 4 partitions flopwatch creates, each at
    the chart's caps, while it checkpoints: caps and memory are raised together."""
    container = daemon(rendered["default"])
    env = container_env(container)
    streams = int(env["FLOPWATCH_LIMITS__MAX_STREAMS"])
    need = BASELINE_BYTES + 4 * streams * STREAM_BYTES + streams * CHECKPOINT_BYTES_PER_STREAM
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    assert int(limit.removesuffix("Mi")) * 2**20 >= 1.1 * need


def test_all_on_values_load_into_settings(
    rendered: dict[str, list[Manifest]], clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SASL/TLS secrets, Alertmanager, PagerDuty, webhook, detector, config file and
    extraEnv all arrive."""
    docs = rendered["all_on"]
    s, _ = settings_from_pod(docs, clean_env, tmp_path)
    k = s.kafka
    assert k.bootstrap_servers == ALL_ON["kafka"]["bootstrapServers"]
    assert k.group_id == "flopwatch-prod"  # env wins over the file's group_id
    assert k.topics.samples == "fleet.samples"
    assert k.topics.state == "fleet.state"
    assert k.auto_offset_reset == "latest"
    assert (k.security_protocol, k.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
    assert k.sasl_plain_username == "flopwatch"
    assert k.sasl_plain_password is not None
    assert k.sasl_plain_password.get_secret_value() == "secret:fw-kafka-sasl/kafka-password"
    assert k.ssl_password is not None
    assert k.ssl_password.get_secret_value() == "secret:fw-kafka-tls/tls-key-password"
    assert s.checkpoint.key is not None
    assert s.checkpoint.key.get_secret_value() == "secret:fw-checkpoint/hmac"
    am = s.sinks.alertmanager
    assert am.urls == ALL_ON["alertmanager"]["urls"]
    assert am.external_url == ALL_ON["alertmanager"]["externalUrl"]
    pd = s.sinks.pagerduty
    assert pd.routing_key is not None
    assert pd.routing_key.get_secret_value() == "secret:fw-pagerduty/routing-key"
    assert (pd.external_url, pd.runbook_base_url) == (
        "https://fw.example", "https://git.example/flopwatch/")  # fmt: skip
    hook = s.sinks.webhook
    assert hook.url == "https://hooks.example/flopwatch"
    assert hook.key is not None
    assert hook.key.get_secret_value() == "secret:fw-webhook/hmac"
    assert hook.previous_key is not None
    assert hook.previous_key.get_secret_value() == "secret:fw-webhook/hmac-old"
    assert s.sinks.retry_budget_s == 120
    assert (s.detector.kind, s.detector.h) == ("cusum", 12.5)
    assert s.log_level == "debug"
    assert s.alerts.group_window_s == 120.0  # from the mounted TOML file
    assert s.alerts.min_devices == 5
    assert s.alerts.page_loss == 0.2  # from extraEnv
    # TLS files: each configured path is a key of the Secret mounted at that directory.
    spec = pod_spec(docs)
    mounts = {m["mountPath"]: m["name"] for m in daemon(docs)["volumeMounts"]}
    for path in (k.ssl_cafile, k.ssl_certfile, k.ssl_keyfile):
        assert path is not None
        volume = next(v for v in spec["volumes"] if v["name"] == mounts[str(path.parent)])
        assert volume["secret"]["secretName"] == "fw-kafka-tls"
        assert path.name in {i["path"] for i in volume["secret"]["items"]}
    assert (
        "checksum/config" in one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    )


def test_secrets_are_never_inline(rendered: dict[str, list[Manifest]]) -> None:
    """No secret comes from values: the one Secret rendered is the generated checkpoint key
    (absent when an existing Secret is named); secret variables use secretKeyRef only."""
    for key, docs in rendered.items():
        secrets = [d for d in docs if d["kind"] == "Secret"]
        if key == "all_on":
            assert secrets == []
        else:
            (secret,) = secrets
            assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
            assert len(base64.b64decode(secret["data"]["key"])) == 64
        for item in daemon(docs)["env"]:
            name = item["name"]
            if any(w in name for w in ("PASSWORD", "SECRET", "TOKEN")) or name.endswith("_KEY"):
                assert "secretKeyRef" in item.get("valueFrom", {}), name


def test_values_schema_enums_match_settings(chart: helm.Chart) -> None:
    """values.schema.json offers exactly the choices Settings accepts, and rejects others."""
    schema = chart.schema
    assert schema is not None
    props = schema["properties"]
    pairs = {
        "security_protocol": props["kafka"]["properties"]["securityProtocol"]["enum"],
        "sasl_mechanism": props["kafka"]["properties"]["sasl"]["properties"]["mechanism"]["enum"],
        "auto_offset_reset": props["kafka"]["properties"]["autoOffsetReset"]["enum"],
    }
    assert Settings.model_fields["kafka"].annotation is KafkaSettings
    assert Settings.model_fields["detector"].annotation is DetectorSettings
    for field, enum in pairs.items():
        assert set(enum) == set(typing.get_args(KafkaSettings.model_fields[field].annotation))
    for field, enum in (("log_format", props["log"]["properties"]["format"]["enum"]),
                        ("log_level", props["log"]["properties"]["level"]["enum"])):  # fmt: skip
        assert set(enum) == set(typing.get_args(Settings.model_fields[field].annotation))
    kinds = set(typing.get_args(DetectorSettings.model_fields["kind"].annotation))
    assert set(props["detector"]["properties"]["kind"]["enum"]) == kinds | {""}
    with pytest.raises(helm.HelmError, match="format"):
        chart.render({"log": {"format": "text"}}, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"kafka": {"securityProtocol": "SASL_SSL"}}, "existingSecret"),
        ({"kafka": {"bootstrapServers": ""}}, "bootstrapServers"),
        ({"kafka": {"tls": {"keyKey": "tls.key"}}}, "existingSecret"),
        ({"webhook": {"url": "https://hooks.example/x"}}, "webhook.existingSecret"),
    ],
)
def test_misconfiguration_fails_at_render(
    chart: helm.Chart, values: dict[str, Any], needle: str
) -> None:
    """Missing secrets or brokers stop `helm install` instead of a crash-looping pod."""
    with pytest.raises(helm.HelmError, match=needle):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


# -- custom resources (not known to kubernetes-validate) -------------------------------------


@pytest.mark.parametrize(
    ("values", "on"),
    [
        ({}, "false"),
        ({"replicaCount": 2}, "true"),
        ({"keda": {"enabled": True}}, "true"),
        ({"replicaCount": 2, "kafka": {"repartition": False}}, "false"),
        ({"kafka": {"repartition": True}}, "true"),
    ],
)
def test_repartition_follows_the_replica_count(
    chart: helm.Chart, values: dict[str, Any], on: str
) -> None:
    """`auto` re-keys by pool exactly when more than one replica can run; KEDA's trigger
    then watches the detecting group on the by-pool copy."""
    docs = render(chart, values)
    env = container_env(daemon(docs))
    assert env["FLOPWATCH_KAFKA__REPARTITION"] == on
    assert env["FLOPWATCH_KAFKA__TOPICS__BY_POOL"] == "flopwatch.samples.by-pool"
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    if scaled:
        topics = [t["metadata"]["topic"] for t in scaled[0]["spec"]["triggers"]]
        assert topics == (["flopwatch.samples.by-pool", "flopwatch.samples"] if on == "true"
                          else ["flopwatch.samples"])  # fmt: skip


@pytest.mark.parametrize(
    ("values", "on"),
    [
        ({}, "false"),
        ({"replicaCount": 2}, "true"),
        ({"keda": {"enabled": True}}, "true"),
        ({"replicaCount": 2, "kafka": {"fleetStage": False}}, "false"),
        ({"kafka": {"fleetStage": True}}, "true"),
    ],
)
def test_fleet_stage_goes_with_repartition(
    chart: helm.Chart, values: dict[str, Any], on: str
) -> None:
    """`auto` runs the fleet stage whenever the samples are re-keyed by pool (several
    replicas): one fleet page across them; the change-point topic is always passed."""
    env = container_env(daemon(render(chart, values)))
    assert env["FLOPWATCH_KAFKA__FLEET_STAGE"] == on
    assert env["FLOPWATCH_KAFKA__TOPICS__CHANGE_POINTS"] == "flopwatch.change-points"


def test_custom_resources(rendered: dict[str, list[Manifest]]) -> None:
    """ServiceMonitor scrapes the Service's port; KEDA watches the daemon's own group."""
    assert not {d["kind"] for d in rendered["default"]} & CRD_KINDS
    docs = rendered["all_on"]
    env = container_env(daemon(docs))
    svc = one(docs, "Service")

    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ep["path"] == "/metrics"
    assert (ep["interval"], ep["scrapeTimeout"], ep["honorLabels"]) == ("15s", "10s", False)
    assert ep["relabelings"] == ALL_ON["serviceMonitor"]["relabelings"]
    assert ep["metricRelabelings"] == ALL_ON["serviceMonitor"]["metricRelabelings"]

    so = one(docs, "ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    target = so["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (
        "Deployment",
        one(docs, "Deployment")["metadata"]["name"],
    )
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (2, 12)
    # KEDA runs several replicas, so the samples are re-keyed by pool: the detecting group
    # reads the by-pool copy, and the copy stage's own group reads the samples.
    assert env["FLOPWATCH_KAFKA__REPARTITION"] == "true"
    detect, copy = so["spec"]["triggers"]
    group = env["FLOPWATCH_KAFKA__GROUP_ID"]
    assert (detect["metadata"]["consumerGroup"], detect["metadata"]["topic"]) == (
        group, env["FLOPWATCH_KAFKA__TOPICS__BY_POOL"])  # fmt: skip
    assert (copy["metadata"]["consumerGroup"], copy["metadata"]["topic"]) == (
        f"{group}.repartition", env["FLOPWATCH_KAFKA__TOPICS__SAMPLES"])  # fmt: skip
    auth = one(docs, "TriggerAuthentication")
    for trigger in (detect, copy):
        meta = trigger["metadata"]
        assert trigger["type"] == "kafka"
        assert all(isinstance(v, str) for v in meta.values()), "KEDA metadata values are strings"
        assert meta["bootstrapServers"] == env["FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS"]
        assert meta["offsetResetPolicy"] == env["FLOPWATCH_KAFKA__AUTO_OFFSET_RESET"]
        assert int(meta["lagThreshold"]) >= 1
        assert (meta["sasl"], meta["tls"]) == ("scram_sha512", "enable")
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]

    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert refs["password"] == ("fw-kafka-sasl", "kafka-password")
    assert refs["ca"] == ("fw-kafka-tls", "ca.crt")
    assert refs["keyPassword"] == ("fw-kafka-tls", "tls-key-password")
    (user,) = auth["spec"]["env"]
    assert user["name"] in env
    assert user["containerName"] == daemon(docs)["name"]

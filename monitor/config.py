"""One settings class: env (`FLOPWATCH_`, nested with `__`), optional TOML file, defaults.

Precedence, highest first: constructor arguments (CLI flags), environment,
the TOML file named by `--config`, defaults. Each component receives its own
sub-model; nothing imports `Settings` to read globals.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from monitor.errors import ConfigError
from monitor.hardware import Catalog, HardwareSpec


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Topics(_Frozen):
    """Topic names (contract §4)."""

    samples: str = "flopwatch.samples"
    changes: str = "flopwatch.changes"
    alerts: str = "flopwatch.alerts"
    dlq: str = "flopwatch.dlq"
    state: str = "flopwatch.state"
    # Not in the contract: flopwatch's own copy of the samples keyed by pool (`repartition`).
    by_pool: str = "flopwatch.samples.by-pool"
    # Not in the contract: each replica's change points for the fleet stage (`fleet_stage`),
    # all under one key (the fleet), so that one partition and one member see them all.
    change_points: str = "flopwatch.change-points"


class KafkaSettings(_Frozen):
    """Connection and consumer settings; security fields pass straight to aiokafka."""

    bootstrap_servers: str | None = Field(
        default=None, description="host:port[,host:port]; unset = embedded broker for `up`"
    )
    group_id: str = "flopwatch"
    client_id: str = "flopwatch"
    topics: Topics = Topics()
    partitions: int = Field(default=4, ge=1, description="partitions when flopwatch creates topics")
    max_batch_records: int = Field(default=5000, ge=1)
    poll_timeout_ms: int = Field(default=500, ge=1)
    probe_s: float = Field(
        default=10.0, gt=0, description="how often readiness asks the cluster for metadata"
    )
    stall_s: float = Field(
        default=60.0,
        gt=0,
        description="not ready after this long without delivering while the broker holds more",
    )
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    repartition: bool = Field(
        default=False,
        description="re-key the samples by pool onto topics.by_pool and consume that, so each "
        "member sees whole pools (turn on with more than one replica)",
    )
    fleet_stage: bool = Field(
        default=False,
        description="publish each replica's change points to topics.change_points and run the "
        "fleet correlation on the member that owns that topic's fleet partition: one "
        "fleet-scope alert across replicas (turn on with repartition and more than one replica)",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"] = (
        "PLAIN"
    )
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_password: SecretStr | None = None

    @property
    def input_topic(self) -> str:
        """The topic the group shares out: the samples, or their by-pool copy."""
        return self.topics.by_pool if self.repartition else self.topics.samples


class DetectorSettings(_Frozen):
    """Change-point detector choice and parameters (see docs/detection.md)."""

    kind: Literal["bank", "cusum", "adwin", "page_hinkley", "kswin"] = "bank"
    h: float | None = Field(
        default=None, gt=0, description="decision threshold: higher = fewer pages, later"
    )
    params: dict[str, float] = Field(
        default_factory=dict, description="other engine parameters, by name (kind-specific)"
    )
    load_aware: bool = Field(default=True, description="detect on y / expected-given-load")
    load_forget: float = Field(default=0.99, gt=0, le=1, description="load model memory/window")
    load_min_support: float = Field(
        default=5.0,
        ge=0,
        description="windows of data the load model needs at a load before its ratios are "
        "judged (0 = always); fewer = extrapolation, e.g. a pool's first burst",
    )
    stream_ttl_s: float = Field(default=3600.0, gt=0, description="expire silent streams after")
    material_rel: dict[str, float] = Field(
        default_factory=dict,
        description="per metric: smallest shift reported, relative to the level before "
        "(overrides the defaults in monitor/indicators.py, e.g. {lat_p99_ms: 0.2})",
    )
    material_abs: dict[str, float] = Field(
        default_factory=dict,
        description="per metric: smallest shift reported, in the metric's units",
    )

    @model_validator(mode="after")
    def _known_params(self) -> DetectorSettings:
        """Reject engine parameters the chosen kind does not take (one clear line, at load)."""
        from monitor.detect import detector_params  # noqa: PLC0415 - detect is heavier

        valid = detector_params(self.kind)
        unknown = sorted(set(self.params) - set(valid))
        if unknown:
            raise ValueError(f"unknown detector.params {unknown} for kind {self.kind!r}")
        return self

    @model_validator(mode="after")
    def _valid_values(self) -> DetectorSettings:
        """Build one small detector now: a bad value fails at load, not at the first batch."""
        from monitor.detect import make_detector  # noqa: PLC0415 - detect is heavier

        try:
            make_detector(self.kind, 1, {**self.engine_params(), "capacity": 1})
        except (ValueError, TypeError) as exc:
            raise ValueError(f"detector parameters for kind {self.kind!r}: {exc}") from None
        return self

    @model_validator(mode="after")
    def _known_metrics(self) -> DetectorSettings:
        """Reject floors for metrics the daemon does not derive, and negative ones."""
        from monitor.indicators import DEVICE_METRICS, LAYER_METRICS  # noqa: PLC0415

        for name, floors in (("material_rel", self.material_rel),
                             ("material_abs", self.material_abs)):  # fmt: skip
            unknown = sorted(set(floors) - set(LAYER_METRICS) - set(DEVICE_METRICS))
            if unknown:
                raise ValueError(f"unknown metrics in detector.{name}: {unknown}")
            negative = sorted(m for m, v in floors.items() if not v >= 0)
            if negative:
                raise ValueError(f"detector.{name} must be >= 0: {negative}")
        return self

    def engine_params(self) -> dict[str, float]:
        """Keyword arguments for `detect.make_detector` (which makes whole counts ints)."""
        return {**self.params, **({"h": self.h} if self.h is not None else {})}


class AlertSettings(_Frozen):
    """Incident grouping and alert lifecycle."""

    group_window_s: float = Field(default=300.0, gt=0, description="onsets this close join")
    pool_fraction: float = Field(default=0.5, gt=0, le=1, description="share for pool scope")
    resolve_windows: int = Field(default=6, ge=1, description="healthy windows to resolve")
    resolve_tolerance: float = Field(default=0.02, ge=0, description="relative, vs before")
    page_loss: float = Field(default=0.10, ge=0, description="MFU loss x share for page")
    max_devices_listed: int = Field(default=50, ge=1)
    max_skew_s: float = Field(default=60.0, ge=0, description="partition lag tolerated")
    min_devices: int = Field(default=3, ge=1, description="devices that confirm an incident")
    min_fraction: float = Field(default=0.05, ge=0, le=1, description="or this share of pool")
    settle_windows: int = Field(default=1, ge=0, description="wait this long before first page")
    update_growth: float = Field(default=0.2, ge=0, description="re-send when devices grow by")
    update_every_windows: int = Field(
        default=6, ge=1, description="else re-send at most this often"
    )
    change_lookback_s: float = Field(default=6 * 3600.0, gt=0)


class DeliverySettings(_Frozen):
    """How an HTTP sink delivers: its own bounded retry queue, drained by a background task."""

    timeout_s: float = Field(default=5.0, gt=0, description="one request, connect to answer")
    queue_max: int = Field(
        default=1000, ge=1,
        description="queued states beyond this drop the oldest firing ones (never an end)",
    )  # fmt: skip
    backoff_s: float = Field(default=1.0, gt=0, description="first retry delay")
    backoff_max_s: float = Field(default=60.0, gt=0, description="retry delay doubles up to this")

    @model_validator(mode="after")
    def _backoff_order(self) -> DeliverySettings:
        """The cap cannot be below the first delay."""
        if self.backoff_max_s < self.backoff_s:
            raise ValueError(
                f"backoff_max_s ({self.backoff_max_s:g}) is below backoff_s ({self.backoff_s:g})"
            )
        return self


class AlertmanagerSettings(DeliverySettings):
    """Prometheus Alertmanager sink (send to every instance, never through a balancer)."""

    urls: list[str] = Field(default_factory=list, description="every instance, e.g. http://am:9093")
    resend_s: float = Field(default=60.0, gt=0, description="re-post firing alerts this often")
    external_url: str | None = Field(default=None, description="generatorURL base for alerts")


PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


class PagerDutySettings(DeliverySettings):
    """PagerDuty Events API v2 sink: on when `routing_key` is set."""

    routing_key: SecretStr | None = Field(
        default=None, description="the service's Events v2 integration key (a secret)"
    )
    url: str = Field(default=PAGERDUTY_EVENTS_URL, description="the Events v2 enqueue endpoint")
    external_url: str | None = Field(
        default=None, description="base of the incident page link: <external_url>/alerts/<id>"
    )
    runbook_base_url: str | None = Field(
        default=None, description="prefix for the record's relative runbook path in links"
    )
    max_event_bytes: int = Field(
        default=512_000, ge=4096, le=512_000,
        description="event size bound (the API takes up to 512 KB); evidence is cut to fit",
    )  # fmt: skip


class WebhookSettings(DeliverySettings):
    """Generic webhook sink: each alert record POSTed as JSON, signed with HMAC-SHA256."""

    url: str | None = Field(default=None, description="where alert records are POSTed")
    key: SecretStr | None = Field(default=None, description="HMAC-SHA256 signing key")
    previous_key: SecretStr | None = Field(
        default=None,
        description="during a rotation: the old key; requests carry a signature by each key",
    )

    @model_validator(mode="after")
    def _signed(self) -> WebhookSettings:
        """An unsigned webhook is refused: receivers could not tell our posts from forgeries."""
        if self.url and self.key is None:
            raise ValueError("sinks.webhook.url needs sinks.webhook.key (the HMAC signing key)")
        if self.previous_key is not None and self.key is None:
            raise ValueError("sinks.webhook.previous_key needs sinks.webhook.key")
        return self


class SinkSettings(_Frozen):
    """Where alerts go."""

    kafka: bool = True
    console: bool = True
    jsonl_path: Path | None = None
    alertmanager: AlertmanagerSettings = AlertmanagerSettings()
    pagerduty: PagerDutySettings = PagerDutySettings()
    webhook: WebhookSettings = WebhookSettings()
    retry_budget_s: float = Field(
        default=300.0, gt=0,
        description="a sink failing this long (retrying) fails /readyz",
    )  # fmt: skip
    drain_s: float = Field(
        default=5.0, ge=0,
        description="on a clean stop, wait this long for the HTTP sinks' queues to deliver",
    )  # fmt: skip


class CheckpointSettings(_Frozen):
    """Per-partition checkpoints of detector and incident state in the state topic."""

    enabled: bool = Field(default=True, description="write and restore checkpoints")
    interval_s: float = Field(default=60.0, gt=0, description="write every this many seconds")
    chunk_bytes: int = Field(
        default=900_000,
        ge=1024,
        description="split records above this size (stay under the broker's max.message.bytes)",
    )
    load_timeout_s: float = Field(
        default=120.0, gt=0, description="give up reading the state topic after this long"
    )
    key: SecretStr | None = Field(
        default=None,
        description="HMAC-SHA256 key: sign checkpoints and restore only signed ones",
    )
    require_key: bool = Field(
        default=True,
        description="refuse to run with checkpoints but no key (false: unsigned, for a state "
        "topic only flopwatch can write)",
    )


class LimitSettings(_Frozen):
    """Bounds on input and state: what one record, one clock or one partition may cost."""

    max_record_bytes: int = Field(
        default=1 << 20, ge=1024, description="larger records are dead-lettered unread"
    )
    max_layers: int = Field(default=256, ge=1, le=4096, description="layer entries per record")
    max_future_s: float = Field(
        default=600.0, gt=0, description="records dated further ahead of the wall clock: future"
    )
    max_dead_letter_bytes: int = Field(
        default=64 * 1024, ge=256, description="dead letters carry at most this much of a record"
    )
    # Per input partition: a partition's state, and so what it detects, then depends on
    # its own records alone, and its detector arrays (which never shrink) stay bounded.
    max_devices: int = Field(
        default=50_000,
        ge=1,
        description="devices tracked per input partition; at the cap the least recently seen "
        "is evicted for a new one",
    )
    max_streams: int = Field(
        default=300_000,
        ge=1,
        description="layer streams (device x layer type) per input partition; least recently "
        "seen evicted",
    )
    max_groups: int = Field(
        default=10_000,
        ge=1,
        description="(pool, model, layer) groups per input partition; least recently seen evicted",
    )


class HardwareEntry(_Frozen):
    """A catalog entry added or overridden from config."""

    peak_flops: dict[str, float]
    hbm_bytes_per_s: float
    source: str = "config"
    max_clock_mhz: float | None = None


class LayerRule(_Frozen):
    """One row of the layer-type rules table: a regex on a module, op or kernel name."""

    field: Literal["module", "op", "kernel"]
    pattern: str
    type: str = Field(pattern=r"^[a-z0-9_]{1,32}$")

    @model_validator(mode="after")
    def _compiles(self) -> LayerRule:
        """A bad regex fails at load, with the pattern named."""
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"bad pattern {self.pattern!r}: {exc}") from None
        return self


class IngestSettings(_Frozen):
    """How the ingest adapters name what they read; each list runs before the built-in one."""

    layer_rules: list[LayerRule] = Field(
        default_factory=list,
        description="extra layer-type rules, tried before the built-in table "
        "(monitor/ingest/rules.py) within their field",
    )
    hw_aliases: dict[str, str] = Field(
        default_factory=dict,
        description="regex on the device name -> hardware catalog key, tried before the "
        "built-in aliases",
    )
    pools: dict[str, str] = Field(
        default_factory=dict, description="host -> pool, for records whose source names no pool"
    )

    @model_validator(mode="after")
    def _aliases_compile(self) -> IngestSettings:
        """A bad alias regex fails at load."""
        for pattern in self.hw_aliases:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"bad hw_aliases pattern {pattern!r}: {exc}") from None
        return self


class Settings(BaseSettings):
    """The whole effective configuration of a flopwatch process."""

    model_config = SettingsConfigDict(
        env_prefix="FLOPWATCH_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        toml_file=None,
    )

    kafka: KafkaSettings = KafkaSettings()
    detector: DetectorSettings = DetectorSettings()
    alerts: AlertSettings = AlertSettings()
    sinks: SinkSettings = SinkSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    limits: LimitSettings = LimitSettings()
    hardware: dict[str, HardwareEntry] = Field(default_factory=dict)
    ingest: IngestSettings = IngestSettings()
    http_port: int = Field(default=9108, ge=0, le=65535, description="0 disables /metrics")
    http_host: str | None = Field(
        default=None,
        description="interface for /metrics and the probes (default: all for `run`, "
        "loopback for `up`; the chart sets the pod IP)",
    )
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags over env over TOML file over defaults."""
        toml = TomlConfigSettingsSource(settings_cls, settings_cls.model_config.get("toml_file"))
        return (init_settings, env_settings, toml)


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from an optional TOML file, the environment and explicit overrides."""
    if config_file is not None:
        if not config_file.is_file():
            raise ConfigError(f"config file not found: {config_file}")
        try:
            with config_file.open("rb") as f:
                tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{config_file}: {exc}") from None

    class _FromFile(Settings):
        model_config = SettingsConfigDict(toml_file=config_file)

    try:
        return _FromFile(**overrides) if config_file else Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {first_error(exc, 'settings')}") from None


def first_error(exc: ValidationError, top: str) -> str:
    """A validation error in one line: where (dotted, `top` at the root), what, how many more."""
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"]) or top
    what = err["msg"].removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {what}{more}"


def mask_url(url: str) -> str:
    """A URL with its user-info (credentials) replaced by '***'."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


def masked_dump(settings: Settings) -> dict[str, Any]:
    """The effective configuration as JSON-able data: secrets (SecretStr, which JSON mode
    dumps as '**********') and credentials in URLs masked."""
    data: dict[str, Any] = settings.model_dump(mode="json")
    am = data["sinks"]["alertmanager"]
    am["urls"] = [mask_url(u) for u in am["urls"]]
    for sink in (am, data["sinks"]["pagerduty"], data["sinks"]["webhook"]):
        for field in ("url", "external_url", "runbook_base_url"):
            if sink.get(field):
                sink[field] = mask_url(sink[field])
    return data


def catalog_from(settings: Settings) -> Catalog:
    """The hardware catalog with the config's `[hardware.<key>]` entries merged in."""
    return Catalog(
        {
            k: HardwareSpec(
                peak_flops={d.lower(): v for d, v in e.peak_flops.items()},
                hbm_bytes_per_s=e.hbm_bytes_per_s,
                source=e.source,
                max_clock_mhz=e.max_clock_mhz,
            )
            for k, e in settings.hardware.items()
        }
    )

"""Sluice's configuration: YAML file, then environment variables, then command-line flags.

Validation is done with pydantic so that a bad value fails at start with the key path and the
reason (`upstream.tls.ca_file: file not found`), never later on a live connection. Environment
variables are `SLUICE_<SECTION>__<KEY>` (double underscore between levels), for example
`SLUICE_METRICS__PORT=9404` or `SLUICE_LISTEN=0.0.0.0:9092`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from protocol import fastpath
from proxy.admin.store import StoreConfig, librdkafka_text
from proxy.fleet.config import FleetConfig
from proxy.ops.disk_guard import StorageConfig
from proxy.stages.callbacks import QuotaPlugins
from quotas.config import QuotaConfig
from quotas.connection_limits import canonical_ip
from quotas.errors import QuotaConfigError
from quotas.section import QuotasSection

ENV_PREFIX = "SLUICE_"
RUNTIME_DIR_MAX_BYTES = 80
ANONYMOUS = "ANONYMOUS"  # quotas.entity.UNAUTHENTICATED_PRINCIPAL: an unauthenticated client's principal


class ConfigError(Exception):
    """Bad configuration: the message names the key and the reason."""


class HostPort(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str
    port: int = Field(ge=0, le=65535)

    @classmethod
    def parse(cls, text: str) -> HostPort:
        host, sep, port = text.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected HOST:PORT, got {text!r}")
        return cls(host=host.strip("[]"), port=int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def _host_port(value: Any) -> Any:
    return HostPort.parse(value) if isinstance(value, str) else value


class UpstreamTls(BaseModel):
    """TLS from Sluice to the brokers (independent of `listen_tls`); also used by the storage poller."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=False, description="connect to the brokers over TLS")
    ca_file: Path | None = Field(default=None, description="CA bundle that signs the brokers' certificates "
                                                           "(default: the system's)")
    cert_file: Path | None = Field(default=None, description="Sluice's client certificate (mutual TLS); "
                                                             "with key_file")
    key_file: Path | None = Field(default=None, description="the private key of cert_file")
    verify_hostname: bool = Field(default=True, description="check that a broker's certificate names the "
                                                            "host Sluice connected to")

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file not found: {value}")
        return value

    @model_validator(mode="after")
    def _pair(self) -> UpstreamTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self

    def context(self) -> ssl.SSLContext | None:
        if not self.enabled:
            return None
        ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        ctx.check_hostname = self.verify_hostname
        if self.cert_file and self.key_file:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        return ctx


class UpstreamConfig(BaseModel):
    """The Kafka cluster Sluice fronts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap: list[HostPort] = Field(min_length=1, description="the brokers' bootstrap addresses: a YAML "
                                      "list ([b1:9092, b2:9092]) or one comma-separated string (the "
                                      "--upstream flag, SLUICE_UPSTREAM__BOOTSTRAP)")
    tls: UpstreamTls = UpstreamTls()
    connect_timeout_ms: int = Field(default=10_000, gt=0, description="a connection to a broker must be "
                                    "established (TLS included) within this")

    @field_validator("bootstrap", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        return [_host_port(v) for v in value] if isinstance(value, list) else value


class MetricsConfig(BaseModel):
    """The HTTP endpoint: /metrics (Prometheus), /healthz, /quotas/usage and /connections."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", description="the address the endpoint binds; it has no "
                      "authentication (but /connections can ask for a token), so bind it where only "
                      "operators and Prometheus reach")
    port: int | None = Field(default=None, ge=0, le=65535,
                             description="the endpoint's port; null (the default): no endpoint")
    max_series_per_metric: int = Field(
        default=2000, ge=1, description="per-entity series of each sluice_quota_* metric; sensors beyond it "
                                        "are folded into user/client_id=\"__overflow__\" "
                                        "(docs/operating.md, Metrics)")


CONNECTIONS_TOKEN_ENV = "SLUICE_CONNECTIONS_TOKEN"
"""The conventional variable for `connections_endpoint.token_env` (never read as a config key)."""


class ConnectionsEndpointConfig(BaseModel):
    """`GET /connections` on the metrics port (docs/operating.md, Connections). Off unless enabled; with
    `token_env` or `token_file` a request needs ``Authorization: Bearer <token>``. The token itself
    is never part of the configuration (nor of any log line)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=False, description="serve /connections (else it answers 404)")
    token_env: str | None = Field(default=None, min_length=1,
                                  description="the environment variable holding the bearer token")
    token_file: Path | None = Field(default=None, description="a file holding the bearer token")
    window_ms: int = Field(default=10_000, ge=1_000, le=300_000,
                           description="rates and throttle time cover this last stretch")

    @model_validator(mode="after")
    def _token_source(self) -> ConnectionsEndpointConfig:
        if self.token_env is not None and self.token_file is not None:
            raise ValueError("give token_env or token_file, not both")
        env = self.token_env
        if env is not None and env.startswith(ENV_PREFIX) and env != CONNECTIONS_TOKEN_ENV:
            raise ValueError(f"token_env: {env}: other {ENV_PREFIX}* variables are configuration keys; "
                             f"use {CONNECTIONS_TOKEN_ENV} or a name without the prefix")
        if self.enabled:
            self.token()  # a named source that yields no token fails at start
        return self

    def token(self) -> str | None:
        """The bearer token, or None when none is required. Raises ValueError (naming the source,
        never the value) when a configured source is unset, unreadable or empty."""
        if self.token_env is not None:
            value = os.environ.get(self.token_env, "").strip()
            if not value:
                raise ValueError(f"token_env: the environment variable {self.token_env} is not set or empty")
            return value
        if self.token_file is not None:
            try:
                value = self.token_file.read_text().strip()
            except OSError as exc:
                raise ValueError(f"token_file: cannot read {self.token_file}: {exc.strerror}") from None
            if not value:
                raise ValueError(f"token_file: {self.token_file} is empty")
            return value
        return None


class AccessLogConfig(BaseModel):
    """One record per request, written by a process of its own (docs/analytics.md has the schema)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dir: Path | None = Field(default=None, description="write access logs under this directory (by date "
                             "and hour); null: no files")
    format: Literal["parquet", "json"] = Field(default="parquet",
                                               description="parquet (needs pyarrow) or json lines")
    rotate_mb: int = Field(default=128, ge=1, description="start a new file once the current one holds "
                           "this many MiB")
    queue_size: int = Field(default=100_000, ge=100, description="records waiting for the writer; beyond "
                            "it records are dropped and counted (sluice_access_log_records_dropped_total)")
    kafka_bootstrap: str | None = Field(default=None, description="also send records to this cluster")
    kafka_topic: str | None = Field(default=None, description="the topic records are sent to (with "
                                                               "kafka_bootstrap)")
    kafka_config: dict[str, SecretStr] = Field(default_factory=dict,
                                               description="librdkafka settings of the topic sink (SASL, "
                                                           "TLS, message.timeout.ms); never shown in logs")

    @field_validator("kafka_config", mode="before")
    @classmethod
    def _settings_as_text(cls, value: object) -> object:
        """librdkafka settings are strings; YAML numbers and booleans are written as librdkafka does."""
        return librdkafka_text(value)

    @model_validator(mode="after")
    def _kafka(self) -> AccessLogConfig:
        if (self.kafka_bootstrap is None) != (self.kafka_topic is None):
            raise ValueError("kafka_bootstrap and kafka_topic go together")
        if self.kafka_config and self.kafka_bootstrap is None:
            raise ValueError("kafka_config needs kafka_bootstrap and kafka_topic")
        if self.format == "parquet" and self.dir is not None and not _installed("pyarrow"):
            raise ValueError("format: parquet needs pyarrow installed (or format: json)")
        if self.kafka_bootstrap is not None and not _installed("confluent_kafka"):
            raise ValueError("kafka_bootstrap: the access-log topic needs confluent-kafka installed")
        return self


def _installed(module: str) -> bool:
    """An optional library is there (a missing one is a config error naming the key, not a traceback)."""
    return importlib.util.find_spec(module) is not None


class ListenTls(BaseModel):
    """TLS from clients to Sluice (every Sluice listener). Independent of `upstream.tls`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cert_file: Path = Field(description="Sluice's server certificate (PEM)")
    key_file: Path = Field(description="the private key of cert_file")
    ca_file: Path | None = Field(default=None, description="CA(s) that sign client certificates")
    client_auth: Literal["none", "requested", "required"] = Field(
        default="none", description="ask clients for a certificate (requested) or insist (required); "
                                    "a certificate's mapped subject is the connection's principal")
    principal_mapping_rules: str = Field(default="DEFAULT", description="Kafka's ssl.principal.mapping.rules")

    @field_validator("cert_file", "key_file", "ca_file")
    @classmethod
    def _exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file not found: {value}")
        return value

    @field_validator("principal_mapping_rules")
    @classmethod
    def _rules(cls, value: str) -> str:
        from protocol.principal_rules import SslPrincipalMapper

        SslPrincipalMapper.from_rules(value)  # MappingRuleError is a ValueError
        return value

    @model_validator(mode="after")
    def _loadable(self) -> ListenTls:
        if self.client_auth != "none" and self.ca_file is None:
            raise ValueError(f"client_auth {self.client_auth} needs ca_file")
        try:
            self.context()
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"cannot load the certificate, key or CA: {exc}") from None
        return self

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        if self.ca_file is not None:
            ctx.load_verify_locations(cafile=str(self.ca_file))
        ctx.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                           "required": ssl.CERT_REQUIRED}[self.client_auth]
        return ctx


_MIB = 1024 * 1024


class LimitsConfig(BaseModel):
    """Bounded resources under abuse (docs/operating.md, Limits). Each hit is counted in
    ``sluice_limit_hits_total{cause}`` (the key's name) and logged once per cause."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_connections: int = Field(default=10_000, ge=1, description="client connections in total "
                                 "(per process); one more is closed at once")
    max_connections_per_ip: int = Field(default=1_000, ge=1, description="client connections from one "
                                        "address (Kafka's max.connections.per.ip)")
    max_connections_per_ip_overrides: dict[str, int] = Field(
        default_factory=dict, description="{address: count} (Kafka's max.connections.per.ip.overrides; "
                                          "0 refuses the address)")
    handshake_timeout_ms: int = Field(
        default=10_000, ge=100, description="a connection's first complete request (ApiVersions counts) must "
        "arrive within this, and each SASL exchange must succeed within this of its SaslHandshake")
    idle_timeout_ms: int = Field(default=600_000, ge=1_000, description="close a connection with nothing "
                                 "read or written and no request in flight (Kafka's connections.max.idle.ms)")
    max_buffered_bytes_per_connection: int = Field(
        default=1 * _MIB, ge=16 * 1024,
        description="bytes held for one slow client before its broker side stops being read")
    max_buffered_bytes_total: int = Field(default=256 * _MIB, ge=16 * 1024, description="bytes held for "
                                          "all clients; over it the biggest holders are paused")
    max_in_flight_requests_per_connection: int = Field(default=100, ge=1, description="requests awaiting "
                                                       "responses before Sluice stops reading the client")

    @field_validator("max_connections_per_ip_overrides")
    @classmethod
    def _override_addresses(cls, value: dict[str, int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for address, count in value.items():
            try:
                ip = canonical_ip(address)
            except ValueError:
                raise ValueError(f"{address!r} is not an IP address") from None
            if count < 0:
                raise ValueError(f"{address}: must be >= 0, got {count}")
            out[ip] = count
        return out

    @model_validator(mode="after")
    def _per_connection_within_total(self) -> LimitsConfig:
        if self.max_buffered_bytes_per_connection > self.max_buffered_bytes_total:
            raise ValueError(f"max_buffered_bytes_per_connection ({self.max_buffered_bytes_per_connection}) "
                             f"cannot exceed max_buffered_bytes_total ({self.max_buffered_bytes_total})")
        return self


class SaslConfig(BaseModel):
    """How Sluice reads the principal of a SASL exchange it passes through."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    oauthbearer_principal_claim: str = Field(default="sub", min_length=1,
                                             description="the JWT claim that names an OAUTHBEARER principal")


class ProxyConfig(BaseModel):
    """Everything `sluice proxy` needs. Flags and environment variables override the file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    listen: HostPort = Field(default=HostPort(host="127.0.0.1", port=9092),
                             description="the bootstrap address clients connect to (port 0: the kernel "
                                         "picks one)")
    advertised_host: str | None = Field(default=None, description="the host name Sluice gives clients for "
                                        "its per-broker listeners (default: listen's host); behind a load "
                                        "balancer, the load balancer's name")
    broker_port_base: int | None = Field(default=None, ge=1, le=65535,
                                         description="per-broker listener port = base + node id; "
                                                     "default listen.port + 1")
    upstream: UpstreamConfig
    data_dir: Path | None = Field(default=None, description="where a relative store.path lives (default: "
                                                            "the config file's directory); the image sets "
                                                            "SLUICE_DATA_DIR=/var/lib/sluice")
    metrics: MetricsConfig = MetricsConfig()
    connections_endpoint: ConnectionsEndpointConfig = Field(
        default_factory=ConnectionsEndpointConfig,
        description="GET /connections on the metrics port: every open client connection "
                    "(docs/operating.md, Connections)")
    access_log: AccessLogConfig = AccessLogConfig()
    max_frame_bytes: int = Field(default=100 * 1024 * 1024, ge=1024,
                                 description="a request or response frame larger than this closes its "
                                             "connection (Kafka's socket.request.max.bytes is 100 MiB)")
    drain_timeout_ms: int = Field(default=30_000, ge=0, description="on SIGTERM, how long in-flight requests "
                                  "may take to be answered before connections are closed")
    heap_trim_interval_ms: int = Field(default=0, ge=0, description="give the heap's free pages back to "
                                       "the kernel (glibc malloc_trim) this often; 0 (the default): never")
    instance: str = Field(default_factory=lambda: os.uname().nodename.split(".")[0],
                          pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
                          description="this instance's name in access-log records and file names and in "
                                      "fleet reports (default: the host name's first label)")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO",
                                                                   description="the log's threshold")
    event_loop: Literal["uvloop", "asyncio"] = Field(default="uvloop", description="uvloop (faster) or the "
                                                     "standard library's asyncio loop")
    quotas: dict[str, Any] = Field(default_factory=dict, description="the quota entries (the seed of the "
                                   "store), their window and rate model, and the quota callback; validated "
                                   "at start, key by key (docs/quotas.md)")
    store: StoreConfig = Field(default_factory=StoreConfig, validate_default=True,
                               description="where quotas live (docs/quotas.md); a relative store.path "
                                           "is under data_dir when set, else beside the configuration file")
    admins: list[str] = Field(default_factory=list, description="principals that may alter quotas "
                                                               "through Sluice (AlterClientQuotas)")
    allow_anonymous_admins: bool = Field(
        default=False, description="start although `admins` lists ANONYMOUS on a listener where a client "
                                   "without credentials is ANONYMOUS (anyone who connects may alter quotas); "
                                   "without it Sluice refuses to start")
    listen_tls: ListenTls | None = Field(default=None, description="terminate TLS from clients")
    principal_from: Literal["none", "client_address"] = Field(
        default="none", description="client_address: an unauthenticated client's principal is its IP")
    proxy_protocol: Literal["off", "v1", "v2", "any"] = Field(
        default="off", description="a PROXY protocol header precedes every client connection")
    sasl: SaslConfig = SaslConfig()
    limits: LimitsConfig = Field(default_factory=LimitsConfig,
                                 description="connection, time, buffer and in-flight limits "
                                             "(docs/operating.md, Limits)")
    storage: StorageConfig | None = Field(
        default=None, description="storage-driven throttling of produce quotas (docs/quotas.md)")
    fleet: FleetConfig | None = Field(
        default=None, description="one budget across every Sluice process naming the same fleet id "
                                  "(docs/fleet.md); needs store.type: kafka")
    workers: int = Field(default=1, ge=1, le=256,
                         description="worker processes sharing every listener (SO_REUSEPORT); auto = CPUs")
    runtime_dir: Path | None = Field(
        default=None, description="a writable directory where the supervisor of `workers` > 1 keeps its "
                                  "private directory (the workers' relay socket); default: the system's "
                                  "temporary directory (TMPDIR, /tmp). Set it on a read-only root "
                                  "(the Kubernetes sample mounts an emptyDir at /run/sluice)")

    @field_validator("listen", mode="before")
    @classmethod
    def _listen(cls, value: Any) -> Any:
        return _host_port(value)

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return os.cpu_count() or 1
        return value

    @model_validator(mode="after")
    def _workers_need_shared_store(self) -> ProxyConfig:
        if self.workers > 1 and self.store.type == "memory":
            raise ValueError(f"workers: {self.workers} needs a store every worker shares (store.type: sqlite "
                             f"or kafka); with store.type: memory each worker would have its own quotas")
        return self

    @model_validator(mode="after")
    def _fleet_needs_shared_store(self) -> ProxyConfig:
        if self.fleet is not None and self.store.type != "kafka":
            raise ValueError(f"fleet: needs the shared quota store (store.type: kafka); with store.type: "
                             f"{self.store.type} every member would have its own quotas")
        return self

    @property
    def anonymous_is_reachable(self) -> bool:
        """Whether a client without credentials gets the principal ANONYMOUS on Sluice's listener:
        unless every client presents a certificate (`listen_tls.client_auth: required`) or an
        unauthenticated client is named by its address (`principal_from: client_address`). SASL
        does not prevent it: a client may send AlterClientQuotas without authenticating first."""
        mutual_tls = self.listen_tls is not None and self.listen_tls.client_auth == "required"
        return not mutual_tls and self.principal_from != "client_address"

    @property
    def anonymous_admin(self) -> bool:
        """`admins` makes every unauthenticated client an admin (see `anonymous_is_reachable`)."""
        return ANONYMOUS in self.admins and self.anonymous_is_reachable

    @model_validator(mode="after")
    def _no_anonymous_admins(self) -> ProxyConfig:
        if self.anonymous_admin and not self.allow_anonymous_admins:
            raise ValueError(
                f"admins: {ANONYMOUS} would let every client that connects without "
                f"credentials alter quotas (the listener has no listen_tls.client_auth: required and no "
                f"principal_from: client_address); name authenticated principals, or set "
                f"allow_anonymous_admins: true to accept it")
        return self

    @field_validator("runtime_dir")
    @classmethod
    def _runtime_dir(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        if not value.is_absolute():
            raise ValueError(f"must be an absolute path, got {value}")
        # the relay socket is <runtime_dir>/sluice-workers-XXXXXXXX/hub.sock; sun_path holds 107 bytes
        if len(os.fsencode(value)) > RUNTIME_DIR_MAX_BYTES:
            raise ValueError(f"{value} is too long for a unix socket path (at most "
                             f"{RUNTIME_DIR_MAX_BYTES} bytes)")
        return value

    @field_validator("proxy_protocol", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false

    @functools.cached_property
    def quotas_section(self) -> QuotasSection:
        """The ``quotas:`` section, typed (`quotas.section`); parsed once per configuration, on
        first use (`load_config` uses it, so a bad section fails at start naming the key)."""
        try:
            return QuotasSection.parse(self.quotas, path="quotas")
        except QuotaConfigError as exc:
            raise ConfigError("invalid configuration:\n  " + str(exc).replace("\n", "\n  ")) from None

    def quota_config(self) -> QuotaConfig:
        """The client quota entries (`quotas_section.entries`)."""
        return self.quotas_section.entries

    def ip_connection_rates(self) -> dict[str, float]:
        """KIP-612's per-IP ``connection_creation_rate``: ``{ip or "<default>": connections/s}``."""
        return dict(self.quotas_section.ip_connection_rates)

    def quota_plugins(self) -> QuotaPlugins:
        """``quotas.scope``, ``quotas.callback`` and ``cluster_entries``, with the callback class
        loaded: called at start and at reload only (validation never runs the user's code)."""
        try:
            return QuotaPlugins.load(self.quotas_section, path="quotas")
        except QuotaConfigError as exc:
            raise ConfigError("invalid configuration:\n  " + str(exc).replace("\n", "\n  ")) from None

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.listen.host

    @property
    def first_broker_port(self) -> int:
        return self.broker_port_base if self.broker_port_base is not None else self.listen.port + 1

    def broker_port(self, node_id: int) -> int:
        if self.listen.port == 0 and self.broker_port_base is None:
            return 0  # ephemeral ports (tests): the broker registry records what the OS chose
        port = self.first_broker_port + node_id
        if not 0 < port <= 65535:
            raise ConfigError(f"broker_port_base: broker {node_id} would need port {port}")
        return port


def _deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """SLUICE_UPSTREAM__BOOTSTRAP=a:1,b:2 -> {"upstream": {"bootstrap": "a:1,b:2"}}."""
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in {"SLUICE_KAFKA_LIBS", "SLUICE_KAFKA_BOOTSTRAP",
                                                        CONNECTIONS_TOKEN_ENV, fastpath.PURE_PYTHON_ENV}:
            continue
        if name.startswith("SLUICE_WORKER_"):  # a worker's role, set by its supervisor (proxy.fleet.local)
            continue
        path = name[len(ENV_PREFIX):].lower().split("__")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def _format_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{key}: {msg}")
    return f"invalid configuration ({source}):\n  " + "\n  ".join(lines)


def load_config(path: Path | None = None, overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> ProxyConfig:
    """File < environment < explicit overrides (the command-line flags)."""
    data: dict[str, Any] = {}
    source = "flags"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: the top level must be a mapping")
        data = loaded
    data = _deep_merge(data, env_overrides(os.environ if environ is None else environ))
    data = _deep_merge(data, overrides or {})
    try:
        data_dir = data.get("data_dir")  # a relative store.path is under it (a read-only config mount)
        config = ProxyConfig.model_validate(
            data, context={"config_dir": path.parent if path is not None else None,
                           "data_dir": Path(data_dir) if isinstance(data_dir, str | Path) else None})
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, source)) from None
    config.quotas_section  # noqa: B018 - the quotas section is parsed (and checked) once, here
    return config

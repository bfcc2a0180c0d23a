"""The proxy process: listeners, shared services, drain on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from proxy.admin.api import QuotaAdminStage
from proxy.config import ConfigError, ProxyConfig
from proxy.fleet.kafka import KafkaExchange
from proxy.fleet.member import FleetClaims, FleetCollector, FleetMember
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, Pipeline, ResponseOutcome, Stage, StageBase
from proxy.ops.access_log import AccessLogStage, AccessLogWriter
from proxy.ops.disk_guard import StorageCollector, StoragePoller
from proxy.ops.http import MetricsEndpoint
from proxy.ops.metrics import AccessLogCollector, QuotaSensorCollector, SluiceMetrics
from proxy.pumps.connection import ClientConnection, ConnectionServices, connection_factory
from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget, schedule_server
from proxy.quota_service import QuotaService
from proxy.settings import auth_settings, listener_settings
from proxy.settings import describe as describe_listener
from proxy.stages.addresses import REWRITTEN_APIS, ResponseRewriter
from proxy.stages.callbacks import ClusterMetadataFeed, ClusterMetadataStage
from proxy.stages.client_software import ClientSoftwareStage
from proxy.stages.quota import DecisionObserver, QuotaManagers, QuotaStage
from quotas.clock import Clock, SystemClock
from quotas.fleet import FleetFallback, FleetView
from quotas.manager import ThrottleDecision

log = logging.getLogger("sluice.server")


class RewriteStage(StageBase):
    """Broker addresses and ApiVersions caps in control-plane responses."""

    def __init__(self, rewriter: ResponseRewriter) -> None:
        self._rewriter = rewriter

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        if entry.api_key not in REWRITTEN_APIS:
            return None
        return self._rewriter.outcome(entry, payload)


class ProxyServer:
    def __init__(self, config: ProxyConfig, stages: Sequence[Stage] = (), clock: Clock | None = None,
                 worker_index: int | None = None) -> None:
        self.config = config
        self.worker_index = worker_index  # one of `--workers N`: listeners shared with SO_REUSEPORT
        self.clock = clock or SystemClock()
        self._extra_stages = list(stages)
        self.registry_metrics = CollectorRegistry()
        self.metrics = SluiceMetrics(self.registry_metrics)
        self.quotas = QuotaManagers(config.quota_config(), self.clock, config.quota_plugins())
        self.cluster_feed = ClusterMetadataFeed(self.quotas.update_cluster_metadata,
                                                lambda: self.quotas.wants_cluster_metadata)
        self.quota_service = QuotaService(config, self.quotas)  # the store; started in start()
        self.storage: StoragePoller | None = None  # storage-driven throttling; started in start()
        if config.storage is not None:
            self.storage = StoragePoller(
                config.storage, self.quotas, [(a.host, a.port) for a in config.upstream.bootstrap],
                config.upstream.tls.context(), config.upstream.connect_timeout_ms / 1000)
            self.registry_metrics.register(StorageCollector(self.storage))
        self.registry_metrics.register(QuotaSensorCollector(self.quotas, self.clock))
        self.fleet = make_fleet(config, self.quotas, self.clock)  # one budget across processes, or None
        if self.fleet is not None:
            self.registry_metrics.register(FleetCollector(self.fleet))
        self.metrics_endpoint: MetricsEndpoint | None = None
        self.access_log = make_access_log(config, worker_index)
        if self.access_log is not None:
            self.registry_metrics.register(AccessLogCollector(self.access_log))
        self._servers: list[asyncio.Server] = []
        self._bootstrap_server: asyncio.Server | None = None
        self.services: ConnectionServices | None = None
        self.registry: BrokerRegistry | None = None
        self.rewriter: ResponseRewriter | None = None
        self.bootstrap_address: tuple[str, int] | None = None
        self._stopped = asyncio.Event()
        self._all_closed = asyncio.Event()
        self._draining = False

    @property
    def connections(self) -> set[ClientConnection]:
        return self.services.connections if self.services else set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        await self.quota_service.start()
        if self.storage is not None:
            await self.storage.start()
        if self.fleet is not None:
            self.fleet.start()

        def start_listener_factory(target: UpstreamTarget) -> object:
            return connection_factory(self._services())(target)

        listener = listener_settings(config)  # client TLS, PROXY protocol (proxy.pumps.listeners)
        self.registry = BrokerRegistry(
            config.listen.host, config.advertised, config.broker_port,
            schedule_server(loop, self._servers, start_listener_factory,  # type: ignore[arg-type]
                            tls=listener.server_ssl), reuse_port=self.worker_index is not None)
        self.rewriter = ResponseRewriter(self.registry, on_failure=self.metrics.rewrite_failures.inc)
        stages: list[Stage] = [ClientSoftwareStage(), RewriteStage(self.rewriter),
                               ClusterMetadataStage(self.cluster_feed,
                                                    lambda: self.quotas.wants_cluster_metadata)]
        if self.access_log is not None:
            self.access_log.start()
            # before the quota stage, to see the broker's own throttle time
            stages.append(AccessLogStage(self.access_log, self.clock))
        stages += [QuotaAdminStage(self.quota_service, config.admins),
                   QuotaStage(self.quotas, self._decision_observer()), *self._extra_stages, self.metrics]
        pipeline = Pipeline(stages)
        self.services = ConnectionServices(
            pipeline=pipeline, registry=self.registry, clock=self.clock,
            bootstrap=[(a.host, a.port) for a in config.upstream.bootstrap],
            upstream_ssl=config.upstream.tls.context(),
            connect_timeout_s=config.upstream.connect_timeout_ms / 1000,
            max_frame_bytes=config.max_frame_bytes, on_close=self._connection_closed,
            on_open=lambda c: self.metrics.connection_opened(c.ctx.listener),
            auth=auth_settings(config, self.registry_metrics), listener=listener)
        self._bootstrap_server = await loop.create_server(
            connection_factory(self.services)(UpstreamTarget(None)), config.listen.host, config.listen.port,
            reuse_address=True, reuse_port=True if self.worker_index is not None else None,
            ssl=listener.server_ssl)
        sock = self._bootstrap_server.sockets[0].getsockname()
        self.bootstrap_address = (sock[0], sock[1])
        log.info("Sluice listening on %s:%d (%s) for %s", sock[0], sock[1], describe_listener(config),
                 ",".join(str(a) for a in config.upstream.bootstrap))
        if config.metrics.port is not None:
            self.metrics_endpoint = MetricsEndpoint(self.registry_metrics, lambda: not self._draining)
            if self.worker_index is None:
                await self.metrics_endpoint.start(config.metrics.host, config.metrics.port)
            else:  # the supervisor serves metrics.port and merges every worker's registry
                await self.metrics_endpoint.start("127.0.0.1", 0)

    def reload(self, config: ProxyConfig) -> None:
        """SIGHUP: YAML quota edits go to the store and to live sensors (see `reconcile_seed`);
        connections and sensor history stay."""
        self.config = config
        self._reload_callback(config)
        self.quota_service.schedule_reload(config)  # logs "configuration reloaded: ..." when done
        if self.storage is not None and config.storage is not None:
            self.storage.reconfigure(config.storage)
        elif (self.storage is None) != (config.storage is None):
            log.warning("storage: adding or removing the section needs a restart")

    def _reload_callback(self, config: ProxyConfig) -> None:
        """A new ``quotas.callback`` swaps the callback on every manager; a bad one keeps the old."""
        try:
            plugins = config.quota_plugins()
            before = self.quotas.plugins.class_path
            changed = not plugins.same_callback(self.quotas.plugins)
            self.quotas.set_plugins(plugins)
        except (ConfigError, ValueError) as exc:
            log.error("reload: quota callback not changed: %s", exc)
            return
        if changed:
            log.info("quota callback: %s -> %s", before, plugins.class_path)

    def _decision_observer(self) -> DecisionObserver:
        if self.fleet is None:
            return self.metrics
        return DecisionObservers(self.metrics, self.fleet.claims)

    def _connection_closed(self, conn: ClientConnection) -> None:
        self.metrics.connection_closed(conn.ctx.listener)
        if self.fleet is not None:
            self.fleet.claims.connection_closed(conn.ctx.connection_id)
        if not self.connections:
            self._all_closed.set()

    def _services(self) -> ConnectionServices:
        assert self.services is not None
        return self.services

    @property
    def bootstrap(self) -> str:
        assert self.bootstrap_address is not None
        return f"{self.config.advertised}:{self.bootstrap_address[1]}"

    async def drain(self, timeout_s: float | None = None) -> None:
        """SIGTERM: stop accepting, let in-flight requests finish, then close everything."""
        timeout = self.config.drain_timeout_ms / 1000 if timeout_s is None else timeout_s
        self._draining = True
        servers = [s for s in [self._bootstrap_server, *self._servers] if s is not None]
        for server in servers:
            server.close()
        connections = list(self.connections)
        log.info("draining %d connection(s), %d request(s) in flight", len(connections),
                 sum(c.in_flight for c in connections))
        for conn in connections:
            conn.begin_drain()
        if self.connections:
            self._all_closed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed.wait(), timeout)
        for conn in list(self.connections):
            conn.close(f"drain timeout with {conn.in_flight} request(s) in flight")
        for server in servers:
            await server.wait_closed()
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.stop()
        if self.access_log is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.access_log.close)
        if self.storage is not None:
            await self.storage.close()
        if self.fleet is not None:
            await self.fleet.close()
        await self.quota_service.close()
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


class DecisionObservers(DecisionObserver):
    """Tell several observers of every violation (metrics, and the fleet's claims)."""

    def __init__(self, *observers: DecisionObserver | FleetClaims) -> None:
        self._observers = observers

    def on_violation(self, ctx: ConnectionContext, decision: ThrottleDecision) -> None:
        for observer in self._observers:
            observer.on_violation(ctx, decision)


def fleet_member_name(config: ProxyConfig) -> str:
    """Unique per process start: a restarted process is a new member (the old one times out)."""
    return f"{config.instance}/p{os.getpid()}"


def make_fleet(config: ProxyConfig, quotas: QuotaManagers, clock: Clock) -> FleetMember | None:
    """The `fleet:` section: this process is a member of the fleet over a Kafka topic."""
    fleet = config.fleet
    if fleet is None:
        return None
    name = fleet_member_name(config)
    bootstrap = fleet.bootstrap or ",".join(str(a) for a in config.upstream.bootstrap)
    exchange = KafkaExchange(bootstrap, fleet.topic, member=name, silence_ms=fleet.timeout_ms,
                             retention_ms=fleet.retention_ms, replication_factor=fleet.replication_factor,
                             kafka_config=fleet.librdkafka_config())
    view = FleetView(fleet.id, name, fleet.timeout_ms, headroom=fleet.headroom,
                     fallback_mode=FleetFallback(fleet.fallback), warmup_ms=2 * fleet.report_interval_ms)
    view.expect_members(fleet.expected_members)
    claims = FleetClaims(clock, ("all", "cluster"), hold_ms=2 * fleet.report_interval_ms)
    return FleetMember(view, exchange, quotas, clock, claims, fleet.report_interval_ms)


def make_access_log(config: ProxyConfig, worker: int | None = None) -> AccessLogWriter | None:
    cfg = config.access_log
    if cfg.dir is None:
        return None
    kafka = None
    if cfg.kafka_bootstrap is not None and cfg.kafka_topic is not None:
        kafka = (cfg.kafka_bootstrap, cfg.kafka_topic)  # the writer process sends there (access_log_files)
    return AccessLogWriter(cfg.dir, config.instance, log_format=cfg.format,
                           rotate_bytes=cfg.rotate_mb * 1024 * 1024, queue_size=cfg.queue_size,
                           kafka=kafka, worker=worker)

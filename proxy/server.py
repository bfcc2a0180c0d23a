"""The proxy process: listeners, shared services, drain on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import cast

from prometheus_client import CollectorRegistry

from protocol import fastpath, log_fastpath
from proxy.admin.api import QuotaAdminStage
from proxy.config import ConfigError, ProxyConfig
from proxy.fleet.exchange import Exchange
from proxy.fleet.kafka import KafkaExchange
from proxy.fleet.local import LocalExchange, hub_path
from proxy.fleet.member import FleetClaims, FleetCollector, FleetMember
from proxy.flow.pipeline import ConnectionContext, Pipeline, Stage
from proxy.ops import access_log as access_log_module
from proxy.ops.access_log import AccessLogStage, AccessLogWriter
from proxy.ops.broker_listeners import BrokerListenerCollector
from proxy.ops.connections import SAMPLE_INTERVAL_MS, BearerToken, ConnectionInventory
from proxy.ops.disk_guard import StorageCollector, StoragePoller
from proxy.ops.headroom import (
    EFFECTIVE_PATH,
    USAGE_PATH,
    HeadroomCollector,
    effective_json,
    usage_json,
    usage_report,
)
from proxy.ops.heap import HeapTrimCollector, HeapTrimmer, glibc_malloc_trim
from proxy.ops.http import Degraded, MetricsEndpoint
from proxy.ops.metrics import (
    AccessLogCollector,
    LimitsCollector,
    QuotaSensorCollector,
    QuotaStoreCollector,
    SluiceMetrics,
)
from proxy.pumps import responses
from proxy.pumps.accepting import Listener
from proxy.pumps.connection import ConnectionServices, connection_factory
from proxy.pumps.limits import ConnectionLimits, LimitSettings
from proxy.pumps.services import ServedConnection
from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget, schedule_server
from proxy.quota_service import QuotaService
from proxy.settings import auth_settings, listener_settings
from proxy.settings import describe as describe_listener
from proxy.stages import addresses as addresses_stage
from proxy.stages import quota as quota_stage
from proxy.stages.addresses import ResponseRewriter, RewriteStage
from proxy.stages.callbacks import ClusterMetadataFeed, ClusterMetadataStage
from proxy.stages.client_software import ClientSoftwareStage
from proxy.stages.connection_stats import ConnectionStatsStage
from proxy.stages.quota import DecisionObserver, QuotaStage
from proxy.stages.topic_resolver import TopicIdResolver
from proxy.stages.topic_usage import TopicNames
from quotas import fastpath as quota_fastpath
from quotas.clock import Clock
from quotas.connection_limits import BufferBudget, ConnectionLimiter
from quotas.engine import QuotaEngine
from quotas.fleet import DEFAULT_HEADROOM, FleetFallback, FleetView
from quotas.manager import ThrottleDecision

log = logging.getLogger("sluice.server")

DRAIN_RECHECK_S = 0.1  # a draining process looks again this often at connections still being set up


class ProxyServer:
    def __init__(self, config: ProxyConfig, stages: Sequence[Stage] = (), clock: Clock | None = None,
                 worker_index: int | None = None) -> None:
        self.config = config
        self.config_at_start = config  # what the parts read only at start were built from
        self.worker_index = worker_index  # one of `--workers N`: listeners shared with SO_REUSEPORT
        self.clock = clock or quota_fastpath.SystemClockImpl()  # SystemClock, or its compiled twin
        self._extra_stages = list(stages)
        self.registry_metrics = CollectorRegistry()
        self.metrics = SluiceMetrics(self.registry_metrics)
        self.quotas = QuotaEngine(config.quota_config(), self.clock, config.quota_plugins(),
                                  config.ip_connection_rates())
        # Produce v13 / Fetch v13+ name topics by id (the quota stage reads them): ids no forwarded
        # Metadata named are asked of the broker by this process itself
        self.topic_names = TopicNames()
        self.topic_ids = TopicIdResolver(
            self.topic_names, [(a.host, a.port) for a in config.upstream.bootstrap],
            config.upstream.tls.context(), timeout_s=config.upstream.connect_timeout_ms / 1000 + 5)
        self.topic_ids.attach()
        self.cluster_feed = ClusterMetadataFeed(self.quotas.update_cluster_metadata,
                                                lambda: self.quotas.wants_cluster_metadata)
        self.quota_service = QuotaService(config, self.quotas)  # the store; started in start()
        self.registry_metrics.register(QuotaStoreCollector(self.quota_service.unreadable))
        self.storage: StoragePoller | None = None  # storage-driven throttling; started in start()
        if config.storage is not None:
            self.storage = StoragePoller(
                config.storage, self.quotas, [(a.host, a.port) for a in config.upstream.bootstrap],
                config.upstream.tls.context(), config.upstream.connect_timeout_ms / 1000)
            self.registry_metrics.register(StorageCollector(self.storage))
        sensor_collector = QuotaSensorCollector(self.quotas, self.clock, config.metrics.max_series_per_metric)
        self.registry_metrics.register(sensor_collector)  # before headroom: it places the sensors
        self.registry_metrics.register(HeadroomCollector(self.quotas, self.clock, sensor_collector.cap))
        self.fleet = make_fleet(config, self.quotas, self.clock, worker_index)  # one budget across processes
        if self.fleet is not None:
            self.registry_metrics.register(FleetCollector(self.fleet, config.metrics.max_series_per_metric))
        self.metrics_endpoint: MetricsEndpoint | None = None
        self.inventory: ConnectionInventory | None = None  # GET /connections, when enabled
        self._sampler: asyncio.Task[None] | None = None
        self.access_log = make_access_log(config, worker_index)
        if self.access_log is not None:
            self.registry_metrics.register(AccessLogCollector(self.access_log))
        self.limits = make_limits(config, self.clock, self.quotas)
        self.registry_metrics.register(LimitsCollector(self.limits, self.quotas.ip_connection_rates))
        self.heap = HeapTrimmer(config.heap_trim_interval_ms / 1000, glibc_malloc_trim())
        self.registry_metrics.register(HeapTrimCollector(self.heap))
        self._heap_task: asyncio.Task[None] | None = None
        self._listeners: list[Listener] = []  # the bootstrap listener and one per broker
        self.services: ConnectionServices | None = None
        self.registry: BrokerRegistry | None = None
        self.rewriter: ResponseRewriter | None = None
        self.bootstrap_address: tuple[str, int] | None = None
        self._stopped = asyncio.Event()
        self._closed_one = asyncio.Event()  # a connection closed (a drain looks again)
        self._draining = False

    @property
    def connections(self) -> set[ServedConnection]:
        return self.services.connections if self.services else set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        await self.quota_service.start()
        if self.storage is not None:
            await self.storage.start()
        if self.fleet is not None:
            await self.fleet.start()  # joins before the listeners open

        def start_listener_factory(target: UpstreamTarget) -> object:
            return connection_factory(self._services())(target)

        listener = listener_settings(config)  # client TLS, PROXY protocol (proxy.pumps.listeners)
        # a missing PROXY header is a handshake timeout: counted, logged once
        listener = dataclasses.replace(listener, on_header_timeout=self.limits.log.hit)
        self.registry = BrokerRegistry(
            config.listen.host, config.advertised, config.broker_port,
            schedule_server(loop, self._listeners, start_listener_factory,  # type: ignore[arg-type]
                            tls=listener.server_ssl,
                            tls_handshake_timeout_s=listener.server_ssl_handshake_timeout),
            reuse_port=self.worker_index is not None)
        self.registry_metrics.register(BrokerListenerCollector(self.registry))  # unbindable ports
        self.rewriter = ResponseRewriter(self.registry, on_failure=self.metrics.rewrite_failures.inc)
        stages: list[Stage] = [ClientSoftwareStage(), RewriteStage(self.rewriter),
                               ClusterMetadataStage(self.cluster_feed,
                                                    lambda: self.quotas.wants_cluster_metadata)]
        if self.access_log is not None:
            self.access_log.start()
            stages.append(AccessLogStage(self.access_log, self.clock))
        stages += [QuotaAdminStage(self.quota_service, config.admins),
                   QuotaStage(self.quotas, self._decision_observer(), self.topic_names),
                   *self._extra_stages, cast(Stage, self.metrics.requests)]  # /metrics' counters
        if config.connections_endpoint.enabled:
            stages.append(ConnectionStatsStage())
            self.inventory = ConnectionInventory(lambda: self.connections, self.clock, self.worker_index,
                                                 config.connections_endpoint.window_ms)
            self._sampler = loop.create_task(self._sample_connections(self.inventory))
        self._heap_task = loop.create_task(self.heap.run())
        pipeline = Pipeline(stages)
        self.services = ConnectionServices(
            pipeline=pipeline, registry=self.registry, clock=self.clock,
            bootstrap=[(a.host, a.port) for a in config.upstream.bootstrap],
            upstream_ssl=config.upstream.tls.context(),
            connect_timeout_s=config.upstream.connect_timeout_ms / 1000,
            max_frame_bytes=config.max_frame_bytes, on_close=self._connection_closed,
            on_open=lambda c: self.metrics.connection_opened(c.ctx.listener),
            auth=auth_settings(config, self.registry_metrics), listener=listener, limits=self.limits)
        bootstrap = Listener(connection_factory(self.services)(UpstreamTarget(None)), listener.server_ssl,
                             listener.server_ssl_handshake_timeout)
        bootstrap.server = await loop.create_server(
            bootstrap.factory, config.listen.host, config.listen.port,
            reuse_address=True, reuse_port=True if self.worker_index is not None else None,
            ssl=bootstrap.tls, ssl_handshake_timeout=bootstrap.tls_handshake_timeout_s)
        self._listeners.insert(0, bootstrap)
        sock = bootstrap.server.sockets[0].getsockname()
        self.bootstrap_address = (sock[0], sock[1])
        log.info("Sluice listening on %s:%d (%s) for %s", sock[0], sock[1], describe_listener(config),
                 ",".join(str(a) for a in config.upstream.bootstrap))
        log.info("data plane: %s; quota stats: %s", fastpath.describe(), quota_fastpath.describe())
        log.info("connection orchestration: %s; quota stage hooks: %s; rewrite stage hook: %s",
                 responses.describe(), quota_stage.describe(), addresses_stage.describe())
        if self.access_log is not None:
            log.info("access-log walks: %s; access-log capture: %s", log_fastpath.describe(),
                     access_log_module.describe())
        if config.metrics.port is not None:
            inventory, token = self.inventory, BearerToken.configured(config.connections_endpoint)
            degraded: list[Degraded] = [self.quota_service.problems]
            if self.access_log is not None:
                degraded.append(self.access_log.problems)
            self.metrics_endpoint = MetricsEndpoint.for_registry(
                self.registry_metrics, lambda: not self._draining, {USAGE_PATH: self._usage},
                connections=None if inventory is None else _async(inventory.render), token=token,
                degraded=degraded, query_routes={EFFECTIVE_PATH: self._effective})
            if self.worker_index is None:
                await self.metrics_endpoint.start(config.metrics.host, config.metrics.port)
            else:  # the supervisor serves metrics.port and merges every worker's registry
                await self.metrics_endpoint.start("127.0.0.1", 0)
            if inventory is not None:
                log.info("connection inventory on http://%s:%d/connections (%s)", config.metrics.host,
                         config.metrics.port, "bearer token required" if token is not None else "NO token: "
                         "anyone who reaches the metrics port may list connections")
        elif self.inventory is not None:
            log.warning("connections_endpoint.enabled needs metrics.port: there is no /connections")

    async def _sample_connections(self, inventory: ConnectionInventory) -> None:
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_MS / 1000)
            inventory.tick()

    async def _usage(self) -> bytes:
        """`GET /quotas/usage`: rate, limit in force and headroom of every live sensor."""
        return usage_json(usage_report(self.quotas, self.clock))

    async def _effective(self, args: Mapping[str, str]) -> bytes:
        """`GET /quotas/effective?user=U&client_id=C[&topic=T][&broker=B]`: every limit in force for
        the caller, from the engine (`QuotaEngine.effective`), with what it is made of."""
        return effective_json(self.quotas, args)

    def reload(self, config: ProxyConfig) -> None:
        """SIGHUP: YAML quota edits go to the store and to live sensors (see `reconcile_seed`);
        connections and sensor history stay."""
        self.config = config
        self._reload_callback(config)
        self._reload_ip_rates(config)
        self.quota_service.schedule_reload(config)  # logs "configuration reloaded: ..." when done
        if self.storage is not None and config.storage is not None:
            self.storage.reconfigure(config.storage)
        elif (self.storage is None) != (config.storage is None):
            log.warning("storage: adding or removing the section needs a restart")

    def _reload_ip_rates(self, config: ProxyConfig) -> None:
        """KIP-612's per-IP quotas are dynamic in Kafka: new bounds apply at once, rates stay.
        (The `limits:` section is read at start only.)"""
        rates = self.quotas.ip_connection_rates
        new = config.ip_connection_rates()
        if new != rates.configured():
            self.quotas.set_ip_connection_rates(new)
            log.info("connection_creation_rate per ip: %s", ", ".join(f"{ip}={rate:g}/s" for ip, rate
                                                                    in sorted(new.items())) or "none")
        if config.limits != self.config_at_start.limits:
            log.warning("limits: changes need a restart (kept: %s)", self.config_at_start.limits)

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

    def _connection_closed(self, conn: ServedConnection) -> None:
        self.metrics.connection_closed(conn.ctx.listener)
        if self.fleet is not None:
            self.fleet.claims.connection_closed(conn.ctx.connection_id)
        self._closed_one.set()

    def _services(self) -> ConnectionServices:
        assert self.services is not None
        return self.services

    @property
    def bootstrap(self) -> str:
        assert self.bootstrap_address is not None
        return f"{self.config.advertised}:{self.bootstrap_address[1]}"

    async def drain(self, timeout_s: float | None = None) -> None:
        """SIGTERM: stop accepting, answer what every client has sent, then close everything.

        `/healthz` answers 503 from here on. The listeners stop accepting, but what the kernel
        had already accepted for them is served (`proxy.pumps.accepting`). Every connection,
        open or still opening (its PROXY header or TLS handshake not done), answers the requests
        its client sent and closes between requests (`ClientConnection.begin_drain`). What is
        still open after `drain_timeout_ms` is closed, and said so in the log."""
        loop = asyncio.get_running_loop()
        timeout = self.config.drain_timeout_ms / 1000 if timeout_s is None else timeout_s
        deadline = loop.time() + timeout
        self._draining = True
        services = self._services()
        services.draining = True  # before the queued connections are accepted: they drain too
        if self.registry is not None:
            self.registry.stop_listening()  # a Metadata answered while draining opens no listener
        queued = [(listener, listener.stop()) for listener in self._listeners]
        connections = list(self.connections)
        log.info("draining %d connection(s), %d request(s) in flight; %d connection(s) opening, "
                 "%d taken from the accept queues", len(connections), sum(c.in_flight for c in connections),
                 sum(o.pending for o in services.opening), sum(len(socks) for _, socks in queued))
        starting = [task for listener, socks in queued for task in listener.serve_accepted(socks)]
        for conn in connections:
            conn.begin_drain()

        def busy() -> bool:
            return bool(self.connections) or any(not t.done() for t in starting) or any(
                o.pending for o in services.opening)

        while busy() and (left := deadline - loop.time()) > 0:
            self._closed_one.clear()
            with contextlib.suppress(TimeoutError):  # an opening one may settle without a close
                await asyncio.wait_for(self._closed_one.wait(), min(left, DRAIN_RECHECK_S))
        for task in starting:
            task.cancel()
        for opening in list(services.opening):
            if opening.pending:
                opening.abort("drain timeout before the connection was set up")
        for conn in list(self.connections):
            conn.close(f"drain timeout with {conn.in_flight} request(s) in flight")
        for listener in self._listeners:
            if not listener.stopped:  # scheduled by a Metadata read just before the drain began
                for sock in listener.stop():
                    sock.close()
            if listener.server is not None:
                await listener.server.wait_closed()
        if self._sampler is not None:
            self._sampler.cancel()
        if self._heap_task is not None:
            self._heap_task.cancel()
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.stop()
        if self.access_log is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.access_log.close)
        if self.storage is not None:
            await self.storage.close()
        if self.fleet is not None:
            await self.fleet.close()
        await self.topic_ids.close()
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


def _async(render: Callable[[], bytes]) -> Callable[[], Awaitable[bytes]]:
    async def call() -> bytes:
        return render()

    return call


def fleet_member_name(config: ProxyConfig, worker_index: int | None) -> str:
    """Unique per process start: a restarted process is a new member (the old one times out)."""
    worker = "" if worker_index is None else f"/w{worker_index}"
    return f"{config.instance}{worker}/p{os.getpid()}"


def make_fleet(config: ProxyConfig, quotas: QuotaEngine, clock: Clock,
               worker_index: int | None = None) -> FleetMember | None:
    """One budget across processes. With `fleet:` this process (each worker of each instance) is a
    member over a Kafka topic; without it, the workers of one instance (``--workers N``) are the
    members of a local fleet relayed by their supervisor; a lone process has no fleet."""
    fleet = config.fleet
    name = fleet_member_name(config, worker_index)
    exchange: Exchange
    if fleet is not None:
        bootstrap = fleet.bootstrap or ",".join(str(a) for a in config.upstream.bootstrap)
        exchange = KafkaExchange(bootstrap, fleet.topic, member=name, silence_ms=fleet.timeout_ms,
                                 retention_ms=fleet.retention_ms, replication_factor=fleet.replication_factor,
                                 kafka_config=fleet.librdkafka_config())
        fleet_id, interval_ms, timeout_ms = fleet.id, fleet.report_interval_ms, fleet.timeout_ms
        headroom, fallback, expected = fleet.headroom, FleetFallback(fleet.fallback), fleet.expected_members
    else:
        hub = hub_path()
        if hub is None:
            return None
        exchange = LocalExchange(hub)
        fleet_id, interval_ms = f"{config.instance}-workers", LOCAL_REPORT_INTERVAL_MS
        timeout_ms, headroom, fallback = 3 * interval_ms, DEFAULT_HEADROOM, FleetFallback.SPLIT
        expected = config.workers
    # a newcomer's clients reconnect once it listens (within a client's reconnect backoff): room is
    # made for it for two member timeouts (quotas.fleet, "Making room for a newcomer")
    view = FleetView(fleet_id, name, timeout_ms, headroom=headroom, fallback_mode=fallback,
                     warmup_ms=2 * interval_ms, join_grace_ms=2 * timeout_ms)
    view.expect_members(expected)
    claims = FleetClaims(clock, ("all", "cluster"), hold_ms=2 * interval_ms)
    return FleetMember(view, exchange, quotas, clock, claims, interval_ms)


def make_limits(config: ProxyConfig, clock: Clock, engine: QuotaEngine) -> ConnectionLimits:
    """The `limits:` section, for every connection; the ip entries of `quotas:` (KIP-612's
    creation rate, measured over the quota window) are the engine's `new_connection`."""
    cfg = config.limits
    settings = LimitSettings(handshake_timeout_ms=cfg.handshake_timeout_ms,
                             idle_timeout_ms=cfg.idle_timeout_ms,
                             max_buffered_bytes_per_connection=cfg.max_buffered_bytes_per_connection,
                             max_in_flight_requests_per_connection=cfg.max_in_flight_requests_per_connection)
    limiter = ConnectionLimiter(cfg.max_connections, cfg.max_connections_per_ip, engine.new_connection,
                                cfg.max_connections_per_ip_overrides)
    return ConnectionLimits(settings, limiter, BufferBudget(cfg.max_buffered_bytes_total), clock)


#: Workers of one instance without `fleet:` report to each other this often over the local hub.
LOCAL_REPORT_INTERVAL_MS = 250


def make_access_log(config: ProxyConfig, worker: int | None = None) -> AccessLogWriter | None:
    cfg = config.access_log
    if cfg.dir is None:
        return None
    kafka = None
    if cfg.kafka_bootstrap is not None and cfg.kafka_topic is not None:  # the writer process sends there
        settings = {k: v.get_secret_value() for k, v in cfg.kafka_config.items()}
        kafka = (cfg.kafka_bootstrap, cfg.kafka_topic, settings)
    return AccessLogWriter(cfg.dir, config.instance, log_format=cfg.format,
                           rotate_bytes=cfg.rotate_mb * 1024 * 1024, queue_size=cfg.queue_size,
                           kafka=kafka, worker=worker)

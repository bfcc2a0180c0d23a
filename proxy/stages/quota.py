"""Quota enforcement on the wire, the way a Kafka broker does it (KIP-219).

What is recorded, and when:

- `producer_byte_rate`: the Produce request's size (header + body, without the 4-byte length
  prefix, as Kafka's `request.sizeInBytes`), when the request arrives. A throttle mutes the client
  at once; the broker's response then carries the throttle time. acks=0 produces get no response,
  so for them the mute is the whole enforcement.
- `consumer_byte_rate`: the Fetch response's size, when it comes back from the broker. When the
  client is throttled (by bytes or requests) the bytes are un-recorded and the client gets an
  empty response instead (error 0, no records, the broker's fetch session id kept) and fetches the
  same offsets again after the delay: nothing is lost.
- `consumer_byte_rate` for ShareFetch (KIP-932), as the broker charges it
  (`KafkaApis.processShareFetchResponse`): the response's size, recorded when it comes back, and
  max_bytes capped at the quota's window like a Fetch. Unlike Fetch it is never emptied: by the
  time the response exists the broker has *acquired* its records for this consumer (a throttled
  broker sends an empty response and leaves them locked until the acquisition lock times out,
  with their delivery count raised). Sluice delivers them, keeps the bytes recorded, writes the
  throttle time and mutes the channel: the next share fetch waits for the delay, so the rate
  holds, and no record is lost, redelivered or acknowledged twice because Sluice throttled.
  ShareAcknowledge carries no data: it counts for `request_rate` and `request_percentage`.
- `request_rate` (Sluice's own, requests per second): every request but ApiVersions and SASL, when
  it arrives.
- `request_percentage`: what a proxy can measure of broker time. Kafka meters request-handler
  thread time; Sluice meters the upstream round trip of each request (from forwarding to the
  response), as percent of one thread, recorded when the response arrives. Fetch and ShareFetch
  are left out: their round trip is mostly a long-poll wait that costs the broker nothing. The round trip also
  includes network time and queueing in the broker, so it overstates thread time under load;
  treat the values as relative, and set them from observed usage.

The response carries max(broker's throttle_time_ms, Sluice's); the channel stays muted until the
response has been written and the delay has passed. In shadow mode the decision is computed,
counted and logged, and nothing is throttled.

Quotas are per broker, as in Kafka: a client that talks to three brokers through Sluice may use
three times its quota. Each broker listener (and the bootstrap listener) has its own sensors.
With ``quotas.scope: cluster`` one manager serves every listener: one budget per entity across all
brokers behind this Sluice (see `proxy.stages.callbacks` for that and the pluggable callback).
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from protocol.apis import ApiKey, api_name, response_header_version
from protocol.errors import ProtocolError
from protocol.fastpath import patch_throttle_time
from protocol.fetch import cap_fetch_max_bytes, empty_fetch_response
from protocol.headers import RequestHeader, response_body_offset
from protocol.share import cap_share_fetch_max_bytes
from proxy.flow.inflight import InFlight, QuotaNote
from proxy.flow.pipeline import ConnectionContext, Forward, RequestOutcome, ResponseOutcome, StageBase
from proxy.stages.callbacks import QuotaPlugins
from proxy.stages.topic_usage import TopicNames, TopicUsage, fetch_usage, produce_usage
from quotas.callback import DefaultQuotaCallback, TopicQuotaCallback, topic_identity
from quotas.clock import Clock
from quotas.cluster import ClusterView
from quotas.config import QuotaConfig
from quotas.entity import ClientIdentity, QuotaKind, SensorKey
from quotas.manager import QuotaManager, ThrottleDecision
from quotas.storage import with_base_rate

log = logging.getLogger("sluice.quotas")

_NOT_REQUEST_RATED = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
_FETCH_METERED = frozenset({ApiKey.FETCH, ApiKey.SHARE_FETCH})  # charged to consumer_byte_rate
_MAX_TRACKED_CALLERS = 10_000
_TOPIC_FETCH_KINDS = frozenset({QuotaKind.FETCH, QuotaKind.CONSUMER_RECORD_RATE, QuotaKind.REQUEST_RATE})

@dataclass(frozen=True, slots=True)
class Scope:
    """Which broker's sensors a connection uses: a broker id, or None for the bootstrap listener."""

    broker_id: int | None


class QuotaManagers:
    """One `QuotaManager` per broker behind Sluice (Kafka's quotas are per broker), or one for
    all of them (``scope: cluster``), each with a callback from `plugins`."""

    def __init__(self, config: QuotaConfig, clock: Clock, plugins: QuotaPlugins | None = None) -> None:
        self._config = config
        self._clock = clock
        self._managers: dict[int | None, QuotaManager] = {}
        # the fleet's standby share and the groups other members use, by scope label
        # (`FleetMember`): a manager created between two report rounds (a client's first request
        # to a broker) starts with them, not with the whole quota and a fresh sensor's credit
        self.fleet_standby_share = 1.0
        self.fleet_busy: Mapping[str, frozenset[SensorKey]] = {}
        self.plugins = QuotaPlugins() if plugins is None else plugins
        self.cluster = ClusterView()
        self._scales: dict[QuotaKind, float] = {}  # storage throttle factors, for new managers too
        self._base_rate: float | None = None  # storage applies_to: all
        # ``cluster_entries`` (the draft's `bps`): one more manager, for every broker at once
        self.cluster_wide: QuotaManager | None = None
        self._cluster_wide_kinds: frozenset[QuotaKind] = frozenset()
        self._set_cluster_entries(self.plugins.cluster_entries)
        # topic and topic-prefix entries (issue 13): one more manager per broker (or one for all
        # with scope: cluster), asked per topic of a request, beside the client's own
        self._topic_managers: dict[int | None, QuotaManager] = {}
        self.topic_names = TopicNames()
        self.topic_kinds: frozenset[QuotaKind] = frozenset()
        self.active_kinds = self._kinds()  # nothing is recorded for a kind with no quota

    @property
    def scope(self) -> str:
        return self.plugins.scope

    def for_broker(self, broker_id: int | None) -> QuotaManager:
        if self.plugins.scope == "cluster":
            broker_id = None
        manager = self._managers.get(broker_id)
        if manager is None:
            factory = self.plugins.factory
            manager = QuotaManager(self._effective(), self._clock, sticky_quotas_enabled=False,
                                   callback=None if factory is None else factory(broker_id))
            manager.update_cluster_metadata(self.cluster)
            for kind, factor in self._scales.items():
                manager.set_limit_scale(kind, factor)
            if self.fleet_standby_share != 1.0 or self.fleet_busy:
                label = "all" if self.plugins.scope == "cluster" else \
                    "bootstrap" if broker_id is None else str(broker_id)
                manager.set_shares({}, self.fleet_standby_share, self.fleet_busy.get(label, frozenset()))
            self._managers[broker_id] = manager
        return manager

    def for_topics(self, broker_id: int | None) -> QuotaManager | None:
        """The topic quotas' manager for `broker_id`, or None when no topic entry is configured."""
        if not self.topic_kinds:
            return None
        if self.plugins.scope == "cluster":
            broker_id = None
        manager = self._topic_managers.get(broker_id)
        if manager is None:
            manager = QuotaManager(self._config, self._clock,
                                   callback=TopicQuotaCallback(broker_id=broker_id))
            for kind, factor in self._scales.items():
                manager.set_limit_scale(kind, factor)
            self._topic_managers[broker_id] = manager
        return manager

    @property
    def needs_produce_usage(self) -> bool:
        """A Produce request must be read per topic: records/s or topic quotas are configured."""
        return QuotaKind.PRODUCER_RECORD_RATE in self.active_kinds or bool(self.topic_kinds)

    @property
    def needs_fetch_usage(self) -> bool:
        """A Fetch response must be read whole, per topic: records/s or topic quotas are configured."""
        return (QuotaKind.CONSUMER_RECORD_RATE in self.active_kinds
                or bool(self.topic_kinds & _TOPIC_FETCH_KINDS))

    def topic_labelled(self) -> list[tuple[str, QuotaManager]]:
        """The topic managers with their `broker` metrics label (as `labelled`)."""
        bootstrap = "all" if self.plugins.scope == "cluster" else "bootstrap"
        return [(bootstrap if b is None else str(b), m) for b, m in self._topic_managers.items()]

    def for_request(self, broker_id: int | None) -> tuple[tuple[QuotaManager, frozenset[QuotaKind]], ...]:
        """The managers a request through `broker_id` is counted in, each with the kinds to record:
        the broker's (or the one of ``scope: cluster``), and the one of ``cluster_entries``."""
        manager = self.for_broker(broker_id)
        if self.cluster_wide is None:
            return ((manager, self.active_kinds),)
        return ((manager, self.active_kinds), (self.cluster_wide, self._cluster_wide_kinds))

    def _set_cluster_entries(self, entries: QuotaConfig | None) -> None:
        if entries is None or not len(entries):
            self.cluster_wide = None
            self._cluster_wide_kinds = frozenset()
            return
        if self.cluster_wide is None:
            self.cluster_wide = QuotaManager(entries, self._clock, sticky_quotas_enabled=False)
            for kind, factor in self._scales.items():
                self.cluster_wide.set_limit_scale(kind, factor)
        else:
            self.cluster_wide.update_config(entries)
        self._cluster_wide_kinds = entries.kinds()

    def set_limit_scale(self, kind: QuotaKind, factor: float) -> None:
        """Scale every limit of `kind` on every broker (`QuotaManager.set_limit_scale`)."""
        before = self._effective()
        self._scales[kind] = factor
        for manager in (*self._managers.values(), *self._topic_managers.values()):
            manager.set_limit_scale(kind, factor)
        if self.cluster_wide is not None:
            self.cluster_wide.set_limit_scale(kind, factor)
        if self._effective() != before:
            self._push()

    def set_storage_base_rate(self, rate: float | None) -> None:
        """Storage ``applies_to: all``: while the produce factor is below 1, clients with no
        produce quota get `rate` x factor (`quotas.storage.with_base_rate`); None: only clients
        with a quota are scaled."""
        before = self._effective()
        self._base_rate = rate
        if self._effective() != before:
            self._push()

    def _effective(self, config: QuotaConfig | None = None) -> QuotaConfig:
        """The configured quotas, plus the storage base rate while it applies."""
        config = self._config if config is None else config
        if self._base_rate is None or self._scales.get(QuotaKind.PRODUCE, 1.0) >= 1.0:
            return config
        return with_base_rate(config, self._base_rate)

    def _push(self) -> None:
        effective = self._effective()
        for manager in self._managers.values():
            manager.update_config(effective)
        self.active_kinds = self._kinds()

    @property
    def config(self) -> QuotaConfig:
        return self._config

    def update_config(self, config: QuotaConfig) -> None:
        """Apply new quotas to live sensors, keeping their history (Kafka's quota update)."""
        effective = self._effective(config)
        for manager in self._managers.values():
            manager.update_config(effective)
        for manager in self._topic_managers.values():
            manager.update_config(config)
        self._config = config
        self.active_kinds = self._kinds()

    @property
    def wants_cluster_metadata(self) -> bool:
        return self._wants_metadata

    def update_cluster_metadata(self, cluster: ClusterView) -> None:
        """Sluice saw the cluster change (`proxy.stages.callbacks.ClusterMetadataFeed`)."""
        self.cluster = cluster
        for manager in self._managers.values():
            manager.update_cluster_metadata(cluster)

    def set_plugins(self, plugins: QuotaPlugins) -> None:
        """SIGHUP: a new callback class or config replaces the callback of every manager
        (`QuotaManager.set_callback` says what history survives). The scope is fixed at start."""
        if plugins.scope != self.plugins.scope:
            raise ValueError(f"quotas.scope cannot change at runtime ({self.plugins.scope} -> "
                             f"{plugins.scope}); restart to apply")
        self._set_cluster_entries(plugins.cluster_entries)
        if plugins.same_callback(self.plugins):
            self.active_kinds = self._kinds()
            return
        self.plugins = plugins
        for broker_id, manager in self._managers.items():
            factory = plugins.factory
            manager.set_callback(DefaultQuotaCallback(sticky_levels=False) if factory is None
                                 else factory(broker_id))
            manager.update_cluster_metadata(self.cluster)
        self.active_kinds = self._kinds()

    def _kinds(self) -> frozenset[QuotaKind]:
        self.topic_kinds = frozenset(k for e in self._config if e.entity.is_topic for k in e.values)
        if self.plugins.factory is None:
            self._wants_metadata = False
            return self._effective().kinds() | self._cluster_wide_kinds
        probe = self.plugins.factory(None)
        self._wants_metadata = bool(getattr(probe, "wants_cluster_metadata", False))
        extra = getattr(probe, "quota_kinds", None)
        probe.close()
        # a callback that does not say which kinds it limits may limit any
        return (self._effective().kinds() | self._cluster_wide_kinds
                | (frozenset(QuotaKind) if extra is None else frozenset(extra)))

    def items(self) -> Iterator[tuple[int | None, QuotaManager]]:
        return iter(list(self._managers.items()))

    def labelled(self) -> list[tuple[str, QuotaManager]]:
        """Every manager with its `broker` metrics label: a broker id, ``bootstrap``, ``all``
        (``scope: cluster``) or ``cluster`` (``cluster_entries``)."""
        bootstrap = "all" if self.plugins.scope == "cluster" else "bootstrap"
        out = [(bootstrap if b is None else str(b), m) for b, m in self._managers.items()]
        if self.cluster_wide is not None:
            out.append(("cluster", self.cluster_wide))
        return out


class QuotaStage(StageBase):
    def __init__(self, managers: QuotaManagers, observer: DecisionObserver | None = None) -> None:
        self._managers = managers
        self._observer = observer
        # consumer_record_rate: the bytes per record of each caller's last fetch, to cap a fetch's
        # max_bytes at the records the quota allows (as KAFKA-9677 caps bytes); bounded, reset when full
        self._bytes_per_record: dict[ClientIdentity, float] = {}

    # ------------------------------------------------------------------ requests

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None:
        kinds = self._managers.active_kinds
        if not kinds:
            return None  # no quota configured: nothing to record, nothing to remember
        identity = ClientIdentity.of(ctx.principal, header.client_id)
        decisions: list[ThrottleDecision] = []
        forward: bytes | None = None
        api_key = header.api_key
        managers = self._managers
        usage: TopicUsage | None = None
        if api_key == ApiKey.PRODUCE and managers.needs_produce_usage:
            usage = produce_usage(payload, header, managers.topic_names)
        for manager, kinds in managers.for_request(ctx.broker_id):
            if QuotaKind.REQUEST_RATE in kinds and api_key not in _NOT_REQUEST_RATED:
                decisions.append(manager.record_and_check(QuotaKind.REQUEST_RATE, identity, 1.0))
            if api_key == ApiKey.PRODUCE and QuotaKind.PRODUCE in kinds:
                decisions.append(manager.record_and_check(QuotaKind.PRODUCE, identity, len(payload)))
            if usage is not None and QuotaKind.PRODUCER_RECORD_RATE in kinds:
                decisions.append(manager.record_and_check(QuotaKind.PRODUCER_RECORD_RATE, identity,
                                                          usage.records))
            if api_key in _FETCH_METERED and QuotaKind.FETCH in kinds:
                # the tighter cap wins: each manager caps what the previous one forwarded
                capped = self._cap_fetch(manager, identity, header, payload if forward is None else forward)
                forward = capped if capped is not None else forward
            if (api_key == ApiKey.FETCH and QuotaKind.CONSUMER_RECORD_RATE in kinds
                    and (per_record := self._bytes_per_record.get(identity)) is not None):
                # without it a fetch larger than the window allows would be emptied again and again
                capped = self._cap_fetch(manager, identity, header, payload if forward is None else forward,
                                         QuotaKind.CONSUMER_RECORD_RATE, per_record)
                forward = capped if capped is not None else forward
        if usage is not None and (topics := managers.for_topics(ctx.broker_id)) is not None:
            # every topic of the request is charged; the largest delay any of them needs wins
            self._charge_topics(topics, usage, QuotaKind.PRODUCE, QuotaKind.PRODUCER_RECORD_RATE, decisions)
        if api_key == ApiKey.FETCH and managers.needs_fetch_usage:
            entry.whole_response = True  # topics and records are read from the whole response
        enforced = self._observe(ctx, decisions)
        entry.quota = QuotaNote(identity, decisions, enforced)
        if forward is None and enforced == 0:
            return None
        return Forward(forward, enforced)

    def _charge_topics(self, topics: QuotaManager, usage: TopicUsage, bytes_kind: QuotaKind,
                       records_kind: QuotaKind, decisions: list[ThrottleDecision]) -> None:
        """Record a request's bytes, records and the request itself on each of its topics, for the
        kinds some topic entry limits."""
        kinds = self._managers.topic_kinds
        for topic, size in usage.bytes_by_topic.items():
            who = topic_identity(topic)
            if bytes_kind in kinds:
                decisions.append(topics.record_and_check(bytes_kind, who, size))
            if records_kind in kinds:
                records = usage.records_by_topic.get(topic, 0)
                decisions.append(topics.record_and_check(records_kind, who, records))
            if QuotaKind.REQUEST_RATE in kinds:
                decisions.append(topics.record_and_check(QuotaKind.REQUEST_RATE, who, 1.0))

    @staticmethod
    def _cap_fetch(manager: QuotaManager, identity: ClientIdentity, header: RequestHeader, payload: bytes,
                   kind: QuotaKind = QuotaKind.FETCH, bytes_per_unit: float = 1.0) -> bytes | None:
        """KAFKA-9677: no fetch may ask for more than the quota allows in one window.

        Records (`consumer_record_rate`) are turned into bytes with the caller's last bytes per
        record, and capped at one sample window of quota, not N-1: a fetch as large as the whole
        window is admitted only once the window is empty, which holds a consumer well under its
        quota (measured: 0.6 x); one window's worth lets it move at the quota."""
        cap = manager.max_value_in_quota_window(kind, identity)
        if kind is not QuotaKind.FETCH:
            bound = manager.check(kind, identity).bound
            if bound is not None:
                cap = min(cap, bound * manager.rate_config.window_ms / 1000.0)
        cap *= bytes_per_unit
        if math.isinf(cap):
            return None
        try:
            if header.api_key == ApiKey.SHARE_FETCH:  # as the broker caps a share fetch
                capped = cap_share_fetch_max_bytes(payload, header, int(cap))
            else:
                capped = cap_fetch_max_bytes(payload, header, int(cap))
        except ProtocolError as exc:
            log.warning("cannot cap %s v%d max_bytes: %s", api_name(header.api_key), header.api_version, exc)
            return None
        return None if capped is payload else capped

    # ------------------------------------------------------------------ responses

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        note = entry.quota
        if note is None:
            return None
        identity = note.identity
        managers = self._managers.for_request(ctx.broker_id)
        decisions = note.decisions
        earlier_ms = note.enforced_ms
        new_ms = 0
        if entry.api_key == ApiKey.FETCH:
            size = entry.upstream_response_bytes  # payload may be only the head of a streamed response
            usage = None
            if self._managers.needs_fetch_usage and len(payload) == size:
                usage = fetch_usage(payload, entry.api_version, self._managers.topic_names)
            # QuotaManager.admit_fetch decides: the windowed rate keeps Kafka's rule (a throttled
            # fetch is answered empty and un-recorded); under a token bucket a fetch is delivered
            # while the credits are not negative and its debt throttles what follows.
            delivered_ms = 0   # bucket throttles after a delivered fetch: they do not empty it
            recorded: list[QuotaManager] = []
            for manager, kinds in managers:
                if QuotaKind.FETCH in kinds:
                    admission = manager.admit_fetch(identity, size)
                    decisions.append(admission.decision)
                    if admission.recorded:
                        recorded.append(manager)
                    fetch_ms = self._observe(ctx, [admission.decision])
                    if admission.throttle_is_debt:
                        delivered_ms = max(delivered_ms, fetch_ms)
                    else:
                        new_ms = max(new_ms, fetch_ms)
                if usage is not None and QuotaKind.CONSUMER_RECORD_RATE in kinds:
                    by_records = manager.record_and_check(QuotaKind.CONSUMER_RECORD_RATE, identity,
                                                          usage.records)
                    decisions.append(by_records)
                    new_ms = max(new_ms, self._observe(ctx, [by_records]))
            if (usage is not None and usage.records > 0
                    and QuotaKind.CONSUMER_RECORD_RATE in self._managers.active_kinds):
                if len(self._bytes_per_record) >= _MAX_TRACKED_CALLERS:
                    self._bytes_per_record.clear()
                self._bytes_per_record[identity] = sum(usage.bytes_by_topic.values()) / usage.records
            topics = self._managers.for_topics(ctx.broker_id) if usage is not None else None
            if topics is not None and usage is not None:
                charged: list[ThrottleDecision] = []
                self._charge_topics(topics, usage, QuotaKind.FETCH, QuotaKind.CONSUMER_RECORD_RATE, charged)
                decisions.extend(charged)
                new_ms = max(new_ms, self._observe(ctx, charged))
            if max(new_ms, earlier_ms) > 0:  # throttled by bytes, records or requests: Kafka empties it
                for manager in recorded:
                    manager.unrecord(QuotaKind.FETCH, identity, size)
                for manager, kinds in managers:
                    if usage is not None and QuotaKind.CONSUMER_RECORD_RATE in kinds:
                        manager.unrecord(QuotaKind.CONSUMER_RECORD_RATE, identity, usage.records)
                if topics is not None and usage is not None:  # nothing was delivered from any topic
                    for topic, topic_bytes in usage.bytes_by_topic.items():
                        topics.unrecord(QuotaKind.FETCH, topic_identity(topic), topic_bytes)
                        topics.unrecord(QuotaKind.CONSUMER_RECORD_RATE, topic_identity(topic),
                                        usage.records_by_topic.get(topic, 0))
                emptied = self._empty_fetch(entry, payload, max(new_ms, earlier_ms))
                if emptied is not None:
                    return ResponseOutcome(emptied, new_ms, replaced=True)
            new_ms = max(new_ms, delivered_ms)  # delivered: the bucket's debt throttles what follows
        elif entry.api_key == ApiKey.SHARE_FETCH:
            # charged to the fetch quota by its size, as the broker does; never emptied: the broker
            # acquired these records for this consumer, so they are delivered and the client throttled
            size = entry.upstream_response_bytes
            for manager, kinds in managers:
                if QuotaKind.FETCH in kinds:
                    fetch = manager.record_and_check(QuotaKind.FETCH, identity, size)
                    decisions.append(fetch)
                    new_ms = max(new_ms, self._observe(ctx, [fetch]))
        elif entry.forwarded and entry.api_key not in _NOT_REQUEST_RATED:
            if entry.api_key == ApiKey.METADATA and self._managers.topic_kinds:
                # the topic ids of Produce v13 and Fetch v13+
                self._managers.topic_names.learn(payload, entry.api_version)
            elapsed_ms = entry.response_received_ms - entry.received_ms
            for manager, kinds in managers:
                if QuotaKind.REQUEST_PERCENTAGE in kinds:
                    rp = manager.record_and_check(QuotaKind.REQUEST_PERCENTAGE, identity, elapsed_ms / 10.0)
                    decisions.append(rp)
                    new_ms = max(new_ms, self._observe(ctx, [rp]))
        total_ms = max(new_ms, earlier_ms)
        note.enforced_ms = total_ms
        if total_ms == 0:
            return None  # nothing to patch, nothing to mute
        if total_ms > 0:
            try:
                payload = patch_throttle_time(payload, entry.api_key, entry.api_version, total_ms)
            except ProtocolError as exc:
                log.warning("cannot write throttle_time_ms into %d v%d response: %s",
                            entry.api_key, entry.api_version, exc)
        return ResponseOutcome(payload, new_ms)

    def _empty_fetch(self, entry: InFlight, payload: bytes, throttle_ms: int) -> bytes | None:
        """The broker's throttled Fetch response, or None to forward the data after all."""
        try:
            version = entry.api_version
            session_id = 0
            if version >= 7:
                body = response_body_offset(payload, response_header_version(ApiKey.FETCH, version))
                _throttle, error_code, session_id = struct.unpack_from(">ihi", payload, body)
                if error_code != 0:
                    return None  # a top-level error (e.g. a session problem) goes through as it is
            return empty_fetch_response(entry.correlation_id, version, throttle_ms, session_id)
        except (ProtocolError, struct.error) as exc:
            log.warning("cannot build a throttled Fetch v%d response, forwarding data: %s",
                        entry.api_version, exc)
            return None

    def _observe(self, ctx: ConnectionContext, decisions: list[ThrottleDecision]) -> int:
        enforced = 0
        for d in decisions:
            if d.would_throttle_ms > 0 and self._observer is not None:
                self._observer.on_violation(ctx, d)
            enforced = max(enforced, d.throttle_time_ms)
        return enforced


class DecisionObserver:
    """Told of every violation (enforced or shadow); metrics and logs implement it."""

    def on_violation(self, ctx: ConnectionContext, decision: ThrottleDecision) -> None:
        raise NotImplementedError

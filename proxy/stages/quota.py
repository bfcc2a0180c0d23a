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
- `request_rate` (Sluice's own, requests per second): every request but ApiVersions and SASL, when
  it arrives.
- `request_percentage`: what a proxy can measure of broker time. Kafka meters request-handler
  thread time; Sluice meters the upstream round trip of each request (from forwarding to the
  response), as percent of one thread, recorded when the response arrives. Fetch is left out:
  its round trip is mostly a long-poll wait that costs the broker nothing. The round trip also
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
from collections.abc import Iterator
from dataclasses import dataclass

from protocol.apis import ApiKey, response_header_version
from protocol.errors import ProtocolError
from protocol.fetch import cap_fetch_max_bytes, empty_fetch_response
from protocol.headers import RequestHeader, response_body_offset
from protocol.throttle import patch_throttle_time
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, RequestVerdict, ResponseOutcome, StageBase
from proxy.stages.callbacks import QuotaPlugins
from quotas.callback import DefaultQuotaCallback
from quotas.clock import Clock
from quotas.cluster import ClusterView
from quotas.config import QuotaConfig
from quotas.entity import ClientIdentity, QuotaKind
from quotas.manager import QuotaManager, ThrottleDecision
from quotas.storage import with_base_rate

log = logging.getLogger("sluice.quotas")

_NOT_REQUEST_RATED = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})

# notes keys stored on an in-flight request
DECISIONS = "decisions"
ENFORCED_MS = "sluice_throttle_ms"
IDENTITY = "identity"


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
        self.plugins = QuotaPlugins() if plugins is None else plugins
        self.cluster = ClusterView()
        self._scales: dict[QuotaKind, float] = {}  # storage throttle factors, for new managers too
        self._base_rate: float | None = None  # storage applies_to: all
        # ``cluster_entries`` (the draft's `bps`): one more manager, for every broker at once
        self.cluster_wide: QuotaManager | None = None
        self._cluster_wide_kinds: frozenset[QuotaKind] = frozenset()
        self._set_cluster_entries(self.plugins.cluster_entries)
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
            self._managers[broker_id] = manager
        return manager

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
        for manager in self._managers.values():
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

    # ------------------------------------------------------------------ requests

    def on_request(self, ctx: ConnectionContext, header: RequestHeader, payload: bytes,
                   expects_response: bool) -> RequestVerdict | None:
        kinds = self._managers.active_kinds
        if not kinds:
            return None  # no quota configured: nothing to record, nothing to remember
        identity = ClientIdentity.of(ctx.principal, header.client_id)
        decisions: list[ThrottleDecision] = []
        forward: bytes | None = None
        for manager, kinds in self._managers.for_request(ctx.broker_id):
            if QuotaKind.REQUEST_RATE in kinds and header.api_key not in _NOT_REQUEST_RATED:
                decisions.append(manager.record_and_check(QuotaKind.REQUEST_RATE, identity, 1.0))
            if header.api_key == ApiKey.PRODUCE and QuotaKind.PRODUCE in kinds:
                decisions.append(manager.record_and_check(QuotaKind.PRODUCE, identity, len(payload)))
            if header.api_key == ApiKey.FETCH and QuotaKind.FETCH in kinds:
                # the tighter cap wins: each manager caps what the previous one forwarded
                capped = self._cap_fetch(manager, identity, header, payload if forward is None else forward)
                forward = capped if capped is not None else forward
        enforced = self._observe(ctx, decisions)
        return RequestVerdict(throttle_time_ms=enforced, forward_payload=forward,
                              notes={DECISIONS: decisions, ENFORCED_MS: enforced, IDENTITY: identity})

    @staticmethod
    def _cap_fetch(manager: QuotaManager, identity: ClientIdentity, header: RequestHeader,
                   payload: bytes) -> bytes | None:
        """KAFKA-9677: no fetch may ask for more than the quota allows in one window."""
        cap = manager.max_value_in_quota_window(QuotaKind.FETCH, identity)
        if math.isinf(cap):
            return None
        try:
            capped = cap_fetch_max_bytes(payload, header, int(cap))
        except ProtocolError as exc:
            log.warning("cannot cap Fetch v%d max_bytes: %s", header.api_version, exc)
            return None
        return None if capped is payload else capped

    # ------------------------------------------------------------------ responses

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        notes = entry.notes
        identity = notes.get(IDENTITY)
        if not isinstance(identity, ClientIdentity):
            return None
        managers = self._managers.for_request(ctx.broker_id)
        decisions: list[ThrottleDecision] = notes[DECISIONS]  # type: ignore[assignment]
        earlier_ms = int(notes[ENFORCED_MS])  # type: ignore[call-overload]
        new_ms = 0
        if entry.api_key == ApiKey.FETCH:
            size = entry.upstream_response_bytes  # payload may be only the head of a streamed response
            for manager, kinds in managers:
                if QuotaKind.FETCH in kinds:
                    fetch = manager.record_and_check(QuotaKind.FETCH, identity, size)
                    decisions.append(fetch)
                    new_ms = max(new_ms, self._observe(ctx, [fetch]))
            if max(new_ms, earlier_ms) > 0:  # throttled by bytes or by requests: Kafka empties it
                for manager, kinds in managers:
                    if QuotaKind.FETCH in kinds:
                        manager.unrecord(QuotaKind.FETCH, identity, size)
                emptied = self._empty_fetch(entry, payload, max(new_ms, earlier_ms))
                if emptied is not None:
                    return ResponseOutcome(emptied, new_ms, replaced=True)
        elif entry.forwarded and entry.api_key not in _NOT_REQUEST_RATED:
            elapsed_ms = entry.response_received_ms - entry.received_ms
            for manager, kinds in managers:
                if QuotaKind.REQUEST_PERCENTAGE in kinds:
                    rp = manager.record_and_check(QuotaKind.REQUEST_PERCENTAGE, identity, elapsed_ms / 10.0)
                    decisions.append(rp)
                    new_ms = max(new_ms, self._observe(ctx, [rp]))
        total_ms = max(new_ms, earlier_ms)
        notes[ENFORCED_MS] = total_ms
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

"""The quota engine: every budget Sluice enforces, and the verbs the proxy calls.

One `QuotaEngine` per process owns every budget: the client budgets of each broker scope (Kafka's
eight entity levels, client-id prefixes, each through the configured callback), the
``cluster_entries`` budgets (the quota-native draft's ``bps``: one budget across every broker),
and the topic and topic-prefix budgets. Each budget is a sensor of a `QuotaManager` with its own
rate model (windowed or token bucket) and one chain for the limit in force: the configured value
(or the callback's) x the storage factor x the fleet share (`QuotaManager.sensor_limit`).

The proxy calls one verb per event and gets a typed, frozen verdict; it never walks managers:

- `produce`: a Produce request (its bytes, its records, its topics), when it arrives (Kafka
  records a produce quota in the response callback; the throttle is the same, KIP-219).
- `fetch_request`: a Fetch or ShareFetch request: ``request_rate``, and the cap on its max_bytes
  (KAFKA-9677: no fetch may ask for more than the client's quota allows in one window, nor more
  than one sample window of any topic budget it fetches from, `topic_fetch_cap`).
- `fetch_response`: its response: bytes, records, topics; Kafka's rule that a throttled fetch is
  answered empty (and un-recorded), or under a token bucket delivered with its debt.
- `share_fetch_response`: a ShareFetch response, never emptied (the broker acquired the records).
- `request` / `response`: any other request (``request_rate``) and its response
  (``request_percentage``, the upstream round trip).
- `new_connection`: a client connection from an IP, against KIP-612's per-IP
  ``connection_creation_rate`` (the proxy's connection limiter asks it, in Kafka's order).

`budgets` lists every manager with its scope label: the fleet reports and shares all of them,
and metrics, headroom and ``describe`` read the same managers, so they show what is enforced.
The engine does no I/O and never reads a clock of its own.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from quotas.callback import DefaultQuotaCallback, TopicQuotaCallback, topic_identity
from quotas.clock import Clock
from quotas.cluster import ClusterView
from quotas.config import QuotaConfig
from quotas.connection_limits import UNLIMITED_CONNECTION, ConnectionVerdict, IpConnectionRates
from quotas.entity import ClientIdentity, QuotaEntity, QuotaKind, SensorKey
from quotas.fastpath import QuickCharge, QuickChargeImpl
from quotas.manager import SENSOR_SWEEP_INTERVAL_MS, QuotaManager, ThrottleDecision
from quotas.plugins import Plugins
from quotas.storage import with_base_rate

_MAX_TRACKED_CALLERS = 10_000
_TOPIC_FETCH_KINDS = frozenset({QuotaKind.FETCH, QuotaKind.CONSUMER_RECORD_RATE, QuotaKind.REQUEST_RATE})
#: topic kinds that cap a fetch's max_bytes or max_records (`QuotaEngine.topic_fetch_cap`)
_TOPIC_CAP_KINDS = frozenset({QuotaKind.FETCH, QuotaKind.CONSUMER_RECORD_RATE})


class TopicTally(Protocol):
    """What a request or response carried, per topic (the proxy reads it from the wire)."""

    @property
    def bytes_by_topic(self) -> Mapping[str, int]: ...

    @property
    def records_by_topic(self) -> Mapping[str, int]: ...

    @property
    def records(self) -> int: ...


@dataclass(frozen=True, slots=True)
class RequestVerdict:
    """What to do with a request: mute the channel for `throttle_ms` now (0: not throttled), and
    for a fetch cap its max_bytes at `fetch_cap_bytes` (None: no cap). `read_whole_response`: the
    response must be read whole (records or topics are charged from it). `fetch_cap_records`: for
    a ShareFetch, the cap on its max_records (None: no cap)."""

    decisions: tuple[ThrottleDecision, ...]
    throttle_ms: int
    fetch_cap_bytes: int | None = None
    read_whole_response: bool = False
    fetch_cap_records: int | None = None


@dataclass(frozen=True, slots=True)
class ResponseVerdict:
    """What to do with a response. `throttle_ms`: the throttle this response adds (the channel is
    muted for it after the response is written). `empty`: a Fetch throttled by its bytes, records
    or requests is answered empty with ``max(throttle_ms, the request's)`` (Kafka's rule; what it
    carried was un-recorded); if it cannot be emptied the data goes on, with `debt_ms` too.
    `debt_ms`: under a token bucket, the debt a delivered fetch ran up (it delays what follows)."""

    decisions: tuple[ThrottleDecision, ...]
    throttle_ms: int
    empty: bool = False
    debt_ms: int = 0

    @property
    def delivered_throttle_ms(self) -> int:
        """The throttle of a response that is delivered (not emptied)."""
        return max(self.throttle_ms, self.debt_ms)


@dataclass(frozen=True, slots=True)
class LimitInForce:
    """One limit that applies to a caller, as enforcement applies it, and where it came from:
    ``limit = configured x storage_factor x fleet_share``. `configured` is the entry's value or
    the callback's (`source`: ``entry``, ``callback``, ``cluster_entries`` (YAML), ``bps`` and
    ``broker_bps`` (the draft's unit keys, from the store) or ``topic``), `per` whether the budget
    is ``broker`` (each broker's own) or ``cluster`` (one across every broker), `entity`
    the configured entity that matched when known. The one answer `describe --effective`,
    ``/quotas/effective`` and the enforcement itself share."""

    scope: str
    kind: QuotaKind
    key: SensorKey
    limit: float
    configured: float
    storage_factor: float
    fleet_share: float
    source: str
    entity: QuotaEntity | None
    shadow: bool
    per: str = "broker"   # the budget is per broker, or one across the cluster (the draft's bps)


NOT_LIMITED_REQUEST = RequestVerdict((), 0)
NOT_LIMITED_RESPONSE = ResponseVerdict((), 0)


def enforced_ms(decisions: tuple[ThrottleDecision, ...] | list[ThrottleDecision]) -> int:
    """The throttle a set of decisions enforces: the largest (shadow decisions enforce none)."""
    out = 0
    for d in decisions:
        out = max(out, d.throttle_time_ms)
    return out


class QuotaEngine:
    """Every budget of this process (see the module docstring). Kafka's quotas are per broker:
    one client manager per broker behind Sluice, or one for all of them (``scope: cluster``)."""

    def __init__(self, config: QuotaConfig, clock: Clock, plugins: Plugins | None = None,
                 ip_connection_rates: Mapping[str, float] | None = None) -> None:
        self._config = config
        self._clock = clock
        # KIP-612: connections created per second per client IP, over the quota window
        self.ip_connection_rates = IpConnectionRates(ip_connection_rates or {}, config.window)
        self._managers: dict[int | None, QuotaManager] = {}
        # the fleet's standby share and the groups other members use, by scope label
        # (`FleetMember`): a manager created between two report rounds (a client's first request
        # to a broker) starts with them, not with the whole quota and a fresh sensor's credit
        self.fleet_standby_share = 1.0
        self.fleet_busy: Mapping[str, frozenset[SensorKey]] = {}
        self.plugins = Plugins() if plugins is None else plugins
        self.cluster = ClusterView()
        self._scales: dict[QuotaKind, float] = {}  # storage throttle factors, for new managers too
        self._base_rate: float | None = None  # storage applies_to: all
        # ``cluster_entries`` (the draft's `bps`): one more manager, for every broker at once
        self.cluster_wide: QuotaManager | None = None
        self._cluster_wide_kinds: frozenset[QuotaKind] = frozenset()
        # the draft's units from the store: ``sluice.bps.*`` (into the cluster-wide budgets, beside
        # the YAML's cluster_entries) and ``sluice.broker_bps.*`` (one manager per broker, whatever
        # the scope): each its own budget beside the plain key's, the limit hit first throttles
        self._store_bps: QuotaConfig | None = None
        self._broker_bps: QuotaConfig | None = None
        self._broker_bps_managers: dict[int | None, QuotaManager] = {}
        self._shares: dict[QuotaEntity, float] = {}  # the store's sluice.shares (the draft's shares)
        self._set_cluster_entries(self.plugins.cluster_entries)
        # topic and topic-prefix entries: one more manager per broker (or one for all with
        # scope: cluster), asked per topic of a request, beside the client's own
        self._topic_managers: dict[int | None, QuotaManager] = {}
        self.topic_kinds: frozenset[QuotaKind] = frozenset()
        self.active_kinds: frozenset[QuotaKind] = frozenset()
        self.needs_produce_usage = False  # these four: `_set_kinds`
        self.needs_fetch_request_topics = False
        self.needs_fetch_usage = False
        self._wants_metadata = False
        self._callback_kinds = self._probe_callback()
        self._set_kinds()  # nothing is recorded for a kind with no quota
        # consumer_record_rate: the bytes per record of each caller's last fetch, to cap a fetch's
        # max_bytes at the records the quota allows (as KAFKA-9677 caps bytes); bounded
        self._bytes_per_record: dict[ClientIdentity, float] = {}
        # and per topic, for a topic consumer_record_rate (`topic_fetch_cap`); bounded
        self._topic_bytes_per_record: dict[str, float] = {}
        # produce and other requests in one compiled call while nothing throttles (quotas.fastpath)
        self._quick: QuickCharge | None = None if QuickChargeImpl is None else QuickChargeImpl(
            self, ThrottleDecision, RequestVerdict, NOT_LIMITED_REQUEST, QuotaKind.REQUEST_RATE,
            QuotaKind.PRODUCE, self.plugins.scope == "cluster", SENSOR_SWEEP_INTERVAL_MS,
            QuotaKind.REQUEST_PERCENTAGE, NOT_LIMITED_RESPONSE, ResponseVerdict, QuotaKind.FETCH,
            QuotaKind.CONSUMER_RECORD_RATE)

    # ------------------------------------------------------------------ verbs

    def produce(self, broker_id: int | None, identity: ClientIdentity, size_bytes: int,
                usage: TopicTally | None) -> RequestVerdict:
        """A Produce request of `size_bytes` (header + body, Kafka's ``request.sizeInBytes``):
        ``request_rate`` 1, ``producer_byte_rate`` its size, ``producer_record_rate`` its records,
        and each topic's bytes, records and the request on the topic budgets."""
        if usage is None and self._quick is not None:
            verdict = self._quick.produce(broker_id, identity, size_bytes)
            if verdict is not None:
                return verdict
        return self._produce_charged(broker_id, identity, size_bytes, usage)

    def _produce_charged(self, broker_id: int | None, identity: ClientIdentity, size_bytes: int,
                         usage: TopicTally | None) -> RequestVerdict:
        """`produce` without the compiled common case (which found this request not common)."""
        decisions = self._charge(broker_id, identity, size_bytes, usage, QuotaKind.PRODUCE,
                                 QuotaKind.PRODUCER_RECORD_RATE, count_request=True)
        return RequestVerdict(tuple(decisions), enforced_ms(decisions))

    def fetch_request(self, broker_id: int | None, identity: ClientIdentity, *,
                      share: bool = False, topics: Collection[str] = ()) -> RequestVerdict:
        """A Fetch (or with `share` a ShareFetch) request: ``request_rate`` 1, and its max_bytes
        capped at what the tightest budget allows: the client's own in one window (Kafka's rule,
        KAFKA-9677: ``quota x (samples - 1) x window``), and each of the `topics` it fetches
        (`topic_fetch_cap`; names, as the response side names them), so that no fetch is larger
        than a topic budget can ever admit. A ``consumer_record_rate`` (the client's or a fetched
        topic's) caps a Fetch's bytes at one sample window of records times the last bytes per
        record, and a ShareFetch's max_records at one sample window of records."""
        if not share and not topics and self._quick is not None:
            verdict = self._quick.fetch_request(broker_id, identity)
            if verdict is not None:
                return verdict
        return self._fetch_request_charged(broker_id, identity, share=share, topics=topics)

    def _fetch_request_charged(self, broker_id: int | None, identity: ClientIdentity, *,
                               share: bool, topics: Collection[str]) -> RequestVerdict:
        """`fetch_request` without the compiled common case (which found this request not common)."""
        decisions: list[ThrottleDecision] = []
        cap = math.inf
        records_cap = math.inf
        crr = QuotaKind.CONSUMER_RECORD_RATE
        for manager, kinds in self.for_request(broker_id):
            if QuotaKind.REQUEST_RATE in kinds:
                decisions.append(manager.record_and_check(QuotaKind.REQUEST_RATE, identity, 1.0))
            if QuotaKind.FETCH in kinds:
                cap = min(cap, manager.max_value_in_quota_window(QuotaKind.FETCH, identity))
            if crr in kinds:
                if share:
                    records_cap = min(records_cap, self._one_sample_cap(manager, crr, identity))
                elif (per_record := self._bytes_per_record.get(identity)) is not None:
                    # without it a fetch larger than the window allows would be emptied again and again
                    cap = min(cap, self._one_sample_cap(manager, crr, identity) * per_record)
        if topics and self.topic_kinds & _TOPIC_CAP_KINDS:
            cap = min(cap, self.topic_fetch_cap(broker_id, topics, share=share))
            if share:
                records_cap = min(records_cap, self.topic_records_cap(broker_id, topics))
        return RequestVerdict(tuple(decisions), enforced_ms(decisions),
                              None if math.isinf(cap) else int(cap),
                              read_whole_response=self.needs_fetch_usage,
                              fetch_cap_records=None if math.isinf(records_cap) else max(1, int(records_cap)))

    def topic_fetch_cap(self, broker_id: int | None, topics: Collection[str], *,
                        share: bool = False) -> float:
        """The most one fetch of `topics` may ask for by their budgets (`math.inf`: none limits
        it): for each topic with a ``consumer_byte_rate``, one sample window of its bound (under a
        token bucket the bucket's request cap, `QuotaManager.max_value_in_quota_window`); with a
        ``consumer_record_rate`` (not for ShareFetch: its max_records is capped instead,
        `topic_records_cap`), one sample window of records times the bytes per record of the
        topic's last fetched records. The
        tightest wins, for the whole request (a fetch's max_bytes is one number for every topic
        in it: a free topic fetched beside a held one is fetched in pieces of the held one's cap).

        Why one sample window and not Kafka's ``(samples - 1)`` windows: a response exactly as large
        as the whole window is admitted only when the window is empty, and the fetch after it is
        throttled by about ``(samples - 1)`` windows, which lands just before the first sample
        expires, so it is throttled once more: about one such fetch per two retention periods,
        half the quota (engine model: 0.48 x at 64 KiB/s with 11 x 500 ms windows, against 0.82 x
        at one sample window's cap; `test_engine.py`). Kafka's own rule is kept for the client's
        budgets, where it is Kafka's behaviour."""
        manager = self.for_topics(broker_id)
        if manager is None:
            return math.inf
        kinds = self.topic_kinds
        cap = math.inf
        for topic in topics:
            who = topic_identity(topic)
            if QuotaKind.FETCH in kinds:
                cap = min(cap, self._one_sample_cap(manager, QuotaKind.FETCH, who))
            if (not share and QuotaKind.CONSUMER_RECORD_RATE in kinds
                    and (per_record := self._topic_bytes_per_record.get(topic)) is not None):
                cap = min(cap, self._one_sample_cap(manager, QuotaKind.CONSUMER_RECORD_RATE, who)
                          * per_record)
        return cap

    def topic_records_cap(self, broker_id: int | None, topics: Collection[str]) -> float:
        """The most records one fetch of `topics` may ask for by their ``consumer_record_rate``
        budgets: one sample window of the tightest (`math.inf`: none limits it)."""
        manager = self.for_topics(broker_id)
        if manager is None or QuotaKind.CONSUMER_RECORD_RATE not in self.topic_kinds:
            return math.inf
        return min((self._one_sample_cap(manager, QuotaKind.CONSUMER_RECORD_RATE, topic_identity(t))
                    for t in topics), default=math.inf)

    def request(self, broker_id: int | None, identity: ClientIdentity, *,
                rated: bool = True) -> RequestVerdict:
        """Any other request: ``request_rate`` 1 unless it is not `rated` (ApiVersions, SASL)."""
        if not rated or QuotaKind.REQUEST_RATE not in self.active_kinds:
            return NOT_LIMITED_REQUEST
        if self._quick is not None:
            verdict = self._quick.request(broker_id, identity)
            if verdict is not None:
                return verdict
        return self._request_charged(broker_id, identity)

    def _request_charged(self, broker_id: int | None, identity: ClientIdentity) -> RequestVerdict:
        """`request` of a rated request without the compiled common case."""
        decisions = [manager.record_and_check(QuotaKind.REQUEST_RATE, identity, 1.0)
                     for manager, kinds in self.for_request(broker_id)
                     if QuotaKind.REQUEST_RATE in kinds]
        return RequestVerdict(tuple(decisions), enforced_ms(decisions))

    def fetch_response(self, broker_id: int | None, identity: ClientIdentity, size_bytes: int,
                       usage: TopicTally | None, request_throttle_ms: int) -> ResponseVerdict:
        """A Fetch response of `size_bytes` (with `usage` when it was read whole).

        Windowed rate (Kafka's rule): the bytes are recorded and checked; if the response, its
        records, its topics or the request (`request_throttle_ms`) are throttled, it is answered
        empty and what it carried is un-recorded (the client fetches the same offsets again after
        the delay). Token bucket: a fetch is delivered while the credits are not negative, and its
        debt throttles what follows (`ResponseVerdict.debt_ms`)."""
        if usage is None and self._quick is not None:
            verdict = self._quick.fetch_response(broker_id, identity, size_bytes, request_throttle_ms)
            if verdict is not None:
                return verdict
        return self._fetch_response_charged(broker_id, identity, size_bytes, usage, request_throttle_ms)

    def _fetch_response_charged(self, broker_id: int | None, identity: ClientIdentity, size_bytes: int,
                                usage: TopicTally | None, request_throttle_ms: int) -> ResponseVerdict:
        """`fetch_response` without the compiled common case (which found this response not common)."""
        decisions: list[ThrottleDecision] = []
        new_ms = 0
        debt_ms = 0
        recorded: list[QuotaManager] = []
        managers = self.for_request(broker_id)
        for manager, kinds in managers:
            if QuotaKind.FETCH in kinds:
                admission = manager.admit_fetch(identity, size_bytes)
                decisions.append(admission.decision)
                if admission.recorded:
                    recorded.append(manager)
                if admission.throttle_is_debt:
                    debt_ms = max(debt_ms, admission.decision.throttle_time_ms)
                else:
                    new_ms = max(new_ms, admission.decision.throttle_time_ms)
            if usage is not None and QuotaKind.CONSUMER_RECORD_RATE in kinds:
                by_records = manager.record_and_check(QuotaKind.CONSUMER_RECORD_RATE, identity,
                                                      usage.records)
                decisions.append(by_records)
                new_ms = max(new_ms, by_records.throttle_time_ms)
        if (usage is not None and usage.records > 0
                and QuotaKind.CONSUMER_RECORD_RATE in self.active_kinds):
            if len(self._bytes_per_record) >= _MAX_TRACKED_CALLERS:
                self._bytes_per_record.clear()
            self._bytes_per_record[identity] = sum(usage.bytes_by_topic.values()) / usage.records
        topics = self.for_topics(broker_id) if usage is not None else None
        if topics is not None and usage is not None:
            self._learn_topic_record_sizes(usage)
            charged: list[ThrottleDecision] = []
            self._charge_topics(topics, usage, QuotaKind.FETCH, QuotaKind.CONSUMER_RECORD_RATE, charged)
            decisions.extend(charged)
            new_ms = max(new_ms, enforced_ms(charged))
        if max(new_ms, request_throttle_ms) == 0:
            return ResponseVerdict(tuple(decisions), new_ms, debt_ms=debt_ms)
        # throttled by bytes, records or requests: Kafka empties it; nothing was delivered
        for manager in recorded:
            manager.unrecord(QuotaKind.FETCH, identity, size_bytes)
        if usage is not None:
            for manager, kinds in managers:
                if QuotaKind.CONSUMER_RECORD_RATE in kinds:
                    manager.unrecord(QuotaKind.CONSUMER_RECORD_RATE, identity, usage.records)
            if topics is not None:
                for topic, topic_bytes in usage.bytes_by_topic.items():
                    topics.unrecord(QuotaKind.FETCH, topic_identity(topic), topic_bytes)
                    topics.unrecord(QuotaKind.CONSUMER_RECORD_RATE, topic_identity(topic),
                                    usage.records_by_topic.get(topic, 0))
        return ResponseVerdict(tuple(decisions), new_ms, empty=True, debt_ms=debt_ms)

    def share_fetch_response(self, broker_id: int | None, identity: ClientIdentity, size_bytes: int,
                             usage: TopicTally | None = None) -> ResponseVerdict:
        """A ShareFetch response (KIP-932), charged as the broker charges it: its size to
        ``consumer_byte_rate``, and with `usage` its records to ``consumer_record_rate`` and its
        topics to the topic budgets. Never emptied: the broker acquired these records for this
        consumer, so they are delivered and the client is throttled for what follows."""
        decisions = self._charge(broker_id, identity, size_bytes, usage, QuotaKind.FETCH,
                                 QuotaKind.CONSUMER_RECORD_RATE, count_request=False)
        return ResponseVerdict(tuple(decisions), enforced_ms(decisions))

    def response(self, broker_id: int | None, identity: ClientIdentity,
                 elapsed_ms: int) -> ResponseVerdict:
        """The response of any other forwarded request: ``request_percentage`` is its upstream
        round trip as percent of one thread (``elapsed_ms / 10`` per second of window)."""
        if QuotaKind.REQUEST_PERCENTAGE not in self.active_kinds:
            return NOT_LIMITED_RESPONSE
        decisions = [manager.record_and_check(QuotaKind.REQUEST_PERCENTAGE, identity, elapsed_ms / 10.0)
                     for manager, kinds in self.for_request(broker_id)
                     if QuotaKind.REQUEST_PERCENTAGE in kinds]
        return ResponseVerdict(tuple(decisions), enforced_ms(decisions))

    def new_connection(self, ip: str) -> ConnectionVerdict:
        """A new client connection from `ip` (KIP-612, Kafka's `ConnectionQuotas.inc` ->
        `recordIpConnectionMaybeThrottle`): recorded on the IP's windowed rate; over its
        ``connection_creation_rate`` (the IP's own, else ``<default>``; none: unlimited) the
        throttle is ``(rate - bound) / bound x window``, rounded half up and capped at one window,
        and the connection is un-recorded (Kafka counts only what it accepts).

        With the defaults (11 x 1 s) a fresh IP's rate is divided by 10 s: at 10/s the 101st
        connection at once is 101 / 10 s = 10.1/s, (10.1 - 10) / 10 x 10 000 ms = 100 ms."""
        rates = self.ip_connection_rates
        if not rates.enabled:
            return UNLIMITED_CONNECTION
        now = self._clock.now_ms()
        throttle_ms = rates.record(ip, now)
        return ConnectionVerdict(throttle_ms, rates.rate(ip, now), rates.quota_for(ip))

    def set_ip_connection_rates(self, rates: Mapping[str, float]) -> None:
        """New per-IP quotas (a reload): new bounds at once, every IP's measured rate kept."""
        self.ip_connection_rates.update(rates)

    # ------------------------------------------------------------------ the one answer

    def effective(self, broker_id: int | None, identity: ClientIdentity,
                  topic: str | None = None) -> tuple[LimitInForce, ...]:
        """Every limit in force for `identity` through `broker_id` (and for `topic`'s budgets):
        read from the sensors enforcement uses, so it equals what is enforced under callbacks,
        cluster entries, the storage factor and fleet shares. Reading creates a sensor as Kafka's
        lookups do (it records nothing; an idle sensor is swept)."""
        out: list[LimitInForce] = []
        custom = self.plugins.factory is not None
        per = "cluster" if self.plugins.scope == "cluster" else "broker"
        sources: list[tuple[str, QuotaManager, ClientIdentity, str, str]] = [
            (self._label(broker_id), self.for_broker(broker_id), identity, "callback" if custom else "entry",
             per)]
        if self.cluster_wide is not None:
            sources.append(("cluster", self.cluster_wide, identity, "cluster_entries", "cluster"))
        if self._broker_bps is not None:
            bps_manager = self._for_broker_bps(broker_id, self._broker_bps)
            sources.append((self._broker_bps_label(broker_id), bps_manager, identity, "broker_bps", "broker"))
        if topic is not None and (topics := self.for_topics(broker_id)) is not None:
            sources.append((self._label(broker_id), topics, topic_identity(topic), "topic", per))
        store_bps = self._store_bps
        for scope, manager, who, source, budget_per in sources:
            for kind in QuotaKind:
                decision = manager.check(kind, who)
                limit = manager.sensor_limit(decision.key) if decision.bound is not None else None
                if limit is None or limit.bound is None or limit.base_bound is None:
                    continue
                configured = limit.base_bound / limit.scale
                origin = source
                if (source == "cluster_entries" and store_bps is not None and limit.entity is not None
                        and store_bps.get(limit.entity) is not None):
                    origin = "bps"
                out.append(LimitInForce(scope, kind, decision.key, limit.bound, configured, limit.scale,
                                        limit.share, origin, limit.entity, limit.shadow, budget_per))
        return tuple(out)

    # ------------------------------------------------------------------ budgets

    def for_broker(self, broker_id: int | None) -> QuotaManager:
        if self.plugins.scope == "cluster":
            broker_id = None
        manager = self._managers.get(broker_id)
        if manager is None:
            factory = self.plugins.factory
            manager = QuotaManager(self._effective(), self._clock, sticky_quotas_enabled=False,
                                   callback=None if factory is None else factory(broker_id))
            manager.update_cluster_metadata(self.cluster)
            self._prepare(manager, broker_id)
            if self._shares:
                self._tell_shares(manager)
            self._managers[broker_id] = manager
        return manager

    def for_topics(self, broker_id: int | None) -> QuotaManager | None:
        """The topic budgets' manager for `broker_id`, or None when no topic entry is configured."""
        if not self.topic_kinds:
            return None
        if self.plugins.scope == "cluster":
            broker_id = None
        manager = self._topic_managers.get(broker_id)
        if manager is None:
            manager = QuotaManager(self._config, self._clock,
                                   callback=TopicQuotaCallback(broker_id=broker_id))
            self._prepare(manager, broker_id)
            self._topic_managers[broker_id] = manager
        return manager

    def _prepare(self, manager: QuotaManager, broker_id: int | None, label: str | None = None) -> None:
        """A new manager joins the chain as it stands: the storage factors and the fleet share
        (the groups other members use in its scope, `label`: by default its broker's)."""
        for kind, factor in self._scales.items():
            manager.set_limit_scale(kind, factor)
        if self.fleet_standby_share != 1.0 or self.fleet_busy:
            scope = self._label(broker_id) if label is None else label
            manager.set_shares({}, self.fleet_standby_share, self.fleet_busy.get(scope, frozenset()))

    def for_request(self, broker_id: int | None,
                    ) -> tuple[tuple[QuotaManager, frozenset[QuotaKind]], ...]:
        """The client managers a request through `broker_id` is counted in, each with the kinds
        to record: the broker's (or the one of ``scope: cluster``), and ``cluster_entries``'."""
        manager = self.for_broker(broker_id)
        broker_bps = self._broker_bps
        if self.cluster_wide is None and broker_bps is None:
            return ((manager, self.active_kinds),)
        out = [(manager, self.active_kinds)]
        if self.cluster_wide is not None:
            out.append((self.cluster_wide, self._cluster_wide_kinds))
        if broker_bps is not None:
            out.append((self._for_broker_bps(broker_id, broker_bps), broker_bps.kinds()))
        return tuple(out)

    def _for_broker_bps(self, broker_id: int | None, config: QuotaConfig) -> QuotaManager:
        manager = self._broker_bps_managers.get(broker_id)
        if manager is None:
            manager = QuotaManager(config, self._clock, sticky_quotas_enabled=False)
            self._prepare(manager, broker_id, self._broker_bps_label(broker_id))
            self._broker_bps_managers[broker_id] = manager
        return manager

    def labelled(self) -> list[tuple[str, QuotaManager]]:
        """Every client manager with its `broker` label: a broker id, ``bootstrap``, ``all``
        (``scope: cluster``), ``cluster`` (``cluster_entries`` and ``bps``) or ``B:broker_bps``."""
        out = [(self._label(b), m) for b, m in self._managers.items()]
        if self.cluster_wide is not None:
            out.append(("cluster", self.cluster_wide))
        out.extend((self._broker_bps_label(b), m) for b, m in self._broker_bps_managers.items())
        return out

    @staticmethod
    def _broker_bps_label(broker_id: int | None) -> str:
        """The scope label of a ``broker_bps`` budget: its broker's, marked (``1:broker_bps``), so
        it never meets the broker's own budgets of the same key."""
        return f"{'bootstrap' if broker_id is None else broker_id}:broker_bps"

    def topic_labelled(self) -> list[tuple[str, QuotaManager]]:
        """The topic managers with their `broker` label (as `labelled`)."""
        return [(self._label(b), m) for b, m in self._topic_managers.items()]

    def budgets(self) -> list[tuple[str, QuotaManager]]:
        """Every manager of every budget kind, client and topic, with its scope label: what the
        fleet reports and shares. A topic budget's sensor key names its topic (or topic prefix),
        so it never meets a client budget in the same scope."""
        return [*self.labelled(), *self.topic_labelled()]

    def _label(self, broker_id: int | None) -> str:
        if broker_id is not None:
            return str(broker_id)
        return "all" if self.plugins.scope == "cluster" else "bootstrap"

    @property
    def scope(self) -> str:
        return self.plugins.scope

    # ------------------------------------------------------------------ the limit chain

    def set_entity_shares(self, shares: Mapping[QuotaEntity, float]) -> None:
        """The store's ``sluice.shares`` (`QuotaTable.shares`): told to every callback that reads
        them (``update_shares``, the `FairShareCallback`), now and as managers are created."""
        self._shares = dict(shares)
        for manager in self._managers.values():
            self._tell_shares(manager)

    def _tell_shares(self, manager: QuotaManager) -> None:
        update = getattr(manager.callback, "update_shares", None)
        if update is not None:
            update(self._shares)

    def set_unit_entries(self, bps: QuotaConfig | None, broker_bps: QuotaConfig | None) -> None:
        """The store's ``sluice.bps.*`` and ``sluice.broker_bps.*`` entries (`QuotaTable.unit_configs`)."""
        self._store_bps = bps if bps is not None and len(bps) else None
        self._set_cluster_entries(self.plugins.cluster_entries)
        if broker_bps is None or not len(broker_bps):
            self._broker_bps = None
            self._broker_bps_managers.clear()
        else:
            self._broker_bps = broker_bps
            for manager in self._broker_bps_managers.values():
                manager.update_config(broker_bps)
        self._set_kinds()

    def _set_cluster_entries(self, yaml_entries: QuotaConfig | None) -> None:
        entries = yaml_entries
        store = self._store_bps
        if store is not None:  # the store's bps beside the YAML's cluster_entries; the store's wins
            base = yaml_entries if yaml_entries is not None else store
            mine = {e.entity for e in store}
            kept = tuple(e for e in (yaml_entries or ()) if e.entity not in mine)
            entries = QuotaConfig((*kept, *store), base.shadow_all, base.window, base.rate_model,
                                  base.burst_ms)
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
        """The storage factor: scale every limit of `kind` in every budget."""
        before = self._effective()
        self._scales[kind] = factor
        for manager in (*self._managers.values(), *self._topic_managers.values(),
                        *self._broker_bps_managers.values()):
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
        self._set_kinds()

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
        self._set_kinds()

    @property
    def wants_cluster_metadata(self) -> bool:
        return self._wants_metadata

    def update_cluster_metadata(self, cluster: ClusterView) -> None:
        """Sluice saw the cluster change (`proxy.stages.callbacks.ClusterMetadataFeed`)."""
        self.cluster = cluster
        for manager in self._managers.values():
            manager.update_cluster_metadata(cluster)

    def set_plugins(self, plugins: Plugins) -> None:
        """Reload: a new callback class or config replaces the callback of every manager
        (`QuotaManager.set_callback` says what history survives). The scope is fixed at start."""
        if plugins.scope != self.plugins.scope:
            raise ValueError(f"quotas.scope cannot change at runtime ({self.plugins.scope} -> "
                             f"{plugins.scope}); restart to apply")
        self._set_cluster_entries(plugins.cluster_entries)
        if plugins.same_callback(self.plugins):
            self._set_kinds()
            return
        self.plugins = plugins
        for broker_id, manager in self._managers.items():
            factory = plugins.factory
            manager.set_callback(DefaultQuotaCallback(sticky_levels=False) if factory is None
                                 else factory(broker_id))
            manager.update_cluster_metadata(self.cluster)
            if self._shares:
                self._tell_shares(manager)
        self._callback_kinds = self._probe_callback()
        self._set_kinds()

    def _probe_callback(self) -> frozenset[QuotaKind]:
        """Once per callback (at start and when it changes, never per config update): whether it
        wants cluster metadata and which kinds it may limit (all, if it does not say)."""
        if self.plugins.factory is None:
            self._wants_metadata = False
            return frozenset()
        probe = self.plugins.factory(None)
        try:
            self._wants_metadata = bool(getattr(probe, "wants_cluster_metadata", False))
            extra = getattr(probe, "quota_kinds", None)
        finally:
            probe.close()
        return frozenset(QuotaKind) if extra is None else frozenset(extra)

    def _set_kinds(self) -> None:
        """The kinds configured (`active_kinds`, `topic_kinds`) and what they make the stage read,
        kept as plain attributes: every request reads them.

        * `needs_produce_usage`: a Produce request must be read per topic (records/s or topic
          quotas are configured);
        * `needs_fetch_request_topics`: a Fetch or ShareFetch request must be read for its topics
          (a topic entry limits consumed bytes or records, so its max_bytes is capped by them,
          `topic_fetch_cap`);
        * `needs_fetch_usage`: a Fetch response must be read whole, per topic (records/s or topic
          quotas are configured)."""
        self.topic_kinds = frozenset(k for e in self._config if e.entity.is_topic for k in e.values)
        broker_bps = frozenset() if self._broker_bps is None else self._broker_bps.kinds()
        self.active_kinds = (self._effective().kinds() | self._cluster_wide_kinds | self._callback_kinds
                             | broker_bps)
        self.needs_produce_usage = (QuotaKind.PRODUCER_RECORD_RATE in self.active_kinds
                                    or bool(self.topic_kinds))
        self.needs_fetch_request_topics = bool(self.topic_kinds & _TOPIC_CAP_KINDS)
        self.needs_fetch_usage = (QuotaKind.CONSUMER_RECORD_RATE in self.active_kinds
                                  or bool(self.topic_kinds & _TOPIC_FETCH_KINDS))

    def _charge(self, broker_id: int | None, identity: ClientIdentity, size_bytes: int,
                usage: TopicTally | None, bytes_kind: QuotaKind, records_kind: QuotaKind, *,
                count_request: bool) -> list[ThrottleDecision]:
        """Record one request's bytes (and with `usage` its records and topics) on the caller's
        budgets, with `count_request` also the request itself on ``request_rate``."""
        decisions: list[ThrottleDecision] = []
        for manager, kinds in self.for_request(broker_id):
            if count_request and QuotaKind.REQUEST_RATE in kinds:
                decisions.append(manager.record_and_check(QuotaKind.REQUEST_RATE, identity, 1.0))
            if bytes_kind in kinds:
                decisions.append(manager.record_and_check(bytes_kind, identity, size_bytes))
            if usage is not None and records_kind in kinds:
                decisions.append(manager.record_and_check(records_kind, identity, usage.records))
        if usage is not None and (topics := self.for_topics(broker_id)) is not None:
            self._charge_topics(topics, usage, bytes_kind, records_kind, decisions)
        return decisions

    def _charge_topics(self, topics: QuotaManager, usage: TopicTally, bytes_kind: QuotaKind,
                       records_kind: QuotaKind, decisions: list[ThrottleDecision]) -> None:
        """Record a request's bytes, records and the request itself on each of its topics, for the
        kinds some topic entry limits; the largest delay any of them needs wins."""
        kinds = self.topic_kinds
        for topic, size in usage.bytes_by_topic.items():
            who = topic_identity(topic)
            if bytes_kind in kinds:
                decisions.append(topics.record_and_check(bytes_kind, who, size))
            if records_kind in kinds:
                records = usage.records_by_topic.get(topic, 0)
                decisions.append(topics.record_and_check(records_kind, who, records))
            if QuotaKind.REQUEST_RATE in kinds:
                decisions.append(topics.record_and_check(QuotaKind.REQUEST_RATE, who, 1.0))

    def _learn_topic_record_sizes(self, usage: TopicTally) -> None:
        """The bytes per record of each topic a fetch carried records of (a topic
        ``consumer_record_rate`` caps a fetch's bytes with it); bounded."""
        if QuotaKind.CONSUMER_RECORD_RATE not in self.topic_kinds:
            return
        sizes = self._topic_bytes_per_record
        for topic, records in usage.records_by_topic.items():
            if records > 0:
                if len(sizes) >= _MAX_TRACKED_CALLERS and topic not in sizes:
                    sizes.clear()
                sizes[topic] = usage.bytes_by_topic.get(topic, 0) / records

    @staticmethod
    def _one_sample_cap(manager: QuotaManager, kind: QuotaKind, identity: ClientIdentity) -> float:
        """The cap of one fetch by a budget of `kind` (bytes or records): the window's worth
        (`QuotaManager.max_value_in_quota_window`), and at most one sample window of the bound (a
        fetch as large as the whole window is admitted only once the window is empty, which holds
        a consumer well under its quota; measured: 0.6 x; see `topic_fetch_cap`)."""
        cap = manager.max_value_in_quota_window(kind, identity)
        bound = manager.check(kind, identity).bound
        if bound is not None:
            cap = min(cap, bound * manager.rate_config.window_ms / 1000.0)
        return cap

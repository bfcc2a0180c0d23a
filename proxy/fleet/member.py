"""This process as a fleet member: every report interval, publish what it used, read what the
others used, and set its local shares (`quotas.fleet` decides them; the quota managers enforce
``limit x share`` with Kafka's windowed rate, so no decision ever waits on the exchange).

*Constrained* (wants more than its share) means: a request was throttled on the group during the
last interval, or a connection throttled on it holds a claim (`FleetClaims`): a client held by a
long throttle sends nothing, yet wants its share, and a saturating client under Kafka's windowed
rate alternates between bursts and mutes. A claim lasts for the throttle plus two report
intervals (`hold_ms`), so a client that keeps hitting its limit keeps its share steady between
throttles (shares that swing make a windowed rate admit the peaks); it ends at once when its
connection closes, so a client that goes away frees its share within one report interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.fleet.exchange import Exchange
from proxy.flow.pipeline import ConnectionContext
from quotas.clock import Clock
from quotas.engine import QuotaEngine
from quotas.entity import SensorKey
from quotas.fleet import (
    FleetReportError,
    FleetView,
    GroupUsage,
    ShareDecision,
    UsageReport,
    decode_report,
    encode_report,
)
from quotas.manager import ThrottleDecision
from quotas.series_cap import DEFAULT_MAX_SERIES_PER_METRIC, OVERFLOW, SeriesCap

log = logging.getLogger("sluice.fleet")

Group = tuple[str, SensorKey]

#: Why a payload on the exchange was not taken (`FleetReportError.reason`), for the metric.
IGNORE_REASONS = ("malformed", "old_version", "unknown_version")


class FleetClaims:
    """Which sharing groups have a connection muted by a throttle right now (a `DecisionObserver`).

    A decision does not say which manager made it, so a claim is held on the key in the
    connection's broker scope and in the cluster-wide scopes; a claim on a group without a bound
    changes nothing."""

    def __init__(self, clock: Clock, scope_labels: tuple[str, ...], hold_ms: int) -> None:
        self._clock = clock
        self._scope_labels = scope_labels
        self._hold_ms = hold_ms
        self._until: dict[Group, dict[int, int]] = {}
        self._by_connection: dict[int, set[Group]] = {}

    def on_violation(self, ctx: ConnectionContext, decision: ThrottleDecision) -> None:
        ms = decision.throttle_time_ms
        if ms <= 0:
            return
        until = self._clock.now_ms() + ms + self._hold_ms
        broker = "bootstrap" if ctx.broker_id is None else str(ctx.broker_id)
        for scope in (broker, *self._scope_labels):
            group = (scope, decision.key)
            holders = self._until.setdefault(group, {})
            holders[ctx.connection_id] = max(until, holders.get(ctx.connection_id, 0))
            self._by_connection.setdefault(ctx.connection_id, set()).add(group)

    def connection_closed(self, connection_id: int) -> None:
        for group in self._by_connection.pop(connection_id, ()):
            holders = self._until.get(group)
            if holders is not None:
                holders.pop(connection_id, None)
                if not holders:
                    del self._until[group]

    def claimed(self, now_ms: int) -> set[Group]:
        """Groups with a throttle still running; forgets the finished ones."""
        out = set()
        for group, holders in list(self._until.items()):
            for conn, until in list(holders.items()):
                if until <= now_ms:
                    del holders[conn]
                    groups = self._by_connection.get(conn)
                    if groups is not None:
                        groups.discard(group)
                        if not groups:
                            del self._by_connection[conn]
            if holders:
                out.add(group)
            else:
                del self._until[group]
        return out


@dataclass(slots=True)
class _Seen:
    used_total: float
    throttle_count: int


#: While joining, a member reports and reads this often (its own report comes back sooner).
JOIN_POLL_MS = 100


class FleetMember:
    """Runs the report loop; `tick` is one round and is what the unit tests drive."""

    def __init__(self, view: FleetView, exchange: Exchange, managers: QuotaEngine, clock: Clock,
                 claims: FleetClaims, interval_ms: int) -> None:
        self.view = view
        self.exchange = exchange
        self.managers = managers
        self.clock = clock
        self.claims = claims
        self.interval_ms = interval_ms
        # a Kafka exchange sets its topic up first (metadata, perhaps a creation): allow for it
        self.join_timeout_ms = max(view.member_timeout_ms, 5000)
        self._seq = 0
        self._seen: dict[Group, _Seen] = {}
        self._last_tick_ms: int | None = None
        self._task: asyncio.Task[None] | None = None
        self.decision = ShareDecision({}, 1.0, 1, joining=True)
        self.in_fallback = False
        self._joined_logged = False
        self.reports_received = 0
        self.reports_sent = 0
        self.report_bytes_sent = 0
        self.ignored: dict[str, int] = {}  # payloads not taken, by reason (FleetReportError.reason)

    @property
    def name(self) -> str:
        return self.view.member

    @property
    def bad_reports(self) -> int:
        return sum(self.ignored.values())

    async def start(self) -> None:
        """Join before any client is served: report and read every `JOIN_POLL_MS` until this
        member's own report comes back (it has then read every live member's latest report), for
        at most `join_timeout_ms`; meanwhile, and if it times out, it holds the joining share
        (`FleetView.decide`), never the whole quota."""
        self._apply(self.view.decide((), {}, self.clock.now_ms(), channel_up=False))
        self.exchange.start()
        log.info("fleet %s: member %s, reports every %d ms over %s", self.view.fleet_id, self.name,
                 self.interval_ms, self.exchange.describe())
        deadline_ms = self.clock.now_ms() + self.join_timeout_ms
        while not self.view.joined and self.clock.now_ms() < deadline_ms:
            await asyncio.sleep(JOIN_POLL_MS / 1000)
            self.tick()
        if not self.view.joined:
            log.warning("fleet %s: not joined after %d ms (exchange %s silent); serving with %.3f of "
                        "each quota", self.view.fleet_id, self.join_timeout_ms, self.exchange.describe(),
                        self.decision.standby)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="fleet-member")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.get_running_loop().run_in_executor(None, self.exchange.close)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            try:
                self.tick()
            except Exception:  # one bad round must not end the loop
                log.exception("fleet: a report round failed")

    def tick(self) -> None:
        now = self.clock.now_ms()
        for payload in self.exchange.drain():
            try:
                report = decode_report(payload)
            except FleetReportError as exc:
                self._ignore(exc)
                continue
            if self.view.receive(report, now):
                self.reports_received += 1
        elapsed_ms = self.interval_ms if self._last_tick_ms is None else max(1, now - self._last_tick_ms)
        self._last_tick_ms = now
        own, limits = self._own_usage(now, elapsed_ms)
        self._seq += 1
        payload = encode_report(UsageReport(self.view.fleet_id, self.name, self._seq, self.interval_ms,
                                            tuple(own)))
        self.exchange.publish(payload)
        self.reports_sent += 1
        self.report_bytes_sent += len(payload)
        decision = self.view.decide(own, limits, now, channel_up=self.exchange.connected)
        self._apply(decision)

    def _ignore(self, exc: FleetReportError) -> None:
        """Count a payload not taken by its reason; the first of each reason is logged as a warning
        (a member of another version keeps sending one every interval)."""
        first = exc.reason not in self.ignored
        self.ignored[exc.reason] = self.ignored.get(exc.reason, 0) + 1
        if first:
            log.warning("fleet %s: ignoring a payload on the exchange (%s): %s (further ones are counted "
                        "in sluice_fleet_reports_ignored_total{reason=\"%s\"})", self.view.fleet_id,
                        exc.reason, exc, exc.reason)
        else:
            log.debug("fleet: ignoring a payload (%s): %s", exc.reason, exc)

    def _own_usage(self, now_ms: int, elapsed_ms: int) -> tuple[list[GroupUsage], dict[Group, float | None]]:
        claimed = self.claims.claimed(now_ms)
        own: list[GroupUsage] = []
        limits: dict[Group, float | None] = {}
        seen: dict[Group, _Seen] = {}
        for scope, manager in self.managers.budgets():  # every budget kind: client, cluster, topic
            for usage in manager.fleet_usage():
                group = (scope, usage.key)
                limits[group] = usage.base_bound
                before = self._seen.get(group)
                seen[group] = _Seen(usage.used_total, usage.throttle_count)
                if before is None:
                    used = usage.used_total
                    throttled = usage.throttle_count > 0
                else:
                    used = usage.used_total - before.used_total
                    throttled = usage.throttle_count > before.throttle_count
                used_per_s = max(0.0, used) * 1000.0 / elapsed_ms
                constrained = throttled or group in claimed
                if usage.base_bound is not None and (used_per_s > 0 or constrained):
                    own.append(GroupUsage(scope, usage.key, used_per_s, constrained))
        self._seen = seen
        return own, limits

    def _apply(self, decision: ShareDecision) -> None:
        if self.view.joined and not self._joined_logged:
            self._joined_logged = True
            log.info("fleet %s: joined (heard its own report back); %d member(s)", self.view.fleet_id,
                     decision.members)
        if decision.fallback != self.in_fallback:
            if decision.fallback:
                log.warning("fleet %s: exchange %s unreachable or silent; fallback: each quota x %.3f "
                            "(%d member(s) last known)", self.view.fleet_id, self.exchange.describe(),
                            decision.standby, decision.members)
            else:
                log.info("fleet %s: exchange back; %d member(s)", self.view.fleet_id, decision.members)
            self.in_fallback = decision.fallback
        elif decision.members != self.decision.members and not decision.fallback:
            log.info("fleet %s: %d member(s) now (was %d)", self.view.fleet_id, decision.members,
                     self.decision.members)
        self.decision = decision
        self.managers.fleet_standby_share = decision.standby
        busy: dict[str, set[SensorKey]] = {}
        for scope, key in decision.busy:
            busy.setdefault(scope, set()).add(key)
        self.managers.fleet_busy = {scope: frozenset(keys) for scope, keys in busy.items()}
        for scope, manager in self.managers.budgets():  # every budget kind: client, cluster, topic
            shares = {key: share for (s, key), share in decision.shares.items() if s == scope}
            manager.set_shares(shares, decision.standby, self.managers.fleet_busy.get(scope, frozenset()))


class FleetCollector(Collector):
    """`sluice_fleet_*`: members seen, this member's share per entity, report age, exchange health.

    `sluice_fleet_share` is labelled with the whole sharing group (scope and every tag of the key);
    at most `max_series_per_metric` groups get a series of their own, the rest are folded into one
    ``__overflow__`` series per scope and kind holding their mean share (`SeriesCap`)."""

    def __init__(self, member: FleetMember,
                 max_series_per_metric: int = DEFAULT_MAX_SERIES_PER_METRIC) -> None:
        self._member = member
        self.cap: SeriesCap[Group] = SeriesCap(max_series_per_metric)

    def collect(self) -> Iterator[Metric]:
        m = self._member
        now = m.clock.now_ms()
        members = GaugeMetricFamily("sluice_fleet_members", "Fleet members this process hears from "
                                    "(itself included; in fallback: the count it splits by)")
        members.add_metric([], m.decision.members)
        yield members
        fallback = GaugeMetricFamily("sluice_fleet_fallback", "1 while the exchange is down and quotas are "
                                     "split by the last known member count")
        fallback.add_metric([], 1 if m.in_fallback else 0)
        yield fallback
        age = GaugeMetricFamily("sluice_fleet_newest_report_age_seconds",
                                "Age of the newest report from another member")
        newest = m.view.newest_report_age_ms(now)
        if newest is not None:
            age.add_metric([], newest / 1000)
            yield age
        errors = CounterMetricFamily("sluice_fleet_exchange_errors", "Failures to publish or read reports")
        errors.add_metric([], m.exchange.errors)
        yield errors
        received = CounterMetricFamily("sluice_fleet_reports_received", "Usage reports read (own included)")
        received.add_metric([], m.reports_received)
        yield received
        ignored = CounterMetricFamily(
            "sluice_fleet_reports_ignored",
            "Payloads on the exchange not taken: not a usage report (malformed), a report of an older "
            "or unknown format version, or a report of another fleet",
            labels=["reason"])
        for reason in IGNORE_REASONS:
            ignored.add_metric([reason], m.ignored.get(reason, 0))
        ignored.add_metric(["other_fleet"], m.view.rejected)
        yield ignored
        sent = CounterMetricFamily("sluice_fleet_reports_sent", "Usage reports published")
        sent.add_metric([], m.reports_sent)
        yield sent
        sent_bytes = CounterMetricFamily("sluice_fleet_report_bytes_sent", "Bytes of usage reports published")
        sent_bytes.add_metric([], m.report_bytes_sent)
        yield sent_bytes
        standby = GaugeMetricFamily("sluice_fleet_standby_share", "This member's share of every group it is "
                                    "not active on")
        standby.add_metric([], m.decision.standby)
        yield standby
        share = GaugeMetricFamily("sluice_fleet_share", "This member's share of an entity's quota",
                                  labels=SHARE_LABELS)
        shares = m.decision.shares
        folded = self.cap.split(sorted(shares, key=_group_order))
        overflow: dict[tuple[str, str], list[float]] = {}
        for (scope, key), value in shares.items():
            if (scope, key) in folded:
                overflow.setdefault((scope, key.kind.value), []).append(value)
                continue
            share.add_metric([scope, key.kind.value, key.user, key.client_id, key.client_id_prefix, key.topic,
                              key.topic_prefix, key.tags_label], value)
        for (scope, kind), values in sorted(overflow.items()):
            share.add_metric([scope, kind, *[OVERFLOW] * (len(SHARE_LABELS) - 2)], sum(values) / len(values))
        yield share
        yield CounterMetricFamily("sluice_fleet_share_series_folded",
                                  "Sharing groups folded into the __overflow__ series of sluice_fleet_share "
                                  "because metrics.max_series_per_metric had series",
                                  value=self.cap.folded_total)


#: `sluice_fleet_share`'s labels: the scope (`broker`), the kind and every tag of the `SensorKey`.
SHARE_LABELS = ["broker", "kind", "user", "client_id", "client_id_prefix", "topic", "topic_prefix", "tags"]


def _group_order(group: Group) -> tuple[str, str, str, str, str, str, str, str]:
    scope, key = group
    return (scope, key.kind.value, key.user, key.client_id, key.client_id_prefix, key.topic, key.topic_prefix,
            key.tags_label)

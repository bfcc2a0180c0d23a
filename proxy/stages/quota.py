"""Quota enforcement on the wire, the way a Kafka broker does it (KIP-219).

What is recorded, and when:

- `producer_byte_rate`: the Produce request's size (header + body, without the 4-byte length
  prefix, as Kafka's `request.sizeInBytes`), when the request arrives. A throttle mutes the client
  at once; the broker's response then carries the throttle time. acks=0 produces get no response,
  so for them the mute is the whole enforcement.
- `consumer_byte_rate`: the Fetch response's size, when it comes back from the broker. A Fetch or
  ShareFetch of a topic with a consumer budget has its max_bytes capped by that budget too (its
  topics are read from the request, and kept per connection for incremental fetch sessions).
  When the client is throttled (by bytes or requests) the bytes are un-recorded and the client gets an
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
  A `consumer_record_rate` (the client's or a topic's) caps its max_records at one sample window
  of records, so no response carries far more than the budget admits. ShareAcknowledge carries
  no data: it counts for `request_rate` and `request_percentage`.
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

This stage is the adapter between wire bytes and the quota engine (`quotas.engine.QuotaEngine`):
it reads what a request or response carried, calls one verb, and applies the verdict (mute, cap
max_bytes, write throttle_time_ms, answer a throttled Fetch empty: `proxy.stages.quota_wire`).
Every rule is the engine's; what a fetch session fetches is `proxy.stages.fetch_sessions`'.
"""

from __future__ import annotations

import logging
from typing import Final

from contracts.compiled import choose
from protocol.apis import ApiKey, api_name
from protocol.errors import ProtocolError
from protocol.fetch import fetch_request_topics
from protocol.headers import RequestHeader
from protocol.share import share_fetch_request_topics
from proxy.flow.inflight import InFlight, QuotaNote
from proxy.flow.pipeline import ConnectionContext, Forward, RequestOutcome, ResponseOutcome, StageBase
from proxy.stages.fetch_sessions import FetchSessions
from proxy.stages.identities import Identities
from proxy.stages.quota_wire import cap_fetch, empty_fetch, with_throttle_time
from proxy.stages.topic_usage import TopicNames, TopicUsage, fetch_usage, produce_usage, share_fetch_usage
from quotas.engine import QuotaEngine, RequestVerdict, ResponseVerdict
from quotas.manager import ThrottleDecision

log = logging.getLogger("sluice.quotas")

_NOT_REQUEST_RATED = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})

_CHOICE: Final = choose("proxy.stages._speedups", ("QuotaHooks",))
COMPILED_MODULE: Final = _CHOICE.compiled_module
"""proxy.stages._speedups if it was built (whatever SLUICE_PURE_PYTHON says: tests use both), else None."""
QuotaHooksImpl: Final = None if _CHOICE.active is None else _CHOICE.active.QuotaHooks
"""The compiled hooks (`proxy/stages/_speedups.pyx`) a stage installs in place of its own, or None."""
describe: Final = _CHOICE.describe


class QuotaStage(StageBase):
    def __init__(self, engine: QuotaEngine, observer: DecisionObserver | None = None,
                 topic_names: TopicNames | None = None) -> None:
        self._engine = engine
        self._observer = observer
        self.topic_names = TopicNames() if topic_names is None else topic_names  # Produce v13, Fetch v13+
        self._fetch_sessions = FetchSessions()  # what an incremental fetch fetches beside what it lists
        self._identities = Identities()  # one ClientIdentity object per (principal, client id)
        if QuotaHooksImpl is not None:  # the same hooks compiled, for the requests most common
            hooks = QuotaHooksImpl(self, QuotaStage)
            self.on_request = hooks.on_request  # type: ignore[method-assign]
            self.on_response = hooks.on_response  # type: ignore[method-assign]

    # ------------------------------------------------------------------ requests

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None:
        engine = self._engine
        if not engine.active_kinds:
            return None  # no quota configured: nothing to record, nothing to remember
        names = (ctx.principal, header.client_id)
        identity = self._identities.get(names)
        if identity is None:
            identity = self._identities.make(names)
        api_key = header.api_key
        forward: bytes | None = None
        verdict: RequestVerdict
        if api_key == ApiKey.PRODUCE:
            usage: TopicUsage | None = None
            if engine.needs_produce_usage:
                usage = produce_usage(entry.produce_parts(payload, header), payload, header,
                                      self.topic_names, ctx.send_own)
            verdict = engine.produce(ctx.broker_id, identity, len(payload), usage)
        elif api_key == ApiKey.FETCH or api_key == ApiKey.SHARE_FETCH:
            topics = self._fetched_topics(ctx, header, payload) if engine.needs_fetch_request_topics else ()
            verdict = engine.fetch_request(ctx.broker_id, identity, share=api_key == ApiKey.SHARE_FETCH,
                                           topics=topics)
            if verdict.fetch_cap_bytes is not None or verdict.fetch_cap_records is not None:
                forward = cap_fetch(header, payload, verdict)
            entry.whole_response = verdict.read_whole_response
        else:
            verdict = engine.request(ctx.broker_id, identity, rated=api_key not in _NOT_REQUEST_RATED)
        observer = self._observer
        if observer is not None:  # `_observe`, inline: every request passes here
            for d in verdict.decisions:
                if d.would_throttle_ms > 0:
                    observer.on_violation(ctx, d)
        enforced = verdict.throttle_ms
        if api_key == ApiKey.PRODUCE and entry.expects_response:
            # KIP-219: the broker records a produce in its response callback and its delay starts
            # when the response is sent, so a slow acks=all produce waits latency + delay. The
            # channel is muted now (Sluice passes pipelined requests on; the broker reads none
            # while one is in flight) and the delay runs from the response (acks=0: from now)
            entry.delay_from_response_ms = enforced
        entry.quota = QuotaNote(identity, list(verdict.decisions), enforced)
        if forward is None and enforced == 0:
            return None
        return Forward(forward, enforced)

    def _fetched_topics(self, ctx: ConnectionContext, header: RequestHeader,
                        payload: bytes) -> tuple[str, ...]:
        """The topics a Fetch or ShareFetch request fetches from (its fetch session's, for an
        incremental one: `FetchSessions`), named as the response side names them (an id by
        `TopicNames`)."""
        try:
            if header.api_key == ApiKey.SHARE_FETCH:
                listed = share_fetch_request_topics(payload, header)
            else:
                listed = fetch_request_topics(payload, header)
        except (ProtocolError, ValueError) as exc:
            log.warning("cannot read the topics of %s v%d, its max_bytes is not capped by topic quotas: %s",
                        api_name(header.api_key), header.api_version, exc)
            return ()
        refs = self._fetch_sessions.fetched((ctx.connection_id, header.api_key), listed)
        names = self.topic_names
        return tuple({names.name(name, topic_id, ctx.send_own): None for name, topic_id in refs})

    # ------------------------------------------------------------------ responses

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        note = entry.quota
        if note is None:
            return None
        engine = self._engine
        earlier_ms = note.enforced_ms
        verdict: ResponseVerdict
        if entry.api_key == ApiKey.FETCH:
            size = entry.upstream_response_bytes  # payload may be only the head of a streamed response
            usage = None
            if engine.needs_fetch_usage and len(payload) == size:
                usage = fetch_usage(payload, entry.api_version, self.topic_names, ctx.send_own)
            verdict = engine.fetch_response(ctx.broker_id, note.identity, size, usage, earlier_ms)
            self._observe(ctx, verdict.decisions)
            note.decisions.extend(verdict.decisions)
            return self._fetch_outcome(entry, payload, note, verdict)
        if entry.api_key == ApiKey.SHARE_FETCH:  # never streamed: the payload is whole
            share_usage = (share_fetch_usage(payload, entry.api_version, self.topic_names, ctx.send_own)
                           if engine.needs_fetch_usage else None)
            verdict = engine.share_fetch_response(ctx.broker_id, note.identity,
                                                  entry.upstream_response_bytes, share_usage)
        elif entry.forwarded and entry.api_key not in _NOT_REQUEST_RATED:
            if entry.api_key == ApiKey.METADATA and engine.topic_kinds:
                # the topic ids of Produce v13 and Fetch v13+
                self.topic_names.learn(payload, entry.api_version)
            verdict = engine.response(ctx.broker_id, note.identity,
                                      entry.response_received_ms - entry.received_ms)
        else:
            return None if earlier_ms == 0 else self._throttled(entry, payload, 0, earlier_ms)
        self._observe(ctx, verdict.decisions)
        note.decisions.extend(verdict.decisions)
        return self._delivered(entry, payload, note, verdict.throttle_ms, earlier_ms)

    @classmethod
    def _fetch_outcome(cls, entry: InFlight, payload: bytes, note: QuotaNote,
                       verdict: ResponseVerdict) -> ResponseOutcome | None:
        """A Fetch response under its verdict (`note.enforced_ms` is still the request's throttle):
        answered empty as the broker answers a throttled fetch, or delivered with the throttle."""
        earlier_ms = note.enforced_ms
        if verdict.empty:
            told_ms = max(verdict.throttle_ms, earlier_ms)
            emptied = empty_fetch(entry, payload, told_ms)
            if emptied is not None:
                note.enforced_ms = told_ms  # the access log's throttle_time_ms for this Fetch
                return ResponseOutcome(emptied, verdict.throttle_ms, replaced=True)
        # delivered: a bucket's debt throttles what follows
        return cls._delivered(entry, payload, note, verdict.delivered_throttle_ms, earlier_ms)

    @classmethod
    def _delivered(cls, entry: InFlight, payload: bytes, note: QuotaNote, new_ms: int,
                   earlier_ms: int) -> ResponseOutcome | None:
        """The response as it goes out: throttled `new_ms` more, its throttle_time_ms the larger of
        that and the request's (`earlier_ms`, what the note says from now on)."""
        total_ms = max(new_ms, earlier_ms)
        note.enforced_ms = total_ms
        if total_ms == 0:
            return None  # nothing to patch, nothing to mute
        return cls._throttled(entry, payload, new_ms, total_ms)

    @staticmethod
    def _throttled(entry: InFlight, payload: bytes, new_ms: int, total_ms: int) -> ResponseOutcome:
        """The response with `total_ms` in its throttle_time_ms; the channel muted `new_ms` more."""
        return ResponseOutcome(with_throttle_time(entry, payload, total_ms), new_ms)

    def _observe(self, ctx: ConnectionContext, decisions: tuple[ThrottleDecision, ...]) -> None:
        if self._observer is None:
            return
        for d in decisions:
            if d.would_throttle_ms > 0:
                self._observer.on_violation(ctx, d)


class DecisionObserver:
    """Told of every violation (enforced or shadow); metrics and logs implement it."""

    def on_violation(self, ctx: ConnectionContext, decision: ThrottleDecision) -> None:
        raise NotImplementedError

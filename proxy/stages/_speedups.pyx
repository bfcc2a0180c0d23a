# cython: language_level=3, boundscheck=False, wraparound=False
"""The quota stage's two hooks compiled (Cython): `QuotaHooks`; and the rewrite stage's response hook
for the responses it leaves alone (`RewriteHooks`, at the end).

The readable reference is `QuotaStage.on_request` and `QuotaStage.on_response`
(`proxy/stages/quota.py`). This is the same code for the requests every connection sends most:
a Produce whose topics need no reading (no records/s and no topic quota configured), a Fetch
whose topics need no reading (no topic quota caps it) and whose response is not read whole (no
records/s or topic quota charges it), and every request that is not a ShareFetch, and their responses. The caller's identity is looked up,
the engine's verb is called through its compiled twin (`quotas._speedups.QuickCharge`'s
`produce_verdict`, `request_verdict`, `response_verdict`, `fetch_request_verdict` and
`fetch_response_verdict`, which run the engine's own Python verb whenever the request is not its
common case), a Fetch's max_bytes capped (`cap_fetch`, called only for a cap below the largest
int32: a higher one lowers nothing), violations are told to the observer, and the
in-flight entry's quota note and delay are written as the reference writes them. It enters no
Python function of its own per request: the reference enters the hook, the engine's verb and the
note's constructor on the request side, and the hook, the verb and `_observe` on the response side.

A Fetch response that is emptied or throttled is then the reference's own `_fetch_outcome`.
Everything else (a ShareFetch, a Produce or Fetch read per topic, a Metadata response whose topic
ids a topic quota needs, a response to a request Sluice answered itself, an engine without the
compiled twin) is the reference's own method, called as it is.

`QuotaStage` installs these hooks in place of its own when `proxy.stages.quota.QuotaHooksImpl` is
the compiled class; SLUICE_PURE_PYTHON=1 (or no build) runs the reference.
tests/unit/differential/test_quota_hooks.py holds the two equal.
"""

from protocol._slots cimport get, put, slot_offset

from protocol.apis import ApiKey
from protocol.headers import RequestHeader
from proxy.flow.inflight import InFlight, QuotaNote
from proxy.flow.pipeline import ConnectionContext, Forward
from proxy.stages.quota_wire import INT32_MAX, cap_fetch
from quotas.engine import RequestVerdict, ResponseVerdict
from quotas.manager import ThrottleDecision

# The fields the hooks read and write, at their slots' offsets (`protocol/_slots.pxd`), for entries,
# contexts, headers and notes of exactly these classes; anything else goes to the reference.
cdef Py_ssize_t H_API_KEY = slot_offset(RequestHeader, "api_key")
cdef Py_ssize_t H_CLIENT_ID = slot_offset(RequestHeader, "client_id")
cdef Py_ssize_t C_PRINCIPAL = slot_offset(ConnectionContext, "principal")
cdef Py_ssize_t C_BROKER_ID = slot_offset(ConnectionContext, "broker_id")
cdef Py_ssize_t E_API_KEY = slot_offset(InFlight, "api_key")
cdef Py_ssize_t E_API_VERSION = slot_offset(InFlight, "api_version")
cdef Py_ssize_t E_FORWARDED = slot_offset(InFlight, "forwarded")
cdef Py_ssize_t E_EXPECTS_RESPONSE = slot_offset(InFlight, "expects_response")
cdef Py_ssize_t E_RECEIVED_MS = slot_offset(InFlight, "received_ms")
cdef Py_ssize_t E_RESPONSE_RECEIVED_MS = slot_offset(InFlight, "response_received_ms")
cdef Py_ssize_t E_DELAY_FROM_RESPONSE_MS = slot_offset(InFlight, "delay_from_response_ms")
cdef Py_ssize_t E_QUOTA = slot_offset(InFlight, "quota")
cdef Py_ssize_t E_UPSTREAM_RESPONSE_BYTES = slot_offset(InFlight, "upstream_response_bytes")
cdef Py_ssize_t E_WHOLE_RESPONSE = slot_offset(InFlight, "whole_response")
cdef Py_ssize_t N_IDENTITY = slot_offset(QuotaNote, "identity")
cdef Py_ssize_t N_DECISIONS = slot_offset(QuotaNote, "decisions")
cdef Py_ssize_t N_ENFORCED_MS = slot_offset(QuotaNote, "enforced_ms")
# and the engine's answers, of exactly these classes (any other is read by name)
cdef Py_ssize_t V_DECISIONS = slot_offset(RequestVerdict, "decisions")
cdef Py_ssize_t V_THROTTLE_MS = slot_offset(RequestVerdict, "throttle_ms")
cdef Py_ssize_t R_DECISIONS = slot_offset(ResponseVerdict, "decisions")
cdef Py_ssize_t R_THROTTLE_MS = slot_offset(ResponseVerdict, "throttle_ms")
cdef Py_ssize_t D_WOULD_THROTTLE_MS = slot_offset(ThrottleDecision, "would_throttle_ms")

# the API keys these hooks tell apart, as C longs
cdef long _PRODUCE, _FETCH, _SHARE_FETCH, _METADATA, _API_VERSIONS, _SASL_HANDSHAKE, _SASL_AUTHENTICATE
(_PRODUCE, _FETCH, _SHARE_FETCH, _METADATA, _API_VERSIONS, _SASL_HANDSHAKE, _SASL_AUTHENTICATE) = (
    ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.SHARE_FETCH, ApiKey.METADATA, ApiKey.API_VERSIONS,
    ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)

_new_note = QuotaNote.__new__


cdef inline bint _rated(long api_key):
    """Not in `proxy.stages.quota._NOT_REQUEST_RATED`."""
    return api_key != _API_VERSIONS and api_key != _SASL_HANDSHAKE and api_key != _SASL_AUTHENTICATE


cdef class QuotaHooks:
    """`QuotaStage.on_request` and `QuotaStage.on_response` of one stage, compiled."""

    cdef object _stage, _engine, _identities, _observer, _on_request, _on_response, _throttled
    cdef object _fetch_outcome

    def __init__(self, stage, reference):
        """`reference`: the stage's class, whose methods are the readable hooks."""
        self._stage = stage
        self._engine = stage._engine
        self._identities = stage._identities
        self._observer = stage._observer
        self._on_request = reference.on_request
        self._on_response = reference.on_response
        self._throttled = reference._throttled
        self._fetch_outcome = reference._fetch_outcome

    cdef inline void _observe(self, ctx, decisions):
        observer = self._observer
        if observer is None:
            return
        for d in decisions:
            if (get(d, D_WOULD_THROTTLE_MS) if type(d) is ThrottleDecision else d.would_throttle_ms) > 0:
                observer.on_violation(ctx, d)

    def on_request(self, ctx, entry, header, payload):
        engine = self._engine
        if not engine.active_kinds:
            return None  # no quota configured: nothing to record, nothing to remember
        if type(header) is not RequestHeader or type(entry) is not InFlight or type(ctx) is not ConnectionContext:
            return self._on_request(self._stage, ctx, entry, header, payload)  # the slots below are theirs
        cdef long api_key = get(header, H_API_KEY)
        quick = engine._quick
        if (quick is None or api_key == _SHARE_FETCH
                or (api_key == _PRODUCE and engine.needs_produce_usage)
                or (api_key == _FETCH and engine.needs_fetch_request_topics)):
            return self._on_request(self._stage, ctx, entry, header, payload)
        broker_id = get(ctx, C_BROKER_ID)
        names = (get(ctx, C_PRINCIPAL), get(header, H_CLIENT_ID))
        identities = self._identities
        identity = identities.get(names)
        if identity is None:
            identity = identities.make(names)
        forward = None
        if api_key == _PRODUCE:
            verdict = quick.produce_verdict(broker_id, identity, len(payload))
        elif api_key == _FETCH:
            verdict = quick.fetch_request_verdict(broker_id, identity)
            cap = verdict.fetch_cap_bytes
            if cap is not None and cap < INT32_MAX:  # a cap at or above it lowers nothing (`cap_fetch`)
                forward = cap_fetch(header, payload, verdict)
            put(entry, E_WHOLE_RESPONSE, verdict.read_whole_response)
        else:
            verdict = quick.request_verdict(broker_id, identity, _rated(api_key))
        if type(verdict) is RequestVerdict:
            decisions, enforced = get(verdict, V_DECISIONS), get(verdict, V_THROTTLE_MS)
        else:
            decisions, enforced = verdict.decisions, verdict.throttle_ms
        if decisions:
            self._observe(ctx, decisions)
        if api_key == _PRODUCE and get(entry, E_EXPECTS_RESPONSE):
            # KIP-219: a produce's delay runs from its response (the reference says why)
            put(entry, E_DELAY_FROM_RESPONSE_MS, enforced)
        note = _new_note(QuotaNote)  # QuotaNote(identity, list(decisions), enforced)
        put(note, N_IDENTITY, identity)
        put(note, N_DECISIONS, list(decisions))
        put(note, N_ENFORCED_MS, enforced)
        put(entry, E_QUOTA, note)
        if forward is None and enforced == 0:
            return None
        return Forward(forward, enforced)

    def on_response(self, ctx, entry, payload):
        if type(entry) is not InFlight or type(ctx) is not ConnectionContext:
            return self._on_response(self._stage, ctx, entry, payload)  # the slots below are theirs
        note = get(entry, E_QUOTA)
        if note is None:
            return None
        if type(note) is not QuotaNote:
            return self._on_response(self._stage, ctx, entry, payload)
        engine = self._engine
        cdef long api_key = get(entry, E_API_KEY)
        if api_key == _FETCH:
            quick = engine._quick
            if quick is None or engine.needs_fetch_usage:
                return self._on_response(self._stage, ctx, entry, payload)
            earlier_ms = get(note, N_ENFORCED_MS)
            verdict = quick.fetch_response_verdict(get(ctx, C_BROKER_ID), get(note, N_IDENTITY),
                                                   get(entry, E_UPSTREAM_RESPONSE_BYTES), earlier_ms)
            decisions = verdict.decisions
            if decisions:
                self._observe(ctx, decisions)
                get(note, N_DECISIONS).extend(decisions)
            if earlier_ms == 0 and verdict.throttle_ms == 0 and verdict.debt_ms == 0 and not verdict.empty:
                return None  # delivered, nothing to patch or mute: `_fetch_outcome`'s answer
            return self._fetch_outcome(entry, payload, note, verdict)
        if api_key == _SHARE_FETCH:
            return self._on_response(self._stage, ctx, entry, payload)
        if not get(entry, E_FORWARDED) or not _rated(api_key):  # nothing is recorded at the response
            if get(note, N_ENFORCED_MS) == 0:
                return None  # and nothing to patch: the reference's answer
            return self._on_response(self._stage, ctx, entry, payload)
        quick = engine._quick
        if quick is None or (api_key == _METADATA and engine.topic_kinds):
            return self._on_response(self._stage, ctx, entry, payload)
        earlier_ms = get(note, N_ENFORCED_MS)
        verdict = quick.response_verdict(get(ctx, C_BROKER_ID), get(note, N_IDENTITY),
                                         get(entry, E_RESPONSE_RECEIVED_MS) - get(entry, E_RECEIVED_MS))
        if type(verdict) is ResponseVerdict:
            decisions, new_ms = get(verdict, R_DECISIONS), get(verdict, R_THROTTLE_MS)
        else:
            decisions, new_ms = verdict.decisions, verdict.throttle_ms
        if decisions:
            self._observe(ctx, decisions)
            get(note, N_DECISIONS).extend(decisions)
        total_ms = new_ms if new_ms > earlier_ms else earlier_ms
        put(note, N_ENFORCED_MS, total_ms)
        if total_ms == 0:
            return None  # nothing to patch, nothing to mute
        return self._throttled(entry, payload, new_ms, total_ms)


# ----------------------------------------------------------------------------- the rewrite stage

from protocol.fastpath import node_endpoints_absent as _node_endpoints_absent
from proxy.flow.pipeline import ResponseOutcome as _ResponseOutcome

# a response outcome made as its constructor makes it, its slots filled in C (its generated
# `__init__` is a Python function that sets each field through `object.__setattr__`: frozen)
cdef Py_ssize_t O_PAYLOAD = slot_offset(_ResponseOutcome, "payload")
cdef Py_ssize_t O_THROTTLE_TIME_MS = slot_offset(_ResponseOutcome, "throttle_time_ms")
cdef Py_ssize_t O_REPLACED = slot_offset(_ResponseOutcome, "replaced")
cdef Py_ssize_t O_TAIL = slot_offset(_ResponseOutcome, "tail")
_new_outcome = _ResponseOutcome.__new__


cdef object _outcome(payload, tail):
    """`ResponseOutcome(payload, tail=tail)`."""
    outcome = _new_outcome(_ResponseOutcome)
    put(outcome, O_PAYLOAD, payload)
    put(outcome, O_THROTTLE_TIME_MS, 0)
    put(outcome, O_REPLACED, False)
    put(outcome, O_TAIL, tail)
    return outcome


cdef class RewriteHooks:
    """`RewriteStage.on_response` (`proxy/stages/addresses.py`, the readable reference), compiled for
    the responses it sees most: a whole Produce v10+ or Fetch v16+ response with no KIP-951 leader
    endpoints (every such response of a modern client, but for a leader move) is left alone, and an
    ApiVersions response already capped once is answered from the rewriter's cache, without
    entering a Python function; the head of a streamed Fetch gets its tail rewrite from the
    rewriter's `streamed_fetch` without the stage's and the rewriter's own hooks. Every other response is the reference's own method, called as it is.
    tests/unit/differential/test_rewrite_hooks.py holds the two equal."""

    cdef object _stage, _rewriter, _on_response
    cdef bint _plain_rewriter  # a `ResponseRewriter`: its `outcome` for a streamed head is read here

    def __init__(self, stage, reference):
        """`reference`: the stage's class, whose `on_response` is the readable hook."""
        self._stage = stage
        self._rewriter = stage._rewriter
        self._on_response = reference.on_response
        from proxy.stages.addresses import ResponseRewriter  # here: that module chooses this one at import
        self._plain_rewriter = type(self._rewriter) is ResponseRewriter

    def on_response(self, ctx, entry, payload):
        if type(entry) is not InFlight:  # the slots below are its
            return self._on_response(self._stage, ctx, entry, payload)
        cdef long api_key = get(entry, E_API_KEY)
        if api_key == _PRODUCE or api_key == _FETCH:
            size = get(entry, E_UPSTREAM_RESPONSE_BYTES)
            if len(payload) == size and _node_endpoints_absent(payload, api_key, get(entry, E_API_VERSION)):
                return None
            if api_key == _FETCH and len(payload) < size and self._plain_rewriter:
                # the head of a streamed Fetch (`ResponseRewriter.outcome`): as it is, and the tail
                # rewrite of a version with leader endpoints
                return _outcome(payload, self._rewriter.streamed_fetch(get(entry, E_API_VERSION)))
        elif api_key == _API_VERSIONS and len(payload) == get(entry, E_UPSTREAM_RESPONSE_BYTES):
            # `ResponseRewriter._cap_api_versions` when its cache holds this answer (all of a
            # cluster's answers but for the correlation id: every one after the first)
            capped = self._rewriter._api_versions_cache.get((get(entry, E_API_VERSION), payload[4:]))
            if capped is not None:
                return _outcome(payload[:4] + capped, None)
        return self._on_response(self._stage, ctx, entry, payload)

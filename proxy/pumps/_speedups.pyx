# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twins of a connection's per-request orchestration (Cython): `ResponseOrder` (the
response side) and `RequestReader` (the request side).

**RequestReader** is `ClientConnection.data_received`, `_read_on` and `_on_request`
(`proxy/pumps/connection.py`, the readable reference) in one compiled object, with
`ReadGate.frames_allowed` and, for a `Pipeline`, `Pipeline.on_request` inline: the frames split,
the gate asked before each, the request header read, the Produce acks peeked, the in-flight entry
made and queued, the request stages run and their outcome applied (forward, answer here or later,
close, throttle, SASL, acks=0). It enters none of those four Python functions per request.

**ResponseOrder** is the twin of `proxy.pumps.responses.ResponseOrder`.

The readable reference is `ResponseOrder` in `proxy/pumps/responses.py`, with the two pipeline
hooks it calls, `Pipeline.on_response` and `Pipeline.on_complete` (`proxy/flow/pipeline.py`). This
is the same code in one compiled object: the broker's response matched to its in-flight slot by
correlation id, the response stages run on it, the throttle they ask for started, and every
response whose turn has come written and completed. Per response it enters no Python function of
its own (the reference enters seven: the frame handler, the match, `run_stages`,
`Pipeline.on_response`, the `ResponseOutcome` of a response no stage changed, `flush` and
`Pipeline.on_complete`); the stages' hooks and the callbacks it is given run as they are.

When the pipeline is a `Pipeline` its routes are read here (the dict lookup the reference's hooks
make) and the outcomes combined by `combine_response`, as `Pipeline.on_response` does; any other
pipeline object is called through its own `on_response` and `on_complete`. Every attribute the
reference writes on an in-flight entry is written here, in the same order.
tests/unit/differential/test_response_order.py holds each twin equal to its reference, and a real
connection on both equal to one on neither.

**FetchStream** (at the end) is the twin of `proxy.pumps.fetch_stream.FetchStream`: a large Fetch
response streamed to the client as it arrives.

The fields these objects read and write per request on an in-flight entry (`InFlight`), a request
header (`RequestHeader`), the read gate and its mute (`ReadGate`, `ChannelMute`), the watchdog
(`ConnectionWatchdog`) and the client buffer (`ClientBuffer`) are read at their slots' offsets
(`protocol/_slots.pxd`), as their member descriptors read them, for objects of exactly those
classes; an object of another class is read by name.

`proxy.pumps.responses` picks the implementation (`ResponseOrderImpl`, `COMPILED_REQUESTS`);
SLUICE_PURE_PYTHON=1 (or no build) runs the references.
"""

from protocol.apis import api_name
from protocol.errors import ProtocolError
from protocol.fastpath import read_response_correlation_id
from protocol.sasl import SASL_API_KEYS
from proxy.flow.inflight import CorrelationMismatch
from proxy.flow.pipeline import Pipeline, ResponseOutcome, combine_response

from protocol._slots cimport get, put, slot_offset
from cpython.bytearray cimport PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE

from protocol.headers import RequestHeader as _Header
from proxy.flow.inflight import InFlight as _InFlight
from proxy.pumps.limits import ClientBuffer as _Buffer
from proxy.pumps.limits import ConnectionWatchdog as _Watchdog
from proxy.pumps.muting import ChannelMute as _Mute
from proxy.pumps.read_gate import ReadGate as _Gate

# The fields read and written per request, at their slots' offsets (`protocol/_slots.pxd`): for an
# object of exactly these classes; an object of any other class (a look-alike in a test) by name.
cdef Py_ssize_t E_API_KEY = slot_offset(_InFlight, "api_key")
cdef Py_ssize_t E_API_VERSION = slot_offset(_InFlight, "api_version")
cdef Py_ssize_t E_CORRELATION_ID = slot_offset(_InFlight, "correlation_id")
cdef Py_ssize_t E_FORWARDED = slot_offset(_InFlight, "forwarded")
cdef Py_ssize_t E_RESPONSE = slot_offset(_InFlight, "response")
cdef Py_ssize_t E_RESPONSE_BYTES = slot_offset(_InFlight, "response_bytes")
cdef Py_ssize_t E_OWN = slot_offset(_InFlight, "own")
cdef Py_ssize_t E_STREAMED = slot_offset(_InFlight, "streamed")
cdef Py_ssize_t E_MUTES_CHANNEL = slot_offset(_InFlight, "mutes_channel")
cdef Py_ssize_t E_DELAY_FROM_RESPONSE_MS = slot_offset(_InFlight, "delay_from_response_ms")
cdef Py_ssize_t E_RESPONSE_RECEIVED_MS = slot_offset(_InFlight, "response_received_ms")
cdef Py_ssize_t E_UPSTREAM_RESPONSE_BYTES = slot_offset(_InFlight, "upstream_response_bytes")
cdef Py_ssize_t E_BROKER_RESPONSE = slot_offset(_InFlight, "broker_response")
cdef Py_ssize_t H_API_KEY = slot_offset(_Header, "api_key")
cdef Py_ssize_t H_API_VERSION = slot_offset(_Header, "api_version")
cdef Py_ssize_t H_CORRELATION_ID = slot_offset(_Header, "correlation_id")
cdef Py_ssize_t H_CLIENT_ID = slot_offset(_Header, "client_id")
cdef Py_ssize_t G_UPSTREAM_UP = slot_offset(_Gate, "upstream_up")
cdef Py_ssize_t G_IN_FLIGHT = slot_offset(_Gate, "_in_flight")
cdef Py_ssize_t G_MAX_IN_FLIGHT = slot_offset(_Gate, "_max_in_flight")
cdef Py_ssize_t G_BACKPRESSURE = slot_offset(_Gate, "backpressure")
cdef Py_ssize_t G_CLOSED = slot_offset(_Gate, "closed")
cdef Py_ssize_t G_PAUSED = slot_offset(_Gate, "paused")
cdef Py_ssize_t G_DRAINING = slot_offset(_Gate, "draining")
cdef Py_ssize_t M_STATE = slot_offset(_Mute, "state")
cdef Py_ssize_t W_LAST_ACTIVE_MS = slot_offset(_Watchdog, "last_active_ms")
cdef Py_ssize_t W_HANDSHAKE_DONE = slot_offset(_Watchdog, "handshake_done")
cdef Py_ssize_t B_HELD_BYTES = slot_offset(_Buffer, "held_bytes")


cdef inline object _eget(object entry, Py_ssize_t offset, str name):
    """`entry.<name>` of an in-flight entry."""
    if type(entry) is _InFlight:
        return get(entry, offset)
    return getattr(entry, name)


cdef inline int _eput(object entry, Py_ssize_t offset, str name, object value) except -1:
    """`entry.<name> = value` of an in-flight entry."""
    if type(entry) is _InFlight:
        put(entry, offset, value)
    else:
        setattr(entry, name, value)
    return 0


cdef class _LastRoute:
    """A `Pipeline`'s route for an API key and version (`Pipeline.on_request`'s lookup: its dict
    first, then `route`), keeping the last one: a pipeline's route for a key never changes."""

    cdef object _pipeline
    cdef long _key      # the key `Pipeline` files the last route under (-1: none yet) ...
    cdef object _route  # ... and that route

    def __init__(self, pipeline):
        self._pipeline = pipeline
        self._key = -1

    cdef object of(self, long api_key, long api_version):
        cdef long key = ((api_key & 0xFFFF) << 16) | (api_version & 0xFFFF)
        if key != self._key:
            route = self._pipeline._routes.get(key)
            if route is None:
                route = self._pipeline.route(api_key, api_version)
            self._route = route
            self._key = key
        return self._route


cdef class ResponseOrder:
    """`proxy.pumps.responses.ResponseOrder`, compiled: same constructor, methods and effects."""

    cdef object _ctx, _pipeline, _clock, _now_ms, _inflight, _slots, _throttle, _gate, _splitter
    cdef object _upstream_name, _send, _start_throttle, _read_on, _close, _is_closed
    cdef bint _plain_pipeline
    cdef _LastRoute _routes
    cdef public object sasl

    def __init__(self, ctx, pipeline, clock, inflight, throttle, gate, splitter, upstream_name, *,
                 send, start_throttle, read_on, close, is_closed):
        self._ctx, self._pipeline, self._clock, self._inflight = ctx, pipeline, clock, inflight
        self._now_ms = clock.now_ms
        self._slots = inflight.queue
        self._throttle, self._gate, self._splitter = throttle, gate, splitter
        self._upstream_name = upstream_name
        self._send, self._start_throttle, self._read_on = send, start_throttle, read_on
        self._close, self._is_closed = close, is_closed
        self._plain_pipeline = type(pipeline) is Pipeline
        self._routes = _LastRoute(pipeline)
        self.sasl = None  # set by the connection at its first SASL request

    cdef object _route(self, entry):
        """The pipeline's route for the entry's API key and version (`Pipeline.on_response`'s lookup)."""
        return self._routes.of(_eget(entry, E_API_KEY, "api_key"), _eget(entry, E_API_VERSION, "api_version"))

    cdef object _match(self, long long correlation_id):
        """`InFlightRequests.match_upstream`: the oldest forwarded, unanswered slot, or raises."""
        for entry in self._slots:
            if _eget(entry, E_FORWARDED, "forwarded") and _eget(entry, E_RESPONSE, "response") is None:
                if _eget(entry, E_CORRELATION_ID, "correlation_id") != correlation_id:
                    raise CorrelationMismatch(
                        f"broker answered correlation id {correlation_id}, "
                        f"expected {entry.correlation_id}")
                return entry
        raise CorrelationMismatch(f"broker answered correlation id {correlation_id} with nothing in flight")

    def on_broker_frame(self, payload):
        """A whole response from the broker: the oldest forwarded request's."""
        self.broker_frame(payload)

    cdef broker_frame(self, payload):
        """`on_broker_frame`, for `UpstreamReader` to call without a method lookup."""
        try:
            entry = self._match(read_response_correlation_id(payload))
        except (ProtocolError, CorrelationMismatch) as exc:
            self._close(f"bad response from {self._upstream_name}: {exc}")
            return
        own = _eget(entry, E_OWN, "own")
        if own is not None:  # Sluice's own request: its answer goes to Sluice, not to the client
            if not own.done():
                own.set_result(payload)
            _eput(entry, E_RESPONSE, "response", b"")
            self.flush()
            return
        if self.sasl is not None and entry.api_key in SASL_API_KEYS:
            self.sasl.on_response(entry, payload)
        outcome = self._stages(entry, payload, len(payload))
        out = payload if outcome is None else outcome.payload
        _eput(entry, E_RESPONSE, "response", out)
        _eput(entry, E_RESPONSE_BYTES, "response_bytes", len(out))
        self.flush()

    def run_stages(self, entry, payload, size):
        """The response stages on `payload` (a whole response of `size` bytes, or a streamed one's head)."""
        outcome = self._stages(entry, payload, size)
        return ResponseOutcome(payload) if outcome is None else outcome

    cdef object _stages(self, entry, payload, size):
        """`run_stages`, returning None where the reference returns `ResponseOutcome(payload)`: no
        stage said anything (the payload is then the broker's, unchanged)."""
        now_ms = self._now_ms()
        _eput(entry, E_RESPONSE_RECEIVED_MS, "response_received_ms", now_ms)
        _eput(entry, E_UPSTREAM_RESPONSE_BYTES, "upstream_response_bytes", size)
        cdef object outcome = None
        if self._plain_pipeline:  # Pipeline.on_response, inline
            _eput(entry, E_BROKER_RESPONSE, "broker_response", payload)
            for on_response in self._route(entry).on_response:
                said = on_response(self._ctx, entry, payload)
                if said is None:
                    continue
                outcome = said if outcome is None else combine_response(outcome, said)
                payload = said.payload
        else:
            outcome = self._pipeline.on_response(self._ctx, entry, payload)
        if outcome is not None and outcome.throttle_time_ms > 0:
            self._start_throttle(now_ms, outcome.throttle_time_ms)
            _eput(entry, E_MUTES_CHANNEL, "mutes_channel", True)
        delay_ms = _eget(entry, E_DELAY_FROM_RESPONSE_MS, "delay_from_response_ms")
        if delay_ms > 0 and _eget(entry, E_MUTES_CHANNEL, "mutes_channel"):
            self._throttle.extend(now_ms, delay_ms)
        return outcome

    def answer_later(self, entry, pending):
        """A stage answers this request itself once `pending` is done; later requests wait their turn."""
        def done(future):
            if self._is_closed():
                return
            if future.cancelled() or future.exception() is not None:
                self._close(f"Sluice could not answer {api_name(entry.api_key)}: "
                            f"{'cancelled' if future.cancelled() else future.exception()!r}")
                return
            entry.answer(future.result(), self._now_ms())
            self.flush()

        pending.add_done_callback(done)

    def flush(self):
        """Write the responses at the head whose turn has come; then read on (which also ends a drain)."""
        send, ctx = self._send, self._ctx
        cdef bint plain = self._plain_pipeline
        cdef bint sent_any = False
        slots = self._slots
        while slots and _eget(slots[0], E_RESPONSE, "response") is not None:
            entry = slots.popleft()
            response = _eget(entry, E_RESPONSE, "response")
            if _eget(entry, E_OWN, "own") is not None:  # never the client's: nothing is sent, nothing completes
                _eput(entry, E_RESPONSE, "response", None)
                sent_any = True  # a slot is free all the same: the gate may let frames on
                continue
            if not _eget(entry, E_STREAMED, "streamed"):
                send(response)
            _eput(entry, E_RESPONSE, "response", None)
            if _eget(entry, E_MUTES_CHANNEL, "mutes_channel"):
                self._throttle.response_sent()
            sent_ms = self._now_ms()
            if plain:  # Pipeline.on_complete, inline
                for on_complete in self._route(entry).on_complete:
                    on_complete(ctx, entry, sent_ms)
            else:
                self._pipeline.on_complete(ctx, entry, sent_ms)
            sent_any = True
        if not sent_any:
            return
        gate = self._gate
        if type(gate) is _Gate:
            waiting = get(gate, G_PAUSED) or get(gate, G_DRAINING)
        else:
            waiting = gate.paused or gate.draining
        if waiting or self._splitter.buffered_bytes:
            self._read_on()  # a response left: a mute may have ended, frames wait, or a drain may end


# ----------------------------------------------------------------------------- the request side

import logging

from protocol._slots cimport fill, offsets_of

from protocol.apis import ApiKey
from protocol.fastpath import read_produce_acks, read_request_header
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import FORWARD, AnswerHere, AnswerLater, Close, Forward, combine_request
from proxy.pumps.muting import ChannelMuteState
from proxy.pumps.sasl_mode import SaslMode

_log = logging.getLogger("sluice.connection")
_NOT_MUTED = ChannelMuteState.NOT_MUTED
cdef long _PRODUCE = ApiKey.PRODUCE
cdef long _API_VERSIONS = ApiKey.API_VERSIONS


# `InFlight(correlation_id, api_key, api_version, client_id, request_bytes, received_ms,
# expects_response=...)` without the dataclass's generated __init__ (a Python function, entered per
# request): the slots filled in C (protocol/_slots.pxd), every other field with its declared default
cdef object _object_new = object.__new__
_GIVEN = ("correlation_id", "api_key", "api_version", "client_id", "request_bytes", "received_ms",
          "expects_response")
cdef Py_ssize_t _given_offsets[7]
offsets_of(InFlight, _GIVEN, _given_offsets, 7)


def _entry_defaults():
    """(names, values) of InFlight's fields that a request does not give: their declared defaults."""
    import dataclasses
    names, values = [], []
    for f in dataclasses.fields(InFlight):
        if f.name in _GIVEN:
            continue
        if f.default is dataclasses.MISSING:  # a default_factory, or none: this module cannot fill it
            raise ImportError(f"InFlight.{f.name} has no plain default to fill in C")
        names.append(f.name)
        values.append(f.default)
    if len(names) + len(_GIVEN) != len(InFlight.__slots__):
        raise ImportError(f"InFlight's slots {InFlight.__slots__} are not its fields")
    return tuple(names), tuple(values)


DEF MAX_DEFAULTS = 64
cdef Py_ssize_t _default_offsets[MAX_DEFAULTS]
_default_names, _default_values = _entry_defaults()
offsets_of(InFlight, _default_names, _default_offsets, MAX_DEFAULTS)
cdef tuple _defaults = _default_values


cdef object new_entry(object correlation_id, object api_key, object api_version, object client_id,
                      object request_bytes, object received_ms, bint expects_response):
    """`InFlight(correlation_id, api_key, api_version, client_id, request_bytes, received_ms,
    expects_response=expects_response)`."""
    entry = _object_new(InFlight)
    fill(entry, _given_offsets, (correlation_id, api_key, api_version, client_id, request_bytes, received_ms,
                                 True if expects_response else False))
    fill(entry, _default_offsets, _defaults)
    return entry


def make_entry(correlation_id, api_key, api_version, client_id, request_bytes, received_ms, *,
               bint expects_response=True):
    """`new_entry` for the differential tests: the entry the request side makes."""
    return new_entry(correlation_id, api_key, api_version, client_id, request_bytes, received_ms,
                     expects_response)


cdef class RequestReader:
    """`ClientConnection.data_received`, `buffer_updated`, `_read_on` and `_on_request` of one
    connection, compiled (the reference is those methods in `proxy/pumps/connection.py`, with
    `ReadGate.frames_allowed` and `Pipeline.on_request` inline). It reads and writes the connection's
    own attributes, as the reference's methods do; the connection installs its bound methods
    `data_received`, `buffer_updated`, `read_on` (as `_read_on` and `read_on`) and `on_request` in
    place of its own (`ClientConnection.__init__`) and calls `attach` once its parts exist."""

    cdef object _conn, _now_ms, _splitter, _gate, _pipeline, _slots, _watchdog, _ctx, _mute
    cdef bint _plain_pipeline
    cdef bint _slotted_gate      # a `ReadGate` whose mute is a `ChannelMute`: read at their slots
    cdef bint _slotted_watchdog  # a `ConnectionWatchdog`: likewise
    cdef bint _processing  # the connection's `_processing`: this object is its `_read_on`
    cdef _LastRoute _routes
    cdef object _out  # the connection's ClientOutput ...
    cdef ClientOutput _compiled_out  # ... when it is the compiled one (else None)
    cdef object _upstream  # the connection's upstream, once a read was corked ...
    cdef UpstreamReader _upstream_reader  # ... its compiled twin, when it has one (else None)
    cdef object _request_handler  # this object's bound on_request: the connection's _client_frame when no
                                  # SASL exchange or streamed Fetch has swapped it

    def __init__(self, conn):
        self._conn = conn
        self._request_handler = self.on_request

    def attach(self):
        """The connection's parts, once its constructor made them (none of them is replaced later)."""
        conn = self._conn
        self._now_ms = conn._now_ms
        self._splitter = conn._splitter
        self._gate = conn._gate
        self._pipeline = conn._pipeline
        self._plain_pipeline = type(conn._pipeline) is Pipeline
        self._routes = _LastRoute(conn._pipeline)
        self._slots = conn._inflight.queue
        self._watchdog = conn._watchdog
        self._ctx = conn.ctx
        self._mute = self._gate._mute
        self._slotted_gate = type(self._gate) is _Gate and type(self._mute) is _Mute
        self._slotted_watchdog = type(self._watchdog) is _Watchdog
        self._out = conn._out
        self._compiled_out = self._out if type(self._out) is ClientOutput else None

    cdef bint _frames_allowed(self, gate):
        """`ReadGate.frames_allowed`."""
        if self._slotted_gate:
            return (get(self._mute, M_STATE) is _NOT_MUTED and get(gate, G_UPSTREAM_UP)
                    and len(get(gate, G_IN_FLIGHT)) < get(gate, G_MAX_IN_FLIGHT)
                    and not (get(gate, G_BACKPRESSURE) or get(gate, G_CLOSED)))
        return (gate._mute.state is _NOT_MUTED and gate.upstream_up
                and len(gate._in_flight) < gate._max_in_flight and not (gate.backpressure or gate.closed))

    def data_received(self, data):
        if self._slotted_watchdog:
            put(self._watchdog, W_LAST_ACTIVE_MS, self._now_ms())
        else:
            self._watchdog.last_active_ms = self._now_ms()
        try:
            self._splitter.feed(data)
        except ProtocolError as exc:
            self._conn.close(f"malformed frame from client: {exc}")
            return
        self.read_on()

    def buffer_updated(self, nbytes):
        """`ClientConnection.buffer_updated`: the socket was read into the splitter's room."""
        if self._slotted_watchdog:
            put(self._watchdog, W_LAST_ACTIVE_MS, self._now_ms())
        else:
            self._watchdog.last_active_ms = self._now_ms()
        self._splitter.buffer_updated(nbytes)
        self.read_on()

    def read_on(self):
        """Handle the buffered client frames while the gate allows."""
        conn = self._conn
        if self._processing:  # re-entered from a flush inside a frame handler: the outer loop goes on
            return
        self._processing = True
        gate = self._gate
        splitter = self._splitter
        next_frame = splitter.next_frame
        cdef bint corked = False
        try:
            while splitter.buffered_bytes and self._frames_allowed(gate):
                try:
                    payload = next_frame()
                except ProtocolError as exc:
                    conn.close(f"malformed frame from client: {exc}")
                    return
                if payload is None:
                    break
                if not corked and splitter.buffered_bytes:  # more follows in this read: write once each way
                    self._cork()
                    corked = True
                handler = conn._client_frame
                if handler is self._request_handler:
                    self._request(payload)
                else:
                    handler(payload)
        finally:
            self._processing = False
            if corked:
                self._uncork()
        if (get(gate, G_PAUSED) if self._slotted_gate else gate.paused) or not self._frames_allowed(gate):
            gate.update()
        if get(gate, G_DRAINING) if self._slotted_gate else gate.draining:
            conn.close_if_drained()

    cdef _cork(self):
        """Cork the upstream and the client's output (`ClientConnection._read_on`'s `cork`)."""
        if self._upstream is None:
            upstream = self._upstream = self._conn._link.upstream
            reader = getattr(upstream, "_reader", None)
            self._upstream_reader = reader if type(reader) is UpstreamReader else None
        if self._upstream_reader is not None:
            self._upstream_reader._cork.corked += 1
        else:
            self._upstream.cork()
        if self._compiled_out is not None:
            self._compiled_out._cork.corked += 1
        else:
            self._out.cork()

    cdef _uncork(self):
        """The requests first: the broker starts on them sooner."""
        if self._upstream_reader is not None:
            self._upstream_reader.uncork()
        else:
            self._upstream.uncork()
        if self._compiled_out is not None:
            self._compiled_out.uncork()
        else:
            self._out.uncork()

    def on_request(self, payload):
        self._request(payload)

    cdef _request(self, payload):
        conn = self._conn
        try:
            header = read_request_header(payload)
        except ProtocolError as exc:
            conn.close(f"malformed request header: {exc}")
            return
        now_ms = self._now_ms()
        if type(header) is _Header:
            api_key_obj, api_version_obj = get(header, H_API_KEY), get(header, H_API_VERSION)
            correlation_id, client_id = get(header, H_CORRELATION_ID), get(header, H_CLIENT_ID)
        else:
            api_key_obj, api_version_obj = header.api_key, header.api_version
            correlation_id, client_id = header.correlation_id, header.client_id
        cdef long api_key = api_key_obj
        cdef long api_version = api_version_obj
        cdef bint expects_response = True
        if api_key == _PRODUCE:  # acks=0: no response will come
            try:
                expects_response = read_produce_acks(payload, header) != 0
            except ProtocolError as exc:
                _log.warning("connection %d: cannot read Produce acks (%s); expecting a response",
                             self._ctx.connection_id, exc)
        entry = new_entry(correlation_id, api_key_obj, api_version_obj, client_id, len(payload), now_ms,
                          expects_response)
        watchdog = self._watchdog
        if not (get(watchdog, W_HANDSHAKE_DONE) if self._slotted_watchdog else watchdog.handshake_done):
            watchdog.request(api_key_obj)
        cdef object outcome
        if self._plain_pipeline:  # Pipeline.on_request, inline
            outcome = None
            route = self._routes.of(api_key, api_version)
            staged = payload
            for on_request in route.on_request:
                said = on_request(self._ctx, entry, header, staged)
                if said is None:
                    continue
                outcome = said if outcome is None else combine_request(outcome, said)
                if isinstance(outcome, Forward) and outcome.payload is not None:
                    staged = outcome.payload  # later stages see what will be forwarded
            if outcome is None:
                outcome = FORWARD
        else:
            outcome = self._pipeline.on_request(self._ctx, entry, header, payload)
        kind = type(outcome)
        if kind is Forward:
            conn._upstream_write(payload if outcome.payload is None else outcome.payload)
        elif kind is AnswerHere:
            entry.answer(outcome.response, now_ms)
        elif kind is AnswerLater:
            put(entry, E_FORWARDED, False)  # (an `InFlight`: made above)
            conn.responses.answer_later(entry, outcome.pending)
        elif kind is Close:
            conn.close(outcome.reason)
            return
        if expects_response:
            self._slots.append(entry)  # InFlightRequests.add
        if api_key_obj in SASL_API_KEYS:  # SaslHandshake, SaslAuthenticate
            conn._past_auth = False
            responses = conn.responses
            sasl = responses.sasl  # one SaslMode per connection, kept where responses reach it
            if sasl is None:
                services = conn._services
                sasl = responses.sasl = SaslMode(conn, services.auth, services.max_frame_bytes)
            sasl.on_request(header, payload, entry)
        elif not conn._past_auth and kind is Forward and api_key != _API_VERSIONS:
            conn._past_auth = True
        throttle_ms = outcome.throttle_time_ms
        if throttle_ms > 0:
            conn.start_throttle(now_ms, throttle_ms)
            if expects_response:
                put(entry, E_MUTES_CHANNEL, True)
            else:
                conn.throttle.response_sent()  # acks=0: no response will come
        if not expects_response:
            self._pipeline.on_complete(self._ctx, entry, now_ms)
        if get(entry, E_RESPONSE) is not None:
            conn._flush()


# ----------------------------------------------------------------------------- writing to the client

from protocol._wire import I32

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize

_pack_size = I32.pack  # the size prefix, as `proxy.pumps.client_output` writes it


cdef inline object _size_prefix4(Py_ssize_t size):
    """`_pack_size(size)` (big-endian int32), made in C: no call into the struct module per frame."""
    if size > 0x7FFFFFFF:
        return _pack_size(size)  # raises as the reference does
    prefix = PyBytes_FromStringAndSize(NULL, 4)
    cdef unsigned char *p = <unsigned char *>PyBytes_AS_STRING(prefix)
    p[0] = (size >> 24) & 0xFF
    p[1] = (size >> 16) & 0xFF
    p[2] = (size >> 8) & 0xFF
    p[3] = size & 0xFF
    return prefix


cdef class WriteCork:
    """`proxy.pumps.client_output.WriteCork`, compiled: same methods and effects."""

    cdef public int corked  # how many corks are in: held while > 0 ...
    cdef public list held   # ... what is written meanwhile, in order

    def __init__(self):
        self.corked = 0
        self.held = []

    cpdef cork(self):
        self.corked += 1

    cpdef bint uncork(self):
        """Take out one cork: whether it was the last with something held (to `take` and write)."""
        self.corked -= 1
        return not self.corked and len(self.held) > 0

    cpdef list take(self):
        """What is held, in order; nothing is held afterwards."""
        held = self.held
        self.held = []
        return held


cdef class ClientOutput:
    """`proxy.pumps.client_output.ClientOutput`, compiled: same constructor, methods and effects."""

    cdef object _buffer, _watchdog, _now_ms
    # the transport's methods, bound once at `attach` (a connection's transport is never replaced):
    # a write costs no attribute lookup on it; None until then (nothing is written)
    cdef object _t_write, _t_writelines, _t_is_closing, _t_buffer_size
    cdef bint _slotted  # a `ClientBuffer` and a `ConnectionWatchdog`: read and written at their slots
    cdef WriteCork _cork  # what is written while corked

    def __init__(self, buffer, watchdog, now_ms):
        self._buffer = buffer
        self._watchdog = watchdog
        self._now_ms = now_ms
        self._slotted = type(buffer) is _Buffer and type(watchdog) is _Watchdog
        self._cork = WriteCork()

    def attach(self, transport):
        self._t_write, self._t_writelines = transport.write, transport.writelines
        self._t_is_closing, self._t_buffer_size = transport.is_closing, transport.get_write_buffer_size

    def write(self, data):
        if self._cork.corked:
            self._cork.held.append(data)
            return
        if self._t_is_closing is not None and not self._t_is_closing():
            self._t_write(data)
            self._wrote()

    def writelines(self, parts):
        if self._cork.corked:
            self._cork.held.extend(parts)
            return
        if self._t_is_closing is not None and not self._t_is_closing():
            self._t_writelines(parts)
            self._wrote()

    def frame(self, payload):
        """One whole Kafka frame: the size prefix, then the payload."""
        if self._cork.corked:
            held = self._cork.held
            held.append(_size_prefix4(len(payload)))
            held.append(payload)
            return
        if self._t_is_closing is not None and not self._t_is_closing():
            self._t_writelines((_size_prefix4(len(payload)), payload))
            self._wrote()

    cpdef cork(self):
        """Hold what is written from now until the matching `uncork`."""
        self._cork.corked += 1

    cpdef uncork(self):
        """Take out one cork; the last one writes what is held, as one `writelines`."""
        if self._cork.uncork():
            self.release()

    cpdef release(self):
        """Write what is held now, corked or not."""
        held = self._cork.take()
        if not held:
            return
        if self._t_is_closing is not None and not self._t_is_closing():
            self._t_writelines(held)
            self._wrote()

    cdef _wrote(self):
        buffer = self._buffer
        if self._slotted:
            put(self._watchdog, W_LAST_ACTIVE_MS, self._now_ms())
            if self._t_buffer_size() != get(buffer, B_HELD_BYTES):
                buffer.measure()
            return
        self._watchdog.last_active_ms = self._now_ms()
        if self._t_buffer_size() != buffer.held_bytes:
            buffer.measure()


# ----------------------------------------------------------------------------- a streamed Fetch response

from protocol.apis import ApiKey as _ApiKey
from protocol.framing import size_prefix as _size_prefix

cdef long _FETCH = _ApiKey.FETCH
cdef object _EMPTY = b""
_int_from_bytes = int.from_bytes


cdef class FetchStream:
    """`proxy.pumps.fetch_stream.FetchStream`, compiled: same constructor, attribute `left`, methods
    and effects (the host's methods called in the same order with the same arguments). Per chunk
    of a streaming response it enters no Python function of its own (the reference enters `feed`
    and `_send`); a tail's `feed` and the host's methods run as they are. The host's methods are
    read at the first stream (a connection makes its stream before its output and response order)."""

    cdef object _host, _entry, _tail
    cdef bint _forward
    cdef public Py_ssize_t left
    cdef object _first_in_flight, _run_stages, _write, _write_lines, _done

    def __init__(self, host):
        self._host = host
        self._entry = None
        self._forward = True
        self._tail = None
        self.left = 0
        self._write = None

    cdef _bind(self):
        host = self._host
        self._first_in_flight = host.first_in_flight
        self._run_stages = host.run_response_stages
        self._write = host.write_client
        self._write_lines = host.write_client_lines
        self._done = host.response_done

    cpdef streamable(self, size, head):
        """The in-flight Fetch a response of `size` starting with `head` belongs to, if it streams."""
        if size < _STREAM_MIN_BYTES:
            return None
        if self._write is None:
            self._bind()
        entry = self._first_in_flight()
        if (entry is None or entry.api_key != _FETCH or not entry.forwarded
                or entry.response is not None or entry.whole_response or len(head) < 4
                or _int_from_bytes(head[:4], "big", signed=True) != entry.correlation_id):
            return None
        return entry

    cpdef start(self, entry, size, splitter):
        """Take what the splitter holds of the response, send or drop it; `left` is what is to come."""
        if self._write is None:
            self._bind()
        part, left = splitter.take_partial()
        head = part[:_STREAM_HEAD_BYTES]
        outcome = self._run_stages(entry, head, size)  # `_decide`
        replaced = outcome.replaced
        sent_head = outcome.payload
        if replaced:
            entry.response = sent_head
            entry.response_bytes = len(sent_head)
        else:
            entry.response_bytes = size
        tail = outcome.tail
        self._entry, self._forward, self._tail, self.left = entry, not replaced, tail, left
        if replaced:
            self._done()
        elif tail is None:
            self._write_lines((_size_prefix(size), sent_head, memoryview(part)[len(head):]))
        else:
            self._write(_size_prefix(size))
            self._send(sent_head)
            self._send(memoryview(part)[len(head):])
        if not left:
            self._end()

    cpdef feed(self, data):
        """Bytes straight off the broker's socket while `left`; returns what follows the response."""
        cdef Py_ssize_t size = len(data)
        cdef Py_ssize_t n = self.left if self.left < size else size
        if self._forward:
            self._send(data if n == size else memoryview(data)[:n])
        self.left -= n
        if self.left:
            return _EMPTY
        self._end()
        return data[n:] if n < size else _EMPTY

    cdef _send(self, chunk):
        tail = self._tail
        if tail is not None:
            ready = tail.feed(chunk)
            if ready != len(chunk):
                chunk = chunk[:ready]
        if chunk:
            self._write(chunk)

    cdef _end(self):
        entry, tail, forward = self._entry, self._tail, self._forward
        self._entry, self._tail, self._forward = None, None, True
        if entry is None or not forward:
            return
        if tail is not None:
            self._write(tail.finish())
        entry.streamed = True
        entry.response = _EMPTY
        self._done()


# ----------------------------------------------------------------------------- the broker side

from proxy.pumps.fetch_stream import STREAM_HEAD_BYTES as _STREAM_HEAD_BYTES_OBJ
from proxy.pumps.fetch_stream import STREAM_MIN_BYTES as _STREAM_MIN_BYTES_OBJ
from proxy.pumps.fetch_stream import STREAM_READ_BYTES as _STREAM_READ_BYTES_OBJ

cdef Py_ssize_t _STREAM_HEAD_BYTES = _STREAM_HEAD_BYTES_OBJ
cdef Py_ssize_t _STREAM_MIN_BYTES = _STREAM_MIN_BYTES_OBJ
cdef Py_ssize_t _STREAM_READ_BYTES = _STREAM_READ_BYTES_OBJ


cdef class UpstreamReader:
    """`UpstreamConnection.write`, `cork`, `uncork`, `release`, `get_buffer`, `buffer_updated` and
    `data_received` of one upstream connection, compiled (the reference is those methods in
    `proxy/pumps/upstream.py`, with the first test of `FetchStream.streamable` and, for a client
    connection whose broker frames go to a compiled `ResponseOrder`,
    `ClientConnection.on_upstream_frame` inline). The connection installs these bound methods in place
    of its own and calls `attach` with its transport."""

    cdef object _client, _stream, _splitter
    cdef object _t_writelines, _t_is_closing  # the transport's, bound once at `attach`
    cdef FetchStream _compiled_stream  # the client's stream when it is the compiled one (else None)
    cdef ResponseOrder _responses   # the client's, when compiled: its frames are handed over in C ...
    cdef object _responses_frame    # ... while its broker-frame handler is this one (no SASL exchange)
    cdef object _output             # the client's output, corked while a read is handled ...
    cdef ClientOutput _compiled_output  # ... when it is the compiled one (else None)
    cdef WriteCork _cork  # the requests held while corked: size prefixes and payloads
    cdef bint _corked_output  # this read corked the client's output
    cdef object _stream_room  # the buffer of a streamed response's next read (a bytearray), or None

    def __init__(self, conn, client):
        self._client = client
        self._stream = conn._stream
        self._compiled_stream = self._stream if type(self._stream) is FetchStream else None
        self._splitter = conn._splitter
        self._output = client.client_output
        self._compiled_output = self._output if type(self._output) is ClientOutput else None
        self._cork = WriteCork()
        responses = getattr(client, "responses", None)
        if isinstance(responses, ResponseOrder) and hasattr(client, "_responses_frame"):
            self._responses = responses
            self._responses_frame = client._responses_frame
        else:
            self._responses = None

    def attach(self, transport):
        self._t_writelines, self._t_is_closing = transport.writelines, transport.is_closing

    def write(self, payload):
        if self._cork.corked:
            held = self._cork.held
            held.append(_size_prefix4(len(payload)))
            held.append(payload)
            return
        self._t_writelines((_size_prefix4(len(payload)), payload))

    cpdef cork(self):
        """Hold the requests written from now until the matching `uncork`."""
        self._cork.corked += 1

    cpdef uncork(self):
        """Take out one cork; the last one writes what is held, as one `writelines`."""
        if self._cork.uncork():
            self.release()

    cpdef release(self):
        """Write what is held now, corked or not."""
        held = self._cork.take()
        if held:
            if not self._t_is_closing():
                self._t_writelines(held)

    def get_buffer(self, sizehint):
        cdef FetchStream compiled_stream = self._compiled_stream
        cdef Py_ssize_t left = compiled_stream.left if compiled_stream is not None else self._stream.left
        if left:  # a new buffer, not zeroed: only what the read wrote is read
            self._stream_room = PyByteArray_FromStringAndSize(
                NULL, left if left < _STREAM_READ_BYTES else _STREAM_READ_BYTES)
            return self._stream_room
        self._stream_room = None
        return self._splitter.get_buffer(sizehint)

    def buffer_updated(self, Py_ssize_t nbytes):
        room = self._stream_room
        if room is not None:
            self._stream_room = None
            chunk = room if nbytes == PyByteArray_GET_SIZE(room) else memoryview(room)[:nbytes]
            if self._compiled_stream is not None:
                self._compiled_stream.feed(chunk)
            else:
                self._stream.feed(chunk)
            return
        self._splitter.buffer_updated(nbytes)
        self._read()

    def data_received(self, data):
        stream = self._stream
        cdef FetchStream compiled_stream = self._compiled_stream
        if compiled_stream is not None:
            if compiled_stream.left:
                data = compiled_stream.feed(data)
                if not data:
                    return
        elif stream.left:
            data = stream.feed(data)
            if not data:
                return
        self._splitter.feed(data)
        self._read()

    cdef _read(self):
        self._corked_output = False
        try:
            self._frames(self._compiled_stream)
        finally:
            if self._corked_output:
                if self._compiled_output is not None:
                    self._compiled_output.uncork()
                else:
                    self._output.uncork()

    cdef _frames(self, FetchStream compiled_stream):
        stream = self._stream
        splitter = self._splitter
        client = self._client
        cdef Py_ssize_t size
        try:
            while True:
                pending = splitter.pending_frame(_STREAM_HEAD_BYTES)
                if pending is None:
                    return
                size = pending[0]
                if size >= _STREAM_MIN_BYTES and not client.closed:  # FetchStream.streamable's first test
                    if compiled_stream is not None:
                        entry = compiled_stream.streamable(size, pending[1])
                        if entry is not None:
                            compiled_stream.start(entry, size, splitter)
                            if compiled_stream.left:
                                return  # the splitter is empty; the rest comes straight off the socket
                            continue
                    else:
                        entry = stream.streamable(size, pending[1])
                        if entry is not None:
                            stream.start(entry, size, splitter)
                            if stream.left:
                                return
                            continue
                payload = splitter.next_frame()
                if payload is None:
                    return
                if not self._corked_output and splitter.buffered_bytes:  # more follows in this read:
                    self._corked_output = True                            # one write to the client
                    if self._compiled_output is not None:
                        self._compiled_output._cork.corked += 1
                    else:
                        self._output.cork()
                if self._responses is None:
                    client.on_upstream_frame(payload)
                elif not client.closed:  # ClientConnection.on_upstream_frame, inline
                    handler = client._broker_frame
                    if handler is self._responses_frame:
                        self._responses.broker_frame(payload)
                    else:
                        handler(payload)
        except ProtocolError as exc:
            client.close(f"malformed frame from the broker: {exc}")


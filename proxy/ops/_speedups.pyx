# cython: language_level=3, boundscheck=False, wraparound=False
"""The access log's capture on the event loop, compiled (Cython): `AccessLogHooks`.

The readable reference is `AccessLogStage.on_request` and `AccessLogStage.on_complete`
(`proxy/ops/access_log.py`), with what `on_complete` calls: `AccessLogWriter.add` and
`LogBatch.add`, `_append` and `_columns_append` (`proxy/ops/access_log_batch.py`). This is the
same code in one object for the records the loop builds most: Produce (its partitions walked
when it arrives, its response's error codes and throttle read in one walk), Fetch (the compiled
walk of a whole response of at most `RESPONSE_WALK_MAX_BYTES`, or the throttle of a streamed
one's head) and ApiVersions. It enters no Python function per record, where the reference enters
six (`produce_parts`, the stage's hook, the writer's `add`, the batch's `add`, `_append` and
`_columns_append`). Every other API (its response may go to the writer process to be read) is
the reference's `LogBatch.add`, called under the same lock, as are the rare steps (a quota, a
topic or an error set seen for the first time in a batch is the batch's own Python).

`AccessLogStage` installs these hooks in place of its own when the compiled module is built and
SLUICE_PURE_PYTHON is not set. tests/unit/differential/test_access_log_hooks.py holds the batch
the two build equal, byte for byte.
"""

import math
import time

from protocol import fastpath
from protocol._wire import I16, I32
from protocol.apis import ApiKey
from protocol.errors import ProtocolError
from protocol.log_fastpath import produce_log_parts, produce_log_summary
from proxy.ops.access_log import log
from proxy.ops.access_log_batch import NULL_INT, RESPONSE_WALK_MAX_BYTES

from cpython cimport array
from cpython.object cimport Py_SIZE

from protocol._slots cimport get, slot_offset

from proxy.flow.inflight import InFlight as _InFlight
from proxy.flow.inflight import QuotaNote as _QuotaNote
from proxy.flow.pipeline import ConnectionContext as _Context
from quotas.manager import ThrottleDecision as _Decision

# The fields a record reads, at their slots' offsets (`protocol/_slots.pxd`): read as the member
# descriptors read them, without an attribute lookup each. Only for entries and contexts of exactly
# these classes; anything else is the reference's (`AccessLogHooks.on_complete`).
cdef Py_ssize_t E_API_KEY = slot_offset(_InFlight, "api_key")
cdef Py_ssize_t E_API_VERSION = slot_offset(_InFlight, "api_version")
cdef Py_ssize_t E_CORRELATION_ID = slot_offset(_InFlight, "correlation_id")
cdef Py_ssize_t E_CLIENT_ID = slot_offset(_InFlight, "client_id")
cdef Py_ssize_t E_REQUEST_BYTES = slot_offset(_InFlight, "request_bytes")
cdef Py_ssize_t E_RECEIVED_MS = slot_offset(_InFlight, "received_ms")
cdef Py_ssize_t E_FORWARDED = slot_offset(_InFlight, "forwarded")
cdef Py_ssize_t E_UPSTREAM_RESPONSE_BYTES = slot_offset(_InFlight, "upstream_response_bytes")
cdef Py_ssize_t E_RESPONSE_BYTES = slot_offset(_InFlight, "response_bytes")
cdef Py_ssize_t E_RESPONSE_RECEIVED_MS = slot_offset(_InFlight, "response_received_ms")
cdef Py_ssize_t E_BROKER_RESPONSE = slot_offset(_InFlight, "broker_response")
cdef Py_ssize_t E_QUOTA = slot_offset(_InFlight, "quota")
cdef Py_ssize_t E_PARTS = slot_offset(_InFlight, "parts")
cdef Py_ssize_t C_CLIENT_ADDRESS = slot_offset(_Context, "client_address")
cdef Py_ssize_t C_PRINCIPAL = slot_offset(_Context, "principal")
cdef Py_ssize_t C_SOFTWARE_NAME = slot_offset(_Context, "client_software_name")
cdef Py_ssize_t C_SOFTWARE_VERSION = slot_offset(_Context, "client_software_version")
cdef Py_ssize_t C_BROKER_ID = slot_offset(_Context, "broker_id")
# and a request's quota note and its decisions, when they are of exactly these classes
cdef Py_ssize_t N_DECISIONS = slot_offset(_QuotaNote, "decisions")
cdef Py_ssize_t N_ENFORCED_MS = slot_offset(_QuotaNote, "enforced_ms")
cdef Py_ssize_t D_BOUND = slot_offset(_Decision, "bound")
cdef Py_ssize_t D_ENTITY = slot_offset(_Decision, "entity")
cdef Py_ssize_t D_SHADOW = slot_offset(_Decision, "shadow")
cdef Py_ssize_t D_WOULD_THROTTLE_MS = slot_offset(_Decision, "would_throttle_ms")

from proxy.ops.access_log_batch import PART_COLUMNS, ROW_COLUMNS

cdef long _PRODUCE = ApiKey.PRODUCE
cdef long _FETCH = ApiKey.FETCH
cdef long _API_VERSIONS = ApiKey.API_VERSIONS
cdef long long _NULL_INT = NULL_INT
cdef long long _WALK_MAX = RESPONSE_WALK_MAX_BYTES
cdef double _NAN = math.nan

_throttle_offset = fastpath.throttle_time_offset
_fetch_partitions = fastpath.fetch_response_partitions
_monotonic = time.monotonic
_unpack_i32 = I32.unpack_from
_unpack_i16 = I16.unpack_from


cdef long long _throttle(payload, long api_key, long api_version):
    """`access_log_batch._throttle`: the broker's throttle_time_ms in `payload`, or NULL_INT."""
    try:
        offset = _throttle_offset(payload, api_key, api_version)
        if offset is None:
            return _NULL_INT
        return _unpack_i32(payload, offset)[0]
    except (ProtocolError, ValueError):
        return _NULL_INT


# --- a batch's columns, appended to in C --------------------------------------------------------
# `array.append` looks the method up and parses its argument per call; `_store` puts the value,
# converted to the column's C type first (out of range raises OverflowError, as `append` does,
# before the array grows), at the end of the typed array. A batch's columns are private to it
# while records are added.

ctypedef fused _Cell:
    long long
    int
    short
    signed char
    double


cdef inline int _store(array.array a, _Cell x) except -1:
    """`x` added at the end of `a`, whose items are of `x`'s C type."""
    cdef Py_ssize_t n = Py_SIZE(a)
    array.resize_smart(a, n + 1)
    (<_Cell *>a.data.as_voidptr)[n] = x
    return 0


# the C type each column's items are stored as, by its array type code (checked per batch)
_CODES = {"ts_ms": "q", "conn": "i", "client_id": "i", "api_key": "h", "api_version": "h",
          "correlation_id": "i", "request_bytes": "q", "response_bytes": "q", "latency_ms": "d",
          "throttle_ms": "i", "broker_throttle_ms": "q", "quota": "i", "would_throttle_ms": "q",
          "errors": "i", "topics_end": "i", "topics_valid": "b", "part_topic": "i", "part_index": "i",
          "part_records": "q", "part_bytes": "q"}
if dict(ROW_COLUMNS + PART_COLUMNS) != _CODES:
    raise ImportError("LogBatch's columns are not the ones proxy.ops._speedups stores into")


cdef object _matched(decisions):
    """`LogBatch._append`'s decision of the record's quota: the configured one (an entity and a
    bound) that would throttle most, the first of equals; None if there is none."""
    matched = most = None  # and its would_throttle_ms
    for d in decisions:
        if type(d) is _Decision:  # at its slots' offsets
            entity, bound, ms = get(d, D_ENTITY), get(d, D_BOUND), get(d, D_WOULD_THROTTLE_MS)
        else:
            entity, bound, ms = d.entity, d.bound, d.would_throttle_ms
        if entity is not None and bound is not None and (matched is None or ms > most):
            matched, most = d, ms
    return matched


cdef class _Columns:
    """One batch's column arrays, typed (read once per batch: the feeder swaps batches, not columns)."""

    cdef object batch
    cdef array.array ts_ms, conn, client_id, api_key, api_version, correlation_id, request_bytes
    cdef array.array response_bytes, latency_ms, throttle_ms, broker_throttle_ms, quota
    cdef array.array would_throttle_ms, errors, topics_end, topics_valid
    cdef array.array part_topic, part_index, part_records, part_bytes
    # the batch's dictionaries of distinct values (made with the batch, never replaced) ...
    cdef dict conns, client_ids, error_sets
    cdef object by_decision, topics
    # ... and the last connection and client-id a row was given, compared by identity: a value
    # identical to the last one has the last one's index (the dictionary would return it)
    cdef object last_address, last_principal, last_software_name, last_software_version, last_broker
    cdef object last_conn, last_client_id, last_client

    def __init__(self, batch):
        for name, code in _CODES.items():  # a column of another type is a bug: say so
            if type(getattr(batch, name)) is not array.array or getattr(batch, name).typecode != code:
                raise TypeError(f"LogBatch.{name} is not an array of {code!r}")
        self.batch = batch
        self.ts_ms, self.conn, self.client_id = batch.ts_ms, batch.conn, batch.client_id
        self.api_key, self.api_version, self.correlation_id = batch.api_key, batch.api_version, batch.correlation_id
        self.request_bytes, self.response_bytes = batch.request_bytes, batch.response_bytes
        self.latency_ms, self.throttle_ms = batch.latency_ms, batch.throttle_ms
        self.broker_throttle_ms, self.quota = batch.broker_throttle_ms, batch.quota
        self.would_throttle_ms, self.errors = batch.would_throttle_ms, batch.errors
        self.topics_end, self.topics_valid = batch.topics_end, batch.topics_valid
        self.part_topic, self.part_index = batch.part_topic, batch.part_index
        self.part_records, self.part_bytes = batch.part_records, batch.part_bytes
        self.conns, self.client_ids, self.error_sets = batch._conns, batch._client_ids, batch._error_sets
        self.by_decision, self.topics = batch._by_decision, batch._topics
        self.last_conn = self.last_client = None

    cdef object conn_of(self, ctx):
        """The row's `conn` (`LogBatch._append`'s dictionary of connection keys)."""
        address, principal = get(ctx, C_CLIENT_ADDRESS), get(ctx, C_PRINCIPAL)
        name, version, broker = get(ctx, C_SOFTWARE_NAME), get(ctx, C_SOFTWARE_VERSION), get(ctx, C_BROKER_ID)
        if (self.last_conn is not None and address is self.last_address and principal is self.last_principal
                and name is self.last_software_name and version is self.last_software_version
                and broker is self.last_broker):
            return self.last_conn
        key = (address, principal, name, version, broker)
        conns = self.conns
        conn = conns.get(key)
        if conn is None:
            conn = conns[key] = len(conns)
        self.last_address, self.last_principal, self.last_software_name = address, principal, name
        self.last_software_version, self.last_broker, self.last_conn = version, broker, conn
        return conn

    cdef object client_of(self, client_id):
        """The row's `client_id` index."""
        if self.last_client is not None and client_id is self.last_client_id:
            return self.last_client
        client_ids = self.client_ids
        client = client_ids.get(client_id)
        if client is None:
            client = client_ids[client_id] = len(client_ids)
        self.last_client_id, self.last_client = client_id, client
        return client


cdef class AccessLogHooks:
    """`AccessLogStage.on_request` and `AccessLogStage.on_complete` of one stage, compiled."""

    cdef object _stage, _writer, _reference_on_complete
    cdef object _acquire, _release   # the writer's lock's (the feeder takes the batch under it)
    cdef Py_ssize_t _queue_size      # the writer's
    cdef object _defer_budget_bytes  # the writer's max_pending_payload_bytes
    cdef _Columns _columns  # the current batch's (a new batch: read again)
    cdef Py_ssize_t _send_rows  # the writer's: a batch this full wakes its feeder thread

    def __init__(self, stage, reference_on_complete):
        """`reference_on_complete`: the stage class's own hook, for an entry or context of another class."""
        self._stage = stage
        self._writer = stage._writer
        self._columns = None
        self._send_rows = self._writer.send_rows
        self._reference_on_complete = reference_on_complete
        self._acquire, self._release = self._writer._lock.acquire, self._writer._lock.release
        self._queue_size = self._writer.queue_size
        self._defer_budget_bytes = self._writer.max_pending_payload_bytes

    def on_request(self, ctx, entry, header, payload):
        if header.api_key == _PRODUCE and not entry.parts_walked:  # InFlight.produce_parts
            entry.parts = produce_log_parts(payload, header)
            entry.parts_walked = True
        return None

    def on_complete(self, ctx, entry, sent_ms):
        """`AccessLogWriter.add(ctx, entry, entry.received_ms + epoch offset)`."""
        if type(entry) is not _InFlight or type(ctx) is not _Context:  # the slots read below are theirs
            self._reference_on_complete(self._stage, ctx, entry, sent_ms)
            return
        writer = self._writer
        cdef long long ts_ms = <long long>get(entry, E_RECEIVED_MS) + <long long>self._stage._epoch_offset_ms
        cdef _Columns c
        self._acquire()
        try:
            batch = writer._batch
            if len(batch.ts_ms) >= self._queue_size:
                writer.dropped += 1
                writer._last_drop_s = _monotonic()
                return
            try:
                self._add(batch, ctx, entry, ts_ms, self._defer_budget_bytes)
            except Exception:  # a bug must cost one record, never the connection
                writer.unreadable += 1
                if writer.unreadable == 1 or writer.unreadable % 10_000 == 0:
                    log.exception("cannot log a request (%d so far)", writer.unreadable)
                return
            c = self._columns  # the batch's own columns once a row of ours went in
            if (Py_SIZE(c.ts_ms) if c is not None and c.batch is batch else len(batch.ts_ms)) == self._send_rows:
                writer.wake()
        finally:
            self._release()

    cdef _add(self, batch, ctx, entry, long long ts_ms, defer_budget_bytes):
        """`LogBatch.add` for Produce, Fetch and ApiVersions; any other API is the batch's own."""
        cdef long api_key = get(entry, E_API_KEY)
        if api_key != _PRODUCE and api_key != _FETCH and api_key != _API_VERSIONS:
            batch.add(ctx, entry, ts_ms, defer_budget_bytes)
            return
        cdef long version = get(entry, E_API_VERSION)
        response = get(entry, E_BROKER_RESPONSE)
        cdef Py_ssize_t size = 0 if response is None else len(response)
        cdef bint whole = (response is not None and size == <Py_ssize_t>get(entry, E_UPSTREAM_RESPONSE_BYTES)
                           and size <= _WALK_MAX)
        parts = None
        codes = ()
        cdef long long throttle = _NULL_INT
        cdef bint read
        if api_key == _PRODUCE:
            parts = get(entry, E_PARTS)
            if whole:
                read = False
                if parts is not None:
                    try:
                        codes, throttle = produce_log_summary(response, version)
                        read = True
                    except ProtocolError:
                        pass
                if not read:
                    throttle = _throttle(response, api_key, version)
        elif api_key == _FETCH:
            if response is not None:
                throttle = _throttle(response, api_key, version)
                if whole:
                    try:
                        top, traffic = _fetch_partitions(response, version)
                    except ProtocolError:
                        pass
                    else:
                        parts = tuple((p.topic, p.topic_id, p.partition,
                                       -1 if p.records is None else p.records, p.bytes) for p in traffic)
                        found_codes = {top, *(p.error_code for p in traffic)}
                        found_codes.discard(0)
                        codes = tuple(sorted(found_codes))
        elif whole:  # ApiVersions: its one error code, read in place
            throttle = _throttle(response, api_key, version)
            if size >= 6:
                code = _unpack_i16(response, 4)[0]
                codes = (code,) if code else ()
        self._append(batch, ctx, entry, ts_ms, parts, codes, throttle)

    cdef _append(self, batch, ctx, entry, long long ts_ms, parts, codes, long long throttle):
        """`LogBatch._append` and `_columns_append` (no deferred response: none of these APIs has one)."""
        cdef _Columns c = self._columns
        if c is None or c.batch is not batch:
            c = self._columns = _Columns(batch)
        conn = c.conn_of(ctx)
        client = c.client_of(get(entry, E_CLIENT_ID))
        note = get(entry, E_QUOTA)
        quota = -1
        cdef long long would = _NULL_INT
        enforced = 0
        if note is not None:
            if type(note) is _QuotaNote:  # at its slots' offsets
                enforced, decisions = get(note, N_ENFORCED_MS), get(note, N_DECISIONS)
            else:
                enforced, decisions = note.enforced_ms, note.decisions
            matched = _matched(decisions)
            if matched is not None:
                by_decision = c.by_decision
                known = by_decision.get(id(matched))
                if known is not None and known[0] is matched:
                    quota = known[1]
                else:
                    quota = batch._quota_index(matched)
                    by_decision[id(matched)] = (matched, quota)
                if get(matched, D_SHADOW) if type(matched) is _Decision else matched.shadow:
                    would = matched.would_throttle_ms
        cdef dict error_sets = c.error_sets
        errors = error_sets.get(codes)
        if errors is None:
            errors = error_sets[codes] = len(error_sets)
        received = get(entry, E_RESPONSE_RECEIVED_MS)
        cdef Py_ssize_t row = Py_SIZE(c.ts_ms)
        cdef Py_ssize_t n_parts = Py_SIZE(c.part_index)
        try:  # `_columns_append`
            _store(c.ts_ms, <long long>ts_ms)
            _store(c.conn, <int>conn)
            _store(c.client_id, <int>client)
            _store(c.api_key, <short>get(entry, E_API_KEY))
            _store(c.api_version, <short>get(entry, E_API_VERSION))
            _store(c.correlation_id, <int>get(entry, E_CORRELATION_ID))
            _store(c.request_bytes, <long long>get(entry, E_REQUEST_BYTES))
            _store(c.response_bytes, <long long>(get(entry, E_RESPONSE_BYTES) if received else _NULL_INT))
            _store(c.latency_ms, <double>float(received - get(entry, E_RECEIVED_MS)) if get(entry, E_FORWARDED) and received
                    else _NAN)
            _store(c.throttle_ms, <int>enforced)
            _store(c.broker_throttle_ms, <long long>throttle)
            _store(c.quota, <int>quota)
            _store(c.would_throttle_ms, <long long>would)
            _store(c.errors, <int>errors)
            if parts is not None:
                topics = c.topics
                for topic, topic_id, index, n_records, n_bytes in parts:
                    key = topic if topic is not None else (topic_id or b"")
                    t = topics.get(key)
                    if t is None:
                        t = topics[key] = len(topics)
                    _store(c.part_topic, <int>t)
                    _store(c.part_index, <int>index)
                    _store(c.part_records, <long long>n_records)
                    _store(c.part_bytes, <long long>n_bytes)
            _store(c.topics_end, <int>Py_SIZE(c.part_index))
            _store(c.topics_valid, <signed char>(parts is not None))
        except Exception:
            batch._truncate(row, n_parts)  # a row is added whole or not at all
            raise

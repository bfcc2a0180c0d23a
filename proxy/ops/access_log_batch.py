"""Access-log records as columns: filled on the event loop, one row per request, sent per batch.

`LogBatch` holds one column per record field (`array.array`s of C numbers, appended to) plus a few
small dictionaries for what repeats: a connection's strings (address, principal, client software,
broker), client ids, the matched quota, topics and error-code sets are each stored once per batch and
referred to by index. `LogBatch.add` derives one row from the request's in-flight entry:

* Produce: the partitions the request carried, walked when it arrived (`InFlight.produce_parts`, the
  one walk the quota stage reads too, kept in `InFlight.parts`, so no payload is kept); the
  response's error codes and the broker's throttle_time_ms from one walk of the broker's response
  (`InFlight.broker_response`, which the pipeline keeps anyway until the response has been sent);
* Fetch: partitions and error codes from the compiled Fetch walk of a whole response of at most
  `RESPONSE_WALK_MAX_BYTES`; a streamed (or larger) one gives only the throttle time of its head;
* ApiVersions: its one error code, read in place;
* every other API: the response itself goes with the batch (`deferred`), at most
  `max_pending_payload_bytes` of them in all, and the writer process reads its error codes (and a
  Metadata's topic ids) with kio, off the event loop. These are rare (Metadata, group and admin
  APIs); Produce and Fetch never ship a payload.

`LogBatch.message()` is what crosses the pipe: the columns' bytes and the dictionaries, pickled;
`LogBatch.from_message` is the writer process's copy, and `proxy.ops.access_log_arrow` turns it into
an Arrow record batch without a Python object per row. Null numbers are sentinels
(`NULL_INT`, NaN for doubles), turned into validity masks by the writer.
"""

from __future__ import annotations

import math
import pickle
from array import array
from collections.abc import Sequence
from typing import Any, Final

from contracts.access_log import format_quota_entity
from protocol import fastpath
from protocol._wire import I16, I32
from protocol.apis import ApiKey
from protocol.errors import ProtocolError
from protocol.log_fastpath import produce_log_summary
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext
from quotas.entity import QuotaEntity
from quotas.manager import ThrottleDecision

RESPONSE_WALK_MAX_BYTES: Final = 64 * 1024
"""Responses larger than this (and streamed Fetch responses) are not walked: only the throttle time
of a Fetch's head is read."""

NULL_INT: Final = -(2**63)
"""A null in an int64 column of nullable values (no logged value can be it)."""

Parts = tuple[tuple[str | None, bytes | None, int, int, int], ...]
"""A Produce request's partitions: (topic name, topic id, partition, records or -1, bytes)."""

# the columns, in the order `message()` sends them: (name, array type code)
ROW_COLUMNS: Final = (
    ("ts_ms", "q"), ("conn", "i"), ("client_id", "i"), ("api_key", "h"), ("api_version", "h"),
    ("correlation_id", "i"), ("request_bytes", "q"), ("response_bytes", "q"), ("latency_ms", "d"),
    ("throttle_ms", "i"), ("broker_throttle_ms", "q"), ("quota", "i"), ("would_throttle_ms", "q"),
    ("errors", "i"), ("topics_end", "i"), ("topics_valid", "b"))
PART_COLUMNS: Final = (("part_topic", "i"), ("part_index", "i"), ("part_records", "q"), ("part_bytes", "q"))

Conn = tuple[str, str, "str | None", "str | None", "int | None"]
"""(client_address, principal, client software name, version, broker id) of a connection."""
Quota = tuple[str, str, float, bool]
"""(quota_entity, quota_kind, quota_limit, shadow) of the decision a record names."""
Deferred = tuple[int, int, int, bytes]
"""(row, api_key, api_version, response) of a response whose error codes the writer reads."""

_ENTITY_TEXT_MAX: Final = 10_000


def _throttle(payload: bytes, api_key: int, api_version: int) -> int:
    """The broker's throttle_time_ms in `payload`, or NULL_INT (no such field, or unreadable)."""
    try:
        offset = fastpath.throttle_time_offset(payload, api_key, api_version)
        if offset is None:
            return NULL_INT
        value: int = I32.unpack_from(payload, offset)[0]
        return value
    except (ProtocolError, ValueError):
        return NULL_INT


class LogBatch:
    """The columns of up to a batch's worth of records (see the module's docstring)."""

    __slots__ = (
        "_by_decision",
        "_client_ids",
        "_conns",
        "_entity_text",
        "_error_sets",
        "_quotas",
        "_topics",
        "api_key",
        "api_version",
        "broker_throttle_ms",
        "client_id",
        "conn",
        "correlation_id",
        "deferred",
        "deferred_bytes",
        "errors",
        "latency_ms",
        "part_bytes",
        "part_index",
        "part_records",
        "part_topic",
        "quota",
        "request_bytes",
        "response_bytes",
        "throttle_ms",
        "topics_end",
        "topics_valid",
        "ts_ms",
        "would_throttle_ms",
    )

    ts_ms: array[int]
    conn: array[int]
    client_id: array[int]
    api_key: array[int]
    api_version: array[int]
    correlation_id: array[int]
    request_bytes: array[int]
    response_bytes: array[int]
    latency_ms: array[float]
    throttle_ms: array[int]
    broker_throttle_ms: array[int]
    quota: array[int]
    would_throttle_ms: array[int]
    errors: array[int]
    topics_end: array[int]
    topics_valid: array[int]
    part_topic: array[int]
    part_index: array[int]
    part_records: array[int]
    part_bytes: array[int]

    def __init__(self, entity_text: dict[QuotaEntity, str] | None = None) -> None:
        for name, code in ROW_COLUMNS + PART_COLUMNS:
            setattr(self, name, array(code))
        self._conns: dict[Conn, int] = {}
        self._client_ids: dict[str | None, int] = {}
        self._quotas: dict[Quota, int] = {}
        # id(decision) -> (the decision, its quota index): the engine's compiled common case
        # hands every not-throttled request of a caller the same decision objects
        self._by_decision: dict[int, tuple[ThrottleDecision, int]] = {}
        self._topics: dict[str | bytes, int] = {}
        self._error_sets: dict[tuple[int, ...], int] = {(): 0}
        self._entity_text = {} if entity_text is None else entity_text  # shared by a writer's batches
        self.deferred: list[Deferred] = []
        self.deferred_bytes = 0

    def __len__(self) -> int:
        return len(self.ts_ms)

    def add(self, ctx: ConnectionContext, entry: InFlight, ts_ms: int, defer_budget_bytes: int) -> None:
        """One record for `entry`, answered (or not) on the connection of `ctx`; a response whose
        error codes the writer must read is kept only while `deferred_bytes` stays within
        `defer_budget_bytes` (past it the record has no error codes)."""
        api_key = entry.api_key
        version = entry.api_version
        response = entry.broker_response
        size = 0 if response is None else len(response)
        whole = (response is not None and size == entry.upstream_response_bytes
                 and size <= RESPONSE_WALK_MAX_BYTES)
        parts: Parts | None = None
        codes: tuple[int, ...] = ()
        throttle = NULL_INT
        defer: bytes | None = None
        if api_key == ApiKey.PRODUCE:
            parts = entry.parts
            if whole:
                assert response is not None
                read = False
                if parts is not None:
                    try:
                        codes, throttle = produce_log_summary(response, version)
                        read = True
                    except ProtocolError:
                        pass
                if not read:
                    throttle = _throttle(response, api_key, version)
        elif api_key == ApiKey.FETCH:
            if response is not None:
                throttle = _throttle(response, api_key, version)
                if whole:
                    try:
                        top, traffic = fastpath.fetch_response_partitions(response, version)
                    except ProtocolError:
                        pass
                    else:
                        parts = tuple((p.topic, p.topic_id, p.partition,
                                       -1 if p.records is None else p.records, p.bytes) for p in traffic)
                        found_codes = {top, *(p.error_code for p in traffic)}
                        found_codes.discard(0)
                        codes = tuple(sorted(found_codes))
        elif whole:
            assert response is not None
            throttle = _throttle(response, api_key, version)
            if api_key == ApiKey.API_VERSIONS:
                if size >= 6:
                    code = I16.unpack_from(response, 4)[0]
                    codes = (code,) if code else ()
            elif self.deferred_bytes + size <= defer_budget_bytes:
                defer = response
        self._append(ctx, entry, ts_ms, parts, codes, throttle, defer)

    def _append(self, ctx: ConnectionContext, entry: InFlight, ts_ms: int, parts: Parts | None,
                codes: tuple[int, ...], throttle: int, defer: bytes | None) -> None:
        conn_key = (ctx.client_address, ctx.principal, ctx.client_software_name, ctx.client_software_version,
                    ctx.broker_id)
        conns = self._conns
        conn = conns.get(conn_key)
        if conn is None:
            conn = conns[conn_key] = len(conns)
        client_ids = self._client_ids
        client = client_ids.get(entry.client_id)
        if client is None:
            client = client_ids[entry.client_id] = len(client_ids)
        note = entry.quota
        quota = -1
        would = NULL_INT
        enforced = 0
        if note is not None:
            enforced = note.enforced_ms
            matched: ThrottleDecision | None = None  # `_matched`, inline: every record passes here
            for d in note.decisions:
                if d.entity is not None and d.bound is not None and (
                        matched is None or d.would_throttle_ms > matched.would_throttle_ms):
                    matched = d
            if matched is not None:
                known = self._by_decision.get(id(matched))
                if known is not None and known[0] is matched:
                    quota = known[1]
                else:
                    quota = self._quota_index(matched)
                    self._by_decision[id(matched)] = (matched, quota)
                if matched.shadow:
                    would = matched.would_throttle_ms
        error_sets = self._error_sets
        errors = error_sets.get(codes)
        if errors is None:
            errors = error_sets[codes] = len(error_sets)
        received = entry.response_received_ms
        row = len(self.ts_ms)
        n_parts = len(self.part_index)
        try:
            self._columns_append(entry, ts_ms, conn, client, enforced, throttle, quota, would, errors,
                                 received, parts)
        except Exception:
            self._truncate(row, n_parts)  # a row is added whole or not at all
            raise
        if defer is not None:
            self.deferred.append((row, entry.api_key, entry.api_version, defer))
            self.deferred_bytes += len(defer)

    def _columns_append(self, entry: InFlight, ts_ms: int, conn: int, client: int, enforced: int,
                        throttle: int, quota: int, would: int, errors: int, received: int,
                        parts: Parts | None) -> None:
        self.ts_ms.append(ts_ms)
        self.conn.append(conn)
        self.client_id.append(client)
        self.api_key.append(entry.api_key)
        self.api_version.append(entry.api_version)
        self.correlation_id.append(entry.correlation_id)
        self.request_bytes.append(entry.request_bytes)
        self.response_bytes.append(entry.response_bytes if received else NULL_INT)
        self.latency_ms.append(float(received - entry.received_ms) if entry.forwarded and received
                               else math.nan)
        self.throttle_ms.append(enforced)
        self.broker_throttle_ms.append(throttle)
        self.quota.append(quota)
        self.would_throttle_ms.append(would)
        self.errors.append(errors)
        if parts is not None:
            topics = self._topics
            part_topic = self.part_topic
            part_index = self.part_index
            part_records = self.part_records
            part_bytes = self.part_bytes
            for topic, topic_id, index, n_records, n_bytes in parts:
                key: str | bytes = topic if topic is not None else (topic_id or b"")
                t = topics.get(key)
                if t is None:
                    t = topics[key] = len(topics)
                part_topic.append(t)
                part_index.append(index)
                part_records.append(n_records)
                part_bytes.append(n_bytes)
        self.topics_end.append(len(self.part_index))
        self.topics_valid.append(parts is not None)

    def _truncate(self, rows: int, parts: int) -> None:
        for name, _ in ROW_COLUMNS:
            column = getattr(self, name)
            del column[rows:]
        for name, _ in PART_COLUMNS:
            column = getattr(self, name)
            del column[parts:]

    def _quota_index(self, matched: ThrottleDecision) -> int:
        entity = matched.entity
        assert entity is not None and matched.bound is not None
        texts = self._entity_text
        text = texts.get(entity)
        if text is None:
            if len(texts) >= _ENTITY_TEXT_MAX:
                texts.clear()
            text = texts[entity] = format_quota_entity(entity.to_kafka())
        key = (text, matched.kind.value, matched.bound, matched.shadow)
        quotas = self._quotas
        index = quotas.get(key)
        if index is None:
            index = quotas[key] = len(quotas)
        return index

    # ------------------------------------------------------------------ the batch as a message

    def message(self) -> bytes:
        """The batch for the writer process: the columns' bytes, the dictionaries, the deferred responses."""
        columns = [getattr(self, name).tobytes() for name, _ in ROW_COLUMNS + PART_COLUMNS]
        return pickle.dumps((columns, list(self._conns), list(self._client_ids), list(self._quotas),
                             list(self._topics), list(self._error_sets), self.deferred),
                            pickle.HIGHEST_PROTOCOL)

    @classmethod
    def from_message(cls, data: bytes) -> LogBatch:
        """The writer process's copy of a batch `message()` made."""
        columns, conns, client_ids, quotas, topics, error_sets, deferred = pickle.loads(data)
        batch = cls()
        for (name, code), raw in zip(ROW_COLUMNS + PART_COLUMNS, columns, strict=True):
            column = array(code)
            column.frombytes(raw)
            setattr(batch, name, column)
        batch._conns = _indexed(conns)
        batch._client_ids = _indexed(client_ids)
        batch._quotas = _indexed(quotas)
        batch._topics = _indexed(topics)
        batch._error_sets = _indexed(error_sets)
        batch.deferred = deferred
        return batch

    # ------------------------------------------------------------------ the dictionaries, in index order

    @property
    def conns(self) -> list[Conn]:
        return list(self._conns)

    @property
    def client_ids(self) -> list[str | None]:
        return list(self._client_ids)

    @property
    def quotas(self) -> list[Quota]:
        return list(self._quotas)

    @property
    def topics(self) -> list[str | bytes]:
        return list(self._topics)

    @property
    def error_sets(self) -> list[tuple[int, ...]]:
        return list(self._error_sets)

    def set_error_codes(self, row: int, codes: Sequence[int]) -> None:
        """The writer's error codes for a deferred row."""
        key = tuple(codes)
        error_sets = self._error_sets
        index = error_sets.get(key)
        if index is None:
            index = error_sets[key] = len(error_sets)
        self.errors[row] = index


def _indexed(keys: list[Any]) -> dict[Any, int]:
    return {key: i for i, key in enumerate(keys)}

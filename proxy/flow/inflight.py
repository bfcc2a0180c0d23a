"""Requests in flight on one client connection, answered to the client in request order.

Kafka answers the requests of one connection in the order they were sent, and clients rely on it.
Most responses come from the broker in that order anyway; the tracker also lets Sluice answer a
request itself (or finish a response asynchronously) without overtaking earlier ones: each request
gets a slot, a slot is filled when its response is ready, and responses leave from the head only.

Produce with acks=0 gets no response and therefore no slot. A request Sluice sends itself on the
client's upstream connection (`InFlight.own`) takes a slot too, in the order it was written, so the
broker's responses still match their slots one by one; its slot is dropped, never sent, when its
turn comes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from protocol.headers import RequestHeader
from protocol.log_fastpath import produce_log_parts
from protocol.log_walks import LogPart
from quotas.entity import ClientIdentity
from quotas.manager import ThrottleDecision


@dataclass(slots=True)
class QuotaNote:
    """What the quota stage decided at request time, for the response and the access log."""

    identity: ClientIdentity
    decisions: list[ThrottleDecision]
    enforced_ms: int                  # the largest throttle Sluice enforced on this request so far


@dataclass(slots=True)
class InFlight:
    """One request awaiting its response, with typed slots for what stages learn about it.

    A stage writes only its own slots; a slot's writer and readers are named beside it.
    """

    correlation_id: int
    api_key: int
    api_version: int
    client_id: str | None
    request_bytes: int
    received_ms: int
    forwarded: bool = True            # False when Sluice answers it itself
    expects_response: bool = True     # False for Produce acks=0
    response: bytes | None = field(default=None, repr=False)
    upstream_response_bytes: int = 0  # the broker's response payload size
    response_bytes: int = 0           # what Sluice sent to the client
    streamed: bool = False            # its response already went out piece by piece
    response_received_ms: int = 0
    mutes_channel: bool = False       # its response being sent is a RESPONSE_SENT mute event
    delay_from_response_ms: int = 0   # QuotaStage -> ResponseOrder: the mute lasts this long past the
                                      # response (KIP-219: a Produce's delay starts when it is sent)
    # the broker's response as it arrived (its head when streamed), kept by the pipeline before any
    # response stage runs: the broker's throttle_time_ms is read from it, never from a patched payload
    broker_response: bytes | None = field(default=None, repr=False)
    quota: QuotaNote | None = None                               # QuotaStage -> QuotaStage, access log
    whole_response: bool = False      # QuotaStage -> connection: never stream it (topics, records read)
    # a Produce's partitions, walked once (`produce_parts`) for the access log and the quota stage
    parts: tuple[LogPart, ...] | None = field(default=None, repr=False)
    parts_walked: bool = False
    sasl_exchange: object | None = None   # principals.SaslInspector: the exchange this request is part of
    sasl_round: int = 0                   # ... and its client message number (0: the handshake)
    # Sluice's own request on the client's upstream connection (`ClientConnection.send_own`): the
    # broker's response goes to this future, never to the client, and no stage sees either
    own: asyncio.Future[bytes] | None = field(default=None, repr=False)

    def produce_parts(self, payload: bytes, header: RequestHeader) -> tuple[LogPart, ...] | None:
        """This Produce request's partitions (topic name, topic id, partition, records or -1,
        bytes), walked at the first call (compiled when `protocol._log_speedups` is built) and
        kept: the access log's row and the topic and records quotas read the same walk. None when
        its layout cannot be read."""
        if not self.parts_walked:
            self.parts = produce_log_parts(payload, header)
            self.parts_walked = True
        return self.parts

    def answer(self, payload: bytes, now_ms: int) -> None:
        """Sluice's own response to it (a stage answered here, or later): never forwarded."""
        self.forwarded = False
        self.response = payload
        self.response_bytes = len(payload)
        self.response_received_ms = now_ms


class CorrelationMismatch(Exception):
    """The broker answered a correlation id that is not the oldest forwarded request."""


class InFlightRequests:
    __slots__ = ("_slots", "queue")

    def __init__(self) -> None:
        self._slots: deque[InFlight] = deque()
        self.queue = self._slots  # read-only view for hot paths: len(queue) without a Python call

    def __len__(self) -> int:
        return len(self._slots)

    def add(self, entry: InFlight) -> InFlight:
        self._slots.append(entry)
        return entry

    def match_upstream(self, correlation_id: int) -> InFlight:
        """The slot the broker's next response belongs to: the oldest forwarded, unanswered one."""
        for entry in self._slots:
            if entry.forwarded and entry.response is None:
                if entry.correlation_id != correlation_id:
                    raise CorrelationMismatch(
                        f"broker answered correlation id {correlation_id}, "
                        f"expected {entry.correlation_id}")
                return entry
        raise CorrelationMismatch(f"broker answered correlation id {correlation_id} with nothing in flight")

    def ready(self) -> Iterator[InFlight]:
        """Pop and yield the slots at the head whose responses are ready, in order."""
        slots = self._slots
        while slots and slots[0].response is not None:
            yield slots.popleft()

    def first(self) -> InFlight | None:
        return self._slots[0] if self._slots else None

    def pending_upstream(self) -> int:
        return sum(1 for e in self._slots if e.forwarded and e.response is None)

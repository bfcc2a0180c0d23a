"""The mute state of one client channel, after Kafka's `KafkaChannel.ChannelMuteState` table.

Kafka (KIP-219) answers a throttled request at once, with throttle_time_ms set, and then reads
nothing more from that client until both the response has been sent and the throttle delay has
passed. The broker reaches that state because it reads one request at a time; Sluice passes
pipelined requests through, so the channel is muted from the moment a throttle is decided.

States (Kafka's names) and events:

    NOT_MUTED --THROTTLE_STARTED--> MUTED_AND_THROTTLED_AND_RESPONSE_PENDING
    MUTED_AND_THROTTLED_AND_RESPONSE_PENDING --RESPONSE_SENT--> MUTED_AND_THROTTLED
    MUTED_AND_THROTTLED_AND_RESPONSE_PENDING --THROTTLE_ENDED--> MUTED_AND_RESPONSE_PENDING
    MUTED_AND_THROTTLED --THROTTLE_ENDED--> NOT_MUTED
    MUTED_AND_RESPONSE_PENDING --RESPONSE_SENT--> NOT_MUTED

A further throttle while muted (a pipelined response that is also throttled) moves back to
MUTED_AND_THROTTLED_AND_RESPONSE_PENDING and the delay ends at the later of the two deadlines.
Any other transition is a bug and raises, as Kafka's `IllegalStateException` does.

No I/O here: the connection asks `reading_allowed` and schedules `THROTTLE_ENDED` at `deadline_ms`.
"""

from __future__ import annotations

from enum import Enum


class ChannelMuteState(Enum):
    NOT_MUTED = "NOT_MUTED"
    MUTED_AND_RESPONSE_PENDING = "MUTED_AND_RESPONSE_PENDING"
    MUTED_AND_THROTTLED = "MUTED_AND_THROTTLED"
    MUTED_AND_THROTTLED_AND_RESPONSE_PENDING = "MUTED_AND_THROTTLED_AND_RESPONSE_PENDING"


class ChannelMuteEvent(Enum):
    THROTTLE_STARTED = "THROTTLE_STARTED"
    RESPONSE_SENT = "RESPONSE_SENT"
    THROTTLE_ENDED = "THROTTLE_ENDED"


class IllegalMuteTransition(RuntimeError):
    pass


S = ChannelMuteState
E = ChannelMuteEvent

_TRANSITIONS: dict[tuple[ChannelMuteState, ChannelMuteEvent], ChannelMuteState] = {
    (S.NOT_MUTED, E.THROTTLE_STARTED): S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING,
    (S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING, E.RESPONSE_SENT): S.MUTED_AND_THROTTLED,
    (S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING, E.THROTTLE_ENDED): S.MUTED_AND_RESPONSE_PENDING,
    (S.MUTED_AND_THROTTLED, E.THROTTLE_ENDED): S.NOT_MUTED,
    (S.MUTED_AND_RESPONSE_PENDING, E.RESPONSE_SENT): S.NOT_MUTED,
    # a second throttle while muted (pipelining): pending again, deadline extended
    (S.MUTED_AND_THROTTLED, E.THROTTLE_STARTED): S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING,
    (S.MUTED_AND_RESPONSE_PENDING, E.THROTTLE_STARTED): S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING,
    (S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING, E.THROTTLE_STARTED):
        S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING,
}


class ChannelMute:
    """Mute state plus the throttle deadline (monotonic ms) of one client channel."""

    __slots__ = ("_pending_responses", "deadline_ms", "state")

    def __init__(self) -> None:
        self.state = S.NOT_MUTED
        self.deadline_ms = 0
        self._pending_responses = 0

    @property
    def reading_allowed(self) -> bool:
        return self.state is S.NOT_MUTED

    def throttle_started(self, deadline_ms: int) -> None:
        """A throttle was decided; its response (if any) is still to be sent."""
        self._apply(E.THROTTLE_STARTED)
        self._pending_responses += 1
        self.deadline_ms = max(self.deadline_ms, deadline_ms)

    def delay_until(self, deadline_ms: int) -> None:
        """KIP-219 for Produce: the delay of a throttle whose response is still to be sent runs until
        `deadline_ms` (counted from the response, not the request). If the delay counted from the
        request had already ended, the channel is throttled again; no response is added."""
        if self._pending_responses == 0:
            raise IllegalMuteTransition(f"a delay with no throttled response pending in {self.state}")
        self.deadline_ms = max(self.deadline_ms, deadline_ms)
        if self.state is S.MUTED_AND_RESPONSE_PENDING:
            self.state = S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING

    def response_sent(self) -> None:
        """The throttled response was handed to the client's transport (or there is none)."""
        if self._pending_responses == 0:
            raise IllegalMuteTransition(f"RESPONSE_SENT with no throttled response pending in {self.state}")
        self._pending_responses -= 1
        if self._pending_responses == 0:
            self._apply(E.RESPONSE_SENT)

    def throttle_ended(self, now_ms: int) -> bool:
        """The delay timer fired. Returns False if a later throttle pushed the deadline further."""
        if now_ms < self.deadline_ms:
            return False
        self._apply(E.THROTTLE_ENDED)
        return True

    def _apply(self, event: ChannelMuteEvent) -> None:
        try:
            self.state = _TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalMuteTransition(f"{event.value} in state {self.state.value}") from None

"""The throttle delay of one client channel: its mute state (`proxy.pumps.muting.ChannelMute`) and
the one timer that ends the delay.

A throttle decided at request or response time mutes the channel at once (KIP-219); the timer fires
at the latest deadline. A later, longer throttle moves the deadline; a timer that fires early (the
deadline moved, or the loop woke a little early) re-arms itself. When the delay is over and the
throttled responses have been sent, `on_unmuted` is called so the connection reads on.

No I/O: the timer is whatever `call_later` the connection gives (the event loop's, or a fake).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from proxy.pumps.muting import ChannelMute
from quotas.clock import Clock


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], TimerHandle]


class ThrottleTimer:
    __slots__ = ("_call_later", "_clock", "_deadline_ms", "_handle", "_on_unmuted", "mute")

    def __init__(self, clock: Clock, call_later: CallLater, on_unmuted: Callable[[], None]) -> None:
        self.mute = ChannelMute()
        self._clock = clock
        self._call_later = call_later
        self._on_unmuted = on_unmuted
        self._handle: TimerHandle | None = None
        self._deadline_ms = 0  # the deadline the armed timer fires at (0: none armed)

    @property
    def reading_allowed(self) -> bool:
        return self.mute.reading_allowed

    def start(self, now_ms: int, throttle_time_ms: int) -> None:
        """A throttle was decided now; its response (if any) is still to be sent."""
        deadline_ms = now_ms + throttle_time_ms
        self.mute.throttle_started(deadline_ms)
        if deadline_ms > self._deadline_ms:
            self.cancel()
            self._arm(now_ms)

    def extend(self, now_ms: int, throttle_time_ms: int) -> None:
        """The running throttle's delay lasts at least until `now_ms` + `throttle_time_ms` (KIP-219:
        a Produce's delay starts when its response goes out); no new response is pending."""
        self.mute.delay_until(now_ms + throttle_time_ms)
        if self.mute.deadline_ms != self._deadline_ms:
            self.cancel()
            self._arm(now_ms)

    def response_sent(self) -> None:
        """A throttled response went to the client (or, for acks=0, there is none)."""
        self.mute.response_sent()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._deadline_ms = 0

    def _arm(self, now_ms: int) -> None:
        self._deadline_ms = self.mute.deadline_ms
        self._handle = self._call_later(max(0, self._deadline_ms - now_ms) / 1000.0, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now_ms = self._clock.now_ms()
        if self.mute.throttle_ended(now_ms):
            self._deadline_ms = 0
            self._on_unmuted()
        else:  # woke a little early, or the deadline moved
            self._arm(now_ms)

"""`ReadGate`, `ClientOutput` and `UpstreamLink`: the parts a client connection delegates to, each
over a fake transport and a fake clock (the connection itself: `test_connection.py`)."""

from __future__ import annotations

import struct
from collections import deque
from typing import Any

import pytest

from protocol.framing import FrameSplitter
from proxy.flow.connection_stats import ConnectionStats
from proxy.flow.pipeline import ConnectionContext
from proxy.pumps.client_output import ClientOutput
from proxy.pumps.limits import MAX_IN_FLIGHT, LimitLog
from proxy.pumps.muting import ChannelMute
from proxy.pumps.read_gate import ReadGate
from proxy.pumps.services import UpstreamLink
from quotas.clock import FakeClock
from tests.unit.proxy.test_connection import FakeTimers, FakeTransport, FakeUpstream


class Parts:
    """A gate with its mute, splitter, in-flight queue and timers in reach."""

    def __init__(self, max_in_flight: int = 2) -> None:
        self.timers = FakeTimers(FakeClock(1_000))
        self.mute = ChannelMute()
        self.splitter = FrameSplitter(1024)
        self.in_flight: deque[object] = deque()
        self.limit_log = LimitLog()
        self.closed = 0
        ctx = ConnectionContext(7, "127.0.0.1:5000", "listener", 1, stats=ConnectionStats(1_000))
        self.gate = ReadGate(self.mute, self.splitter, self.in_flight, max_in_flight, ctx, self.limit_log,
                             self.timers.call_later, self.close)
        self.transport = FakeTransport()
        self.gate.attach(self.transport)  # type: ignore[arg-type]

    def close(self) -> None:
        self.closed += 1

    def open(self) -> ReadGate:
        self.gate.upstream_up = True
        self.gate.update()
        return self.gate

    def buffer_a_frame(self) -> None:
        self.splitter.feed(struct.pack(">i", 3) + b"abc")


def test_nothing_is_read_before_the_upstream_is_up_and_everything_after() -> None:
    parts = Parts()
    gate = parts.gate
    assert not gate.frames_allowed()
    gate.update()
    assert parts.transport.paused and gate.paused          # the socket waits for the upstream
    parts.open()
    assert gate.frames_allowed() and not parts.transport.paused and not gate.paused


@pytest.mark.parametrize("flag", ["backpressure", "closed"])
def test_backpressure_and_close_each_stop_frames_and_the_socket(flag: str) -> None:
    parts = Parts()
    gate = parts.open()
    setattr(gate, flag, True)
    assert not gate.frames_allowed()
    gate.update()
    assert parts.transport.paused
    setattr(gate, flag, False)
    gate.update()
    assert gate.frames_allowed() and not parts.transport.paused


def test_a_drain_stops_neither_frames_nor_the_socket() -> None:
    parts = Parts()
    gate = parts.open()
    gate.draining = True  # what a client sends while Sluice drains is answered (closed between requests)
    parts.buffer_a_frame()
    gate.update()
    assert gate.frames_allowed() and not parts.transport.paused


def test_a_muted_channel_is_read_until_something_is_buffered() -> None:
    parts = Parts()
    gate = parts.open()
    parts.mute.throttle_started(deadline_ms=1_500)
    assert not gate.frames_allowed()                       # muted: no frame is handled ...
    gate.update()
    assert not parts.transport.paused                      # ... but the socket is read (a close shows)
    parts.buffer_a_frame()
    gate.update()
    assert parts.transport.paused                          # something waits: stop reading


def muted_and_unread() -> tuple[Parts, ReadGate]:
    """A long throttle with a frame waiting: the socket is not read, the peer check is armed."""
    parts = Parts()
    gate = parts.open()
    parts.mute.throttle_started(deadline_ms=60_000)
    parts.buffer_a_frame()
    gate.update()
    return parts, gate


def test_a_client_that_leaves_while_muted_and_unread_is_closed_within_a_check() -> None:
    parts, _ = muted_and_unread()
    parts.timers.advance(1_000)
    assert parts.closed == 0                               # still ESTABLISHED
    parts.transport.tcp_state = 8                          # CLOSE_WAIT: the client sent its FIN
    parts.timers.advance(1_000)
    assert parts.closed == 1


def test_stopping_disarms_the_peer_check() -> None:
    parts, gate = muted_and_unread()
    assert parts.timers.pending
    gate.stop()
    assert not parts.timers.pending and gate.closed and not gate.frames_allowed()


def test_the_in_flight_limit_pauses_reading_and_counts_one_hit_per_pause() -> None:
    parts = Parts(max_in_flight=2)
    gate = parts.open()
    parts.in_flight.extend(["a", "b"])                     # 2 of 2 await responses
    assert not gate.frames_allowed()
    gate.update()
    gate.update()                                          # still paused: not another hit
    assert parts.transport.paused and parts.limit_log.hits == {MAX_IN_FLIGHT: 1}
    parts.in_flight.popleft()
    gate.update()
    assert not parts.transport.paused and gate.frames_allowed()


def test_a_closing_transport_is_left_alone() -> None:
    parts = Parts()
    parts.transport.closed = True
    parts.gate.update()
    assert not parts.transport.paused and not parts.gate.paused


class FakeBuffer:
    def __init__(self) -> None:
        self.held_bytes = 0
        self.measured = 0

    def measure(self) -> None:
        self.measured += 1


class FakeWatchdog:
    last_active_ms = 0


def output() -> tuple[ClientOutput, FakeTransport, FakeBuffer, Any, FakeClock]:
    clock = FakeClock(5_000)
    buffer, watchdog, transport = FakeBuffer(), FakeWatchdog(), FakeTransport()
    out = ClientOutput(buffer, watchdog, clock.now_ms)  # type: ignore[arg-type]
    out.attach(transport)  # type: ignore[arg-type]
    return out, transport, buffer, watchdog, clock


def test_a_frame_goes_out_size_prefixed_and_counts_as_activity() -> None:
    out, transport, buffer, watchdog, clock = output()
    clock.advance(250)
    out.frame(b"hello")
    assert bytes(transport.data) == b"\x00\x00\x00\x05hello"   # int32 size 5, then the payload
    assert watchdog.last_active_ms == 5_250
    assert buffer.measured == 0                            # the transport holds what it held: 0


def test_what_the_client_holds_is_measured_only_when_it_changed() -> None:
    out, transport, buffer, _, _ = output()
    transport.buffered = 4096                              # the client is not reading
    out.write(b"x")
    out.writelines((b"y", b"z"))
    assert bytes(transport.data) == b"xyz" and buffer.measured == 2


def test_writes_after_the_client_went_away_are_dropped() -> None:
    out, transport, buffer, watchdog, clock = output()
    transport.closed = True
    clock.advance(10)
    out.frame(b"late")
    out.write(b"late")
    assert transport.data == b"" and watchdog.last_active_ms == 0 and buffer.measured == 0


class PauseRecordingUpstream(FakeUpstream):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def test_a_pause_asked_before_the_upstream_is_up_is_applied_when_it_comes() -> None:
    link = UpstreamLink()
    link.set_paused(True)                                  # the client buffer filled early
    link.close()                                           # nothing to close yet: no error
    upstream = PauseRecordingUpstream()
    link.connected(upstream)
    assert not upstream.reading
    link.set_paused(False)
    assert upstream.reading
    link.write(b"request")
    link.close()
    assert upstream.written == [b"request"] and upstream.closed

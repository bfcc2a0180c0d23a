"""The mute table, event by event (Kafka's KafkaChannel transitions plus Sluice's pipelining case)."""

from __future__ import annotations

import pytest

from proxy.pumps.muting import ChannelMute, ChannelMuteState, IllegalMuteTransition

S = ChannelMuteState


def test_response_sent_then_throttle_ended_unmutes() -> None:
    mute = ChannelMute()
    assert mute.reading_allowed
    mute.throttle_started(deadline_ms=1_100)           # a throttle of 100 ms decided at t=1000
    assert mute.state is S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING and not mute.reading_allowed
    mute.response_sent()
    assert mute.state is S.MUTED_AND_THROTTLED
    assert mute.throttle_ended(now_ms=1_100)
    assert mute.state is S.NOT_MUTED and mute.reading_allowed


def test_throttle_ending_before_the_response_is_sent_keeps_the_mute() -> None:
    mute = ChannelMute()
    mute.throttle_started(deadline_ms=50)
    assert mute.throttle_ended(now_ms=50)
    assert mute.state is S.MUTED_AND_RESPONSE_PENDING   # the response has still not gone out
    assert not mute.reading_allowed
    mute.response_sent()
    assert mute.state is S.NOT_MUTED


def test_an_early_timer_does_not_unmute() -> None:
    mute = ChannelMute()
    mute.throttle_started(deadline_ms=500)
    mute.response_sent()
    assert not mute.throttle_ended(now_ms=499)          # 1 ms early: still throttled
    assert mute.state is S.MUTED_AND_THROTTLED


def test_a_second_throttle_extends_the_deadline_and_waits_for_both_responses() -> None:
    mute = ChannelMute()
    mute.throttle_started(deadline_ms=300)
    mute.throttle_started(deadline_ms=900)              # a pipelined response, also throttled
    mute.response_sent()
    assert mute.state is S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING  # one response still pending
    mute.response_sent()
    assert not mute.throttle_ended(now_ms=300)          # the later deadline wins
    assert mute.throttle_ended(now_ms=900)
    assert mute.reading_allowed


def test_a_shorter_second_throttle_keeps_the_longer_deadline() -> None:
    mute = ChannelMute()
    mute.throttle_started(deadline_ms=900)
    mute.throttle_started(deadline_ms=200)
    assert mute.deadline_ms == 900


def test_throttle_during_response_pending_goes_back_to_throttled() -> None:
    mute = ChannelMute()
    mute.throttle_started(deadline_ms=10)
    mute.throttle_ended(now_ms=10)                      # MUTED_AND_RESPONSE_PENDING
    mute.throttle_started(deadline_ms=40)
    assert mute.state is S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING
    mute.response_sent()
    mute.response_sent()
    assert mute.state is S.MUTED_AND_THROTTLED


@pytest.mark.parametrize("illegal", ["response_sent", "throttle_ended"])
def test_events_without_a_throttle_are_illegal(illegal: str) -> None:
    mute = ChannelMute()
    with pytest.raises(IllegalMuteTransition):
        if illegal == "response_sent":
            mute.response_sent()
        else:
            mute.throttle_ended(now_ms=0)

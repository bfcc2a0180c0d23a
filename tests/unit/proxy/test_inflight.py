"""Responses leave in request order, whoever produced them."""

from __future__ import annotations

import pytest

from proxy.flow.inflight import CorrelationMismatch, InFlight, InFlightRequests


def entry(correlation_id: int, forwarded: bool = True) -> InFlight:
    return InFlight(correlation_id, 3, 12, "c", 10, 0, forwarded=forwarded)


def test_broker_responses_match_the_oldest_forwarded_request() -> None:
    tracker = InFlightRequests()
    first, second = tracker.add(entry(7)), tracker.add(entry(8))
    assert tracker.match_upstream(7) is first
    first.response = b"r7"
    assert tracker.match_upstream(8) is second


def test_out_of_order_broker_response_is_a_mismatch() -> None:
    tracker = InFlightRequests()
    tracker.add(entry(7))
    tracker.add(entry(8))
    with pytest.raises(CorrelationMismatch, match="expected 7"):
        tracker.match_upstream(8)


def test_a_local_answer_waits_for_the_earlier_broker_response() -> None:
    tracker = InFlightRequests()
    upstream = tracker.add(entry(1))
    local = tracker.add(entry(2, forwarded=False))
    local.response = b"answered by sluice"
    assert list(tracker.ready()) == []            # request 1 has not been answered yet
    assert tracker.match_upstream(1) is upstream  # local slots are skipped when matching
    upstream.response = b"from broker"
    assert [e.correlation_id for e in tracker.ready()] == [1, 2]
    assert len(tracker) == 0


def test_response_with_nothing_in_flight_is_a_mismatch() -> None:
    with pytest.raises(CorrelationMismatch, match="nothing in flight"):
        InFlightRequests().match_upstream(1)


def test_sluices_own_answer_is_never_matched_to_a_broker_response() -> None:
    tracker = InFlightRequests()
    local = tracker.add(entry(1))
    upstream = tracker.add(entry(2))
    local.answer(b"answered by sluice", now_ms=1_234)
    assert (local.forwarded, local.response_bytes, local.response_received_ms) == (False, 18, 1_234)
    assert tracker.match_upstream(2) is upstream  # the broker's first response is request 2's
    upstream.response = b"from broker"
    assert [e.response for e in tracker.ready()] == [b"answered by sluice", b"from broker"]


def test_a_produce_is_walked_once_for_the_access_log_and_the_quotas() -> None:
    """`produce_parts` walks at the first call and keeps the answer: the second reader (the quota
    stage after the access log, or the other way round) gets the same object, not a second walk."""
    from protocol.fastpath import read_request_header
    from tests.unit.protocol.test_records import produce_v3_request

    payload = produce_v3_request()
    header = read_request_header(payload)
    produce = InFlight(7, 0, 3, "c", len(payload), 0)
    first = produce.produce_parts(payload, header)
    assert first is not None and produce.parts_walked
    assert produce.produce_parts(b"not walked again", header) is first
    unreadable = InFlight(8, 0, 3, "c", 3, 0)
    assert unreadable.produce_parts(payload[:-1], header) is None   # its layout does not add up
    assert unreadable.parts_walked and unreadable.produce_parts(payload, header) is None

"""rate_model token_bucket: Kafka's TokenBucket arithmetic, its config, and the manager on a fake clock."""

from __future__ import annotations

import pytest

from quotas import (
    BucketShape,
    ClientIdentity,
    FakeClock,
    QuotaConfig,
    QuotaConfigError,
    QuotaKind,
    QuotaManager,
    RateConfig,
    RateModel,
    TokenBucket,
    bucket_throttle_time_ms,
)
from quotas.table import BURST_MS_KEY, TOKEN_BUCKET_KEY, QuotaTable, validate_key_value

P = QuotaKind.PRODUCE
F = QuotaKind.FETCH
WHO = ClientIdentity("ANONYMOUS", "c")
START_MS = 1_000_000


# ---- the stat -----------------------------------------------------------------------------

def test_bucket_starts_full_and_credits_go_negative() -> None:
    bucket = TokenBucket()
    assert bucket.measure(100.0, 1100.0, 0) == 1100.0       # full at the first call
    bucket.record(1100.0, 100.0, 1100.0, 0)
    assert bucket.measure(100.0, 1100.0, 0) == 0.0
    bucket.record(250.0, 100.0, 1100.0, 0)
    assert bucket.measure(100.0, 1100.0, 0) == -250.0        # may go negative
    assert bucket.measure(100.0, 1100.0, 500) == -200.0      # refills at the quota: 100/s
    assert bucket.measure(100.0, 1100.0, 2500) == 0.0


def test_refill_is_capped_at_the_burst_and_a_negative_record_gives_credits_back() -> None:
    bucket = TokenBucket()
    bucket.record(300.0, 100.0, 1000.0, 0)
    assert bucket.measure(100.0, 1000.0, 60_000) == 1000.0   # a minute idle: full, no more
    bucket.record(400.0, 100.0, 1000.0, 60_000)
    bucket.record(-400.0, 100.0, 1000.0, 60_000)             # the fetch un-record
    assert bucket.measure(100.0, 1000.0, 60_000) == 1000.0
    bucket.record(-5000.0, 100.0, 1000.0, 60_000)
    assert bucket.measure(100.0, 1000.0, 60_000) == 1000.0   # never beyond the burst


def test_a_smaller_bound_clips_the_credits_to_its_burst() -> None:
    bucket = TokenBucket()
    assert bucket.measure(1000.0, 11_000.0, 0) == 11_000.0
    assert bucket.measure(10.0, 110.0, 0) == 110.0


@pytest.mark.parametrize(("credits", "quota", "expected"), [
    (0.0, 100.0, 0),
    (5.0, 100.0, 0),
    (-100.0, 100.0, 1000),
    (-1.0, 3.0, 333),
    (-0.5, 1000.0, 1),                  # 0.5 ms rounds half up, as Java's Math.round
    (-1.0, 0.0, 2**31 - 1),             # a bound of 0 (storage factor 0): the maximum, capped by callers
])
def test_throttle_is_the_time_to_refill_to_zero(credits: float, quota: float, expected: int) -> None:
    assert bucket_throttle_time_ms(credits, quota) == expected


# ---- config -------------------------------------------------------------------------------

def test_global_and_per_entry_models_and_bursts() -> None:
    config = QuotaConfig.from_dict({
        "rate_model": "token_bucket", "burst_ms": 3000,
        "entries": [{"client_id": "a", "producer_byte_rate": 100},
                    {"client_id": "b", "producer_byte_rate": 100, "rate_model": "windowed"},
                    {"client_id": "c", "producer_byte_rate": 100, "burst_ms": 500}]})
    a, b, c = config.entries
    assert config.model_of(a) is RateModel.TOKEN_BUCKET
    assert config.bucket_of(a) == BucketShape(3000)
    assert config.bucket_of(b) is None
    assert config.bucket_of(c) == BucketShape(500)
    assert QuotaConfig.from_dict(config.to_dict()) == config
    default = QuotaConfig.from_dict({"entries": [{"client_id": "a", "producer_byte_rate": 100,
                                                  "rate_model": "token_bucket"}]})
    assert default.rate_model is RateModel.WINDOWED
    assert default.bucket_of(default.entries[0]) == BucketShape(11_000)   # samples x window x quota


@pytest.mark.parametrize(("data", "key", "reason"), [
    ({"rate_model": "leaky"}, "quotas.rate_model", "'windowed' or 'token_bucket'"),
    ({"burst_ms": 20_000}, "quotas.burst_ms", "larger than the window allows"),
    ({"burst_ms": 0}, "quotas.burst_ms", ">= 1"),
    ({"window": {"samples": 3, "size_ms": 500},
      "entries": [{"client_id": "a", "producer_byte_rate": 1, "burst_ms": 1501}]},
     "quotas.entries[0].burst_ms", "larger than the window allows (samples x size_ms = 1500)"),
    ({"entries": [{"client_id": "a", "producer_byte_rate": 1, "rate_model": "windowed", "burst_ms": 10}]},
     "quotas.entries[0].burst_ms", "applies only to rate_model token_bucket"),
    ({"entries": [{"client_id": "a", "producer_byte_rate": 1, "rate_model": "bucket"}]},
     "quotas.entries[0].rate_model", "'windowed' or 'token_bucket'"),
])
def test_bad_rate_model_input_is_refused_with_the_key(data: dict[str, object], key: str, reason: str) -> None:
    with pytest.raises(QuotaConfigError) as err:
        QuotaConfig.from_dict(data)
    assert err.value.key == key
    assert reason in err.value.reason


def test_store_keys_round_trip_and_are_validated() -> None:
    config = QuotaConfig.from_dict({"entries": [
        {"client_id": "a", "producer_byte_rate": 100, "rate_model": "token_bucket", "burst_ms": 2000},
        {"client_id": "b", "producer_byte_rate": 100, "rate_model": "windowed"}]})
    table = QuotaTable.from_config(config)
    assert dict(table[config.entries[0].entity])[TOKEN_BUCKET_KEY] == 1.0
    assert dict(table[config.entries[0].entity])[BURST_MS_KEY] == 2000.0
    assert dict(table[config.entries[1].entity])[TOKEN_BUCKET_KEY] == 0.0
    assert table.to_config() == config
    assert validate_key_value(TOKEN_BUCKET_KEY, 0.0) is None
    assert validate_key_value(TOKEN_BUCKET_KEY, 2.0) is not None
    assert validate_key_value(BURST_MS_KEY, 1.5) is not None
    assert validate_key_value(BURST_MS_KEY, 0.0) is not None
    too_big = table.apply([])  # a burst that does not fit a smaller window is refused with the key
    with pytest.raises(QuotaConfigError) as err:
        too_big.to_config(window=RateConfig(samples=1, window_ms=1000))
    assert err.value.key == f"client-id 'a': {BURST_MS_KEY}"


# ---- the manager --------------------------------------------------------------------------

def _saturate(model: str, *, burst_ms: int | None = None, duration_ms: int = 60_000,
              chunk: int = 100, quota: int = 1000) -> list[int]:
    """A client that sends `chunk` bytes, then waits for the throttle (at least 10 ms), for
    `duration_ms`: bytes accepted per second."""
    clock = FakeClock(START_MS)
    entry: dict[str, object] = {"client_id": "c", "producer_byte_rate": quota}
    if burst_ms is not None:
        entry["burst_ms"] = burst_ms
    manager = QuotaManager(QuotaConfig.from_dict({"rate_model": model, "entries": [entry]}), clock)
    per_second = [0] * (duration_ms // 1000)
    t = 0
    while t < duration_ms:
        clock.set(START_MS + t)
        decision = manager.record_and_check(P, WHO, chunk)
        per_second[t // 1000] += chunk
        t += max(decision.throttle_time_ms, 10)
    return per_second


def test_windowed_saturating_client_moves_in_a_sawtooth() -> None:
    per_second = _saturate("windowed")
    assert per_second[0] == 10_000                      # ~ (samples - 1) x quota at once
    late_peak = max(per_second[12:])                    # long after the first burst
    assert late_peak >= 5 * 1000, per_second           # the windowed rate lets it burst again


def test_token_bucket_saturating_client_moves_at_the_quota() -> None:
    per_second = _saturate("token_bucket")
    # The burst (11 x 1000 B) is spent in the first two seconds; from then on the client gets
    # exactly the refill: 1000 B every second, never a second burst.
    assert per_second[0] + per_second[1] == 11_000 + 2 * 1000
    assert all(s == 1000 for s in per_second[2:]), per_second
    assert sum(per_second) == 11_000 + 60 * 1000       # burst + quota x time: long-run = quota


def test_a_smaller_burst_bounds_the_first_second() -> None:
    per_second = _saturate("token_bucket", burst_ms=1000)
    assert per_second[0] == 2000                        # the 1 s burst + 1 s of refill
    assert all(s == 1000 for s in per_second[1:]), per_second


def test_throttle_arithmetic_through_the_manager() -> None:
    clock = FakeClock(START_MS)
    entry = {"client_id": "c", "producer_byte_rate": 1000, "rate_model": "token_bucket", "burst_ms": 2000}
    manager = QuotaManager(QuotaConfig.from_dict({"entries": [entry]}), clock)
    assert manager.record_and_check(P, WHO, 2000).throttle_time_ms == 0     # credits 2000 -> 0
    assert manager.record_and_check(P, WHO, 500).throttle_time_ms == 500    # -500 at 1000/s
    clock.advance(200)
    assert manager.check(P, WHO).throttle_time_ms == 300                    # -300
    decision = manager.record_and_check(P, WHO, 1700)                       # -2000
    assert decision.throttle_time_ms == 2000
    assert decision.observed == pytest.approx(4200 / 10.2)   # the sampled rate stays the metric


def test_fetch_unrecord_gives_the_credits_back() -> None:
    clock = FakeClock(START_MS)
    entries = [{"client_id": "c", "consumer_byte_rate": 1000}]
    manager = QuotaManager(QuotaConfig.from_dict({"rate_model": "token_bucket", "burst_ms": 1000,
                                                  "entries": entries}), clock)
    assert manager.record_and_check(F, WHO, 3000).throttle_time_ms == 2000
    manager.unrecord(F, WHO, 3000)
    assert manager.check(F, WHO).throttle_time_ms == 0
    assert manager.record_and_check(F, WHO, 1000).throttle_time_ms == 0


def test_request_kinds_cap_the_bucket_throttle_at_one_window() -> None:
    clock = FakeClock(START_MS)
    manager = QuotaManager(QuotaConfig.from_dict({"rate_model": "token_bucket", "burst_ms": 1000,
                                                  "entries": [{"client_id": "c", "request_rate": 1}]}), clock)
    for _ in range(5):
        decision = manager.record_and_check(QuotaKind.REQUEST_RATE, WHO, 1)
    assert decision.throttle_time_ms == 1000   # 4 requests short = 4 s to refill, capped at 1 window


def test_switching_models_live_keeps_the_sampled_history() -> None:
    clock = FakeClock(START_MS)
    windowed = QuotaConfig.from_dict({"entries": [{"client_id": "c", "producer_byte_rate": 1000}]})
    manager = QuotaManager(windowed, clock)
    manager.record_and_check(P, WHO, 5000)
    assert manager.check(P, WHO).throttle_time_ms == 0       # 5000 / 10 s: under the quota
    manager.update_config(QuotaConfig.from_dict({"entries": [
        {"client_id": "c", "producer_byte_rate": 1000, "rate_model": "token_bucket", "burst_ms": 1000}]}))
    decision = manager.record_and_check(P, WHO, 3000)         # fresh full bucket of 1000: -2000
    assert decision.throttle_time_ms == 2000
    assert decision.observed == pytest.approx(8000 / 10.0)   # the rate kept the 5000 from before
    manager.update_config(windowed)
    assert manager.check(P, WHO).throttle_time_ms == 0        # back to the windowed decision


def test_fetch_cap_is_a_tenth_of_a_second_of_quota_under_the_bucket() -> None:
    clock = FakeClock(START_MS)
    entries = [{"client_id": "c", "consumer_byte_rate": 10_000},
               {"client_id": "w", "consumer_byte_rate": 10_000, "rate_model": "windowed"}]
    manager = QuotaManager(QuotaConfig.from_dict({"rate_model": "token_bucket", "entries": entries}), clock)
    assert manager.max_value_in_quota_window(F, WHO) == 1000.0                          # 100 ms of quota
    assert manager.max_value_in_quota_window(F, ClientIdentity("ANONYMOUS", "w")) == 100_000.0  # KAFKA-9677


def test_fetch_cap_is_half_the_burst_when_that_is_less() -> None:
    """A fetch is answered when the bucket holds its size; capped at half the burst, the other half
    takes the credits that refill during the consumer's next round trip instead of losing them."""
    clock = FakeClock(START_MS)
    config = QuotaConfig.from_dict({"entries": [
        {"client_id": "c", "consumer_byte_rate": 10_000, "rate_model": "token_bucket", "burst_ms": 100}]})
    manager = QuotaManager(config, clock)
    assert manager.max_value_in_quota_window(F, WHO) == 500.0   # min(100 ms, 100 ms / 2) of 10,000 B/s


def test_admit_fetch_delivers_while_the_credits_are_not_negative_and_records_nothing_in_debt() -> None:
    clock = FakeClock(START_MS)
    manager = QuotaManager(QuotaConfig.from_dict({"rate_model": "token_bucket", "burst_ms": 100, "entries": [
        {"client_id": "c", "consumer_byte_rate": 1000}]}), clock)
    first = manager.admit_fetch(WHO, 600)
    # credits 100 B (100 ms of 1000 B/s) - 600 = -500: delivered, its debt throttles 500 ms
    assert first.recorded and first.throttle_is_debt and first.decision.throttle_time_ms == 500
    clock.advance(200)  # refilled to -300: in debt, so neither recorded nor delivered
    second = manager.admit_fetch(WHO, 600)
    assert not second.recorded and not second.throttle_is_debt and second.decision.throttle_time_ms == 300
    clock.advance(300)  # t=500, back at 0; but the second before holds 600, and 600 + 600 > Q x 1 s + B
    third = manager.admit_fetch(WHO, 600)
    assert not third.recorded and third.decision.throttle_time_ms == 500   # until t=0 leaves it
    clock.advance(500)  # t=1000: credits min(100, 0 + 500) = 100, delivered, down to -500
    fourth = manager.admit_fetch(WHO, 600)
    assert fourth.recorded and fourth.decision.throttle_time_ms == 500


def test_no_second_delivers_more_than_the_quota_and_the_burst_with_responses_near_a_second_of_quota(
) -> None:
    """The overshoot of one 1 MiB batch per fetch at 1 MiB/s, in its arithmetic. Q = 1000 B/s,
    B = 100 ms of Q = 100 B, every response S = 940 B (a broker returns a partition's first batch
    whole, whatever max_bytes asks).

    Without the guard: t=0 credits 100 -> -840, debt 840 ms; t=840 credits 0 -> delivered, -940;
    t=1780 ... responses every 940 ms, so the second [0, 1000) holds 2 x 940 = 1.88 x Q.
    With it: at t=840 the second before holds 940 and 940 + 940 > Q x 1 s + B = 1100, so the fetch
    is not recorded and waits until the delivery at t=0 leaves the second: 1000 - 840 = 160 ms."""
    clock = FakeClock(START_MS)
    manager = QuotaManager(QuotaConfig.from_dict({"rate_model": "token_bucket", "burst_ms": 100, "entries": [
        {"client_id": "c", "consumer_byte_rate": 1000}]}), clock)
    first = manager.admit_fetch(WHO, 940)
    assert first.recorded and first.throttle_is_debt and first.decision.throttle_time_ms == 840
    clock.advance(840)
    early = manager.admit_fetch(WHO, 940)
    assert not early.recorded and not early.throttle_is_debt
    assert early.decision.throttle_time_ms == 160
    clock.advance(160)  # t=1000: the first has left the second; credits min(100, 0 + 160) = 100
    second = manager.admit_fetch(WHO, 940)
    assert second.recorded and second.decision.throttle_time_ms == 840
    # the un-recorded early fetch gave nothing away: over 10 s of a client fetching as soon as it is
    # let, no 1000 ms span holds more than Q x 1 s + B, and every second gets one response
    deliveries = [START_MS, START_MS + 1000]
    while clock.now_ms() < START_MS + 10_000:
        admission = manager.admit_fetch(WHO, 940)
        if admission.recorded:
            deliveries.append(clock.now_ms())
        clock.advance(max(1, admission.decision.throttle_time_ms))
    for i, at in enumerate(deliveries):
        in_second = sum(940 for d in deliveries[i:] if d < at + 1000)
        assert in_second <= 1000 + 100, (at, deliveries)
    assert len(deliveries) >= 10


def test_a_response_larger_than_the_quota_and_burst_still_goes_through_alone_in_its_second() -> None:
    # S = 3000 B > Q x 1 s + B = 1100: delivered when the second before it is empty (credits >= 0),
    # so a consumer of batches larger than a second's quota is slowed, never starved
    clock = FakeClock(START_MS)
    manager = QuotaManager(QuotaConfig.from_dict({"rate_model": "token_bucket", "burst_ms": 100, "entries": [
        {"client_id": "c", "consumer_byte_rate": 1000}]}), clock)
    assert manager.admit_fetch(WHO, 3000).decision.throttle_time_ms == 2900   # 100 - 3000 = -2900
    clock.advance(2900)
    assert manager.admit_fetch(WHO, 3000).recorded


def test_an_emptied_fetch_is_taken_back_from_the_second_too() -> None:
    # the engine un-records a fetch it empties for another reason (records, requests): the guard
    # must not count it as delivered
    clock = FakeClock(START_MS)
    manager = QuotaManager(QuotaConfig.from_dict({"rate_model": "token_bucket", "burst_ms": 1000, "entries": [
        {"client_id": "c", "consumer_byte_rate": 1000}]}), clock)
    assert manager.admit_fetch(WHO, 900).recorded       # credits 1000 -> 100
    manager.unrecord(F, WHO, 900)                         # emptied after all: back to 1000
    # were the 900 still counted, 900 + 1500 > 2000 (Q x 1 s + B) would hold this one back
    assert manager.admit_fetch(WHO, 1500).recorded


def test_admit_fetch_under_the_windowed_rate_records_and_checks_as_kafka_does() -> None:
    clock = FakeClock(START_MS)
    config = QuotaConfig.from_dict({"entries": [{"client_id": "c", "consumer_byte_rate": 1000}]})
    manager = QuotaManager(config, clock)
    admission = manager.admit_fetch(WHO, 20_000)
    # 20,000 B over a fresh window padded to 10 s = 2,000 B/s: (2000 - 1000) / 1000 x 10 s
    assert admission.recorded and not admission.throttle_is_debt
    assert admission.decision.throttle_time_ms == 10_000

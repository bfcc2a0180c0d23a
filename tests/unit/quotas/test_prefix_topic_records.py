"""Sluice's entities beyond Kafka's: client-id prefixes, topics and topic prefixes; records/s kinds."""

from __future__ import annotations

from typing import Any

import pytest

from quotas import (
    DEFAULT,
    ClientIdentity,
    FakeClock,
    QuotaConfig,
    QuotaConfigError,
    QuotaEntity,
    QuotaKind,
    QuotaManager,
    SensorKey,
)
from quotas.callback import TopicQuotaCallback, topic_identity
from quotas.effective import effective_quotas, effective_topic_quotas
from quotas.table import EACH_CLIENT_ID_KEY, QuotaTable, validate_key_value

P = QuotaKind.PRODUCE
PR = QuotaKind.PRODUCER_RECORD_RATE
START_MS = 1_000_000


def manager(*entries: dict[str, Any]) -> tuple[QuotaManager, FakeClock]:
    clock = FakeClock(START_MS)
    return QuotaManager(QuotaConfig.from_dict({"entries": list(entries)}), clock), clock


# ---- client-id prefixes -------------------------------------------------------------------

def test_members_of_a_prefix_share_one_sensor_and_limit() -> None:
    quotas, _ = manager({"client_id_prefix": "etl-", "producer_byte_rate": 1000})
    one = quotas.record_and_check(P, ClientIdentity.of(None, "etl-1"), 6000)
    two = quotas.record_and_check(P, ClientIdentity.of(None, "etl-2"), 6000)
    assert one.key == two.key == SensorKey(P, "", "", client_id_prefix="etl-")
    assert one.bound == 1000 and one.entity == QuotaEntity(client_id_prefix="etl-")
    assert one.throttle_time_ms == 0                       # 6000 / 10 s
    assert two.throttle_time_ms == 2000                    # 12000 / 10 s, shared: (1200-1000)/1000 x 10 s
    other = quotas.record_and_check(P, ClientIdentity.of(None, "web-1"), 60_000)
    assert other.bound is None and other.throttle_time_ms == 0


def test_each_client_id_gets_its_own_sensor_when_the_entry_says_so() -> None:
    quotas, _ = manager({"client_id_prefix": "etl-", "each_client_id": True, "producer_byte_rate": 1000})
    one = quotas.record_and_check(P, ClientIdentity.of(None, "etl-1"), 6000)
    two = quotas.record_and_check(P, ClientIdentity.of(None, "etl-2"), 6000)
    assert one.key == SensorKey(P, "", "etl-1") and two.key == SensorKey(P, "", "etl-2")
    assert one.throttle_time_ms == two.throttle_time_ms == 0
    assert one.bound == two.bound == 1000


def test_longest_prefix_wins_and_exact_client_ids_beat_prefixes() -> None:
    quotas, _ = manager({"client_id_prefix": "etl-", "producer_byte_rate": 100},
                        {"client_id_prefix": "etl-batch-", "producer_byte_rate": 200},
                        {"client_id": "etl-batch-7", "producer_byte_rate": 300},
                        {"client_id": "<default>", "producer_byte_rate": 400})
    def bound(client_id: str) -> float | None:
        return quotas.check(P, ClientIdentity.of(None, client_id)).bound
    assert bound("etl-1") == 100
    assert bound("etl-batch-1") == 200
    assert bound("etl-batch-7") == 300
    assert bound("web") == 400                             # a prefix beats only <default>


@pytest.mark.parametrize(("entries", "client_id", "expected"), [
    # user + prefix (level 1p) beats user + <default> client (2) and the user alone (3)
    ([{"user": "alice", "client_id_prefix": "etl-", "producer_byte_rate": 1},
      {"user": "alice", "client_id": "<default>", "producer_byte_rate": 2},
      {"user": "alice", "producer_byte_rate": 3}], "etl-1", 1),
    # user + exact client id (1) beats user + prefix (1p)
    ([{"user": "alice", "client_id_prefix": "etl-", "producer_byte_rate": 1},
      {"user": "alice", "client_id": "etl-1", "producer_byte_rate": 5}], "etl-1", 5),
    # the user alone (3) beats <default> user + prefix (4p) and the bare prefix (7p)
    ([{"user": "<default>", "client_id_prefix": "etl-", "producer_byte_rate": 1},
      {"client_id_prefix": "etl-", "producer_byte_rate": 2},
      {"user": "alice", "producer_byte_rate": 3}], "etl-1", 3),
    # <default> user + prefix (4p) beats <default> user + <default> client (5) and the bare prefix (7p)
    ([{"user": "<default>", "client_id_prefix": "etl-", "producer_byte_rate": 1},
      {"user": "<default>", "client_id": "<default>", "producer_byte_rate": 2},
      {"client_id_prefix": "etl-", "producer_byte_rate": 3}], "etl-1", 1),
    # the bare prefix (7p) beats the <default> client id (8), but not the exact one (7)
    ([{"client_id_prefix": "etl-", "producer_byte_rate": 1},
      {"client_id": "<default>", "producer_byte_rate": 2}], "etl-1", 1),
    ([{"client_id_prefix": "etl-", "producer_byte_rate": 1},
      {"client_id": "etl-1", "producer_byte_rate": 2}], "etl-1", 2),
])
def test_prefix_levels_in_the_precedence(entries: list[dict[str, Any]], client_id: str,
                                         expected: float) -> None:
    quotas, _ = manager(*entries)
    assert quotas.check(P, ClientIdentity("alice", client_id)).bound == expected
    config = QuotaConfig.from_dict({"entries": entries})
    assert effective_quotas(config, ClientIdentity("alice", client_id))[P].value == expected


def test_describe_shows_the_prefix_and_what_it_overrides() -> None:
    config = QuotaConfig.from_dict({"entries": [
        {"client_id_prefix": "etl-", "producer_byte_rate": 100},
        {"client_id_prefix": "etl-b", "producer_byte_rate": 200},
        {"client_id": "<default>", "producer_byte_rate": 400}]})
    got = effective_quotas(config, ClientIdentity("ANONYMOUS", "etl-b1"))[P]
    assert got.source.entity == QuotaEntity(client_id_prefix="etl-b")
    assert [s.entity for s in got.overridden] == [QuotaEntity(client_id_prefix="etl-"),
                                                  QuotaEntity(client_id=DEFAULT)]


def test_removing_a_prefix_entry_live_moves_members_back() -> None:
    quotas, _ = manager({"client_id_prefix": "etl-", "producer_byte_rate": 100},
                        {"client_id": "<default>", "producer_byte_rate": 400})
    who = ClientIdentity.of(None, "etl-1")
    assert quotas.check(P, who).bound == 100
    default_only = [{"client_id": "<default>", "producer_byte_rate": 400}]
    quotas.update_config(QuotaConfig.from_dict({"entries": default_only}))
    assert quotas.check(P, who).bound == 400


# ---- topics -------------------------------------------------------------------------------

def test_topic_callback_exact_beats_prefix_and_longest_prefix_wins() -> None:
    clock = FakeClock(START_MS)
    config = QuotaConfig.from_dict({"entries": [
        {"topic": "orders", "producer_byte_rate": 100},
        {"topic_prefix": "ord", "producer_byte_rate": 200},
        {"topic_prefix": "orders-", "producer_byte_rate": 300},
        {"client_id": "<default>", "producer_byte_rate": 1}]})      # not a topic entry: ignored here
    topics = QuotaManager(config, clock, callback=TopicQuotaCallback())
    def decide(topic: str, value: float = 0.0) -> Any:
        return topics.record_and_check(P, topic_identity(topic), value)
    assert decide("orders").bound == 100
    assert decide("orders-eu").key == SensorKey(P, "", "", topic_prefix="orders-")
    assert decide("orders-eu").bound == 300
    assert decide("orderly").bound == 200
    assert decide("payments").bound is None
    a = decide("orders-eu", 3000)
    b = decide("orders-us", 3000)
    assert a.key == b.key and b.throttle_time_ms > 0                # a prefix shares one sensor
    got = effective_topic_quotas(config, "orders-eu")[P]
    assert got.value == 300
    assert [s.value for s in got.overridden] == [200]


@pytest.mark.parametrize(("entry", "key", "reason"), [
    ({"topic": "a", "topic_prefix": "a", "producer_byte_rate": 1}, "topic_prefix", "not both"),
    ({"topic": "a", "user": "alice", "producer_byte_rate": 1}, "topic", "applies to every client"),
    ({"topic": "", "producer_byte_rate": 1}, "topic", "must not be empty"),
    ({"topic": "a", "request_percentage": 1}, "request_percentage", "cannot limit it"),
    ({"client_id": "a", "client_id_prefix": "a", "producer_byte_rate": 1}, "client_id_prefix", "not both"),
    ({"client_id": "a", "each_client_id": True, "producer_byte_rate": 1}, "each_client_id",
     "only to a client_id_prefix"),
    ({"client_id_prefix": "a", "producer_record_rate": 0}, "producer_record_rate", "must be > 0"),
    ({"client_id_prefix": "a", "consumer_record_rate": -5}, "consumer_record_rate", "must be > 0"),
])
def test_bad_entries_are_refused_with_the_key(entry: dict[str, Any], key: str, reason: str) -> None:
    with pytest.raises(QuotaConfigError) as err:
        QuotaConfig.from_dict({"entries": [entry]})
    assert err.value.key == f"quotas.entries[0].{key}"
    assert reason in err.value.reason


def test_new_entities_and_keys_round_trip_through_the_table() -> None:
    config = QuotaConfig.from_dict({"entries": [
        {"client_id_prefix": "etl-", "each_client_id": True, "producer_record_rate": 50},
        {"user": "alice", "client_id_prefix": "etl-", "producer_byte_rate": 1000},
        {"topic": "orders", "producer_byte_rate": 2000, "request_rate": 5},
        {"topic_prefix": "logs-", "consumer_record_rate": 10.5}]})
    table = QuotaTable.from_config(config)
    assert dict(table[QuotaEntity(client_id_prefix="etl-")])[EACH_CLIENT_ID_KEY] == 1.0
    back = table.to_config()
    assert set(back.entries) == set(config.entries)
    flagged = back.get(QuotaEntity(client_id_prefix="etl-"))
    assert flagged is not None and flagged.entity.each_client_id
    assert QuotaConfig.from_dict(config.to_dict()) == config
    assert validate_key_value("producer_record_rate", 2.5) is None
    assert validate_key_value(EACH_CLIENT_ID_KEY, 2.0) is not None
    for entity in config:
        assert QuotaEntity.from_kafka(entity.entity.to_kafka()) == entity.entity


def test_entity_types_on_the_wire() -> None:
    assert QuotaEntity(user="u", client_id_prefix="p").to_kafka() == [("user", "u"),
                                                                       ("client-id-prefix", "p")]
    assert QuotaEntity.from_kafka([("topic-prefix", "x")]) == QuotaEntity(topic_prefix="x")
    with pytest.raises(QuotaConfigError):
        QuotaEntity.from_kafka([("topic", None)])              # no default topic
    with pytest.raises(QuotaConfigError):
        QuotaEntity.from_kafka([("topic", "t"), ("client-id", "c")])


# ---- records per second -------------------------------------------------------------------

def test_record_rates_throttle_uncapped_like_byte_rates() -> None:
    quotas, _ = manager({"client_id": "c", "producer_record_rate": 100})
    who = ClientIdentity.of(None, "c")
    assert quotas.record_and_check(PR, who, 1000).throttle_time_ms == 0       # 100 records/s over 10 s
    # 3000 records over 10 s = 300/s: (300 - 100) / 100 x 10 s, not capped at one window
    assert quotas.record_and_check(PR, who, 2000).throttle_time_ms == 20_000
    assert not PR.caps_throttle and not PR.is_byte_rate
    assert QuotaKind.REQUEST_RATE.caps_throttle

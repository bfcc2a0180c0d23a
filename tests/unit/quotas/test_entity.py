from __future__ import annotations

import pytest

from quotas import DEFAULT, ClientIdentity, QuotaConfigError, QuotaEntity, QuotaKind, SensorKey, sanitize_user


def test_kinds_are_kafka_config_keys() -> None:
    assert QuotaKind("producer_byte_rate") is QuotaKind.PRODUCE
    assert QuotaKind("consumer_byte_rate") is QuotaKind.FETCH
    assert QuotaKind("request_percentage") is QuotaKind.REQUEST_PERCENTAGE
    assert QuotaKind("request_rate") is QuotaKind.REQUEST_RATE
    assert [k for k in QuotaKind if k.caps_throttle] == [QuotaKind.REQUEST_PERCENTAGE, QuotaKind.REQUEST_RATE]
    assert [k for k in QuotaKind if k.is_byte_rate] == [QuotaKind.PRODUCE, QuotaKind.FETCH]


def test_identity_maps_wire_nulls() -> None:
    assert ClientIdentity.of(None, None) == ClientIdentity("ANONYMOUS", "")
    assert ClientIdentity.of("alice", "app") == ClientIdentity("alice", "app")


@pytest.mark.parametrize(("entity", "text"), [
    (QuotaEntity(user="alice"), "user 'alice'"),
    (QuotaEntity(user=DEFAULT), "user <default>"),
    (QuotaEntity(client_id="app"), "client-id 'app'"),
    (QuotaEntity(user="alice", client_id=DEFAULT), "user 'alice', client-id <default>"),
    (QuotaEntity(user=DEFAULT, client_id=DEFAULT), "user <default>, client-id <default>"),
])
def test_describe(entity: QuotaEntity, text: str) -> None:
    assert entity.describe() == text
    assert str(entity) == text


@pytest.mark.parametrize(("kwargs", "key"), [
    ({}, ""),
    ({"user": ""}, "user"),
    ({"client_id": ""}, "client_id"),
    ({"user": "alice", "client_id": ""}, "client_id"),
    ({"user": 7}, "user"),
])
def test_invalid_shapes(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(QuotaConfigError) as err:
        QuotaEntity(**kwargs)  # type: ignore[arg-type]
    assert err.value.key == key


def test_kafka_entity_lists_round_trip() -> None:
    entity = QuotaEntity(user="alice", client_id=DEFAULT)
    assert entity.to_kafka() == [("user", "alice"), ("client-id", None)]
    assert QuotaEntity.from_kafka([("client-id", None), ("user", "alice")]) == entity
    assert QuotaEntity.from_kafka([("user", None)]) == QuotaEntity(user=DEFAULT)
    assert QuotaEntity(client_id="app").to_kafka() == [("client-id", "app")]


@pytest.mark.parametrize("components", [
    [("ip", "10.0.0.1")],
    [("user", "a"), ("user", "b")],
    [("user", "")],
    [],
])
def test_kafka_entity_lists_rejects_what_kafka_rejects(components: list[tuple[str, str | None]]) -> None:
    with pytest.raises(QuotaConfigError):
        QuotaEntity.from_kafka(components)


def test_default_is_not_a_name() -> None:
    # A client literally named "<default>" is not the default entity.
    assert QuotaEntity(client_id="<default>") != QuotaEntity(client_id=DEFAULT)
    assert repr(DEFAULT) == "DEFAULT"


def test_sensor_key_is_a_value() -> None:
    assert SensorKey(QuotaKind.PRODUCE, "alice", "") == SensorKey(QuotaKind.PRODUCE, "alice", "")
    assert SensorKey(QuotaKind.PRODUCE, "alice", "") != SensorKey(QuotaKind.FETCH, "alice", "")
    assert len({SensorKey(QuotaKind.PRODUCE, "a", "b"), SensorKey(QuotaKind.PRODUCE, "a:b", "")}) == 2


@pytest.mark.parametrize(("name", "sanitized"), [
    ("alice", "alice"),
    ("CN=a b,O=x", "CN%3Da%20b%2CO%3Dx"),  # Java URLEncoder, then "+" -> "%20"
    ("a*b", "a%2Ab"),
    ("a.b-c_d", "a.b-c_d"),
    ("a~b", "a%7Eb"),                      # URLEncoder encodes "~"; Python's quote would not
    ("é", "%C3%A9"),
])
def test_sanitize_user_matches_kafka_sanitizer(name: str, sanitized: str) -> None:
    assert sanitize_user(name) == sanitized

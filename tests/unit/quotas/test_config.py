from __future__ import annotations

from typing import Any

import pytest

from quotas import (
    DEFAULT,
    QuotaConfig,
    QuotaConfigError,
    QuotaEntity,
    QuotaEntry,
    QuotaKind,
    RateConfig,
    validate_quota_value,
)

ALICE = QuotaEntity(user="alice")


# ---- value validation (ClientQuotaControlManager) ----

@pytest.mark.parametrize(("kind", "value"), [
    (QuotaKind.PRODUCE, 1048576),
    (QuotaKind.PRODUCE, 1048576.0),
    (QuotaKind.PRODUCE, 1048576.0000001),  # |v mod 1| <= 1e-6 counts as whole
    (QuotaKind.FETCH, 1),
    (QuotaKind.REQUEST_PERCENTAGE, 0.5),
    (QuotaKind.REQUEST_RATE, 12.25),
])
def test_valid_values(kind: QuotaKind, value: float) -> None:
    assert validate_quota_value(kind, value) == float(value)


@pytest.mark.parametrize(("kind", "value", "reason"), [
    (QuotaKind.PRODUCE, 0, "must be > 0"),
    (QuotaKind.FETCH, -5, "must be > 0"),
    (QuotaKind.REQUEST_PERCENTAGE, 0.0, "must be > 0"),
    (QuotaKind.PRODUCE, 1.5, "must be a whole number of bytes per second, got 1.5"),
    (QuotaKind.FETCH, 1048576.00001, "must be a whole number of bytes per second, got 1048576.00001"),
    (QuotaKind.PRODUCE, 2.0**64, "must be <= 9223372036854775807"),
    (QuotaKind.REQUEST_RATE, float("nan"), "must be finite, got nan"),
    (QuotaKind.REQUEST_RATE, float("inf"), "must be finite, got inf"),
    (QuotaKind.PRODUCE, True, "must be a number, got True"),
    (QuotaKind.PRODUCE, "1MB", "must be a number, got '1MB'"),
])
def test_invalid_values(kind: QuotaKind, value: Any, reason: str) -> None:
    with pytest.raises(QuotaConfigError) as err:
        validate_quota_value(kind, value)
    assert (err.value.key, err.value.reason) == (kind.value, reason)
    assert str(err.value) == f"{kind.value}: {reason}"


def test_entry_validates_and_freezes_values() -> None:
    values = {QuotaKind.PRODUCE: 1000}
    entry = QuotaEntry(ALICE, values)
    values[QuotaKind.PRODUCE] = 1
    assert entry.values == {QuotaKind.PRODUCE: 1000.0}
    assert hash(entry) == hash(QuotaEntry(ALICE, {QuotaKind.PRODUCE: 1000.0}))
    with pytest.raises(TypeError):
        entry.values[QuotaKind.FETCH] = 1  # type: ignore[index]
    with pytest.raises(QuotaConfigError, match="producer_byte_rate: must be > 0"):
        QuotaEntry(ALICE, {QuotaKind.PRODUCE: 0})
    with pytest.raises(QuotaConfigError, match="at least one"):
        QuotaEntry(ALICE, {})


# ---- snapshots ----

def test_snapshot_updates_return_new_snapshots() -> None:
    base = QuotaConfig((QuotaEntry(ALICE, {QuotaKind.PRODUCE: 1000}),))
    more = base.with_value(ALICE, QuotaKind.FETCH, 2000)
    assert base.get(ALICE) == QuotaEntry(ALICE, {QuotaKind.PRODUCE: 1000})
    assert more.get(ALICE) == QuotaEntry(ALICE, {QuotaKind.PRODUCE: 1000, QuotaKind.FETCH: 2000})
    assert more.value(ALICE, QuotaKind.FETCH) == 2000
    assert more.kinds() == {QuotaKind.PRODUCE, QuotaKind.FETCH}

    less = more.without_key(ALICE, QuotaKind.PRODUCE)
    assert less.get(ALICE) == QuotaEntry(ALICE, {QuotaKind.FETCH: 2000})
    gone = less.without_key(ALICE, QuotaKind.FETCH)  # last key: the entity goes
    assert ALICE not in gone and len(gone) == 0
    assert gone.without_key(ALICE, QuotaKind.FETCH) is gone  # absent key: no-op, as Kafka

    bob = QuotaEntity(user="bob")
    replaced = more.with_entry(QuotaEntry(bob, {QuotaKind.PRODUCE: 5})).with_entry(
        QuotaEntry(ALICE, {QuotaKind.PRODUCE: 7}, shadow=True))
    assert [e.entity for e in replaced] == [ALICE, bob]  # replacing keeps the position
    assert replaced.get(ALICE) == QuotaEntry(ALICE, {QuotaKind.PRODUCE: 7}, shadow=True)
    assert replaced.without_entity(bob).get(bob) is None
    assert replaced.with_shadow_all(True).shadow_all and not replaced.shadow_all


def test_snapshot_rejects_duplicate_entities() -> None:
    with pytest.raises(QuotaConfigError, match=r"entries\[1\]: duplicate entity user 'alice'"):
        QuotaConfig((QuotaEntry(ALICE, {QuotaKind.PRODUCE: 1}), QuotaEntry(ALICE, {QuotaKind.FETCH: 1})))


# ---- parsing plain dicts (YAML) ----

EXAMPLE: dict[str, Any] = {
    "shadow": False,
    "window": {"samples": 11, "size_ms": 1000},
    "entries": [
        {"user": "alice", "client_id": "<default>", "producer_byte_rate": 1048576, "shadow": True},
        {"user": "<default>", "consumer_byte_rate": 2097152},
        {"client_id": "app", "request_percentage": 50.5, "request_rate": 100},
    ],
}


def test_parses_the_example() -> None:
    config = QuotaConfig.from_dict(EXAMPLE)
    assert config == QuotaConfig(
        (QuotaEntry(QuotaEntity(user="alice", client_id=DEFAULT), {QuotaKind.PRODUCE: 1048576}, shadow=True),
         QuotaEntry(QuotaEntity(user=DEFAULT), {QuotaKind.FETCH: 2097152}),
         QuotaEntry(QuotaEntity(client_id="app"), {QuotaKind.REQUEST_PERCENTAGE: 50.5,
                                                   QuotaKind.REQUEST_RATE: 100})),
        shadow_all=False, window=RateConfig(11, 1000))


def test_empty_mapping_is_no_quotas_with_kafka_window() -> None:
    config = QuotaConfig.from_dict({})
    assert len(config) == 0 and not config.shadow_all and config.window == RateConfig()


def test_to_dict_round_trips() -> None:
    config = QuotaConfig.from_dict(EXAMPLE)
    assert QuotaConfig.from_dict(config.to_dict()) == config
    assert config.to_dict()["entries"][0] == {"user": "alice", "client_id": "<default>",
                                              "producer_byte_rate": 1048576, "shadow": True}


def _errors(data: Any) -> list[str]:
    with pytest.raises(QuotaConfigError) as err:
        QuotaConfig.from_dict(data)
    return str(err.value).splitlines()


def _with_entry(entry: dict[str, Any]) -> dict[str, Any]:
    return {"entries": [*EXAMPLE["entries"][:2], entry]}


@pytest.mark.parametrize(("entry", "message"), [
    ({"user": "bob", "producer_byte_rate": 0}, "quotas.entries[2].producer_byte_rate: must be > 0"),
    ({"user": "bob", "producer_byte_rate": 1.5},
     "quotas.entries[2].producer_byte_rate: must be a whole number of bytes per second, got 1.5"),
    ({"user": "bob", "request_percentage": -1}, "quotas.entries[2].request_percentage: must be > 0"),
    ({"user": "bob", "producer_byte_rate": "1MB"},
     "quotas.entries[2].producer_byte_rate: must be a number, got '1MB'"),
    ({"user": "bob", "producer_byte_rate": True},
     "quotas.entries[2].producer_byte_rate: must be a number, got True"),
    ({"user": "bob", "producer_byte_rat": 5}, "quotas.entries[2].producer_byte_rat: unknown key"),
    ({"user": "", "producer_byte_rate": 5},
     'quotas.entries[2].user: must not be empty (write "<default>" for the default entity)'),
    ({"user": 5, "producer_byte_rate": 5}, "quotas.entries[2].user: must be a string, got 5"),
    ({"producer_byte_rate": 5}, "quotas.entries[2]: an entity needs a user, a client_id, a client_id_prefix, "
                                "a topic or a topic_prefix"),
    ({"user": "bob"}, "quotas.entries[2]: needs at least one of producer_byte_rate, consumer_byte_rate, "
                      "request_percentage, request_rate, producer_record_rate, consumer_record_rate"),
    ({"user": "<default>", "producer_byte_rate": 5},
     "quotas.entries[2]: duplicate entity user <default> (already at entries[1])"),
    ({"user": "bob", "producer_byte_rate": 5, "shadow": "yes"},
     "quotas.entries[2].shadow: must be true or false, got 'yes'"),
])
def test_errors_name_the_key_path(entry: dict[str, Any], message: str) -> None:
    assert _errors(_with_entry(entry)) == [message]


@pytest.mark.parametrize(("data", "message"), [
    ({"window": {"samples": 0}}, "quotas.window.samples: must be >= 1, got 0"),
    ({"window": {"size_ms": 1.5}}, "quotas.window.size_ms: must be an integer, got 1.5"),
    ({"shadow": 1}, "quotas.shadow: must be true or false, got 1"),
    ({"entries": {"user": "a"}}, "quotas.entries: must be a list, got {'user': 'a'}"),
    ({"entries": ["alice"]}, "quotas.entries[0]: must be a mapping, got 'alice'"),
    ({"entires": []}, "quotas.entires: unknown key"),
    (["alice"], "quotas: must be a mapping, got ['alice']"),
])
def test_structural_errors_name_the_key_path(data: Any, message: str) -> None:
    assert _errors(data) == [message]


def test_all_problems_are_reported_at_once() -> None:
    data = {"entries": [{"user": "a", "producer_byte_rate": 0, "consumer_byte_rate": -1},
                        {"client_id": "", "request_rate": 0}]}
    with pytest.raises(QuotaConfigError) as err:
        QuotaConfig.from_dict(data, path="sluice.quotas")
    assert err.value.problems == (
        ("sluice.quotas.entries[0].producer_byte_rate", "must be > 0"),
        ("sluice.quotas.entries[0].consumer_byte_rate", "must be > 0"),
        ("sluice.quotas.entries[1].client_id",
         'must not be empty (write "<default>" for the default entity)'),
        ("sluice.quotas.entries[1].request_rate", "must be > 0"),
    )
    assert err.value.key == "sluice.quotas.entries[0].producer_byte_rate"

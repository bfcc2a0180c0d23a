"""The quota table a store holds: Kafka's value rules and messages, changes, the enforcement view."""

from __future__ import annotations

import math

import pytest

from quotas import DEFAULT, QuotaEntity, QuotaKind
from quotas.config import QuotaConfig, QuotaEntry
from quotas.stats import RateConfig
from quotas.table import SHADOW_KEY, QuotaChange, QuotaTable, format_value, validate_key_value

ALICE = QuotaEntity(user="alice")
APP = QuotaEntity(client_id="app")
ANY_CLIENT = QuotaEntity(client_id=DEFAULT)


@pytest.mark.parametrize(("key", "value", "message"), [
    # the broker's own words (ClientQuotaControlManager.validateQuotaKeyValue), checked in its order
    ("bogus_key", 1.0, "Invalid configuration key bogus_key"),
    ("bogus_key", -1.0, "Invalid configuration key bogus_key"),
    ("producer_byte_rate", -5.0, "Quota producer_byte_rate must be greater than 0"),
    ("producer_byte_rate", 0.0, "Quota producer_byte_rate must be greater than 0"),
    ("request_percentage", 0.0, "Quota request_percentage must be greater than 0"),
    ("producer_byte_rate", 1.5, "producer_byte_rate cannot be a fractional value."),
    ("consumer_byte_rate", 2.0**63, "Proposed value for consumer_byte_rate is too large for a LONG."),
    # Sluice's additions
    ("producer_byte_rate", math.nan, "Quota producer_byte_rate must be a number"),
    ("request_rate", math.inf, "Quota request_rate must be finite"),
    (SHADOW_KEY, 2.0, "Quota sluice.shadow must be 1 (remove the key to turn shadow mode off)"),
    (SHADOW_KEY, 0.0, "Quota sluice.shadow must be greater than 0"),
])
def test_invalid_values_get_kafkas_messages(key: str, value: float, message: str) -> None:
    assert validate_key_value(key, value) == message


@pytest.mark.parametrize(("key", "value"), [
    ("producer_byte_rate", 1048576.0), ("consumer_byte_rate", 1.0000000001), ("request_percentage", 0.5),
    ("request_rate", 12.5), (SHADOW_KEY, 1.0), ("producer_byte_rate", 2.0**62)])
def test_valid_values(key: str, value: float) -> None:
    assert validate_key_value(key, value) is None


def test_changes_set_and_remove_keys_and_drop_empty_entities() -> None:
    table = QuotaTable().apply([QuotaChange(ALICE, "producer_byte_rate", 100.0),
                                QuotaChange(ALICE, "consumer_byte_rate", 200.0),
                                QuotaChange(APP, "request_rate", 5.0)])
    assert table == {ALICE: {"producer_byte_rate": 100.0, "consumer_byte_rate": 200.0},
                     APP: {"request_rate": 5.0}}
    table = table.apply([QuotaChange(APP, "request_rate", None), QuotaChange(ALICE, "nothing", None)])
    assert APP not in table                         # its last key went
    assert dict(table[ALICE]) == {"consumer_byte_rate": 200.0, "producer_byte_rate": 100.0}
    assert table.apply([]) == table                 # removing an absent key was a no-op


def test_tables_are_immutable_values() -> None:
    table = QuotaTable({ALICE: {"producer_byte_rate": 1.0}})
    with pytest.raises(TypeError):
        table[ALICE]["producer_byte_rate"] = 2.0  # type: ignore[index]
    assert table == QuotaTable({ALICE: {"producer_byte_rate": 1.0}})
    assert hash(table) == hash(QuotaTable({ALICE: {"producer_byte_rate": 1.0}}))


def test_changes_to_turns_one_table_into_another() -> None:
    old = QuotaTable({ALICE: {"producer_byte_rate": 1.0, "consumer_byte_rate": 2.0},
                      APP: {"request_rate": 3.0}})
    new = QuotaTable({ALICE: {"producer_byte_rate": 9.0}, ANY_CLIENT: {"request_rate": 4.0}})
    changes = old.changes_to(new)
    assert old.apply(changes) == new
    assert QuotaChange(ALICE, "consumer_byte_rate", None) in changes
    assert QuotaChange(ALICE, "producer_byte_rate", 9.0) in changes
    assert old.changes_to(old) == []


def test_enforcement_view_keeps_quota_keys_and_the_shadow_flag() -> None:
    table = QuotaTable({ALICE: {"producer_byte_rate": 100.0, SHADOW_KEY: 1.0},
                        APP: {"request_rate": 5.0},
                        ANY_CLIENT: {SHADOW_KEY: 1.0}})  # a flag with nothing to enforce
    config = table.to_config(shadow_all=True, window=RateConfig(11, 500))
    assert config.shadow_all and config.window == RateConfig(11, 500)
    assert config.get(ALICE) == QuotaEntry(ALICE, {QuotaKind.PRODUCE: 100.0}, shadow=True)
    assert config.get(APP) == QuotaEntry(APP, {QuotaKind.REQUEST_RATE: 5.0})
    assert ANY_CLIENT not in config
    assert QuotaTable.from_config(config) == {ALICE: {"producer_byte_rate": 100.0, SHADOW_KEY: 1.0},
                                              APP: {"request_rate": 5.0}}


def test_from_yaml_config() -> None:
    config = QuotaConfig.from_dict({"entries": [{"user": "alice", "client_id": "<default>",
                                                 "producer_byte_rate": 1024, "shadow": True}]})
    assert QuotaTable.from_config(config) == {
        QuotaEntity(user="alice", client_id=DEFAULT): {"producer_byte_rate": 1024.0, SHADOW_KEY: 1.0}}


def test_sorted_items_put_names_before_defaults() -> None:
    any_user = QuotaEntity(user=DEFAULT)
    table = QuotaTable({e: {"request_rate": 1.0} for e in (ANY_CLIENT, APP, ALICE, any_user)})
    assert [e for e, _ in table.sorted_items()] == [APP, ANY_CLIENT, ALICE, QuotaEntity(user=DEFAULT)]


def test_values_print_as_the_cli_shows_them() -> None:
    assert format_value(1048576.0) == "1048576"
    assert format_value(1.5) == "1.5"
    assert format_value(2.0**63) == "9.223372036854776e+18"

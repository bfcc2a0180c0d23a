"""The ``quotas:`` section, typed and parsed once; the callback class is never loaded by parsing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from proxy.config import ConfigError, load_config
from quotas.entity import QuotaKind
from quotas.errors import QuotaConfigError
from quotas.section import CallbackSpec, QuotasSection


def test_one_parse_gives_every_part_of_the_section() -> None:
    section = QuotasSection.parse({
        "scope": "cluster", "window": {"samples": 5, "size_ms": 500}, "rate_model": "token_bucket",
        "callback": {"class": "quotas.builtin:GroupQuotaCallback", "config": {"groups": []}},
        "entries": [{"user": "alice", "producer_byte_rate": 1000},
                    {"ip": "10.0.0.1", "connection_creation_rate": 5}],
        "cluster_entries": [{"client_id": "app", "consumer_byte_rate": 2000}]})
    assert [e.entity.user for e in section.entries] == ["alice"]  # the ip entry is not a client entry
    assert section.entries.window.samples == 5 and section.entries.window.window_ms == 500
    assert dict(section.ip_connection_rates) == {"10.0.0.1": 5.0}
    assert section.scope == "cluster"
    assert section.callback == CallbackSpec("quotas.builtin:GroupQuotaCallback", {"groups": []})
    assert section.cluster_entries is not None
    assert section.cluster_entries.window.samples == 5  # the section's one window and rate model
    assert section.cluster_entries.rate_model.value == "token_bucket"
    assert [k for e in section.cluster_entries for k in e.values] == [QuotaKind.FETCH]


def test_every_problem_is_named_by_its_key_at_once() -> None:
    with pytest.raises(QuotaConfigError) as err:
        QuotasSection.parse({"entries": [{"user": "a", "producer_byte_rate": 0},
                                          {"ip": "nowhere", "connection_creation_rate": 1}],
                             "cluster_entries": [{"user": "b", "consumer_byte_rate": -1}]})
    keys = {key for key, _ in err.value.problems}
    assert keys == {"quotas.entries[0].producer_byte_rate", "quotas.entries[1].ip",
                    "quotas.cluster_entries[0].consumer_byte_rate"}
    with pytest.raises(QuotaConfigError, match=r"quotas\.scope"):
        QuotasSection.parse({"scope": "galaxy"})
    with pytest.raises(QuotaConfigError, match=r"quotas\.bogus: unknown key"):
        QuotasSection.parse({"bogus": 1})


def test_validation_never_imports_the_callback_class(tmp_path: Path) -> None:
    """On old main `load_config` imported and instantiated the callback to validate the section."""
    module = "engine_section_probe_never_imported"
    path = tmp_path / "sluice.yaml"
    path.write_text("upstream: {bootstrap: 'k:9092'}\n"
                    f"quotas: {{callback: {{class: '{module}:Callback'}}, "
                    "entries: [{user: alice, producer_byte_rate: 1000}]}\n")
    config = load_config(path)
    assert module not in sys.modules
    assert config.quotas_section is config.quotas_section  # parsed once per configuration
    assert config.quota_config() is config.quotas_section.entries
    with pytest.raises(ConfigError, match=rf"quotas\.callback\.class: cannot import {module}"):
        config.quota_plugins()  # what the proxy calls at start and at reload


def test_a_bad_section_still_fails_load_config_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "sluice.yaml"
    path.write_text("upstream: {bootstrap: 'k:9092'}\nquotas: {entries: [{user: a, request_rate: -2}]}\n")
    with pytest.raises(ConfigError, match=r"quotas\.entries\[0\]\.request_rate: must be > 0"):
        load_config(path)

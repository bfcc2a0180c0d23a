"""Effective quotas of a caller: the enforcing entry and what it overrides, by Kafka's precedence."""

from __future__ import annotations

import pytest

from quotas import DEFAULT, ClientIdentity, QuotaConfig, QuotaEntity, QuotaEntry, QuotaKind, QuotaManager
from quotas.clock import FakeClock
from quotas.effective import QuotaSource, effective_quotas

P, F = QuotaKind.PRODUCE, QuotaKind.FETCH
ALICE_APP = ClientIdentity("alice", "app")

# Kafka's eight levels, most specific first (docs/design.html), each with a distinct value
LEVELS = [QuotaEntity(user="alice", client_id="app"), QuotaEntity(user="alice", client_id=DEFAULT),
          QuotaEntity(user="alice"), QuotaEntity(user=DEFAULT, client_id="app"),
          QuotaEntity(user=DEFAULT, client_id=DEFAULT), QuotaEntity(user=DEFAULT),
          QuotaEntity(client_id="app"), QuotaEntity(client_id=DEFAULT)]


def config_of(*entities: QuotaEntity, kind: QuotaKind = P, shadow: frozenset[QuotaEntity] = frozenset()
              ) -> QuotaConfig:
    return QuotaConfig(tuple(QuotaEntry(e, {kind: 1000.0 * (i + 1)}, shadow=e in shadow)
                             for i, e in enumerate(entities)))


@pytest.mark.parametrize("level", range(8))
def test_the_most_specific_existing_level_wins_and_enforcement_agrees(level: int) -> None:
    present = LEVELS[level:]
    config = config_of(*present)
    got = effective_quotas(config, ALICE_APP)[P]
    assert got.source.entity == LEVELS[level]
    # the value is the one the quota manager enforces for this caller
    decision = QuotaManager(config, FakeClock(0)).check(P, ALICE_APP)
    assert decision.bound == got.value and decision.entity == got.source.entity


def test_overrides_are_listed_most_specific_first() -> None:
    config = config_of(LEVELS[0], LEVELS[2], LEVELS[7])
    got = effective_quotas(config, ALICE_APP)[P]
    assert got.source == QuotaSource(LEVELS[0], 1000.0)
    assert got.overridden == (QuotaSource(LEVELS[2], 2000.0), QuotaSource(LEVELS[7], 3000.0))


def test_each_kind_resolves_on_its_own() -> None:
    config = QuotaConfig((QuotaEntry(QuotaEntity(user="alice"), {P: 100.0}),
                          QuotaEntry(QuotaEntity(client_id="app"), {F: 200.0, P: 300.0})))
    got = effective_quotas(config, ALICE_APP)
    assert got[P].source.entity == QuotaEntity(user="alice")
    assert got[P].overridden == (QuotaSource(QuotaEntity(client_id="app"), 300.0),)
    assert got[F].source == QuotaSource(QuotaEntity(client_id="app"), 200.0)
    assert QuotaKind.REQUEST_RATE not in got


def test_entries_that_do_not_match_the_caller_are_not_shown() -> None:
    config = config_of(QuotaEntity(user="bob"), QuotaEntity(client_id="other"))
    assert effective_quotas(config, ALICE_APP) == {}


def test_an_empty_client_id_escapes_client_id_quotas_as_in_kafka() -> None:
    config = config_of(QuotaEntity(client_id=DEFAULT))
    assert effective_quotas(config, ClientIdentity("alice", "")) == {}


def test_shadow_entries_and_shadow_all_are_marked() -> None:
    config = config_of(LEVELS[0], LEVELS[7], shadow=frozenset({LEVELS[0]}))
    got = effective_quotas(config, ALICE_APP)[P]
    assert got.source.shadow and not got.overridden[0].shadow
    everything = effective_quotas(config.with_shadow_all(True), ALICE_APP)[P]
    assert everything.source.shadow and everything.overridden[0].shadow

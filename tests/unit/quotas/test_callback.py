"""DefaultQuotaCallback: Kafka's 8-level precedence, who shares a sensor, and its edge cases."""

from __future__ import annotations

import pytest

from quotas import DEFAULT, ClientIdentity, DefaultQuotaCallback, QuotaEntity, QuotaKind, SensorKey
from quotas.callback import EntityMatcher, QuotaCallback

P = QuotaKind.PRODUCE
ALICE_APP = ClientIdentity("alice", "app")

# The eight levels, most specific first, with the key an (alice, app) caller gets at that level.
LEVELS: list[tuple[int, QuotaEntity, tuple[str, str]]] = [
    (1, QuotaEntity(user="alice", client_id="app"), ("alice", "app")),
    (2, QuotaEntity(user="alice", client_id=DEFAULT), ("alice", "app")),
    (3, QuotaEntity(user="alice"), ("alice", "")),
    (4, QuotaEntity(user=DEFAULT, client_id="app"), ("alice", "app")),
    (5, QuotaEntity(user=DEFAULT, client_id=DEFAULT), ("alice", "app")),
    (6, QuotaEntity(user=DEFAULT), ("alice", "")),
    (7, QuotaEntity(client_id="app"), ("", "app")),
    (8, QuotaEntity(client_id=DEFAULT), ("", "app")),
]


def _callback(*quotas: tuple[QuotaEntity, float], kind: QuotaKind = P,
              sticky: bool = True) -> DefaultQuotaCallback:
    callback = DefaultQuotaCallback(sticky_levels=sticky)
    for entity, value in quotas:
        callback.update_quota(entity, kind, value)
    return callback


def test_is_a_kip257_callback_and_entity_matcher() -> None:
    callback = DefaultQuotaCallback()
    assert isinstance(callback, QuotaCallback)
    assert isinstance(callback, EntityMatcher)
    assert callback.quota_reset_required(P) is False


@pytest.mark.parametrize(("level", "entity", "tags"), LEVELS, ids=[f"level{lv}" for lv, _, _ in LEVELS])
def test_most_specific_level_wins(level: int, entity: QuotaEntity, tags: tuple[str, str]) -> None:
    # Configure this level and every less specific one, each with value 1000 * level.
    callback = _callback(*((e, 1000.0 * lv) for lv, e, _ in LEVELS if lv >= level))
    key = callback.sensor_key(P, ALICE_APP)
    assert key == SensorKey(P, *tags)
    assert callback.quota_limit(key) == 1000.0 * level
    assert callback.matched_entity(key) == entity


@pytest.mark.parametrize(("level", "entity", "tags"), LEVELS, ids=[f"level{lv}" for lv, _, _ in LEVELS])
def test_each_level_alone(level: int, entity: QuotaEntity, tags: tuple[str, str]) -> None:
    callback = _callback((entity, 500.0))
    key = callback.sensor_key(P, ALICE_APP)
    assert key == SensorKey(P, *tags)
    assert callback.quota_limit(key) == 500.0
    assert callback.matched_entity(key) == entity


def test_nothing_configured_is_unlimited() -> None:
    callback = DefaultQuotaCallback()
    key = callback.sensor_key(P, ALICE_APP)
    assert key == SensorKey(P, "", "app")
    assert callback.quota_limit(key) is None
    assert callback.matched_entity(key) is None
    assert not callback.quotas_enabled(P)


def test_quotas_are_per_kind() -> None:
    callback = _callback((QuotaEntity(user="alice"), 100.0), kind=QuotaKind.FETCH)
    assert callback.quota_limit(callback.sensor_key(QuotaKind.FETCH, ALICE_APP)) == 100.0
    assert callback.quota_limit(callback.sensor_key(P, ALICE_APP)) is None
    assert callback.quotas_enabled(QuotaKind.FETCH) and not callback.quotas_enabled(P)


@pytest.mark.parametrize(("entity", "shared"), [
    (QuotaEntity(user="alice"), True),                       # /users/alice: all of alice's client ids
    (QuotaEntity(user=DEFAULT), True),                       # /users/<default>: per user
    (QuotaEntity(user="alice", client_id=DEFAULT), False),   # the default applies to each client id
    (QuotaEntity(user=DEFAULT, client_id=DEFAULT), False),
    (QuotaEntity(client_id=DEFAULT), False),
])
def test_two_client_ids_of_one_user(entity: QuotaEntity, shared: bool) -> None:
    callback = _callback((entity, 100.0))
    one = callback.sensor_key(P, ClientIdentity("alice", "app1"))
    two = callback.sensor_key(P, ClientIdentity("alice", "app2"))
    assert (one == two) is shared
    assert callback.quota_limit(one) == callback.quota_limit(two) == 100.0


@pytest.mark.parametrize(("entity", "shared"), [
    (QuotaEntity(client_id="app"), True),     # /clients/app: every user with client id app
    (QuotaEntity(client_id=DEFAULT), True),   # /clients/<default>: per client id, across users
    (QuotaEntity(user=DEFAULT), False),
    (QuotaEntity(user=DEFAULT, client_id="app"), False),
])
def test_one_client_id_of_two_users(entity: QuotaEntity, shared: bool) -> None:
    callback = _callback((entity, 100.0))
    bob = callback.sensor_key(P, ClientIdentity("bob", "app"))
    carol = callback.sensor_key(P, ClientIdentity("carol", "app"))
    assert (bob == carol) is shared


def test_user_level_beats_default_user_client_level() -> None:
    # Level 3 (/users/alice) before level 4 (/users/<default>/clients/app): key (alice, "").
    callback = _callback((QuotaEntity(user="alice"), 300.0),
                         (QuotaEntity(user=DEFAULT, client_id="app"), 400.0))
    assert callback.sensor_key(P, ALICE_APP) == SensorKey(P, "alice", "")
    assert callback.quota_limit(SensorKey(P, "alice", "")) == 300.0
    # bob has no user quota: level 4 applies to him.
    bob = callback.sensor_key(P, ClientIdentity("bob", "app"))
    assert bob == SensorKey(P, "bob", "app") and callback.quota_limit(bob) == 400.0


def test_empty_client_id_escapes_client_id_quotas() -> None:
    # Client-id quotas only, even <default>: an empty client id gets key ("", "") = unlimited.
    callback = _callback((QuotaEntity(client_id=DEFAULT), 100.0), (QuotaEntity(client_id="app"), 200.0))
    key = callback.sensor_key(P, ClientIdentity("alice", ""))
    assert key == SensorKey(P, "", "")
    assert callback.quota_limit(key) is None


def test_empty_client_id_under_user_default_client_quota_uses_user_level() -> None:
    # /users/alice/clients/<default> alone: the (u, c) fast path gives (alice, ""), whose limit is
    # looked up at user level, where nothing is configured: unlimited.
    only = _callback((QuotaEntity(user="alice", client_id=DEFAULT), 100.0))
    key = only.sensor_key(P, ClientIdentity("alice", ""))
    assert key == SensorKey(P, "alice", "")
    assert only.quota_limit(key) is None
    # With a /users/alice quota too, the same key takes the user's value, not the (u, <default>) one.
    both = _callback((QuotaEntity(user="alice", client_id=DEFAULT), 100.0),
                     (QuotaEntity(user="alice"), 700.0))
    key = both.sensor_key(P, ClientIdentity("alice", ""))
    assert key == SensorKey(P, "alice", "")
    assert both.quota_limit(key) == 700.0
    assert both.matched_entity(key) == QuotaEntity(user="alice")


def test_removal_falls_back_to_the_next_level() -> None:
    callback = _callback((QuotaEntity(user="alice", client_id="app"), 100.0),
                         (QuotaEntity(user="alice"), 200.0))
    assert callback.quota_limit(callback.sensor_key(P, ALICE_APP)) == 100.0
    callback.remove_quota(QuotaEntity(user="alice", client_id="app"), P)
    key = callback.sensor_key(P, ALICE_APP)
    assert key == SensorKey(P, "alice", "") and callback.quota_limit(key) == 200.0
    callback.remove_quota(QuotaEntity(user="alice", client_id="app"), P)  # absent: no-op


@pytest.mark.parametrize("sticky", [True, False])
def test_levels_in_use_sticky_or_not(sticky: bool) -> None:
    # Configure and remove a (user, client-id) quota, then configure a user quota.
    callback = _callback((QuotaEntity(user="alice", client_id="app"), 100.0), sticky=sticky)
    callback.remove_quota(QuotaEntity(user="alice", client_id="app"), P)
    assert callback.quotas_enabled(P) is sticky  # Kafka <= 4.0: sticky until restart
    callback.update_quota(QuotaEntity(user="alice"), P, 200.0)
    bob = callback.sensor_key(P, ClientIdentity("bob", "x"))
    # Sticky: two levels ever used -> full walk, nothing matches bob -> ("", x).
    # Not sticky (Kafka 4.1+): only the user level is in use -> fast path (bob, "").
    assert bob == (SensorKey(P, "", "x") if sticky else SensorKey(P, "bob", ""))
    assert callback.quota_limit(bob) is None  # unlimited either way
    assert callback.quota_limit(callback.sensor_key(P, ALICE_APP)) == 200.0


def test_levels_are_sticky_by_default() -> None:
    callback = DefaultQuotaCallback()
    callback.update_quota(QuotaEntity(user="alice"), P, 1.0)
    callback.remove_quota(QuotaEntity(user="alice"), P)
    assert callback.quotas_enabled(P)


def test_single_level_fast_paths() -> None:
    # User level only: every caller is keyed (u, ""), configured or not.
    users = _callback((QuotaEntity(user="alice"), 1.0))
    assert users.sensor_key(P, ClientIdentity("bob", "x")) == SensorKey(P, "bob", "")
    # (user, client-id) level only: (u, c).
    pairs = _callback((QuotaEntity(user="alice", client_id="app"), 1.0))
    assert pairs.sensor_key(P, ClientIdentity("bob", "x")) == SensorKey(P, "bob", "x")
    # Several levels: full walk, an unmatched caller falls to ("", c).
    mixed = _callback((QuotaEntity(user="alice"), 1.0), (QuotaEntity(client_id="app"), 1.0))
    assert mixed.sensor_key(P, ClientIdentity("bob", "x")) == SensorKey(P, "", "x")

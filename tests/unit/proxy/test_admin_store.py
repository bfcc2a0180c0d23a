"""Quota stores without a broker (SQLite, memory) and the YAML seed rules (which wins)."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from proxy.admin.store import (
    SEEDED,
    MemoryStore,
    QuotaStore,
    SqliteStore,
    StoreConfig,
    StoreError,
    decode_entity,
    encode_entity,
    prepare_store,
    reconcile_seed,
    seed_meta,
    table_from_described,
)
from proxy.config import load_config
from quotas import DEFAULT, QuotaEntity
from quotas.table import SHADOW_KEY, QuotaChange, QuotaTable

ALICE = QuotaEntity(user="alice")
ANY_CLIENT = QuotaEntity(client_id=DEFAULT)
ALICE_APP = QuotaEntity(user="alice", client_id="app")


def set_(entity: QuotaEntity, key: str, value: float | None) -> QuotaChange:
    return QuotaChange(entity, key, value)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> QuotaStore:
    return MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "q.db")


def test_entities_encode_as_sorted_json() -> None:
    assert encode_entity(ALICE_APP) == '{"client-id":"app","user":"alice"}'
    assert encode_entity(ANY_CLIENT) == '{"client-id":null}'
    for entity in (ALICE, ANY_CLIENT, ALICE_APP, QuotaEntity(user="a,b=c", client_id=DEFAULT)):
        assert decode_entity(encode_entity(entity)) == entity
    with pytest.raises(ValueError):
        decode_entity('{"ip":"1.2.3.4"}')


def test_apply_meta_and_notifications(store: QuotaStore) -> None:
    seen: list[QuotaTable] = []
    store.subscribe(seen.append)
    table = store.apply([set_(ALICE, "producer_byte_rate", 100.0), set_(ALICE, SHADOW_KEY, 1.0)], {"x": "1"})
    assert table == {ALICE: {"producer_byte_rate": 100.0, SHADOW_KEY: 1.0}}
    assert store.load() == table == store.current() and seen == [table]
    assert store.meta("x") == "1" and store.meta("y") is None
    store.apply([set_(ALICE, "producer_byte_rate", None), set_(ALICE, SHADOW_KEY, None)])
    assert store.load() == {} and seen[-1] == {}


def test_sqlite_survives_a_restart(tmp_path: Path) -> None:
    first = SqliteStore(tmp_path / "q.db")
    first.apply([set_(ALICE_APP, "request_rate", 2.5), set_(ANY_CLIENT, "consumer_byte_rate", 1024.0)],
                {SEEDED: "now"})
    first.close()
    again = SqliteStore(tmp_path / "q.db")
    assert again.load() == {ALICE_APP: {"request_rate": 2.5}, ANY_CLIENT: {"consumer_byte_rate": 1024.0}}
    assert again.meta(SEEDED) == "now"


def test_sqlite_writes_a_batch_whole_or_not_at_all(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "q.db")
    store.apply([set_(ALICE, "producer_byte_rate", 1.0)])
    bad = QuotaChange(ALICE, "consumer_byte_rate", "not a number")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.apply([set_(ALICE, "producer_byte_rate", 2.0), bad], {"m": "x"})
    assert SqliteStore(tmp_path / "q.db").load() == {ALICE: {"producer_byte_rate": 1.0}}
    assert store.meta("m") is None and store.current() == {ALICE: {"producer_byte_rate": 1.0}}


@pytest.mark.parametrize(("entity", "key", "value", "why"), [
    (encode_entity(ALICE), "producer_byte_rate", -1.0, "must be greater than 0"),
    ('{"ip":"x"}', "connection_creation_rate", 1.0, "unsupported entity type 'ip'"),
    (encode_entity(ALICE), "bogus", 1.0, "Invalid configuration key bogus"),
    ("not json", "request_rate", 1.0, "not an entity"),
])
def test_sqlite_refuses_a_row_it_cannot_read_naming_it(tmp_path: Path, entity: str, key: str, value: float,
                                                       why: str) -> None:
    """A hand-edited (or newer) store: the row is an error that names it, never a quota silently
    dropped (issue 26)."""
    SqliteStore(tmp_path / "q.db").close()
    with sqlite3.connect(tmp_path / "q.db") as db:
        db.executemany("INSERT INTO quotas VALUES (?, ?, ?)", [
            (encode_entity(ALICE), "request_rate", 3.0), (entity, key, value)])
    with pytest.raises(StoreError) as raised:
        SqliteStore(tmp_path / "q.db")
    assert f"entity {entity}, key {key}" in str(raised.value) and why in str(raised.value)


def test_store_path_is_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "sluice.yaml"
    path.write_text("upstream: {bootstrap: 'localhost:9092'}\n")
    assert load_config(path, environ={}).store.path == tmp_path / "conf" / "sluice-quotas.db"
    path.write_text("upstream: {bootstrap: 'localhost:9092'}\nstore: {path: data/q.db}\n")
    assert load_config(path, environ={}).store.path == tmp_path / "conf" / "data" / "q.db"
    path.write_text(f"upstream: {{bootstrap: 'localhost:9092'}}\nstore: {{path: {tmp_path}/abs.db}}\n")
    assert load_config(path, environ={}).store.path == tmp_path / "abs.db"


def test_store_secrets_never_print() -> None:
    config = StoreConfig(type="kafka", kafka_config={"sasl.password": "hunter2"})  # type: ignore[dict-item]
    assert "hunter2" not in repr(config) and "hunter2" not in str(config)
    assert config.librdkafka_config() == {"sasl.password": "hunter2"}


# ------------------------------------------------------------------------------ seeding

YAML_V1 = QuotaTable({ANY_CLIENT: {"producer_byte_rate": 1000.0}, ALICE: {"consumer_byte_rate": 10.0}})


def test_first_start_seeds_the_store_from_yaml(store: QuotaStore) -> None:
    outcome = reconcile_seed(store, YAML_V1, "a")
    assert outcome.table == YAML_V1 == store.load()
    assert "seeded from the YAML entries" in outcome.message
    assert store.meta(SEEDED) is not None and store.meta(seed_meta("a")) is not None


def test_afterwards_the_store_wins_over_unchanged_yaml(store: QuotaStore) -> None:
    reconcile_seed(store, YAML_V1, "a")
    store.apply([set_(ANY_CLIENT, "producer_byte_rate", 5000.0), set_(ALICE, "consumer_byte_rate", None)])
    outcome = reconcile_seed(store, YAML_V1, "a")  # a restart, or SIGHUP, with the same YAML
    assert outcome.table == {ANY_CLIENT: {"producer_byte_rate": 5000.0}} == store.load()
    assert outcome.changes == ()


def test_a_yaml_edit_is_applied_as_a_change_of_the_keys_it_touches(store: QuotaStore) -> None:
    reconcile_seed(store, YAML_V1, "a")
    store.apply([set_(ANY_CLIENT, "producer_byte_rate", 5000.0), set_(ALICE_APP, "request_rate", 7.0)])
    # the edit: alice's entry deleted, a key added to the default client's; producer_byte_rate as it was
    edited = QuotaTable({ANY_CLIENT: {"producer_byte_rate": 1000.0, "request_rate": 3.0}})
    outcome = reconcile_seed(store, edited, "a")
    assert store.load() == {ANY_CLIENT: {"producer_byte_rate": 5000.0,   # the admin's value stays
                                         "request_rate": 3.0},
                            ALICE_APP: {"request_rate": 7.0}}           # the admin's entity stays
    assert set(outcome.changes) == {set_(ALICE, "consumer_byte_rate", None),
                                    set_(ANY_CLIENT, "request_rate", 3.0)}
    assert "2 change(s) written" in outcome.message


def test_another_instance_joining_a_seeded_store_does_not_apply_its_yaml(store: QuotaStore) -> None:
    reconcile_seed(store, YAML_V1, "a")
    other = QuotaTable({ALICE: {"producer_byte_rate": 1.0}})
    outcome = reconcile_seed(store, other, "b")
    assert store.load() == YAML_V1 and "it wins over the YAML entries" in outcome.message
    # ... but its later YAML edits are changes like any other
    reconcile_seed(store, QuotaTable({ALICE: {"producer_byte_rate": 2.0}}), "b")
    assert store.load()[ALICE] == {"consumer_byte_rate": 10.0, "producer_byte_rate": 2.0}


def test_reseed_replaces_the_store(store: QuotaStore) -> None:
    reconcile_seed(store, YAML_V1, "a")
    store.apply([set_(ALICE_APP, "request_rate", 7.0)])
    outcome = reconcile_seed(store, QuotaTable({ALICE: {"request_rate": 1.0}}), "a", reseed=True)
    assert store.load() == {ALICE: {"request_rate": 1.0}} and "replaced by the YAML" in outcome.message


def test_brokers_quotas_are_imported_when_seeding_and_yaml_wins_per_key(store: QuotaStore) -> None:
    brokers = QuotaTable({ALICE: {"consumer_byte_rate": 99.0, "producer_byte_rate": 98.0},
                          ALICE_APP: {"producer_byte_rate": 97.0}})
    calls: list[int] = []

    def imported() -> QuotaTable:
        calls.append(1)
        return brokers

    reconcile_seed(store, YAML_V1, "a", imported=imported)
    assert store.load() == {ANY_CLIENT: {"producer_byte_rate": 1000.0},
                            ALICE: {"consumer_byte_rate": 10.0, "producer_byte_rate": 98.0},
                            ALICE_APP: {"producer_byte_rate": 97.0}}
    reconcile_seed(store, YAML_V1, "a", imported=imported)   # seeded already: no second import
    assert calls == [1]


def test_imported_quotas_keep_only_what_sluice_enforces(caplog: pytest.LogCaptureFixture) -> None:
    table = table_from_described([
        ((("user", "alice"),), {"producer_byte_rate": 1.0, "controller_mutation_rate": 5.0}),
        ((("ip", "10.0.0.1"),), {"connection_creation_rate": 3.0}),
        ((("client-id", None), ("user", None)), {"request_percentage": 50.0}),
    ], "brokers")
    assert table == {ALICE: {"producer_byte_rate": 1.0},
                     QuotaEntity(user=DEFAULT, client_id=DEFAULT): {"request_percentage": 50.0}}
    assert "controller_mutation_rate" in caplog.text and "ip" in caplog.text


def test_sqlite_notices_another_processs_commit(tmp_path: Path) -> None:
    """`--workers N`: a write through one worker's store reaches another's within ~100 ms."""
    import threading

    path = tmp_path / "q.db"
    watcher = SqliteStore(path, watch_interval_ms=20)
    writer = SqliteStore(path, watch_interval_ms=None)  # another connection, as another process has
    seen: list[QuotaTable] = []
    arrived = threading.Event()

    def on_change(table: QuotaTable) -> None:
        seen.append(table)
        arrived.set()

    watcher.subscribe(on_change)
    try:
        writer.apply([QuotaChange(ALICE, "producer_byte_rate", 100.0)])
        assert arrived.wait(5)
        assert seen[-1] == QuotaTable({ALICE: {"producer_byte_rate": 100.0}})
        assert watcher.current() == seen[-1]
        own_before = len(seen)
        watcher.apply([QuotaChange(ALICE, "producer_byte_rate", 200.0)])  # its own write: notified once
        assert len(seen) == own_before + 1
        # the poller's check (what its thread runs every 20 ms) sees nothing new for our own write
        assert watcher.poll_external_change() is None
        assert len(seen) == own_before + 1
    finally:
        watcher.close()
        writer.close()


def _open_at_once(path: str, start: Any, results: Any) -> None:
    start.wait()
    try:
        SqliteStore(Path(path), watch_interval_ms=None).close()
        results.put("ok")
    except StoreError as exc:
        results.put(str(exc))


def test_workers_opening_a_new_sqlite_store_together_all_start(tmp_path: Path) -> None:
    # The workers of one instance open the same new file at the same moment. SQLite answers a
    # WAL switch that races another with "database is locked" at once (busy_timeout does not
    # apply); before the retry about 8 % of such opens failed, so 4 x 15 opens all failing to
    # fail by luck is below 1 in 100.
    context = multiprocessing.get_context("fork")
    for round_ in range(15):
        path = str(tmp_path / f"q{round_}.db")
        start, results = context.Barrier(4), context.Queue()
        openers = [context.Process(target=_open_at_once, args=(path, start, results)) for _ in range(4)]
        for opener in openers:
            opener.start()
        outcomes = [results.get(timeout=60) for _ in openers]
        for opener in openers:
            opener.join(30)
        assert outcomes == ["ok"] * 4, outcomes


def test_opening_a_made_store_only_reads_so_a_writer_holding_the_lock_does_not_stop_it(
        tmp_path: Path) -> None:
    # prepare_store makes the file (WAL, tables) before the workers start; a worker's open then
    # takes no write lock, so another worker's long commit (an fsync on a stalled disk) cannot
    # time it out. Here the lock is held for the whole open: an open that wrote would wait the
    # busy timeout and fail.
    path = tmp_path / "q.db"
    prepare_store(StoreConfig(type="sqlite", path=path))
    with sqlite3.connect(path, isolation_level=None) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"quotas", "meta"}
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO meta VALUES ('held', 'by another worker')")
        store = SqliteStore(path, watch_interval_ms=None)
        try:
            assert store.current() == {}
        finally:
            store.close()
        db.execute("ROLLBACK")


def test_prepare_store_names_a_file_it_cannot_make(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StoreError, match=r"cannot open the quota store .*a-file/q\.db"):
        prepare_store(StoreConfig(type="sqlite", path=tmp_path / "a-file" / "q.db"))
    prepare_store(StoreConfig(type="memory"))  # nothing to make
    assert not (tmp_path / "sluice-quotas.db").exists()


def test_sqlite_changed_into_a_row_it_cannot_read_says_so_until_fixed(tmp_path: Path) -> None:
    """Another process writes a row Sluice cannot read into a running store: the quotas as last
    read stay, and `unreadable()` (for /healthz and the metric) names the problem until the row goes."""
    from tests.harness.wait import eventually

    store = SqliteStore(tmp_path / "q.db", watch_interval_ms=10)
    try:
        store.apply([set_(ALICE, "request_rate", 3.0)])
        with sqlite3.connect(tmp_path / "q.db") as db:
            db.execute("INSERT INTO quotas VALUES (?, ?, ?)", (encode_entity(ALICE), "bogus", 1.0))
        problems = eventually(store.unreadable, bool, timeout_s=15)
        assert "Invalid configuration key bogus" in problems[str(tmp_path / "q.db")]
        assert store.current() == {ALICE: {"request_rate": 3.0}}
        with sqlite3.connect(tmp_path / "q.db") as db:
            db.execute("DELETE FROM quotas WHERE key = 'bogus'")
        assert eventually(store.unreadable, lambda p: not p, timeout_s=15) == {}
    finally:
        store.close()

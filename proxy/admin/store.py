"""Where quotas live across restarts: an embedded SQLite file, a compacted Kafka topic, or memory.

A store holds a `QuotaTable` (per entity, Kafka's raw quota keys and values) and a few named
meta values. The interface is small and blocking; `proxy.quota_service` calls it from one worker
thread, never from the event loop:

    load() -> QuotaTable                   what the store holds (read again from its medium)
    current() -> QuotaTable                the table as this instance last saw it (no I/O)
    apply(changes, meta) -> QuotaTable     write a batch of changes (and meta values)
    subscribe(callback)                    callback(table) whenever the table changes, from any
                                           thread, including changes made by other instances

`sqlite` (the default) is one local file, written in one transaction per batch: a batch applies
whole or not at all. One Sluice instance per file; its workers (`--workers N`) share it: each
process polls SQLite's `PRAGMA data_version` (`watch_interval_ms`, 100 ms) and reloads the table
when another process committed, so a change made through one worker applies in all within ~100 ms.

`kafka` is a compacted topic shared by several instances (and their workers). It is designed on
what Kafka guarantees, so that no change an admin was told succeeded is ever undone:

* One record per (entity, quota key): key ``[{"client-id":"x"},"producer_byte_rate"]``, value
  the number, a tombstone when the key is removed. Compaction keeps the latest record per key, so
  the topic is Kafka's own ``entity -> {key: value}`` map (`ClientQuotaRecord` is per key too).
  A write never reads and rewrites an entity: two writers changing different keys of one entity
  touch different records, and both changes stand. Two writers changing the same key: the one
  the partition log orders last wins, on every instance alike (one partition: one order).
* A batch (one AlterClientQuotas request, a seed) is one Kafka transaction (a transactional
  producer, `transactional.id` unique to this process) and consumers read committed records
  only: every instance sees all of a batch or none of it. An error aborts the transaction, so
  an error answered means nothing of the batch was written (unless the abort itself fails,
  which the error then says).
* `apply` returns once this instance has read its batch back, so what it answers is what it
  enforces. A committed batch not read back within `write_timeout_ms` is not an error: it is in
  the log and applies when it is read; the table returned already holds it.
* Every instance consumes the topic from the beginning and keeps consuming; a change reaches
  every instance within the consumer's poll interval (`poll_interval_ms`, 100 ms).
* A record Sluice cannot read (a bad entity, an unknown key, a value out of range) is an error
  naming the record: at start the store refuses to open; later it is logged and listed by
  `KafkaStore.unreadable` (counted in `sluice_quota_store_unreadable_records`) until a readable
  record with the same key replaces it. No quota is silently dropped.
* The older format (one record per entity holding all its keys) is still read, in log order,
  and rewritten as one record per key (in one transaction) when an instance opens the topic.

Meta values (seeding state, see `reconcile_seed`) are rows of a `meta` table, or records keyed
``__sluice__/<name>``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from quotas.entity import QuotaEntity
from quotas.errors import QuotaConfigError
from quotas.table import QuotaChange, QuotaTable, format_value, validate_key_value

log = logging.getLogger("sluice.quota_store")

SEEDED = "seeded"
META_PREFIX = "__sluice__/"


def seed_meta(instance: str) -> str:
    """The meta name holding the YAML entries `instance` last applied (its seed baseline)."""
    return f"seed/{instance}"


class StoreError(Exception):
    """The store cannot be read or written; the message says why."""


# ---------------------------------------------------------------------------------- config

def librdkafka_text(value: object) -> object:
    """A mapping of librdkafka settings with YAML's numbers and booleans as the strings librdkafka
    takes (``30000``, ``true``); anything else is left for validation to refuse."""
    if not isinstance(value, dict):
        return value
    return {k: (str(v).lower() if isinstance(v, bool) else str(v)) if isinstance(v, bool | int | float)
            else v for k, v in value.items()}


class StoreSasl(BaseModel):
    """Credentials for the brokers' quota import over SASL (PLAIN or SCRAM)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(description="the SASL mechanism")
    username: str = Field(description="the SASL user name")
    password: SecretStr = Field(description="the SASL password (never logged)")


class StoreConfig(BaseModel):
    """The ``store:`` section. A relative `path` is relative to the configuration file."""

    # revalidated when given as a default, so that `path` is resolved against the config file
    model_config = ConfigDict(extra="forbid", frozen=True, revalidate_instances="always")

    type: Literal["sqlite", "kafka", "memory"] = Field(
        default="sqlite", description="sqlite: one local file (one instance and its workers); kafka: a "
                                      "compacted topic every instance shares (required by fleet); memory: "
                                      "nothing survives a restart")
    path: Path = Field(default=Path("sluice-quotas.db"), validate_default=True,
                       description="sqlite: the database file")
    bootstrap: str | None = Field(default=None, description="kafka: the cluster holding the topic "
                                                            "(default: the upstream brokers)")
    topic: str = Field(default="_sluice_quotas", pattern=r"^[A-Za-z0-9._-]{1,249}$",
                       description="kafka: the compacted topic (created if missing)")
    replication_factor: int = Field(default=-1, description="kafka: for a topic Sluice creates; "
                                                            "-1 = the brokers' default")
    poll_interval_ms: int = Field(default=100, ge=10, le=10_000,
                                  description="kafka: how often the topic is read for other "
                                              "instances' changes")
    write_timeout_ms: int = Field(default=10_000, ge=100, description="kafka: the limit for creating the "
                                  "topic and for a change to be acknowledged and read back")
    kafka_config: dict[str, SecretStr] = Field(default_factory=dict,
                                               description="kafka: extra librdkafka settings (security); "
                                                           "never shown in logs")
    import_from_brokers: bool = Field(default=False, description="when seeding, first import the quotas "
                                                                 "set on the upstream brokers")
    import_sasl: StoreSasl | None = Field(default=None, description="SASL credentials for "
                                          "import_from_brokers where the upstream listener requires SASL")
    reseed: bool = Field(default=False, description="replace the store with the YAML seed at start")

    @field_validator("path")
    @classmethod
    def _relative_to_config(cls, value: Path, info: ValidationInfo) -> Path:
        """Under `data_dir` when set (the image's /var/lib/sluice), else beside the config file."""
        context = info.context if isinstance(info.context, dict) else {}
        base = context.get("data_dir") or context.get("config_dir")
        if not value.is_absolute() and base is not None:
            return Path(base) / value
        return value

    @field_validator("kafka_config", mode="before")
    @classmethod
    def _settings_as_text(cls, value: object) -> object:
        """YAML numbers and booleans as the strings librdkafka takes (``30000``, ``true``)."""
        return librdkafka_text(value)

    @model_validator(mode="after")
    def _kafka_library(self) -> StoreConfig:
        if self.type == "kafka" and importlib.util.find_spec("confluent_kafka") is None:
            raise ValueError("type: kafka needs confluent-kafka installed")
        return self

    def librdkafka_config(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.kafka_config.items()}


# ---------------------------------------------------------------------------------- encoding

def encode_entity(entity: QuotaEntity) -> str:
    """The entity as a compact JSON object, its components sorted: ``{"user":"alice"}``;
    ``null`` is the default name."""
    return json.dumps(dict(sorted(entity.to_kafka())), separators=(",", ":"))


def decode_entity(text: str) -> QuotaEntity:
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"not an entity: {text!r}") from None
    if not isinstance(data, dict) or not all(isinstance(v, str | None) for v in data.values()):
        raise ValueError(f"not an entity: {text!r}")
    return QuotaEntity.from_kafka(data.items())  # every entity type Sluice knows, or QuotaConfigError


def encode_table(table: Mapping[QuotaEntity, Mapping[str, float]]) -> str:
    return json.dumps([[encode_entity(e), dict(v)] for e, v in QuotaTable(table).sorted_items()])


def decode_table(text: str) -> QuotaTable:
    return QuotaTable((decode_entity(e), v) for e, v in json.loads(text))


def checked_values(entity: QuotaEntity, values: Mapping[str, object], where: str) -> dict[str, float]:
    """The values that pass Kafka's rules; the others are logged and dropped (a hand-edited store,
    a newer Sluice's keys)."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            problem: str | None = f"value {value!r} is not a number"
        else:
            problem = validate_key_value(key, float(value))
        if problem is None:
            out[key] = float(value)  # type: ignore[arg-type]
        else:
            log.warning("%s: ignoring %s of %s: %s", where, key, entity.describe(), problem)
    return out


# ---------------------------------------------------------------------------------- stores

class QuotaStore(Protocol):
    def load(self) -> QuotaTable: ...

    def current(self) -> QuotaTable: ...

    def apply(self, changes: Sequence[QuotaChange], meta: Mapping[str, str] | None = None) -> QuotaTable: ...

    def meta(self, name: str) -> str | None: ...

    def subscribe(self, callback: Callable[[QuotaTable], None]) -> None: ...

    def unreadable(self) -> dict[str, str]: ...

    def close(self) -> None: ...

    def describe(self) -> str: ...


class _Subscribers:
    def __init__(self) -> None:
        self._callbacks: list[Callable[[QuotaTable], None]] = []

    def subscribe(self, callback: Callable[[QuotaTable], None]) -> None:
        self._callbacks.append(callback)

    def notify(self, table: QuotaTable) -> None:
        for callback in list(self._callbacks):
            try:
                callback(table)
            except Exception:
                log.exception("quota store subscriber failed")


class MemoryStore(_Subscribers):
    """Nothing survives a restart: for tests, and for a Sluice configured from YAML alone."""

    def __init__(self) -> None:
        super().__init__()
        self._table = QuotaTable()
        self._meta: dict[str, str] = {}
        self._lock = threading.Lock()

    def load(self) -> QuotaTable:
        return self._table

    def current(self) -> QuotaTable:
        return self._table

    def apply(self, changes: Sequence[QuotaChange], meta: Mapping[str, str] | None = None) -> QuotaTable:
        with self._lock:
            self._table = self._table.apply(changes)
            self._meta.update(meta or {})
            table = self._table
        if changes:
            self.notify(table)
        return table

    def meta(self, name: str) -> str | None:
        return self._meta.get(name)

    def unreadable(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return "memory (nothing survives a restart)"


class SqliteStore(_Subscribers):
    """One SQLite file; each `apply` is one transaction. Commits by other processes (the other
    workers of the instance, `sluice quotas` run against the file) are noticed by a thread that polls
    `PRAGMA data_version` every `watch_interval_ms` (None: never); subscribers then get the new table."""

    _SCHEMA = """
        CREATE TABLE IF NOT EXISTS quotas (
            entity TEXT NOT NULL,      -- JSON of the entity's components, as encode_entity
            key    TEXT NOT NULL,      -- producer_byte_rate, ..., sluice.shadow
            value  REAL NOT NULL,
            PRIMARY KEY (entity, key)
        );
        CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
    """
    # how long a write (or the first open) waits for another process's transaction. A worker that
    # commits (synchronous=FULL: an fsync) while the machine stalls holds the lock for seconds;
    # waiting that out beats failing a worker's start or an operator's change
    _BUSY_TIMEOUT_MS = 30_000

    def __init__(self, path: Path, watch_interval_ms: int | None = 100) -> None:
        super().__init__()
        self.path = path
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._problem: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute(f"PRAGMA busy_timeout={self._BUSY_TIMEOUT_MS}")
            self._use_wal()
            self._db.execute("PRAGMA synchronous=FULL")
            if not self._has_tables():
                # made under the write lock, taken first (waiting on busy_timeout): a CREATE that
                # reads the schema and then upgrades to write fails at once with "database is
                # locked" when another worker made the tables in between (a stale WAL snapshot)
                self._db.executescript(f"BEGIN IMMEDIATE; {self._SCHEMA} COMMIT;")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the quota store {path}: {exc}") from exc
        self._table = self._read()
        self._data_version = self._version()
        self._watcher: threading.Thread | None = None
        if watch_interval_ms is not None:
            self._watcher = threading.Thread(target=self._watch, args=(watch_interval_ms / 1000,),
                                             name="quota-store-watch", daemon=True)
            self._watcher.start()

    def _use_wal(self) -> None:
        """Switch the file to WAL. SQLite answers a switch that races another connection's (the
        workers of one instance open the file together) with "database is locked" at once, without
        waiting on busy_timeout, so the switch is retried until the busy timeout has passed."""
        deadline = time.monotonic() + self._BUSY_TIMEOUT_MS / 1000
        pause_s = 0.005
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 0.1)

    def _has_tables(self) -> bool:
        """Whether the file has its tables: then opening it only reads (no write lock to wait for)."""
        names = {row[0] for row in self._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('quotas', 'meta')")}
        return names == {"quotas", "meta"}

    def _version(self) -> int:
        """SQLite's `data_version`: changes when another connection commits (never for our own)."""
        return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    def _watch(self, interval_s: float) -> None:
        while not self._closed.wait(interval_s):
            try:
                changed = self.poll_external_change()
            except StoreError as exc:
                if self._problem != str(exc):  # once per problem: it is on /healthz and a metric
                    log.error("%s; the quotas as last read stay in force", exc)
                self._problem = str(exc)
                continue
            if changed is not None:
                self.notify(changed)

    def unreadable(self) -> dict[str, str]:
        """The file's problem when another process last changed it into something Sluice cannot
        read (the quotas as last read stay in force); empty otherwise."""
        problem = self._problem
        return {} if problem is None else {str(self.path): problem}

    def poll_external_change(self) -> QuotaTable | None:
        """The table as another process left it, when one committed since the last poll; else None."""
        with self._lock:
            if self._closed.is_set():
                return None
            try:
                version = self._version()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read the quota store {self.path}: {exc}") from exc
            if version == self._data_version:
                return None
            table = self._read()  # raises while the file holds a row it cannot read: tried again next time
            self._data_version = version
            self._problem = None
            if table == self._table:
                return None
            self._table = table
            return table

    def _read(self) -> QuotaTable:
        rows: dict[QuotaEntity, dict[str, float]] = {}
        try:
            # every row first: a statement left unfinished by an error below would hold its read
            # snapshot, and the next reads would see the file as it was then
            found = self._db.execute("SELECT entity, key, value FROM quotas ORDER BY entity, key").fetchall()
            for entity_text, key, value in found:
                try:
                    entity = decode_entity(entity_text)
                except (ValueError, QuotaConfigError) as exc:
                    raise StoreError(f"the quota store {self.path} holds a row Sluice cannot read (entity "
                                     f"{entity_text}, key {key}): {exc}") from None
                problem = (f"value {value!r} is not a number"
                           if isinstance(value, bool) or not isinstance(value, int | float)
                           else validate_key_value(key, float(value)))
                if problem is not None:
                    raise StoreError(f"the quota store {self.path} holds a row Sluice cannot read (entity "
                                     f"{entity_text}, key {key}): {problem}")
                rows.setdefault(entity, {})[key] = float(value)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the quota store {self.path}: {exc}") from exc
        return QuotaTable(rows.items())

    def load(self) -> QuotaTable:
        with self._lock:
            self._table = self._read()
            return self._table

    def current(self) -> QuotaTable:
        return self._table

    def apply(self, changes: Sequence[QuotaChange], meta: Mapping[str, str] | None = None) -> QuotaTable:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for change in changes:
                        entity = encode_entity(change.entity)
                        if change.value is None:
                            self._db.execute("DELETE FROM quotas WHERE entity = ? AND key = ?",
                                             (entity, change.key))
                        else:
                            self._db.execute("INSERT INTO quotas (entity, key, value) VALUES (?, ?, ?) "
                                             "ON CONFLICT (entity, key) DO UPDATE SET value = excluded.value",
                                             (entity, change.key, float(change.value)))
                    for name, value in (meta or {}).items():
                        self._db.execute("INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) "
                                         "DO UPDATE SET value = excluded.value", (name, value))
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"cannot write the quota store {self.path}: {exc}") from exc
            self._table = self._table.apply(changes)
            table = self._table
        if changes:
            self.notify(table)
        return table

    def meta(self, name: str) -> str | None:
        with self._lock:
            try:
                row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read the quota store {self.path}: {exc}") from exc
        return None if row is None else str(row[0])

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self._db.close()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(2)

    def describe(self) -> str:
        return f"sqlite {self.path}"


class KafkaStore(_Subscribers):
    """A compacted topic every instance reads from the beginning and writes through.

    One record per (entity, quota key): key ``[{"client-id":"x"},"producer_byte_rate"]`` (the
    entity as `encode_entity`, then the key), value the number as JSON, a tombstone when the key
    is removed. A batch is one Kafka transaction (`transactional.id` unique to this process); the
    consumer reads committed records only. See the module docstring for why.
    """

    def __init__(self, bootstrap: str, topic: str, *, replication_factor: int = -1,
                 poll_interval_ms: int = 100, write_timeout_ms: int = 10_000,
                 kafka_config: Mapping[str, str] | None = None, instance: str = "sluice",
                 load_timeout_s: float = 30.0) -> None:
        super().__init__()
        try:
            from confluent_kafka import Consumer, KafkaException
        except ImportError:
            raise StoreError("the kafka quota store needs confluent-kafka: pip install confluent-kafka") \
                from None
        self.bootstrap = bootstrap
        self.topic = topic
        self._timeout_s = write_timeout_ms / 1000
        self._poll_s = poll_interval_ms / 1000
        self._common = {"bootstrap.servers": bootstrap, **(kafka_config or {})}
        self._instance = instance
        self._table = QuotaTable()
        self._meta: dict[str, str] = {}
        self._legacy: set[str] = set()           # keys of readable records of the old format
        self._unreadable: dict[str, str] = {}    # record key -> why it cannot be read
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._position: dict[int, int] = {}
        self._unnotified = False                 # the table changed since subscribers were told
        self._closed = threading.Event()
        self._producer: Any = None
        try:
            partitions = self._ensure_topic(self._common, replication_factor)
            group = f"sluice-quota-store-{instance}-{uuid.uuid4().hex}"  # never joined: we assign
            self._consumer = Consumer({**self._common, "group.id": group, "isolation.level": "read_committed",
                                       "enable.auto.commit": False, "enable.partition.eof": False,
                                       "fetch.wait.max.ms": poll_interval_ms, "fetch.error.backoff.ms": 100,
                                       "client.id": f"sluice-quota-store-{instance}"})
        except KafkaException as exc:
            raise StoreError(f"cannot reach the quota store topic {topic} on {bootstrap}: {exc}") from exc
        self._partitions = partitions
        self._catch_up(load_timeout_s)
        self._unnotified = False  # nobody has subscribed yet: `load` gives them the table
        if self._unreadable:
            self._consumer.close()
            raise StoreError(f"the quota store topic {topic} holds records Sluice cannot read "
                             f"(fix or delete them; nothing is dropped silently): "
                             f"{self._describe_unreadable()}")
        self._thread = threading.Thread(target=self._run, name="quota-store-consumer", daemon=True)
        self._thread.start()
        if self._legacy:
            self._migrate()

    # ---------------------------------------------------------------- reading

    def _ensure_topic(self, common: Mapping[str, str], replication_factor: int) -> list[int]:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient(dict(common))
        metadata = admin.list_topics(timeout=self._timeout_s)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            futures = admin.create_topics([NewTopic(self.topic, num_partitions=1,
                                                    replication_factor=replication_factor,
                                                    config={"cleanup.policy": "compact"})],
                                          operation_timeout=self._timeout_s)
            try:
                futures[self.topic].result(timeout=self._timeout_s)
                log.info("created the quota store topic %s (compacted, 1 partition)", self.topic)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            deadline = time.monotonic() + self._timeout_s
            while True:
                topic = admin.list_topics(self.topic, timeout=self._timeout_s).topics.get(self.topic)
                if topic is not None and topic.error is None and topic.partitions:
                    break
                if time.monotonic() > deadline:
                    raise StoreError(f"topic {self.topic} has no partitions yet")
                time.sleep(0.1)
        return sorted(topic.partitions)

    def _catch_up(self, timeout_s: float) -> None:
        """Read the topic from the beginning up to its end as of now. The end is the high watermark;
        the consumer's position (not the last record's offset) is compared with it, since the
        position moves past transaction markers, which are never delivered."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        deadline = time.monotonic() + timeout_s
        ends = {p: self._end_offset(p, deadline) for p in self._partitions}
        self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in self._partitions])
        while True:
            positions = {tp.partition: tp.offset for tp in
                         self._consumer.position([TopicPartition(self.topic, p) for p in self._partitions])}
            if all(max(positions.get(p, -1), self._position.get(p, 0)) >= end for p, end in ends.items()):
                return
            if time.monotonic() > deadline:
                raise StoreError(f"could not read the quota store topic {self.topic} to its end "
                                 f"within {timeout_s:g} s")
            self._poll_once(notify=False)

    def _end_offset(self, partition: int, deadline: float) -> int:
        """The partition's high watermark. A retriable error (a topic just created whose leader the
        broker does not know yet: NOT_LEADER_FOR_PARTITION, LEADER_NOT_AVAILABLE) is retried until
        `deadline`; any other error, or the deadline, is a `StoreError`."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        transient = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                     KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._TIMED_OUT,
                     KafkaError._TRANSPORT}
        while True:
            try:
                _low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                                  timeout=self._timeout_s)
                return int(high)
            except KafkaException as exc:
                error = exc.args[0]
                if not (error.retriable() or error.code() in transient) or time.monotonic() > deadline:
                    raise StoreError(f"cannot read the end of the quota store topic {self.topic}: "
                                     f"{error.str()}") from exc
                log.info("quota store topic %s partition %d: %s; retrying", self.topic, partition,
                         error.str())
                time.sleep(0.2)

    def _poll_once(self, notify: bool) -> None:
        """Read what is there (up to 1,000 records) and apply it. Subscribers are told only once the
        consumer is at the partition's end (read_committed: its last stable offset), which is
        always a transaction's boundary: they never see part of a batch."""
        msgs = self._consumer.consume(1000, self._poll_s)
        changed = False
        with self._cond:
            for msg in msgs:
                if msg.error() is not None:
                    log.warning("quota store consumer: %s", msg.error())
                    continue
                key = (msg.key() or b"").decode("utf-8", "replace")
                value = msg.value()
                if key.startswith(META_PREFIX):
                    name = key[len(META_PREFIX):]
                    if value is None:
                        self._meta.pop(name, None)
                    else:
                        self._meta[name] = value.decode("utf-8", "replace")
                elif self._apply_record(key, value, int(msg.offset() or 0)):
                    changed = True
                self._position[int(msg.partition() or 0)] = int(msg.offset() or 0) + 1
            self._unnotified = self._unnotified or changed
            table = self._table
            if msgs:
                self._cond.notify_all()
        if notify and self._unnotified and self._at_end():
            self._unnotified = False
            self.notify(table)

    def _at_end(self) -> bool:
        """The consumer has read every committed record it knows of (its cached end offsets)."""
        from confluent_kafka import TopicPartition

        for tp in self._consumer.position([TopicPartition(self.topic, p) for p in self._partitions]):
            _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset < 0 or (high >= 0 and tp.offset < high):
                return False
        return True

    def _apply_record(self, key: str, value: bytes | None, offset: int) -> bool:
        """Apply one quota record (under `_cond`); True when the table changed. A record that
        cannot be read is remembered by its key (an error at start; logged and counted later)
        until a readable record with the same key replaces it."""
        try:
            changes = record_changes(key, value, self._table)
        except ValueError as exc:
            if value is None:  # a tombstone clears whatever its key held, readable or not
                self._unreadable.pop(key, None)
                return False
            self._unreadable[key] = f"offset {offset}: {exc}"
            log.error("quota store topic %s: cannot read the record %s at offset %d: %s", self.topic,
                      key, offset, exc)
            return False
        self._unreadable.pop(key, None)
        if key.startswith("{"):
            (self._legacy.add if value is not None else self._legacy.discard)(key)
        if not changes:
            return False
        table = self._table.apply(changes)
        if table == self._table:
            return False
        self._table = table
        return True

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self._poll_once(notify=True)
            except Exception:  # keep consuming whatever one record does
                log.exception("quota store consumer failed on a record")

    def unreadable(self) -> dict[str, str]:
        """Records the store could not read (record key -> why): for `/healthz` and metrics."""
        with self._cond:
            return dict(self._unreadable)

    def _describe_unreadable(self) -> str:
        items = sorted(self._unreadable.items())
        text = "; ".join(f"record {k}: {why}" for k, why in items[:5])
        return text + (f"; and {len(items) - 5} more" if len(items) > 5 else "")

    def load(self) -> QuotaTable:
        with self._cond:
            return self._table

    def current(self) -> QuotaTable:
        return self._table

    def meta(self, name: str) -> str | None:
        with self._cond:
            return self._meta.get(name)

    # ---------------------------------------------------------------- writing

    def _migrate(self) -> None:
        """Rewrite the old format's entity records (all of an entity's keys in one record) as one
        record per key, and delete them, in one transaction."""
        with self._cond:
            legacy = sorted(self._legacy)
            table = self._table
        records: list[tuple[str, bytes | None]] = []
        for key in legacy:  # the old record's tombstone first: it removes every key of its entity
            entity = decode_entity(key)
            records.append((key, None))
            for name, value in sorted(table.get(entity, {}).items()):
                records.append((encode_record_key(entity, name), json.dumps(value).encode()))
        try:
            self._write(records)
        except StoreError as exc:
            log.warning("quota store topic %s: old-format records not migrated yet (they are still read): %s",
                        self.topic, exc)
            return
        log.info("quota store topic %s: %d old-format entity record(s) rewritten as one record per key",
                 self.topic, len(legacy))

    def apply(self, changes: Sequence[QuotaChange], meta: Mapping[str, str] | None = None) -> QuotaTable:
        """Write the batch in one transaction, one record per changed (entity, key): a change to one
        key never rewrites another, so concurrent writers of different keys never undo each other.
        Returns once this instance has read the batch back; if that takes longer than the write
        timeout, the committed batch is still reported as written (it will be read: it is in the
        log), with the table as it will be."""
        last: dict[tuple[QuotaEntity, str], float | None] = {}
        for change in changes:
            last[(change.entity, change.key)] = change.value
        records: list[tuple[str, bytes | None]] = [
            (encode_record_key(entity, key), None if value is None else json.dumps(float(value)).encode())
            for (entity, key), value in last.items()]
        records += [(META_PREFIX + name, value.encode()) for name, value in (meta or {}).items()]
        if not records:
            return self.current()
        written = self._write(records)
        deadline = time.monotonic() + self._timeout_s
        with self._cond:
            while any(self._position.get(p, 0) <= offset for p, offset in written.items()):
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("quota store topic %s: a committed change is not read back yet after %g s; "
                                "it applies when it is", self.topic, self._timeout_s)
                    return self._table.apply(changes)
                self._cond.wait(left)
            return self._table

    def _write(self, records: Sequence[tuple[str, bytes | None]]) -> dict[int, int]:
        """Produce `records` in one transaction; the highest offset written per partition. Either
        every record is committed or none is (an error aborts the transaction)."""
        from confluent_kafka import KafkaException

        with self._write_lock:
            errors: list[str] = []
            written: dict[int, int] = {}

            def delivered(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    written[msg.partition()] = max(written.get(msg.partition(), -1), msg.offset())

            producer = self._transactional_producer()
            try:
                producer.begin_transaction()
                for key, value in records:
                    producer.produce(self.topic, key=key.encode(), value=value, on_delivery=delivered)
                left = producer.flush(self._timeout_s)
                if errors or left:
                    why = "; ".join(errors) or \
                        f"{left} record(s) not acknowledged within {self._timeout_s:g} s"
                    raise StoreError(why)
                self._commit(producer)
            except (KafkaException, BufferError, StoreError) as exc:
                outcome = "nothing of the batch was written" if self._abort(producer) else \
                    "the transaction could not be aborted: the batch may still apply"
                raise StoreError(f"cannot write to the quota store topic {self.topic} ({outcome}): "
                                 f"{exc}") from exc
            return written

    def _transactional_producer(self) -> Any:
        from confluent_kafka import KafkaException, Producer

        if self._producer is None:
            transactional_id = f"sluice-quota-store-{self._instance}-{uuid.uuid4().hex}"  # one per process
            producer = Producer({**self._common, "acks": "all", "enable.idempotence": True, "linger.ms": 0,
                                 "transactional.id": transactional_id,
                                 # a process that dies mid-batch holds readers back until the broker
                                 # aborts its transaction: this long, just over a batch's own limit
                                 "transaction.timeout.ms": int(self._timeout_s * 1000) + 5_000,
                                 "client.id": f"sluice-quota-store-{self._instance}"})
            # the first transactional producer of a cluster makes it create and load its transaction
            # log: retriable errors (coordinator loading, not available) are retried for a while
            deadline = time.monotonic() + max(30.0, self._timeout_s)
            while True:
                try:
                    producer.init_transactions(max(1.0, deadline - time.monotonic()))
                    break
                except KafkaException as exc:
                    if not exc.args[0].retriable() or time.monotonic() >= deadline:
                        raise StoreError(f"cannot start writing to the quota store topic {self.topic} "
                                         f"(Kafka transactions): {exc}") from exc
                    log.info("quota store topic %s: %s; retrying", self.topic, exc.args[0].str())
            self._producer = producer
        return self._producer

    def _commit(self, producer: Any) -> None:
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                producer.commit_transaction(max(0.1, deadline - time.monotonic()))
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.retriable() and time.monotonic() < deadline:
                    continue
                raise

    def _abort(self, producer: Any) -> bool:
        """Abort the open transaction (True: done). A producer that cannot is replaced next time."""
        from confluent_kafka import KafkaException

        try:
            producer.abort_transaction(self._timeout_s)
            return True
        except KafkaException as exc:
            log.warning("quota store topic %s: cannot abort a transaction (%s); a new producer is used",
                        self.topic, exc)
            self._producer = None
            return False

    def close(self) -> None:
        self._closed.set()
        if hasattr(self, "_thread"):
            self._thread.join(5)
        self._consumer.close()
        if self._producer is not None:
            self._producer.flush(2)

    def describe(self) -> str:
        return f"kafka topic {self.topic} on {self.bootstrap}"


def encode_record_key(entity: QuotaEntity, key: str) -> str:
    """The Kafka store's record key of one (entity, quota key): ``[{"client-id":"x"},"request_rate"]``."""
    return f"[{encode_entity(entity)},{json.dumps(key)}]"


def record_changes(key: str, value: bytes | None, table: QuotaTable) -> list[QuotaChange]:
    """The changes one quota record of the Kafka store makes to `table`; ValueError (naming what is
    wrong) for a record that cannot be read.

    * ``[entity, key]`` -> the number, or a tombstone: set or remove that key;
    * ``{entity}`` -> an object of every key (the old format, before one record per key): the
      entity's keys become the object's; a tombstone removes them all.
    """
    try:
        parsed = json.loads(key)
    except ValueError:
        raise ValueError("the key is not JSON") from None
    if isinstance(parsed, list):
        if len(parsed) != 2 or not isinstance(parsed[0], dict) or not isinstance(parsed[1], str):
            raise ValueError("the key is not [entity, quota key]")
        entity = _entity_of(parsed[0])
        if value is None:
            return [QuotaChange(entity, parsed[1], None)]
        return [QuotaChange(entity, parsed[1], _number(parsed[1], value))]
    if isinstance(parsed, dict):
        entity = _entity_of(parsed)
        old = table.get(entity, {})
        if value is None:
            return [QuotaChange(entity, k, None) for k in old]
        try:
            raw = json.loads(value)
        except ValueError:
            raise ValueError("the value is not JSON") from None
        if not isinstance(raw, dict):
            raise ValueError("the value is not a JSON object of quota keys")
        values = {k: _number(k, json.dumps(v).encode()) for k, v in raw.items()}
        return [QuotaChange(entity, k, None) for k in old if k not in values] + \
            [QuotaChange(entity, k, v) for k, v in values.items()]
    raise ValueError("the key is neither [entity, quota key] nor an entity")


def _entity_of(components: Mapping[str, object]) -> QuotaEntity:
    try:
        return decode_entity(json.dumps(components))
    except QuotaConfigError as exc:
        raise ValueError(f"not an entity Sluice knows: {exc}") from None


def _number(key: str, value: bytes) -> float:
    try:
        number = json.loads(value)
    except ValueError:
        raise ValueError(f"the value of {key} is not JSON") from None
    if isinstance(number, bool) or not isinstance(number, int | float):
        raise ValueError(f"the value of {key} is not a number: {value[:40]!r}")
    problem = validate_key_value(key, float(number))
    if problem is not None:
        raise ValueError(problem)
    return float(number)


def prepare_store(config: StoreConfig) -> None:
    """Before the workers of one instance start: a new SQLite file is made (WAL, tables) by one
    process, so the workers opening it together only read it. Raises StoreError naming the file."""
    if config.type == "sqlite":
        SqliteStore(config.path, watch_interval_ms=None).close()


def open_store(config: StoreConfig, *, upstream_bootstrap: str, instance: str) -> QuotaStore:
    """Open the configured store (blocking; for Kafka, reads the topic to its end)."""
    if config.type == "memory":
        return MemoryStore()
    if config.type == "sqlite":
        return SqliteStore(config.path)
    return KafkaStore(config.bootstrap or upstream_bootstrap, config.topic,
                      replication_factor=config.replication_factor, poll_interval_ms=config.poll_interval_ms,
                      write_timeout_ms=config.write_timeout_ms, kafka_config=config.librdkafka_config(),
                      instance=instance)


# ---------------------------------------------------------------------------------- seeding

@dataclass(frozen=True)
class SeedOutcome:
    table: QuotaTable
    message: str
    changes: tuple[QuotaChange, ...] = ()


def _sets(table: Mapping[QuotaEntity, Mapping[str, float]]) -> list[QuotaChange]:
    return [QuotaChange(e, k, v) for e, vals in QuotaTable(table).sorted_items() for k, v in vals.items()]


def reconcile_seed(store: QuotaStore, seed: QuotaTable, instance: str, *, reseed: bool = False,
                   imported: Callable[[], QuotaTable] | None = None) -> SeedOutcome:
    """Bring the YAML seed (`quotas.entries`) and the store together. Which wins:

    * first start (the store was never seeded), or `reseed`: the store becomes the brokers'
      quotas (when `imported` is given) overlaid with the YAML seed, key by key;
    * afterwards the store wins. A YAML edit is still a change: the keys that differ from the
      entries this instance applied last time (its baseline, kept in the store) are written to
      the store, as an admin request would; keys the YAML did not touch keep their stored values.
      An instance that joins a seeded store takes its YAML as its baseline without applying it.

    Called at start and on SIGHUP (never with `reseed` or `imported` then).
    """
    baseline_name = seed_meta(instance)
    seed_text = encode_table(seed)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if reseed or store.meta(SEEDED) is None:
        target = seed
        if imported is not None:
            target = imported().apply(_sets(seed))
        current = store.load()
        changes = current.changes_to(target) if reseed else _sets(target)
        table = store.apply(changes, {SEEDED: now, baseline_name: seed_text})
        how = "replaced by" if reseed else "seeded from"
        source = "the brokers' quotas and the YAML entries" if imported is not None else "the YAML entries"
        return SeedOutcome(table, f"quota store {how} {source}: {len(table)} entities", tuple(changes))
    baseline_text = store.meta(baseline_name)
    if baseline_text is None:
        table = store.apply([], {baseline_name: seed_text})
        return SeedOutcome(table, f"quota store already holds {len(table)} entities: it wins over the YAML "
                                  f"entries (edit them, or start with --reseed, to change it)")
    try:
        baseline = decode_table(baseline_text)
    except (ValueError, TypeError, QuotaConfigError) as exc:
        log.warning("unreadable seed baseline for %s (%s): taking the YAML entries as it", instance, exc)
        baseline = seed
    changes = baseline.changes_to(seed)
    if not changes:
        return SeedOutcome(store.load(), "YAML quota entries unchanged: the store's quotas stand")
    table = store.apply(changes, {baseline_name: seed_text})
    listed = "; ".join(_describe_change(c) for c in changes[:5]) + ("; ..." if len(changes) > 5 else "")
    return SeedOutcome(table, f"YAML quota entries changed: {len(changes)} change(s) written to the store "
                              f"({listed})", tuple(changes))


def _describe_change(change: QuotaChange) -> str:
    what = "removed" if change.value is None else f"= {format_value(change.value)}"
    return f"{change.entity.describe()} {change.key} {what}"


def table_from_described(entries: Sequence[tuple[Sequence[tuple[str, str | None]], Mapping[str, float]]],
                         where: str) -> QuotaTable:
    """A table from DescribeClientQuotas results: entities Sluice cannot hold (ip) and keys it
    does not enforce (controller_mutation_rate) are logged and left out."""
    items: dict[QuotaEntity, dict[str, float]] = {}
    for components, values in entries:
        try:
            entity = QuotaEntity.from_kafka(components)
        except QuotaConfigError as exc:
            log.warning("%s: skipping entity %s: %s", where, dict(components), exc.reason)
            continue
        kept = checked_values(entity, values, where)
        if kept:
            items[entity] = kept
    return QuotaTable(items)


__all__ = [
    "KafkaStore",
    "MemoryStore",
    "QuotaStore",
    "SeedOutcome",
    "SqliteStore",
    "StoreConfig",
    "StoreError",
    "StoreSasl",
    "decode_entity",
    "encode_entity",
    "encode_record_key",
    "open_store",
    "reconcile_seed",
    "record_changes",
    "table_from_described",
]

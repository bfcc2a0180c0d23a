"""Sluice's answers to DescribeClientQuotas and AlterClientQuotas, against a fake store.

Messages and codes are the broker's (Kafka 4.3.1, `ClientQuotasImage.describe` and
`ClientQuotaControlManager`); tests/integration/test_quota_admin.py checks the same cases against a
real broker and through a real Sluice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from kio.static.primitive import f64, i8

from protocol.apis import ApiKey
from protocol.encode import decode_response_body, encode_request, request_schema
from protocol.headers import RequestHeader, read_request_header
from proxy.admin.api import QuotaAdminStage, kafka_entity_string
from proxy.admin.store import StoreError
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import AnswerHere, AnswerLater, Close, ConnectionContext
from quotas import DEFAULT, QuotaConfigError, QuotaEntity
from quotas.table import SHADOW_KEY, QuotaChange, QuotaTable

ALICE = QuotaEntity(user="alice")
ALICE_ANY = QuotaEntity(user="alice", client_id=DEFAULT)
ALICE_APP = QuotaEntity(user="alice", client_id="app")
BOB = QuotaEntity(user="bob")
ANY_USER = QuotaEntity(user=DEFAULT)
APP = QuotaEntity(client_id="app")
ANY_CLIENT = QuotaEntity(client_id=DEFAULT)

TABLE = QuotaTable({ALICE: {"producer_byte_rate": 1.0}, ALICE_ANY: {"consumer_byte_rate": 2.0},
                    ALICE_APP: {"request_rate": 3.0}, BOB: {"producer_byte_rate": 4.0},
                    ANY_USER: {"producer_byte_rate": 5.0}, APP: {"request_percentage": 6.5},
                    ANY_CLIENT: {"producer_byte_rate": 7.0, SHADOW_KEY: 1.0}})


class FakeBackend:
    def __init__(self, table: QuotaTable = TABLE, fail: str | None = None) -> None:
        self.table = table
        self.fail = fail
        self.submitted: list[list[QuotaChange]] = []

    def submit(self, changes: Sequence[QuotaChange]) -> asyncio.Future[QuotaTable]:
        future: asyncio.Future[QuotaTable] = asyncio.get_running_loop().create_future()
        self.submitted.append(list(changes))
        if self.fail is not None:
            future.set_exception(StoreError(self.fail))
        else:
            self.table = self.table.apply(changes)
            future.set_result(self.table)
        return future

    def check_table(self, table: QuotaTable) -> str | None:
        try:
            table.to_config()
        except QuotaConfigError as exc:
            return str(exc)
        return None


def ctx(principal: str = "admin") -> ConnectionContext:
    return ConnectionContext(1, "127.0.0.1:5000", "bootstrap", None, principal=principal)


def request(api_key: int, version: int, body: Any) -> tuple[RequestHeader, bytes]:
    payload = encode_request(RequestHeader(api_key, version, 42, "tester", 2 if version else 1, 0), body)
    return read_request_header(payload), payload


async def answer(stage: QuotaAdminStage, api_key: int, version: int, body: Any,
                 principal: str = "admin") -> Any:
    header, payload = request(api_key, version, body)
    entry = InFlight(header.correlation_id, header.api_key, header.api_version, header.client_id,
                     len(payload), 0)
    verdict = stage.on_request(ctx(principal), entry, header, payload)
    if isinstance(verdict, AnswerHere):
        response = verdict.response
    else:
        assert isinstance(verdict, AnswerLater)
        response = await verdict.pending
    assert int.from_bytes(response[:4], "big") == 42
    return decode_response_body(response, api_key, version)


async def describe(components: Sequence[tuple[str, int, str | None]], strict: bool = False, version: int = 1,
                   table: QuotaTable = TABLE) -> Any:
    cls = request_schema(ApiKey.DESCRIBE_CLIENT_QUOTAS, version)
    module = __import__(cls.__module__, fromlist=["ComponentData"])
    body = cls(components=tuple(module.ComponentData(entity_type=t, match_type=i8(m), match=n)
                                for t, m, n in components), strict=strict)
    stage = QuotaAdminStage(FakeBackend(table), ["admin"])
    return await answer(stage, ApiKey.DESCRIBE_CLIENT_QUOTAS, version, body)


def entities(response: Any) -> set[QuotaEntity]:
    assert int(response.error_code) == 0
    return {QuotaEntity.from_kafka((e.entity_type, e.entity_name) for e in entry.entity)
            for entry in response.entries}


# ------------------------------------------------------------------------------ describe

@pytest.mark.parametrize(("components", "strict", "expected"), [
    ([], False, set(TABLE)),                                           # everything
    ([], True, set()),                                                 # strict and no filter: nothing
    ([("user", 0, "alice")], False, {ALICE, ALICE_ANY, ALICE_APP}),    # exact, other types allowed
    ([("user", 0, "alice")], True, {ALICE}),                           # exact, only that type
    ([("user", 1, None)], True, {ANY_USER}),                           # the default entity
    ([("user", 2, None)], True, {ALICE, BOB, ANY_USER}),               # any name, default included
    ([("user", 2, None)], False, {ALICE, BOB, ANY_USER, ALICE_ANY, ALICE_APP}),
    ([("client-id", 1, None)], False, {ALICE_ANY, ANY_CLIENT}),
    ([("user", 0, "alice"), ("client-id", 2, None)], True, {ALICE_ANY, ALICE_APP}),
    ([("user", 0, "alice"), ("client-id", 1, None)], False, {ALICE_ANY}),
    ([("user", 0, "nobody")], False, set()),
    ([("user", 0, "")], False, set()),                                 # an empty name matches nothing
    ([("ip", 2, None)], False, set()),                                 # Sluice holds no ip quotas
])
async def test_describe_matches_like_the_broker(components: list[tuple[str, int, str | None]], strict: bool,
                                                expected: set[QuotaEntity]) -> None:
    response = await describe(components, strict)
    assert entities(response) == expected
    assert response.error_message == ""


async def test_describe_returns_every_key_including_sluices_own() -> None:
    response = await describe([("client-id", 1, None)], True)
    (entry,) = response.entries
    assert [(e.entity_type, e.entity_name) for e in entry.entity] == [("client-id", None)]
    assert {v.key: float(v.value) for v in entry.values} == {"producer_byte_rate": 7.0, SHADOW_KEY: 1.0}


TWICE = "Entity type user cannot appear more than once in the filter."


@pytest.mark.parametrize(("components", "code", "message"), [
    ([("", 0, "x")], 42, "Invalid empty entity type."),
    ([("user", 0, "a"), ("user", 0, "b")], 42, TWICE),
    ([("user", 0, "a"), ("user", 2, None)], 42, TWICE),
    ([("group", 0, "a")], 35, "Unsupported entity type group"),
    ([("user", 0, None)], 42, "Request specified MATCH_TYPE_EXACT, but set match string to null."),
    ([("user", 1, "x")], 42, "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
    ([("user", 2, "x")], 42, "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."),
    ([("user", 3, None)], 42, "Unknown match type 3"),
    ([("ip", 2, None), ("user", 2, None)], 42, "Invalid entity filter component combination. IP filter "
                                               "component should not be used with user or clientId filter "
                                               "component."),
])
@pytest.mark.parametrize("version", [0, 1])
async def test_describe_errors_are_kafkas(components: list[tuple[str, int, str | None]], code: int,
                                          message: str, version: int) -> None:
    response = await describe(components, version=version)
    assert (int(response.error_code), response.error_message, response.entries) == (code, message, None)


# ------------------------------------------------------------------------------ alter

Op = tuple[str, float | None]
Entries = Sequence[tuple[Sequence[tuple[str, str | None]], Sequence[Op]]]


def alter_body(entries: Entries, validate_only: bool = False, version: int = 1) -> Any:
    cls = request_schema(ApiKey.ALTER_CLIENT_QUOTAS, version)
    m = __import__(cls.__module__, fromlist=["EntryData"])
    return cls(entries=tuple(
        m.EntryData(entity=tuple(m.EntityData(entity_type=t, entity_name=n) for t, n in entity),
                    ops=tuple(m.OpData(key=k, value=f64(0.0 if v is None else v), remove=v is None)
                              for k, v in ops))
        for entity, ops in entries), validate_only=validate_only)


async def alter(backend: FakeBackend, entries: Entries, validate_only: bool = False, principal: str = "admin",
                version: int = 1) -> list[tuple[int, str | None]]:
    stage = QuotaAdminStage(backend, ["admin", "ANONYMOUS-not"])
    body = alter_body(entries, validate_only, version)
    response = await answer(stage, ApiKey.ALTER_CLIENT_QUOTAS, version, body, principal)
    return [(int(e.error_code), e.error_message) for e in response.entries]


OK = (0, None)


@pytest.mark.parametrize("version", [0, 1])
async def test_alter_sets_and_removes_keys(version: int) -> None:
    backend = FakeBackend(QuotaTable())
    got = await alter(backend, [
        ([("user", "alice")], [("producer_byte_rate", 1048576.0), ("request_rate", 5.0)]),
        ([("user", None), ("client-id", "app")], [(SHADOW_KEY, 1.0), ("consumer_byte_rate", 10.0)])],
        version=version)
    assert got == [OK, OK]
    assert backend.table == {
        ALICE: {"producer_byte_rate": 1048576.0, "request_rate": 5.0},
        QuotaEntity(user=DEFAULT, client_id="app"): {SHADOW_KEY: 1.0, "consumer_byte_rate": 10.0}}
    assert len(backend.submitted) == 1  # one batch
    assert await alter(backend, [([("user", "alice")], [("producer_byte_rate", None),
                                                        ("never_set", None)])]) == [OK]
    assert backend.table[ALICE] == {"request_rate": 5.0}


@pytest.mark.parametrize(("entity", "ops", "message"), [
    ([], [("producer_byte_rate", 1.0)], "Invalid empty client quota entity"),
    ([("user", "")], [("producer_byte_rate", 1.0)], "Empty user not supported"),
    ([("client-id", "")], [("producer_byte_rate", 1.0)], "Empty client-id not supported"),
    ([("group", "x")], [("producer_byte_rate", 1.0)], "Unhandled client quota entity type: group"),
    ([("user", "a"), ("user", "b")], [("producer_byte_rate", 1.0)],
     "Invalid client quota entity, duplicate entity entry user"),
    ([("user", "a"), ("ip", "1.2.3.4")], [("producer_byte_rate", 1.0)],
     "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId"),
    ([("ip", "1.2.3.4")], [("connection_creation_rate", 1.0)],
     "Sluice does not enforce ip (connection rate) quotas: set them on the brokers"),
    ([("user", "alice")], [("bogus_key", 1.0)], "Invalid configuration key bogus_key"),
    ([("user", "alice")], [("producer_byte_rate", -5.0)], "Quota producer_byte_rate must be greater than 0"),
    ([("user", "alice")], [("producer_byte_rate", 0.0)], "Quota producer_byte_rate must be greater than 0"),
    ([("user", "alice")], [("producer_byte_rate", 1.5)], "producer_byte_rate cannot be a fractional value."),
    ([("user", "alice")], [("request_percentage", -1.0)], "Quota request_percentage must be greater than 0"),
    ([("user", "alice")], [("controller_mutation_rate", 3.0)],
     "Sluice does not enforce controller_mutation_rate (the brokers' controller mutation quota): set it on "
     "the brokers"),
    ([("user", "alice")], [(SHADOW_KEY, 0.5)], "Quota sluice.shadow must be 1 (remove the key to turn shadow "
                                               "mode off)"),
    ([("user", "alice")], [("producer_byte_rate", 1.0), ("sluice.token_bucket", 2.0)],
     "Quota sluice.token_bucket must be 1 (token bucket) or 0 (windowed rate), got 2"),
    ([("user", "alice")], [("sluice.burst_ms", 12000.0)],   # the window is 11 x 1000 ms
     "user 'alice': sluice.burst_ms: 12000 is larger than the window allows (samples x size_ms = 11000)"),
    ([("user", "alice")], [("sluice.token_bucket", 0.0), ("sluice.burst_ms", 100.0)],
     "user 'alice': sluice.burst_ms: applies only to rate_model token_bucket, and this entry says windowed"),
    ([("user", "alice")], [("producer_byte_rate", 1.0), ("producer_byte_rate", 2.0)],
     "Duplicate quota key producer_byte_rate not updating quota for this entity "
     "ClientQuotaEntity(entries={user=alice})"),
    # the first bad op spoils the whole entity, including the good ops before it
    ([("user", "alice")], [("consumer_byte_rate", 1.0), ("producer_byte_rate", -1.0)],
     "Quota producer_byte_rate must be greater than 0"),
])
async def test_invalid_alterations_get_kafkas_errors_and_change_nothing(
        entity: list[tuple[str, str | None]], ops: list[Op], message: str) -> None:
    backend = FakeBackend()
    assert await alter(backend, [(entity, ops)]) == [(42, message)]
    assert backend.table == TABLE and backend.submitted == []


async def test_rate_model_keys_are_set_per_entity() -> None:
    backend = FakeBackend(QuotaTable())
    got = await alter(backend, [([("client-id", "app")], [("producer_byte_rate", 1024.0),
                                                           ("sluice.token_bucket", 1.0),
                                                           ("sluice.burst_ms", 2000.0)])])
    assert got == [OK]
    entry = backend.table.to_config().get(APP)
    assert entry is not None and entry.rate_model is not None
    assert (entry.rate_model.value, entry.burst_ms) == ("token_bucket", 2000)


async def test_a_bad_entry_does_not_stop_the_good_ones() -> None:
    backend = FakeBackend(QuotaTable())
    got = await alter(backend, [([("user", "carol")], [("producer_byte_rate", 1.0)]),
                                ([("user", "dave")], [("producer_byte_rate", -1.0)])])
    assert got == [OK, (42, "Quota producer_byte_rate must be greater than 0")]
    assert backend.table == {QuotaEntity(user="carol"): {"producer_byte_rate": 1.0}}


async def test_a_repeated_entity_changes_nothing() -> None:
    backend = FakeBackend(QuotaTable())
    got = await alter(backend, [([("user", "bob")], [("producer_byte_rate", 1.0)]),
                                ([("user", "bob")], [("consumer_byte_rate", 2.0)])])
    assert got == [(42, "Ignoring duplicate entity ClientQuotaEntity(entries={user=bob})")]  # one per entity
    assert backend.table == {}


async def test_validate_only_checks_and_writes_nothing() -> None:
    backend = FakeBackend(QuotaTable())
    got = await alter(backend, [([("user", "erin")], [("producer_byte_rate", 100.0)]),
                                ([("user", "")], [("producer_byte_rate", 100.0)])], validate_only=True)
    assert got == [OK, (42, "Empty user not supported")]
    assert backend.submitted == [] and backend.table == {}


@pytest.mark.parametrize("validate_only", [False, True])
async def test_only_admins_may_alter(validate_only: bool) -> None:
    backend = FakeBackend()
    got = await alter(backend, [([("user", "alice")], [("producer_byte_rate", 9.0)]),
                                ([("user", "")], [("producer_byte_rate", 9.0)])],
                      validate_only=validate_only, principal="alice")
    assert got == [(31, "Cluster authorization failed.")] * 2
    assert backend.table == TABLE and backend.submitted == []


async def test_a_store_failure_is_reported_for_the_entities_that_were_to_change() -> None:
    backend = FakeBackend(QuotaTable(), fail="disk full")
    got = await alter(backend, [([("user", "carol")], [("producer_byte_rate", 1.0)]),
                                ([("user", "")], [("producer_byte_rate", 1.0)])])
    assert got == [(-1, "Sluice could not write its quota store: disk full"),
                   (42, "Empty user not supported")]


async def test_an_undecodable_request_closes_the_connection() -> None:
    stage = QuotaAdminStage(FakeBackend(), ["admin"])
    header, payload = request(ApiKey.ALTER_CLIENT_QUOTAS, 1, alter_body([([("user", "a")], [("x", 1.0)])]))
    entry = InFlight(header.correlation_id, header.api_key, header.api_version, header.client_id,
                     len(payload), 0)
    verdict = stage.on_request(ctx(), entry, header, payload[:-3])
    assert isinstance(verdict, Close)  # a Close, with its reason logged, as a broker closes on it
    assert verdict.reason.startswith("cannot answer AlterClientQuotas v1: could not decode")


async def test_other_apis_pass_through() -> None:
    stage = QuotaAdminStage(FakeBackend(), ["admin"])
    header = RequestHeader(ApiKey.METADATA, 12, 1, "c", 2, 0)
    assert stage.on_request(ctx(), InFlight(1, ApiKey.METADATA, 12, "c", 0, 0), header, b"") is None


def test_entities_print_as_java_does() -> None:
    assert kafka_entity_string([("user", "alice"), ("client-id", None)]) == (
        "ClientQuotaEntity(entries={client-id=null, user=alice})")



def test_an_undecodable_describe_closes_the_connection_too() -> None:
    header = RequestHeader(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, 42, "tester", 2, 0)
    body = request_schema(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1)(components=(), strict=False)
    payload = encode_request(header, body)
    header = read_request_header(payload)
    entry = InFlight(header.correlation_id, header.api_key, header.api_version, header.client_id,
                     len(payload) - 1, 0)
    verdict = QuotaAdminStage(FakeBackend(), ["admin"]).on_request(ctx(), entry, header, payload[:-1])
    assert isinstance(verdict, Close)
    assert verdict.reason.startswith("cannot answer DescribeClientQuotas v1: ")

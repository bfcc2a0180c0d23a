"""`sluice quotas` against a fake server: what it sends, what it prints, how it fails."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from click.testing import CliRunner

from protocol.quota_client import AlterEntry, AlterOutcome, DescribedEntity, QuotaAdminError
from proxy.admin import cli as quotas_cli
from proxy.cli import main

DESCRIBED = [
    DescribedEntity((("user", "alice"),), {"producer_byte_rate": 2097152.0, "consumer_byte_rate": 1000.0}),
    DescribedEntity((("client-id", None),), {"producer_byte_rate": 1048576.0}),
    DescribedEntity((("client-id", "app"), ("user", "alice")),
                    {"producer_byte_rate": 500.0, "sluice.shadow": 1.0}),
    DescribedEntity((("user", "team-a"),), {"request_rate": 12.5}),
    DescribedEntity((("user", None),), {"request_rate": 100.0}),
    DescribedEntity((("ip", "10.0.0.1"),), {"connection_creation_rate": 3.0}),
]


class FakeClient:
    def __init__(self, outcomes: Sequence[AlterOutcome] | None = None,
                 error: QuotaAdminError | None = None) -> None:
        self.described: list[tuple[list[Any], bool]] = []
        self.altered: list[tuple[list[AlterEntry], bool]] = []
        self.outcomes = outcomes
        self.error = error

    def __enter__(self) -> FakeClient:
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def describe(self, components: Sequence[Any] = (), *, strict: bool = False) -> list[DescribedEntity]:
        self.described.append((list(components), strict))
        return list(DESCRIBED)

    def alter(self, entries: Sequence[AlterEntry], *, validate_only: bool = False) -> list[AlterOutcome]:
        self.altered.append((list(entries), validate_only))
        return list(self.outcomes or [AlterOutcome(e.entity, 0, None) for e in entries])


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient()
    monkeypatch.setattr(quotas_cli.Connection, "client", lambda self: client)
    return client


def run(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(main, ["quotas", *args, "--bootstrap-server", "localhost:9092"], input=input)


def test_list_everything_in_the_drafts_format(fake: FakeClient) -> None:
    result = run("list")
    assert result.exit_code == 0, result.output
    assert fake.described == [([], False)]
    assert result.output == (
        "{client-id=<default>}\nproducer_byte_rate=1048576\n\n"
        "{user=alice}\nconsumer_byte_rate=1000\nproducer_byte_rate=2097152\n\n"
        "{user=alice, client-id=app}\nproducer_byte_rate=500\nsluice.shadow=1\n\n"
        "{user=team-a}\nrequest_rate=12.5\n\n"
        "{user=<default>}\nrequest_rate=100\n\n"
        "{ip=10.0.0.1}\nconnection_creation_rate=3\n")


def test_list_filters_names_defaults_and_prefixes(fake: FakeClient) -> None:
    result = run("list", "--prefix", "user=team-", "--defaults", "client-id")
    assert fake.described == [([("client-id", 1, None), ("user", 2, None)], False)]
    assert result.exit_code == 0
    # the fake ignores the filter; the prefix is applied client-side and excludes the default user
    assert "{user=team-a}" in result.output and "{user=<default>}" not in result.output
    run("list", "--names", "user=alice,client-id=app")
    assert fake.described[-1] == ([("user", 0, "alice"), ("client-id", 0, "app")], False)


def test_list_json(fake: FakeClient) -> None:
    result = run("list", "--output", "json", "--prefix", "user=al")
    entries = json.loads(result.output)["entries"]
    assert entries == [{"entity": {"user": "alice"}, "values": {"consumer_byte_rate": 1000.0,
                                                                  "producer_byte_rate": 2097152.0}},
                       {"entity": {"client-id": "app", "user": "alice"},
                        "values": {"producer_byte_rate": 500.0, "sluice.shadow": 1.0}}]


def test_describe_shows_the_effective_quota_and_its_overrides(fake: FakeClient) -> None:
    result = run("describe", "--names", "user=alice,client-id=app", "--include-overrides")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "producer_byte_rate=500 {user=alice, client-id=app} (shadow)",
        "*producer_byte_rate=2097152 {user=alice}",
        "*producer_byte_rate=1048576 {client-id=<default>}",
        "consumer_byte_rate=1000 {user=alice}",
        "request_rate=100 {user=<default>}",
    ]
    plain = run("describe", "--names", "user=alice,client-id=app")
    assert not any(line.startswith("*") for line in plain.output.splitlines())


def test_describe_a_caller_without_user_is_anonymous(fake: FakeClient) -> None:
    result = run("describe", "--names", "client-id=app", "--output", "json")
    doc = json.loads(result.output)
    assert doc["caller"] == {"user": "ANONYMOUS", "client-id": "app"}
    assert [(q["key"], q["value"], q["entity"]) for q in doc["quotas"]] == [
        ("producer_byte_rate", 1048576.0, {"client-id": None}), ("request_rate", 100.0, {"user": None})]


def test_alter_sends_one_entity_and_is_quiet_on_success(fake: FakeClient) -> None:
    result = run("alter", "--names", "user=alice", "--defaults", "client-id",
                 "--add", "producer_byte_rate=1048576,request_rate=5", "--delete", "consumer_byte_rate")
    assert result.exit_code == 0 and result.output == ""
    assert fake.altered == [([AlterEntry((("user", "alice"), ("client-id", None)),
                                         [("producer_byte_rate", 1048576.0), ("request_rate", 5.0),
                                          ("consumer_byte_rate", None)])], False)]
    result = run("alter", "--names", "user=alice", "--add", "producer_byte_rate=1", "--validate-only")
    assert fake.altered[-1][1] is True and "nothing was changed" in result.output


def test_a_refused_alter_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient(outcomes=[AlterOutcome((("user", "alice"),), 42, "Invalid configuration key bogus")])
    monkeypatch.setattr(quotas_cli.Connection, "client", lambda self: client)
    result = run("alter", "--names", "user=alice", "--add", "bogus=1")
    assert result.exit_code == 1
    assert "Error: {user=alice}: Invalid configuration key bogus (nothing was changed) (INVALID_REQUEST)" \
        in result.output
    result = run("alter", "--names", "user=alice", "--add", "bogus=1", "--output", "json")
    assert json.loads(result.output)["error"]["code"] == 42


def test_connection_failures_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient(error=QuotaAdminError("cannot connect to any bootstrap server: x"))
    monkeypatch.setattr(quotas_cli.Connection, "client", lambda self: client)
    result = run("list")
    assert result.exit_code == 1 and "cannot connect" in result.output


@pytest.mark.parametrize("args", [
    ["alter", "--names", "user=alice"],                                     # nothing to do
    ["alter", "--add", "producer_byte_rate=1"],                             # no entity
    ["alter", "--names", "user=alice", "--add", "producer_byte_rate"],     # not KEY=VALUE
    ["alter", "--names", "user=alice", "--add", "producer_byte_rate=lots"],
    ["alter", "--names", "user=alice", "--add", "request_rate=1", "--delete", "request_rate"],
    ["alter", "--names", "group=x", "--add", "request_rate=1"],
    ["alter", "--names", "user=a", "--defaults", "user", "--add", "request_rate=1"],
    ["list", "--names", "user=a", "--prefix", "user=b"],
    ["describe", "--names", ""],
    ["list", "--sasl-mechanism", "PLAIN"],
])
def test_usage_errors_send_nothing(fake: FakeClient, args: list[str]) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert fake.described == [] and fake.altered == []


def test_sasl_password_is_asked_for_and_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    client = FakeClient()

    def make(self: quotas_cli.Connection) -> FakeClient:
        seen.append(self.sasl)
        return client

    monkeypatch.setattr(quotas_cli.Connection, "client", make)
    result = run("list", "--sasl-mechanism", "SCRAM-SHA-256", "--sasl-username", "admin", input="hunter2\n")
    assert result.exit_code == 0
    assert seen[0].username == "admin" and seen[0].password == "hunter2"
    assert "hunter2" not in result.output


@pytest.mark.parametrize(("name", "shown"), [(None, "<default>"), ("alice", "alice"), ("a,b", '"a,b"'),
                                             ("<default>", '"<default>"'), ("x y", '"x y"')])
def test_names_print_unambiguously(name: str | None, shown: str) -> None:
    assert quotas_cli.format_name(name) == shown


BEYOND = [
    DescribedEntity((("client-id-prefix", "etl-"),),
                    {"producer_byte_rate": 4096.0, "sluice.token_bucket": 1.0, "sluice.burst_ms": 2000.0}),
    DescribedEntity((("client-id", None),), {"producer_byte_rate": 1048576.0}),
    DescribedEntity((("topic", "orders"),), {"producer_byte_rate": 2048.0}),
    DescribedEntity((("topic-prefix", "ord"),), {"producer_byte_rate": 8192.0, "producer_record_rate": 50.0}),
]


def test_describe_shows_prefixes_rate_models_and_topic_quotas(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient()
    monkeypatch.setattr(quotas_cli.Connection, "client", lambda self: client)
    monkeypatch.setattr(FakeClient, "describe", lambda self, components=(), strict=False: list(BEYOND))
    result = run("describe", "--names", "client-id=etl-7,topic=orders", "--include-overrides")
    assert result.exit_code == 0, result.output
    beside = " (topic: applies beside the caller's own; the larger throttle wins)"
    assert result.output.splitlines() == [
        "producer_byte_rate=4096 {client-id-prefix=etl-} token_bucket(burst_ms=2000)",
        "*producer_byte_rate=1048576 {client-id=<default>}",
        "producer_byte_rate=2048 {topic=orders}" + beside,
        "*producer_byte_rate=8192 {topic-prefix=ord}",
        "producer_record_rate=50 {topic-prefix=ord}" + beside,
    ]
    doc = json.loads(run("describe", "--names", "client-id=etl-7", "--output", "json").output)
    assert doc["quotas"][0]["rate_model"] == "token_bucket" and doc["quotas"][0]["burst_ms"] == 2000


def test_alter_new_entity_types_and_rate_model(fake: FakeClient) -> None:
    result = run("alter", "--names", "user=alice,client-id-prefix=etl-",
                 "--add", "producer_record_rate=100,rate_model=token_bucket,sluice.each_client_id=1")
    assert result.exit_code == 0, result.output
    assert fake.altered[-1] == ([AlterEntry((("user", "alice"), ("client-id-prefix", "etl-")),
                                            [("producer_record_rate", 100.0), ("sluice.token_bucket", 1.0),
                                             ("sluice.each_client_id", 1.0)])], False)
    run("alter", "--names", "topic=orders", "--add", "rate_model=windowed")
    assert fake.altered[-1][0][0].ops == [("sluice.token_bucket", 0.0)]
    assert run("alter", "--defaults", "topic", "--add", "producer_byte_rate=1").exit_code == 2
    assert run("alter", "--names", "topic=t", "--add", "rate_model=leaky").exit_code == 2

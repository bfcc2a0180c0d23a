"""Managing quotas live, through real Sluice processes in front of a real broker (issue 6).

* kafka-configs (Java) and `sluice quotas` change a live producer's throttled rate through Sluice,
  on the same connection;
* quotas survive a restart (SQLite), and the YAML seed rules hold (the store wins; YAML edits apply);
* two instances on the Kafka-backed store converge on a change within a second;
* bad input gets the broker's own error code and message (asked of the broker too, with
  validate_only) and changes nothing;
* only admins may alter;
* the brokers' quotas can be imported when the store is seeded.

Every quota the broker itself gets is on a fresh name and removed again: the broker is shared.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from protocol.quota_client import MATCH_ANY, MATCH_EXACT, AlterEntry, QuotaAdminError, QuotaClient, Stream
from protocol.sasl_client import SaslCredentials
from tests.conftest import create_topic, unique_name
from tests.harness import load
from tests.harness.kafka import REPO, KafkaCluster, free_port
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools, sasl_properties
from tests.harness.wait import eventually

pytestmark = pytest.mark.integration

KiB = 1024
MiB = 1024 * 1024
WINDOW = {"samples": 11, "size_ms": 500}


def connect(host: str, port: int, timeout_s: float) -> Stream:
    return socket.create_connection((host, port), timeout=timeout_s)


def client(bootstrap: str, sasl: SaslCredentials | None = None) -> QuotaClient:
    return QuotaClient(bootstrap, connect, sasl=sasl, client_id="quota-admin-test")


def config_for(*, admins: Sequence[str] = ("ANONYMOUS",), entries: Sequence[dict[str, Any]] = (),
               store: dict[str, Any] | None = None, metrics: bool = False,
               instance: str = "sluice-test") -> dict[str, Any]:
    config: dict[str, Any] = {"admins": list(admins), "instance": instance,
                              "allow_anonymous_admins": "ANONYMOUS" in admins,  # a plaintext test listener
                              "quotas": {"window": WINDOW, "entries": list(entries)}}
    if store is not None:
        config["store"] = store
    if metrics:
        config["metrics"] = {"port": free_port()}
    return config


def start(kafka_bootstrap: str, workdir: Path, **config: Any) -> SluiceProcess:
    return SluiceProcess(kafka_bootstrap, workdir, config=config_for(**config)).start()


def cli(bootstrap: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`sluice quotas ...` as operators run it: a separate process."""
    return subprocess.run([sys.executable, "-m", "proxy", "quotas", *args, "--bootstrap-server", bootstrap],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, **(env or {})})


def listed(bootstrap: str, *args: str) -> dict[str, dict[str, float]]:
    """`sluice quotas list --output json` as {entity-json: values}."""
    done = cli(bootstrap, "list", "--output", "json", *args)
    assert done.returncode == 0, done.stderr + done.stdout
    return {json.dumps(e["entity"], sort_keys=True): e["values"] for e in json.loads(done.stdout)["entries"]}


def key(**entity: str | None) -> str:
    return json.dumps({k.replace("_", "-"): v for k, v in entity.items()}, sort_keys=True)


def metric(port: int, name: str, **labels: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


# ----------------------------------------------------------------------------- live changes

@pytest.mark.slow
def test_kafka_configs_and_the_cli_change_a_live_producers_rate(kafka: KafkaCluster, tmp_path: Path) -> None:
    cid = unique_name("live")
    sluice = start(kafka.bootstrap, tmp_path / "sluice", metrics=True,
                   entries=[{"client_id": "<default>", "producer_byte_rate": 256 * KiB}])
    port = sluice.config["metrics"]["port"]
    try:
        topic = create_topic(kafka.bootstrap, unique_name("live"))
        stats: list[dict[str, Any]] = []
        stop = threading.Event()
        timeline = load.Timeline()
        config = {"statistics.interval.ms": 1000, "stats_cb": lambda s: stats.append(json.loads(s))}
        worker = threading.Thread(target=lambda: load.confluent_flood(
            sluice.bootstrap, topic, 120, client_id=cid, stop=stop, batch_bytes=32 * KiB, config=config,
            timeline=timeline))
        worker.start()
        # On a loaded machine the first delivery (metadata, a leader for the new topic) can take seconds:
        # the periods are counted from it, not from the start.
        first = eventually(lambda: timeline.count, lambda n: n > 0, timeout_s=60)
        assert first > 0, "the producer delivered nothing through Sluice"
        first_s = min(t for t, _ in timeline.events) - timeline.started
        # two whole periods of the sawtooth (11 x 500 ms)
        load.load_until(timeline, timeline.started + first_s + 2 * 5.5)
        connections = metric(port, "sluice_open_connections", listener="broker 1")

        # kafka-configs raises it to 1 MiB/s for this client id. The change applies somewhere between
        # the tool's start and its exit (a JVM that can take seconds to exit under load): each rate
        # below is judged only over time that is wholly before the start or wholly after the exit.
        tools = KafkaTools(sluice.bootstrap, workdir=tmp_path)
        raising_at = time.monotonic()
        tools.configs("--alter", "--add-config", f"producer_byte_rate={MiB}", "--entity-type", "clients",
                      "--entity-name", cid).check()
        raised_at = time.monotonic()
        load.load_until(timeline, raised_at + 14)  # two periods of the new sawtooth after its catch-up

        # `sluice quotas alter` brings it down to 512 KiB/s: a (1 MiB - 512 KiB) / 512 KiB x 5.5 s = 5.5 s
        # mute first (the window still holds 1 MiB/s), then 512 KiB/s
        lowering_at = time.monotonic()
        done = cli(sluice.bootstrap, "alter", "--names", f"client-id={cid}",
                   "--add", f"producer_byte_rate={512 * KiB}")
        assert done.returncode == 0, done.stderr
        lowered_at = time.monotonic()
        load.load_until(timeline, lowered_at + 18)  # the mute, then two periods at 512 KiB/s
        connections_after = metric(port, "sluice_open_connections", listener="broker 1")
        stop.set()
        worker.join(60)
        described = tools.configs("--describe", "--entity-type", "clients", "--entity-name", cid).check()
        assert f"Quota configs for client-id '{cid}' are producer_byte_rate=524288.0" in described.stdout
        raising_s, raised_s = raising_at - timeline.started, raised_at - timeline.started
        lowering_s, lowered_s = lowering_at - timeline.started, lowered_at - timeline.started
        # rates over whole throttle cycles (burst start to burst start): over a span that ends just
        # after a burst, a plain rate counts one burst too many (up to ~1.4 x at 256 KiB/s here)
        before = timeline.cycle_rate(first_s, raising_s)
        raised = timeline.cycle_rate(raised_s + 1.5, lowering_s, or_plain=True)
        lowered = timeline.cycle_rate(lowered_s + 6, lowered_s + 18, or_plain=True)
        assert before <= 1.3 * 256 * KiB, before / KiB
        assert 2.2 * 256 * KiB <= raised <= 1.3 * MiB, raised / KiB
        assert 0.5 * 512 * KiB <= lowered <= 1.3 * 512 * KiB, lowered / KiB
        # the producer kept its connections throughout: nothing was reconnected
        brokers = stats[-1]["brokers"]
        assert all(b["connects"] <= 1 and b["disconnects"] == 0 for b in brokers.values() if b["nodeid"] >= 0)
        assert connections_after == connections == 1
        assert metric(port, "sluice_quota_limit", client_id=cid, kind="produce") == 512 * KiB
        assert sluice.wait_for_log("quotas altered by ANONYMOUS from 127.0.0.1"), sluice.log()[-2000:]
    finally:
        sluice.stop()


def test_kafka_configs_describe_and_delete_through_sluice(kafka: KafkaCluster, tmp_path: Path) -> None:
    user = unique_name("kc-user")
    sluice = start(kafka.bootstrap, tmp_path / "sluice")
    try:
        tools = KafkaTools(sluice.bootstrap, workdir=tmp_path)
        tools.configs("--alter", "--add-config", "producer_byte_rate=1048576,request_percentage=50",
                      "--entity-type", "users", "--entity-name", user).check()
        tools.configs("--alter", "--add-config", "consumer_byte_rate=2048", "--entity-type", "users",
                      "--entity-default", "--entity-type", "clients", "--entity-name", "app").check()
        out = tools.configs("--describe", "--entity-type", "users", "--entity-name", user).check().stdout
        assert (f"Quota configs for user-principal '{user}' are producer_byte_rate=1048576.0, "
                f"request_percentage=50.0") in out
        out = tools.configs("--describe", "--entity-type", "users", "--entity-default", "--entity-type",
                            "clients").check().stdout
        assert ("Quota configs for the default user-principal, client-id 'app' are consumer_byte_rate=2048.0"
                in out)
        # the broker itself was not touched
        with client(kafka.bootstrap) as broker:
            assert broker.describe([("user", MATCH_EXACT, user)]) == []
        # kafka-configs checks --delete-config keys exist with a describe first, as against a broker
        bad = tools.configs("--alter", "--delete-config", "consumer_byte_rate", "--entity-type", "users",
                            "--entity-name", user)
        assert bad.returncode != 0 and "Invalid config(s): consumer_byte_rate" in bad.stdout + bad.stderr
        tools.configs("--alter", "--delete-config", "request_percentage", "--entity-type", "users",
                      "--entity-name", user).check()
        assert listed(sluice.bootstrap, "--names", f"user={user}")[key(user=user)] == {
            "producer_byte_rate": 1048576.0}
    finally:
        sluice.stop()


# ----------------------------------------------------------------------------- durability

def test_quotas_survive_a_restart_and_the_yaml_seed_rules_hold(kafka: KafkaCluster, tmp_path: Path) -> None:
    workdir = tmp_path / "sluice"
    seed = [{"client_id": "<default>", "producer_byte_rate": 1000 * KiB}]
    sluice = start(kafka.bootstrap, workdir, entries=seed)
    try:
        assert listed(sluice.bootstrap) == {key(client_id=None): {"producer_byte_rate": 1000.0 * KiB}}
        for args in (["--names", "user=alice", "--add", "request_rate=25,sluice.shadow=1"],
                     ["--defaults", "client-id", "--add", "producer_byte_rate=2048000"]):
            done = cli(sluice.bootstrap, "alter", *args)
            assert done.returncode == 0, done.stderr
    finally:
        sluice.stop()
    assert (workdir / "sluice-quotas.db").is_file()

    sluice = start(kafka.bootstrap, workdir, entries=seed)  # same YAML: the store wins
    try:
        expected = {key(client_id=None): {"producer_byte_rate": 2048000.0},
                    key(user="alice"): {"request_rate": 25.0, "sluice.shadow": 1.0}}
        assert listed(sluice.bootstrap) == expected
        assert sluice.wait_for_log("the store's quotas stand"), sluice.log()[-2000:]
        done = cli(sluice.bootstrap, "describe", "--names", "user=alice,client-id=x")
        assert done.stdout.splitlines() == ["producer_byte_rate=2048000 {client-id=<default>}",
                                            "request_rate=25 {user=alice} (shadow)"]
        # an edit of the YAML is a change, applied on SIGHUP; the admin's other entry stays
        config = yaml.safe_load(sluice.config_path.read_text())
        config["quotas"]["entries"] = [{"client_id": "<default>", "producer_byte_rate": 3000 * KiB}]
        sluice.config_path.write_text(yaml.safe_dump(config))
        sluice.signal(signal.SIGHUP)
        expected[key(client_id=None)] = {"producer_byte_rate": 3000.0 * KiB}
        assert eventually(lambda: listed(sluice.bootstrap), lambda got: got == expected) == expected
    finally:
        sluice.stop()

    # --reseed: the YAML replaces the store
    reseeded = SluiceProcess(kafka.bootstrap, workdir, config=config_for(entries=seed),
                             args=["--reseed"]).start()
    try:
        assert listed(reseeded.bootstrap) == {key(client_id=None): {"producer_byte_rate": 1000.0 * KiB}}
    finally:
        reseeded.stop()


@pytest.mark.slow
def test_two_instances_on_the_kafka_store_converge_within_a_second(kafka: KafkaCluster,
                                                                  tmp_path: Path) -> None:
    store = {"type": "kafka", "topic": unique_name("sluice-quotas")}
    user = unique_name("conv")
    first = start(kafka.bootstrap, tmp_path / "a", store=store, instance="a",
                  entries=[{"user": "<default>", "request_rate": 500}])
    second = start(kafka.bootstrap, tmp_path / "b", store=store, instance="b")
    third: SluiceProcess | None = None
    try:
        assert listed(second.bootstrap) == {key(user=None): {"request_rate": 500.0}}  # seeded by the first
        with client(first.bootstrap) as a, client(second.bootstrap) as b:
            for writer, reader, value in ((a, b, 1000.0), (b, a, 2000.0), (a, b, None)):
                ops: list[tuple[str, float | None]] = [("producer_byte_rate", value)]
                assert [o.error_code for o in writer.alter([AlterEntry((("user", user),), ops)])] == [0]
                written = time.monotonic()
                want = [] if value is None else [{"producer_byte_rate": value}]

                def seen(r: QuotaClient = reader) -> list[dict[str, float]]:
                    return [dict(e.values) for e in r.describe([("user", MATCH_EXACT, user)], strict=True)]

                assert eventually(seen, lambda got, w=want: got == w, timeout_s=5) == want
                assert time.monotonic() - written < 1.0
        # a new instance reads the topic from the beginning
        third = start(kafka.bootstrap, tmp_path / "c", store=store, instance="c")
        assert listed(third.bootstrap) == {key(user=None): {"request_rate": 500.0}}
    finally:
        for proc in (first, second, third):
            if proc is not None:
                proc.stop()


# ----------------------------------------------------------------------------- bad input

BAD_ALTERATIONS = [
    ("unknown key", (("user", "x-bad"),), [("bogus_key", 1.0)]),
    ("negative value", (("user", "x-bad"),), [("producer_byte_rate", -1048576.0)]),
    ("zero", (("client-id", "x-bad"),), [("request_percentage", 0.0)]),
    ("fractional byte rate", (("user", "x-bad"),), [("consumer_byte_rate", 10.5)]),
    ("unknown entity type", (("group", "x-bad"),), [("producer_byte_rate", 1.0)]),
    ("empty name", (("user", ""),), [("producer_byte_rate", 1.0)]),
    ("empty entity", (), [("producer_byte_rate", 1.0)]),
    ("ip with user", (("user", "x-bad"), ("ip", "127.0.0.1")), [("producer_byte_rate", 1.0)]),
]


def test_bad_input_gets_the_brokers_error_and_changes_nothing(kafka: KafkaCluster, tmp_path: Path) -> None:
    sluice = start(kafka.bootstrap, tmp_path / "sluice",
                   entries=[{"user": "x-bad", "producer_byte_rate": 4096}])
    try:
        before = listed(sluice.bootstrap)
        with client(kafka.bootstrap) as broker, client(sluice.bootstrap) as ours:
            for what, entity, ops in BAD_ALTERATIONS:
                entry = [AlterEntry(entity, ops)]
                (theirs,) = broker.alter(entry, validate_only=True)  # the broker's answer; it writes nothing
                (got,) = ours.alter(entry)
                assert (got.error_code, got.error_message) == (theirs.error_code, theirs.error_message), what
                assert got.error_code == 42, what
            # a good and a bad entry in one request: the good one applies, as on a broker
            good, bad = ours.alter([AlterEntry((("user", "x-good"),), [("producer_byte_rate", 8192.0)]),
                                    AlterEntry((("user", "x-bad"),), [("producer_byte_rate", -1.0)])])
            assert (good.error_code, bad.error_code) == (0, 42)
            bad_filters = ([("group", MATCH_ANY, None)], [("user", MATCH_EXACT, None)],
                           [("", MATCH_ANY, None)])
            for filters in bad_filters:
                with pytest.raises(QuotaAdminError) as theirs_error:
                    broker.describe(filters)
                with pytest.raises(QuotaAdminError) as our_error:
                    ours.describe(filters)
                assert our_error.value.error_code == theirs_error.value.error_code in (35, 42)
                assert str(our_error.value) == str(theirs_error.value)
        assert listed(sluice.bootstrap) == {**before, key(user="x-good"): {"producer_byte_rate": 8192.0}}

        # the same through the tools: an error that says what was wrong, nothing changed
        done = cli(sluice.bootstrap, "alter", "--names", "user=x-bad", "--add", "producer_byte_rate=-5")
        assert done.returncode == 1
        assert "Quota producer_byte_rate must be greater than 0 (nothing was changed) (INVALID_REQUEST)" \
            in done.stderr
        done = cli(sluice.bootstrap, "alter", "--names", "user=x-bad", "--add", "bogus=1", "--output", "json")
        assert json.loads(done.stdout)["error"] == {
            "message": "{user=x-bad}: Invalid configuration key bogus (nothing was changed)", "code": 42,
            "name": "INVALID_REQUEST"}
        tools = KafkaTools(sluice.bootstrap, workdir=tmp_path)
        negative = tools.configs("--alter", "--add-config", "producer_byte_rate=-5", "--entity-type", "users",
                                 "--entity-name", "x-bad")
        assert negative.returncode != 0
        assert "InvalidRequestException: Quota producer_byte_rate must be greater than 0" in (
            negative.stdout + negative.stderr)
        assert listed(sluice.bootstrap) == {**before, key(user="x-good"): {"producer_byte_rate": 8192.0}}
    finally:
        sluice.stop()


# ----------------------------------------------------------------------------- who may alter

def test_a_principal_that_is_not_an_admin_cannot_alter(kafka: KafkaCluster, tmp_path: Path) -> None:
    sluice = start(kafka.bootstrap, tmp_path / "sluice", admins=["admin"],
                   entries=[{"client_id": "<default>", "producer_byte_rate": 4096}])
    try:
        before = listed(sluice.bootstrap)  # describing is open to everyone
        with client(sluice.bootstrap) as anonymous:
            for validate_only in (False, True):
                entry = AlterEntry((("user", "mallory"),), [("producer_byte_rate", 1e9)])
                (outcome,) = anonymous.alter([entry], validate_only=validate_only)
                assert (outcome.error_code, outcome.error_message) == (31, "Cluster authorization failed.")
        done = cli(sluice.bootstrap, "alter", "--defaults", "client-id", "--delete", "producer_byte_rate")
        assert done.returncode == 1 and "(CLUSTER_AUTHORIZATION_FAILED)" in done.stderr
        refused = KafkaTools(sluice.bootstrap, workdir=tmp_path).configs(
            "--alter", "--add-config", "producer_byte_rate=1", "--entity-type", "clients", "--entity-default")
        assert refused.returncode != 0 and "ClusterAuthorizationException" in refused.stdout + refused.stderr
        assert listed(sluice.bootstrap) == before
        assert sluice.wait_for_log("refused: not one of the admins"), sluice.log()[-2000:]
    finally:
        sluice.stop()


def test_over_sasl_only_the_admin_principal_may_alter(kafka: KafkaCluster, tmp_path: Path) -> None:
    """Principals come from the SASL exchange Sluice follows (issue 5): `admin` may, `alice` may not."""
    sluice = SluiceProcess(kafka.sasl_bootstrap, tmp_path / "sluice",
                           config={"admins": ["admin"], "quotas": {"window": WINDOW}}).start()
    user = unique_name("sasl")
    try:
        as_alice = {"SLUICE_SASL_PASSWORD": "alice-secret"}
        done = cli(sluice.bootstrap, "alter", "--names", f"user={user}", "--add", "producer_byte_rate=1",
                   "--sasl-mechanism", "SCRAM-SHA-256", "--sasl-username", "alice", env=as_alice)
        assert done.returncode == 1 and "(CLUSTER_AUTHORIZATION_FAILED)" in done.stderr, done.stderr
        (tmp_path / "alice").mkdir()
        (tmp_path / "admin").mkdir()
        alice_tools = KafkaTools(sluice.bootstrap, sasl_properties("alice", "alice-secret"),
                                 workdir=tmp_path / "alice")
        refused = alice_tools.configs("--alter", "--add-config", "producer_byte_rate=1",
                                      "--entity-type", "users", "--entity-name", user)
        assert refused.returncode != 0 and "ClusterAuthorizationException" in refused.stdout + refused.stderr
        assert listed_as(sluice.bootstrap, as_alice) == {}  # nothing changed; describing is open

        done = cli(sluice.bootstrap, "alter", "--names", f"user={user}", "--add", "producer_byte_rate=2048",
                   "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "admin",
                   env={"SLUICE_SASL_PASSWORD": "admin-secret"})
        assert done.returncode == 0, done.stderr
        admin_tools = KafkaTools(sluice.bootstrap, sasl_properties("admin", "admin-secret", "PLAIN"),
                                 workdir=tmp_path / "admin")
        admin_tools.configs("--alter", "--add-config", "consumer_byte_rate=4096", "--entity-type", "users",
                            "--entity-name", user).check()
        assert listed_as(sluice.bootstrap, as_alice) == {
            key(user=user): {"producer_byte_rate": 2048.0, "consumer_byte_rate": 4096.0}}
        assert sluice.wait_for_log("quotas altered by admin from 127.0.0.1"), sluice.log()[-2000:]
        assert sluice.wait_for_log("refused: not one of the admins"), sluice.log()[-2000:]
        assert "alice-secret" not in sluice.log() and "admin-secret" not in sluice.log()
        wrong = cli(sluice.bootstrap, "list", "--sasl-mechanism", "PLAIN", "--sasl-username", "alice",
                    env={"SLUICE_SASL_PASSWORD": "wrong"})
        assert wrong.returncode == 1 and "SASL authentication failed" in wrong.stderr
    finally:
        sluice.stop()


def listed_as(bootstrap: str, env: dict[str, str]) -> dict[str, dict[str, float]]:
    done = cli(bootstrap, "list", "--output", "json", "--sasl-mechanism", "SCRAM-SHA-256", "--sasl-username",
               "alice", env=env)
    assert done.returncode == 0, done.stderr
    return {json.dumps(e["entity"], sort_keys=True): e["values"] for e in json.loads(done.stdout)["entries"]}


# ----------------------------------------------------------------------------- import

@pytest.fixture
def broker_quota(kafka: KafkaCluster) -> Iterator[str]:
    """A quota set on the broker itself, removed afterwards."""
    user = unique_name("imported")
    entity = (("user", user),)
    with client(kafka.bootstrap) as broker:
        assert broker.alter([AlterEntry(entity, [("producer_byte_rate", 123456.0),
                                                 ("controller_mutation_rate", 5.0)])])[0].ok
        eventually(lambda: broker.describe([("user", MATCH_EXACT, user)]), bool)
    try:
        yield user
    finally:
        with client(kafka.bootstrap) as broker:
            broker.alter([AlterEntry(entity, [("producer_byte_rate", None),
                                              ("controller_mutation_rate", None)])])


def test_the_brokers_quotas_are_imported_when_the_store_is_seeded(kafka: KafkaCluster, tmp_path: Path,
                                                                 broker_quota: str) -> None:
    sluice = start(kafka.bootstrap, tmp_path / "sluice", store={"import_from_brokers": True},
                   entries=[{"user": broker_quota, "consumer_byte_rate": 2048}])
    try:
        got = listed(sluice.bootstrap, "--names", f"user={broker_quota}")
        # the broker's byte rate and the YAML's key, overlaid; controller_mutation_rate is the broker's job
        assert got == {key(user=broker_quota): {"producer_byte_rate": 123456.0, "consumer_byte_rate": 2048.0}}
        assert "imported" in sluice.log() and "controller_mutation_rate" in sluice.log()
    finally:
        sluice.stop()

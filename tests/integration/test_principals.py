"""Who is calling, proved against a real broker through a real Sluice process (issue 5).

* SASL passthrough: every mechanism and client gets the principal the broker authenticated, per-user
  quotas hold the right user and only that user, a wrong password gets the broker's own error and no
  principal, raw tokens after a SaslHandshake v0 work, KIP-368 re-authentication, OAUTHBEARER with a
  configured claim; a SASL exchange the broker refuses never names anyone.
* TLS: an mTLS client gets its certificate subject mapped by Kafka's rules; SASL over TLS; upstream
  TLS independent of client TLS.
* PROXY protocol v1/v2: a client behind a load balancer is attributed to its real address.
* Secrets: known passwords and tokens never reach Sluice's log, its access log, or what clients print.

The session broker (`kafka`) has PLAIN and SCRAM users created at format time; `auth_kafka` is a
second one with OAUTHBEARER, `connections.max.reauth.ms` (KIP-368) and an SSL listener whose
certificates come from their own CA.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as HandshakeV0
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest as HandshakeV1

from protocol.sasl_client import PlainMechanism, SaslMechanism, ScramMechanism
from tests.conftest import create_topic, unique_name
from tests.harness import clients, load
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.proxyhop import proxy_hop
from tests.harness.rawclient import RawKafkaSocket, metadata_request
from tests.harness.sluice import SluiceProcess
from tests.harness.tls import TestCA
from tests.harness.wait import wait_until

pytestmark = pytest.mark.integration

KiB = 1024
MiB = 1024 * 1024
WINDOW = {"samples": 11, "size_ms": 500}
PERIOD_S = 11 * 0.5
RUN_S = 3 * PERIOD_S
PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
WRONG = "Wr0ng-Secret-4711"
EVERY_USER = {"user": "<default>", "request_rate": 1_000_000}   # a sensor (and metrics) per user


# ----------------------------------------------------------------------------- helpers

class Sluice:
    """A Sluice process with metrics and an access log, and ways to read both."""

    def __init__(self, upstream_bootstrap: str, workdir: Path, **config: Any) -> None:
        self.metrics_port = free_port()
        self.access_dir = workdir / "access"
        self.process = SluiceProcess(upstream_bootstrap, workdir / "sluice", config={
            "metrics": {"port": self.metrics_port},
            "access_log": {"dir": str(self.access_dir), "format": "json"},  # read as text below
            **config})

    def __enter__(self) -> Sluice:
        self.process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.stop()

    @property
    def bootstrap(self) -> str:
        return self.process.bootstrap

    def log(self) -> str:
        return self.process.log()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def metric(self, name: str, **labels: str) -> float | None:
        for line in self.metrics().splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None

    def records(self) -> list[dict[str, Any]]:
        """Access-log records (stop the process first: the writer flushes on SIGTERM)."""
        out = []
        for path in sorted(self.access_dir.rglob("*.jsonl")):
            out += [json.loads(line) for line in path.read_text().splitlines() if line]
        return out

    def access_log_text(self) -> str:
        files = sorted(p for p in self.access_dir.rglob("*") if p.is_file())
        return "".join(p.read_text(errors="replace") for p in files)


def sasl(mechanism: str, user: str, password: str | None = None, protocol: str = "SASL_PLAINTEXT"
         ) -> dict[str, str]:
    return {"security.protocol": protocol, "sasl.mechanisms": mechanism, "sasl.username": user,
            "sasl.password": PASSWORDS[user] if password is None else password}


def principals_by_client(records: list[dict[str, Any]], api: str = "Produce") -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in records:
        if r["api_name"] == api:
            out.setdefault(r["client_id"], set()).add(r["principal"])
    return out


def produce(bootstrap: str, topic: str, n: int, config: dict[str, Any]) -> None:
    clients.confluent_produce(bootstrap, topic, clients.values(n, config.get("client.id", "m")), config)


def produce_errors(bootstrap: str, topic: str, config: dict[str, Any], timeout_s: float = 8.0) -> list[str]:
    """What a librdkafka producer reports when it cannot get in (delivery and error callbacks)."""
    from confluent_kafka import Producer

    errors: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": int(timeout_s * 1000),
                         "error_cb": lambda err: errors.append(str(err)), **config})
    producer.produce(topic, b"never", on_delivery=lambda err, msg: errors.append(str(err)) if err else None)
    producer.flush(timeout_s + 5)
    return errors


def raw_authenticate(sock: RawKafkaSocket, mechanism: SaslMechanism, name: str) -> tuple[int, str | None]:
    """SaslHandshake v1 + SaslAuthenticate v2 rounds; (error code, message) of the last answer."""
    sock.send(HandshakeV1(mechanism=name))
    _, handshake = sock.recv(17, 1)
    assert handshake.error_code == ErrorCode.none, handshake
    message: bytes | None = mechanism.first()
    while message is not None:
        sock.send(SaslAuthenticateRequest(auth_bytes=message))
        _, answer = sock.recv(36, 2)
        if answer.error_code != ErrorCode.none:
            return answer.error_code.value, answer.error_message
        message = mechanism.next(answer.auth_bytes) if not mechanism.done else None
    return 0, None


def raw_v0_authenticate(sock: RawKafkaSocket, mechanism: SaslMechanism, name: str) -> bool:
    """SaslHandshake v0, then raw size-prefixed tokens; False if the broker closed the connection."""
    sock.send(HandshakeV0(mechanism=name))
    _, handshake = sock.recv(17, 0)
    assert handshake.error_code == ErrorCode.none, handshake
    message: bytes | None = mechanism.first()
    try:
        while message is not None:
            sock.send_raw(struct.pack(">i", len(message)) + message)
            reply = sock.recv_frame()
            message = mechanism.next(reply)
    except (ConnectionError, OSError):
        return False
    return mechanism.done


def metadata_ports(sock: RawKafkaSocket) -> list[int]:
    sock.send(metadata_request(None, 12))
    _, metadata = sock.recv(3, 12)
    return [b.port for b in metadata.brokers]


def sluice_port(bootstrap: str) -> int:
    return int(bootstrap.rsplit(":", 1)[1])


# ----------------------------------------------------------------------------- SASL: quotas per user

@pytest.mark.slow
def test_per_user_quota_holds_alice_and_only_alice(kafka: KafkaCluster, tmp_path: Path) -> None:
    """alice and bob run the same flood with the same client id; the quota names alice only."""
    quota = 256 * KiB
    with Sluice(kafka.sasl_bootstrap, tmp_path, quotas={"window": WINDOW, "entries": [
            {"user": "alice", "producer_byte_rate": quota}]}) as sluice:
        topic = create_topic(kafka.bootstrap, unique_name("peruser"))
        results: dict[str, load.Timeline] = {}

        def flood(user: str, mechanism: str) -> None:
            results[user] = load.confluent_flood(sluice.bootstrap, topic, RUN_S, client_id="same-app",
                                                 batch_bytes=32 * KiB, config=sasl(mechanism, user))

        threads = [threading.Thread(target=flood, args=("alice", "SCRAM-SHA-256")),
                   threading.Thread(target=flood, args=("bob", "PLAIN"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RUN_S + 60)
        alice, bob = results["alice"].rate(0, RUN_S), results["bob"].rate(0, RUN_S)
        assert 0.85 * quota <= alice <= 1.15 * quota, f"alice at {alice / quota:.2f} x quota"
        assert bob > 4 * quota, f"bob at {bob / quota:.2f} x alice's quota: he has none"
        assert (sluice.metric("sluice_quota_throttled_requests_total", user="alice", kind="produce") or 0) > 0
        assert sluice.metric("sluice_quota_limit", user="alice", kind="produce") == quota
        # bob's traffic is measured under his own name (Kafka's metric tags), and nothing bounds it
        assert (sluice.metric("sluice_quota_produce_byte_rate", user="bob") or 0) > 4 * quota
        assert sluice.metric("sluice_quota_limit", user="bob", kind="produce") is None
        assert sluice.metric("sluice_quota_throttled_requests_total", user="bob", kind="produce") is None
    by_client = principals_by_client(sluice.records())
    assert by_client["same-app"] == {"alice", "bob"}         # never ANONYMOUS once authenticated
    throttled = [r for r in sluice.records() if r["api_name"] == "Produce" and r["throttle_time_ms"] > 0]
    assert throttled and {r["principal"] for r in throttled} == {"alice"}


# ----------------------------------------------------------------------------- SASL: every mechanism

def test_every_mechanism_and_client_gets_the_principal_the_broker_authenticated(
        kafka: KafkaCluster, tmp_path: Path) -> None:
    with Sluice(kafka.sasl_bootstrap, tmp_path, quotas={"entries": [EVERY_USER]}) as sluice:
        topic = create_topic(kafka.bootstrap, unique_name("mech"))
        produce(sluice.bootstrap, topic, 20, {"client.id": "ck-plain", **sasl("PLAIN", "alice")})
        produce(sluice.bootstrap, topic, 20, {"client.id": "ck-scram512", **sasl("SCRAM-SHA-512", "bob")})
        produce(sluice.bootstrap, topic, 20, {"client.id": "ck-scram256", **sasl("SCRAM-SHA-256", "admin")})
        clients.kafka_python_produce(sluice.bootstrap, topic, clients.values(20), client_id="kp-scram256",
                                     security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                                     sasl_plain_username="alice", sasl_plain_password="alice-secret")
        got = clients.confluent_consume(sluice.bootstrap, topic, 80, config={
            "client.id": "ck-consumer", **sasl("SCRAM-SHA-512", "bob")})
        assert len(got) == 80
        for user in ("alice", "bob", "admin"):
            assert sluice.metric("sluice_quota_request_rate", user=user, client_id="") is not None
        assert sluice.metric("sluice_sasl_authentications_total", mechanism="SCRAM-SHA-512", result="success")
        log = sluice.log()
    by_client = principals_by_client(sluice.records())
    assert by_client == {"ck-plain": {"alice"}, "ck-scram512": {"bob"}, "ck-scram256": {"admin"},
                         "kp-scram256": {"alice"}}
    assert principals_by_client(sluice.records(), "Fetch") == {"ck-consumer": {"bob"}}
    assert "authenticated as 'alice' (SASL PLAIN)" in log
    assert "authenticated as 'admin' (SASL SCRAM-SHA-256)" in log


def test_raw_tokens_after_a_v0_handshake(kafka: KafkaCluster, tmp_path: Path) -> None:
    """No current client sends SaslHandshake v0 on its own: a raw socket does, through Sluice to
    the real broker, for PLAIN and SCRAM; Kafka requests then flow as usual (Metadata rewritten)."""
    with Sluice(kafka.sasl_bootstrap, tmp_path) as sluice:
        for mechanism, name, client_id in [(PlainMechanism("alice", "alice-secret"), "PLAIN", "raw-plain"),
                                           (ScramMechanism("SCRAM-SHA-256", "bob", "bob-secret"),
                                            "SCRAM-SHA-256", "raw-scram")]:
            with RawKafkaSocket(sluice.bootstrap) as sock:
                assert raw_v0_authenticate(sock, mechanism, name)
                sock.send(metadata_request(None, 12), client_id=client_id)
                _, metadata = sock.recv(3, 12)
                assert {b.host for b in metadata.brokers} == {"127.0.0.1"}
                assert [b.port for b in metadata.brokers] != [int(kafka.sasl_bootstrap.rsplit(":", 1)[1])]
        with RawKafkaSocket(sluice.bootstrap) as sock:                       # refused: the broker hangs up
            assert not raw_v0_authenticate(sock, PlainMechanism("alice", WRONG), "PLAIN")
            assert sock.at_eof(5)
    records = sluice.records()
    assert principals_by_client(records, "Metadata") == {"raw-plain": {"alice"}, "raw-scram": {"bob"}}
    handshakes = [r for r in records if r["api_name"] == "SaslHandshake"]
    assert len(handshakes) == 3 and {r["api_version"] for r in handshakes} == {0}


def test_wrong_password_gets_the_brokers_error_and_no_principal(kafka: KafkaCluster, tmp_path: Path) -> None:
    with Sluice(kafka.sasl_bootstrap, tmp_path, quotas={"entries": [EVERY_USER]}) as sluice:
        answers = []
        for address in (kafka.sasl_bootstrap, sluice.bootstrap):           # directly, then through Sluice
            with RawKafkaSocket(address) as sock:
                answers.append(raw_authenticate(sock, PlainMechanism("alice", WRONG), "PLAIN"))
        assert answers[0] == answers[1] == (ErrorCode.sasl_authentication_failed.value,
                                            "Authentication failed: Invalid username or password")
        for mechanism in ("PLAIN", "SCRAM-SHA-256"):
            errors = produce_errors(sluice.bootstrap, "any-topic", {"client.id": f"wrong-{mechanism}",
                                                                    **sasl(mechanism, "alice", WRONG)})
            assert any("Authentication failed" in e for e in errors), errors
        failures = sluice.metric("sluice_sasl_authentications_total", mechanism="PLAIN", result="failure")
        assert (failures or 0) >= 2
        assert sluice.metric("sluice_sasl_authentications_total", mechanism="PLAIN", result="success") is None
        assert 'user="alice"' not in sluice.metrics()
    records = sluice.records()
    failed = [r for r in records if r["api_name"] == "SaslAuthenticate" and 58 in r["error_codes"]]
    assert len(failed) >= 3 and {r["principal"] for r in failed} == {"ANONYMOUS"}
    assert {r["principal"] for r in records} == {"ANONYMOUS"}
    assert "SASL PLAIN authentication failed (broker error 58); principal stays 'ANONYMOUS'" in sluice.log()


def test_sasl_to_a_broker_listener_without_sasl_names_nobody(kafka: KafkaCluster, tmp_path: Path) -> None:
    """A client cannot choose its principal: claiming alice to a listener that checks nothing, or
    calling itself alice in its client id, leaves it ANONYMOUS."""
    with Sluice(kafka.bootstrap, tmp_path, quotas={"entries": [EVERY_USER]}) as sluice:
        with RawKafkaSocket(sluice.bootstrap) as sock:
            sock.send(HandshakeV1(mechanism="PLAIN"), client_id="alice")
            _, handshake = sock.recv(17, 1)
            assert handshake.error_code != ErrorCode.none                  # the PLAINTEXT listener says no
            sock.send(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-secret"), client_id="alice")
            _, answer = sock.recv(36, 2)
            assert answer.error_code != ErrorCode.none
            assert metadata_ports(sock)
        assert 'user="alice"' not in sluice.metrics()
    assert {r["principal"] for r in sluice.records()} == {"ANONYMOUS"}


# ----------------------------------------------------------------------------- the second broker

@pytest.fixture(scope="module")
def auth_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaCluster, TestCA]]:
    """OAUTHBEARER (unsecured JWTs, principal claim `user_name`), KIP-368 re-authentication every 4 s,
    and an SSL listener requiring client certificates from its own CA."""
    root = tmp_path_factory.mktemp("auth-kafka")
    ca = TestCA(root / "broker-ca", name="Broker CA")
    cluster = KafkaCluster(root, 1, sasl=True, tls=ca, broker_properties={
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
        "listener.name.client.oauthbearer.sasl.jaas.config":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'unsecuredLoginStringClaim_sub="broker" unsecuredValidatorPrincipalClaimName="user_name";',
        "connections.max.reauth.ms": "4000",
    })
    cluster.start()
    try:
        yield cluster, ca
    finally:
        cluster.stop()


def unsecured_jwt(claims: dict[str, Any]) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")
    return f"{part({'alg': 'none'})}.{part(claims)}."


@pytest.mark.slow
def test_reauthentication_keeps_working_and_cannot_switch_users(auth_kafka: tuple[KafkaCluster, TestCA],
                                                                tmp_path: Path) -> None:
    cluster, _ = auth_kafka
    with Sluice(cluster.sasl_bootstrap, tmp_path) as sluice:
        topic = create_topic(cluster.bootstrap, unique_name("reauth"))
        timeline = load.confluent_flood(sluice.bootstrap, topic, 10, client_id="reauth-app",
                                        rate_bytes_per_s=50 * KiB, config=sasl("SCRAM-SHA-512", "alice"))
        assert timeline.rate(0, 10) >= 0.9 * 50 * KiB          # no pause, no lost connection
        log = sluice.log()
        assert "re-authenticated as 'alice' (SASL SCRAM-SHA-512)" in log
        assert not re.search(r"upstream [a-z]+( \d+)? closed| lost: ", log)   # the broker kept them all
        with RawKafkaSocket(sluice.bootstrap) as sock:          # KIP-368 by hand: the same user, then bob
            assert raw_authenticate(sock, PlainMechanism("alice", "alice-secret"), "PLAIN") == (0, None)
            assert raw_authenticate(sock, PlainMechanism("alice", "alice-secret"), "PLAIN") == (0, None)
            sock.send(metadata_request(None, 12), client_id="reauth-raw")
            sock.recv(3, 12)
            time.sleep(1.2)                                     # Kafka: one re-authentication a second
            code, _message = raw_authenticate(sock, PlainMechanism("bob", "bob-secret"), "PLAIN")
            assert code == ErrorCode.sasl_authentication_failed.value   # Kafka: principals cannot change
            assert sock.at_eof(10)
    records = sluice.records()
    assert principals_by_client(records) == {"reauth-app": {"alice"}}
    assert principals_by_client(records, "Metadata")["reauth-raw"] == {"alice"}
    handshakes = [r for r in records if r["api_name"] == "SaslHandshake" and r["client_id"] == "reauth-app"]
    assert len(handshakes) >= 2


def test_oauthbearer_principal_is_the_configured_claim(auth_kafka: tuple[KafkaCluster, TestCA],
                                                       tmp_path: Path) -> None:
    cluster, _ = auth_kafka
    claim = {"oauthbearer_principal_claim": "user_name"}
    with Sluice(cluster.sasl_bootstrap, tmp_path, sasl=claim) as sluice:
        topic = create_topic(cluster.bootstrap, unique_name("oauth"))
        produce(sluice.bootstrap, topic, 10, {
            "client.id": "ck-oauth", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "OAUTHBEARER",
            "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": "principalClaimName=user_name principal=carol"})

        from kafka.net.sasl.oauth import AbstractTokenProvider

        class Token(AbstractTokenProvider):  # type: ignore[misc]
            def token(self) -> str:
                return unsecured_jwt({"user_name": "dave", "sub": "not-the-principal",
                                      "iat": int(time.time()), "exp": int(time.time()) + 3600})

        clients.kafka_python_produce(sluice.bootstrap, topic, clients.values(10), client_id="kp-oauth",
                                     security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                                     sasl_oauth_token_provider=Token())
        errors = produce_errors(sluice.bootstrap, topic, {
            "client.id": "ck-oauth-bad", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "OAUTHBEARER",
            "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": "principalClaimName=sub principal=mallory"})   # no user_name claim
        assert errors
    assert principals_by_client(sluice.records()) == {"ck-oauth": {"carol"}, "kp-oauth": {"dave"}}
    assert "mallory" not in sluice.log()


# ----------------------------------------------------------------------------- TLS

@pytest.fixture(scope="module")
def client_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("client-ca"), name="Sluice Clients CA")


def listen_tls(ca: TestCA, client_auth: str = "required") -> dict[str, Any]:
    server = ca.issue("sluice-server", "localhost", server=True)
    return {"cert_file": str(server.cert), "key_file": str(server.key), "ca_file": str(ca.cert_path),
            "client_auth": client_auth, "principal_mapping_rules": "RULE:^CN=([^,]+),O=Sluice$/$1/L,DEFAULT"}


def tls_client(ca: TestCA, cn: str | None, org: str | None = None, protocol: str = "SSL") -> dict[str, str]:
    config = {"security.protocol": protocol, "ssl.ca.location": str(ca.cert_path)}
    if cn is not None:
        files = ca.issue(f"client-{cn}-{org}", cn, org=org)
        config |= {"ssl.certificate.location": str(files.cert), "ssl.key.location": str(files.key)}
    return config


def test_mtls_client_gets_its_mapped_principal(kafka: KafkaCluster, client_ca: TestCA,
                                               tmp_path: Path) -> None:
    with Sluice(kafka.bootstrap, tmp_path, listen_tls=listen_tls(client_ca),
                quotas={"entries": [EVERY_USER]}) as sluice:
        topic = create_topic(kafka.bootstrap, unique_name("mtls"))
        produce(sluice.bootstrap, topic, 10,
                {"client.id": "tls-alice", **tls_client(client_ca, "Alice", "Sluice")})
        produce(sluice.bootstrap, topic, 10,
                {"client.id": "tls-svc", **tls_client(client_ca, "svc", "Elsewhere")})
        errors = produce_errors(sluice.bootstrap, topic,
                                {"client.id": "tls-none", **tls_client(client_ca, None)})
        assert errors                                              # required: no certificate, no connection
        assert sluice.metric("sluice_quota_request_rate", user="alice", client_id="") is not None
        assert sluice.metric("sluice_quota_request_rate", user="CN=svc,O=Elsewhere", client_id="") is not None
    assert principals_by_client(sluice.records()) == {"tls-alice": {"alice"},
                                                      "tls-svc": {"CN=svc,O=Elsewhere"}}


def test_sasl_over_tls_wins_over_the_certificate(kafka: KafkaCluster, client_ca: TestCA,
                                                 tmp_path: Path) -> None:
    with Sluice(kafka.sasl_bootstrap, tmp_path, listen_tls=listen_tls(client_ca, "requested")) as sluice:
        topic = create_topic(kafka.bootstrap, unique_name("sasl-tls"))
        produce(sluice.bootstrap, topic, 10, {"client.id": "sasl-ssl", **sasl("SCRAM-SHA-256", "bob"),
                                              **tls_client(client_ca, "Alice", "Sluice", "SASL_SSL")})
        produce(sluice.bootstrap, topic, 10, {"client.id": "sasl-ssl-nocert", **sasl("PLAIN", "admin"),
                                              **tls_client(client_ca, None, protocol="SASL_SSL")})
    assert principals_by_client(sluice.records()) == {"sasl-ssl": {"bob"}, "sasl-ssl-nocert": {"admin"}}
    # before SASL the connection was the certificate's: the handshake records say so
    handshakes = {r["principal"] for r in sluice.records()
                  if r["client_id"] == "sasl-ssl" and r["api_name"] == "SaslHandshake"}
    assert handshakes == {"alice"}


def test_upstream_tls_is_independent_of_client_tls(auth_kafka: tuple[KafkaCluster, TestCA], client_ca: TestCA,
                                                   tmp_path: Path) -> None:
    """Clients use certificates of one CA to reach Sluice; Sluice uses its own, of the broker's CA."""
    cluster, broker_ca = auth_kafka
    sluice_cert = broker_ca.issue("sluice-as-client", "sluice")
    with Sluice(cluster.ssl_bootstrap, tmp_path, listen_tls=listen_tls(client_ca), upstream={
            "bootstrap": cluster.ssl_bootstrap, "tls": {"enabled": True, "ca_file": str(broker_ca.cert_path),
                                                        "cert_file": str(sluice_cert.cert),
                                                        "key_file": str(sluice_cert.key)}}) as sluice:
        topic = create_topic(cluster.bootstrap, unique_name("both-tls"))
        produce(sluice.bootstrap, topic, 10,
                {"client.id": "both-tls", **tls_client(client_ca, "Alice", "Sluice")})
        got = clients.confluent_consume(sluice.bootstrap, topic, 10, config={
            "client.id": "both-tls-c", **tls_client(client_ca, "Bob", "Sluice")})
        assert len(got) == 10
    assert principals_by_client(sluice.records()) == {"both-tls": {"alice"}}
    assert principals_by_client(sluice.records(), "Fetch") == {"both-tls-c": {"bob"}}


# ----------------------------------------------------------------------------- PROXY protocol

def free_port_pair() -> int:
    """A port free on both 127.0.0.1 and 127.0.0.2 (and the next one, for broker 1)."""
    for _ in range(50):
        port = free_port()
        try:
            for host in ("127.0.0.1", "127.0.0.2"):
                for p in (port, port + 2):
                    with socket.socket() as s:
                        s.bind((host, p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair")


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
def test_client_behind_a_proxy_hop_is_attributed_to_its_real_address(kafka: KafkaCluster, tmp_path: Path,
                                                                      version: int) -> None:
    real = ("203.0.113.7", 4711)
    port = free_port_pair()
    broker_port = port + 1 + 1                                   # broker_port_base + node id 1
    with Sluice(kafka.bootstrap, tmp_path, listen=f"127.0.0.2:{port}", broker_port_base=port + 1,
                advertised_host="127.0.0.1", proxy_protocol=f"v{version}", principal_from="client_address",
                quotas={"window": WINDOW, "entries": [{"user": real[0], "producer_byte_rate": 128 * KiB}]}
                ) as sluice, proxy_hop("127.0.0.1", "127.0.0.2", [port, broker_port], real, version) as hop:
        bootstrap = f"127.0.0.1:{port}"
        topic = create_topic(kafka.bootstrap, unique_name("pp"))
        timeline = load.confluent_flood(bootstrap, topic, 6, client_id="behind-lb", batch_bytes=16 * KiB)
        assert timeline.count > 0 and hop.connections >= 2          # bootstrap and broker, both via the hop
        assert (sluice.metric("sluice_quota_throttled_requests_total", user=real[0], kind="produce") or 0) > 0
        with RawKafkaSocket(f"127.0.0.2:{port}") as sock:            # straight in, without the header
            sock.send(metadata_request(None, 12))
            assert sock.at_eof(5)
        deadline = time.monotonic() + 10   # the log reaches us through a pipe, a little later
        while "refused: connection does not start with a PROXY protocol" not in sluice.log():
            assert time.monotonic() < deadline, sluice.log()[-2000:]
            time.sleep(0.1)
    produced = [r for r in sluice.records() if r["api_name"] == "Produce"]
    assert produced and {r["principal"] for r in produced} == {real[0]}
    assert {r["client_address"] for r in produced} == {f"{real[0]}:{real[1]}"}


# ----------------------------------------------------------------------------- secrets

@pytest.mark.slow
def test_no_secret_reaches_any_log(auth_kafka: tuple[KafkaCluster, TestCA], tmp_path: Path,
                                   capfd: pytest.CaptureFixture[str]) -> None:
    """Authentications with known secrets, successful and not, every mechanism and framing; then
    Sluice's log (at DEBUG), its access log and everything the clients reported are searched."""
    cluster, _ = auth_kafka
    token = unsecured_jwt({"user_name": "erin", "iat": int(time.time()), "exp": int(time.time()) + 3600})
    secrets = [*PASSWORDS.values(), WRONG, token, token.split(".")[1]]
    client_output: list[str] = []
    with Sluice(cluster.sasl_bootstrap, tmp_path, log_level="DEBUG",
                sasl={"oauthbearer_principal_claim": "user_name"}) as sluice:
        topic = create_topic(cluster.bootstrap, unique_name("secrets"))
        for mechanism, user in [("PLAIN", "alice"), ("SCRAM-SHA-256", "bob"), ("SCRAM-SHA-512", "admin")]:
            produce(sluice.bootstrap, topic, 5, {"client.id": f"ok-{mechanism}", **sasl(mechanism, user)})
            client_output += produce_errors(sluice.bootstrap, topic, {"client.id": f"bad-{mechanism}",
                                                                      **sasl(mechanism, user, WRONG)}, 5)
        for address in (sluice.bootstrap,):
            with RawKafkaSocket(address) as sock:
                client_output.append(repr(raw_authenticate(sock, PlainMechanism("alice", WRONG), "PLAIN")))
            with RawKafkaSocket(address) as sock:
                raw_v0_authenticate(sock, PlainMechanism("alice", "alice-secret"), "PLAIN")
            with RawKafkaSocket(address) as sock:
                raw_v0_authenticate(sock, ScramMechanism("SCRAM-SHA-512", "bob", WRONG), "SCRAM-SHA-512")
            with RawKafkaSocket(address) as sock:
                sock.send(HandshakeV1(mechanism="OAUTHBEARER"))
                sock.recv(17, 1)
                sock.send(SaslAuthenticateRequest(auth_bytes=f"n,,\x01auth=Bearer {token}\x01\x01".encode()))
                _, answer = sock.recv(36, 2)
                assert answer.error_code == ErrorCode.none
                client_output.append(repr(answer))
        # the log reaches us through a pipe: wait for the last authentication's line
        wait_until(lambda: "authenticated as 'erin' (SASL OAUTHBEARER)" in sluice.log(), 15,
                   "the OAUTHBEARER authentication logged")
        log = sluice.log()
    access = sluice.access_log_text()
    printed = capfd.readouterr()                                 # librdkafka's own log lines, on stderr
    client_output += [printed.out, printed.err]
    assert "Authentication failed" in printed.err
    assert "authenticated as 'erin' (SASL OAUTHBEARER)" in log and "authentication failed" in log
    assert len(sluice.records()) > 20
    for secret in secrets:
        for where, text in [("Sluice's log", log), ("the access log", access),
                            ("the clients' output", "\n".join(client_output))]:
            assert secret not in text, f"a secret is in {where}"
    assert not re.search(r"\\x00alice", log)


def test_kafka_python_pinned_to_an_old_api_version_uses_raw_tokens(kafka: KafkaCluster,
                                                                    tmp_path: Path) -> None:
    """kafka-python told it talks to Kafka 0.11 sends SaslHandshake v0 and raw SASL tokens."""
    with Sluice(kafka.sasl_bootstrap, tmp_path) as sluice:
        topic = create_topic(kafka.bootstrap, unique_name("kp-raw"))
        for mechanism, user in [("PLAIN", "alice"), ("SCRAM-SHA-512", "bob")]:
            clients.kafka_python_produce(sluice.bootstrap, topic, clients.values(10),
                                         client_id=f"kp-v0-{user}", api_version=(0, 11),
                                         security_protocol="SASL_PLAINTEXT",
                                         sasl_mechanism=mechanism, sasl_plain_username=user,
                                         sasl_plain_password=PASSWORDS[user])
    records = sluice.records()
    assert principals_by_client(records) == {"kp-v0-alice": {"alice"}, "kp-v0-bob": {"bob"}}
    assert {r["api_version"] for r in records if r["api_name"] == "SaslHandshake"} == {0}


@pytest.mark.slow
def test_tls_behind_a_proxy_hop(kafka: KafkaCluster, client_ca: TestCA, tmp_path: Path) -> None:
    """The load balancer passes TLS through: Sluice reads the PROXY header, then terminates TLS
    (uvloop transport, TLS started on the bytes after the header): the certificate's principal as
    without the hop, the address principal for a client without one, the real address logged."""
    real = ("198.51.100.23", 5555)
    port = free_port_pair()
    with Sluice(kafka.bootstrap, tmp_path, listen=f"127.0.0.2:{port}", broker_port_base=port + 1,
                advertised_host="127.0.0.1", proxy_protocol="any", principal_from="client_address",
                listen_tls=listen_tls(client_ca, "requested")) as sluice, \
            proxy_hop("127.0.0.1", "127.0.0.2", [port, port + 2], real, 2):
        bootstrap = f"127.0.0.1:{port}"
        topic = create_topic(kafka.bootstrap, unique_name("pp-tls"))
        produce(bootstrap, topic, 10, {"client.id": "lb-cert", **tls_client(client_ca, "Alice", "Sluice")})
        produce(bootstrap, topic, 10, {"client.id": "lb-anon", **tls_client(client_ca, None)})
    records = sluice.records()
    assert principals_by_client(records) == {"lb-cert": {"alice"}, "lb-anon": {real[0]}}
    assert {r["client_address"] for r in records} == {f"{real[0]}:{real[1]}"}

"""Headroom from the running managers: the usage report, `sluice_quota_headroom_ratio`, the
`/quotas/usage` route, the supervisor's merge and `sluice quotas describe --usage`.

Rates use Kafka's windowed measure with the default window (11 samples of 1 s): a rate is the
retained total over at least (11 - 1) x 1 s = 10 s, so 4000 bytes recorded at t=0 read
4000 / 10 = 400 B/s.
"""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.admin import cli as quotas_cli
from proxy.cli import main
from proxy.config import ProxyConfig, load_config
from proxy.ops.headroom import USAGE_PATH, HeadroomCollector, usage_json, usage_report
from proxy.ops.http import MetricsEndpoint
from proxy.ops.metrics import QuotaSensorCollector
from proxy.workers.status import WorkerStatus
from proxy.workers.supervisor import Supervisor
from quotas import ClientIdentity, FakeClock, QuotaKind, SensorKey
from quotas.callback import topic_identity
from quotas.engine import QuotaEngine
from quotas.headroom import UsageReport

P = QuotaKind.PRODUCE
ALICE = ClientIdentity("alice", "app")
BOB = ClientIdentity("bob", "app")


def proxy_config(quotas: dict[str, Any]) -> ProxyConfig:
    return ProxyConfig.model_validate({"upstream": {"bootstrap": "k:9092"}, "quotas": quotas})


def managers_for(quotas: dict[str, Any], clock: FakeClock) -> QuotaEngine:
    config = proxy_config(quotas)
    return QuotaEngine(config.quota_config(), clock, config.quota_plugins())


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = generate_latest(registry).decode()
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def test_report_reads_rate_and_the_limit_in_force_from_the_managers() -> None:
    clock = FakeClock()
    managers = managers_for({"entries": [{"user": "alice", "producer_byte_rate": 1000},
                                         {"user": "bob", "producer_byte_rate": 2000}]}, clock)
    broker = managers.for_broker(1)
    broker.record_and_check(P, ALICE, 4000)  # 4000 B / 10 s = 400 B/s
    broker.check(P, BOB)                      # a sensor, nothing recorded: idle
    by_user = {e.user: e for e in usage_report(managers, clock).entries}
    alice, bob = by_user["alice"], by_user["bob"]
    assert (alice.broker, alice.kind, alice.client_id, alice.topic) == ("1", P, "", "")
    assert (alice.rate, alice.limit, alice.headroom, alice.headroom_ratio) == (400.0, 1000.0, 600.0, 0.6)
    assert alice.entity == (("user", "alice"),) and not alice.shadow
    assert (bob.rate, bob.headroom_ratio) == (0.0, 1.0)
    # the storage factor scales the limit in force: 1000 x 0.5 = 500; (500 - 400) / 500 = 0.2
    managers.set_limit_scale(P, 0.5)
    alice = next(e for e in usage_report(managers, clock).entries if e.user == "alice")
    assert (alice.limit, alice.storage_factor, alice.headroom_ratio) == (500.0, 0.5, pytest.approx(0.2))
    # a fleet share of 0.4 on top: base 500, in force 200; (200 - 400) / 200 = -1 (over its share)
    broker.set_shares({SensorKey(P, "alice", ""): 0.4}, standby=1.0)
    alice = next(e for e in usage_report(managers, clock).entries if e.user == "alice")
    assert (alice.base_limit, alice.share, alice.limit) == (500.0, 0.4, 200.0)
    assert alice.headroom_ratio == pytest.approx(-1.0)
    # 11 s later every sample has left the window (N x W = 11 s): idle, ratio 1
    clock.advance(11_000)
    alice = next(e for e in usage_report(managers, clock).entries if e.user == "alice")
    assert (alice.rate, alice.headroom_ratio) == (0.0, 1.0)


def test_cluster_entries_a_callback_and_topic_quotas_are_their_own_rows() -> None:
    clock = FakeClock()
    managers = managers_for({
        "entries": [{"user": "alice", "producer_byte_rate": 1000},
                    {"topic": "logs", "producer_byte_rate": 800}],
        "cluster_entries": [{"user": "alice", "producer_byte_rate": 1500}]}, clock)
    for manager, _ in managers.for_request(1):
        manager.record_and_check(P, ALICE, 9000)   # 900 B/s on broker 1 and on the cluster budget
    for manager, _ in managers.for_request(2):
        manager.record_and_check(P, ALICE, 3000)   # 300 B/s on broker 2; the cluster's 1200 B/s
    topics = managers.for_topics(1)
    assert topics is not None
    topics.record_and_check(P, topic_identity("other"), 500)  # no topic entry: unlimited, not shown
    topics.record_and_check(P, topic_identity("logs"), 2000)  # 200 B/s of 800
    rows = {(e.broker, e.topic): e for e in usage_report(managers, clock).entries}
    assert set(rows) == {("1", ""), ("2", ""), ("cluster", ""), ("1", "logs")}
    assert (rows["1", ""].headroom_ratio, rows["2", ""].headroom_ratio) == (pytest.approx(0.1), 0.7)
    # the cluster-wide budget: (1500 - 1200) / 1500 = 0.2
    assert rows["cluster", ""].limit == 1500.0 and rows["cluster", ""].headroom_ratio == pytest.approx(0.2)
    assert rows["1", "logs"].headroom_ratio == 0.75 and rows["1", "logs"].user == ""


def test_a_callback_limit_is_what_the_report_shows() -> None:
    clock = FakeClock()
    managers = managers_for({"callback": {"class": "quotas.builtin:GroupQuotaCallback", "config": {
        "groups": [{"name": "payments", "users": ["alice", "bob"], "producer_byte_rate": 1000}]}}}, clock)
    managers.for_broker(None).record_and_check(P, ALICE, 2500)
    managers.for_broker(None).record_and_check(P, BOB, 2500)  # one group: 5000 B / 10 s = 500 B/s
    (entry,) = [e for e in usage_report(managers, clock).entries if e.kind is P]
    assert (entry.broker, entry.rate, entry.limit, entry.headroom_ratio) == ("bootstrap", 500.0, 1000.0, 0.5)


def test_headroom_metric_agrees_with_the_limit_metric() -> None:
    clock = FakeClock()
    managers = managers_for({"entries": [{"client_id": "<default>", "producer_byte_rate": 1000}]}, clock)
    managers.for_broker(0).record_and_check(P, ClientIdentity("u", "app"), 4000)
    managers.for_broker(0).record_and_check(P, ClientIdentity("u", "idle"), 0)
    registry = CollectorRegistry()
    registry.register(QuotaSensorCollector(managers, clock))
    registry.register(HeadroomCollector(managers, clock))
    ratios = samples(registry, "sluice_quota_headroom_ratio")
    base = (("broker", "0"), ("kind", "produce"))
    rest = (("tags", ""), ("topic", ""), ("user", ""))
    assert ratios == {(*base[:1], ("client_id", "app"), base[1], *rest): 0.6,
                      (*base[:1], ("client_id", "idle"), base[1], *rest): 1.0}
    limits = samples(registry, "sluice_quota_limit")
    assert limits[(("broker", "0"), ("client_id", "app"), ("kind", "produce"), ("tags", ""),
                   ("user", ""))] == 1000.0
    doc = json.loads(usage_json(usage_report(managers, clock)))
    assert [(e["client_id"], e["limit"], e["headroom_ratio"]) for e in doc["entries"]] == [
        ("app", 1000.0, 0.6), ("idle", 1000.0, 1.0)]
    assert doc["window_ms"] == 11_000 and doc["scope"] == "broker" and doc["workers"] is None


def test_metrics_port_serves_the_usage_document_and_the_supervisor_merges_workers() -> None:
    """Two workers' endpoints serve their reports over HTTP; the supervisor sums the rates of the
    group they share: budget 1000 B/s, worker 0 at 400 B/s with share 0.5 (500), worker 1 at 300
    B/s with share 0.5 (500); instance: rate 700, limit min(500 + 500, 1000) = 1000, ratio 0.3."""
    clock = FakeClock()

    async def scenario() -> None:
        supervisor = Supervisor(load_config(None, {"upstream": {"bootstrap": "b:9092"}, "workers": 2},
                                            environ={}), ["proxy"])
        endpoints = []
        for index, recorded in enumerate((4000, 3000)):
            managers = managers_for({"entries": [{"user": "alice", "producer_byte_rate": 1000}]}, clock)
            manager = managers.for_broker(None)
            manager.record_and_check(P, ALICE, recorded)
            manager.set_shares({SensorKey(P, "alice", ""): 0.5}, standby=0.5)

            async def route(managers: QuotaEngine = managers) -> bytes:
                return usage_json(usage_report(managers, clock))

            endpoint = MetricsEndpoint.for_registry(CollectorRegistry(), lambda: True, {USAGE_PATH: route})
            await endpoint.start("127.0.0.1", 0)
            endpoints.append(endpoint)
            worker = supervisor.workers[index]
            worker.process = type("Running", (), {"returncode": None})()  # type: ignore[assignment]
            worker.status = WorkerStatus("127.0.0.1:9092", endpoint.port)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", endpoints[0].port)
            writer.write(b"GET /quotas/usage HTTP/1.0\r\n\r\n")
            head, _, body = (await reader.read()).partition(b"\r\n\r\n")
            writer.close()
            assert b"200 OK" in head and b"application/json" in head
            assert json.loads(body)["entries"][0]["headroom_ratio"] == pytest.approx(0.2)  # (500-400)/500
            merged = UsageReport.from_json(json.loads(await supervisor.usage()))
            (entry,) = merged.entries
            assert merged.workers == 2
            assert (entry.rate, entry.limit, entry.headroom_ratio) == (700.0, 1000.0, pytest.approx(0.3))
            assert [(w.worker, w.rate, w.limit) for w in entry.workers] == [(0, 400.0, 500.0),
                                                                           (1, 300.0, 500.0)]
        finally:
            for endpoint in endpoints:
                await endpoint.stop()
            await supervisor._cleanup()

    asyncio.run(scenario())


# ----------------------------------------------------------------------------- the CLI

def fake_usage(monkeypatch: pytest.MonkeyPatch, doc: dict[str, Any]) -> list[str]:
    opened: list[str] = []

    def urlopen(url: str, timeout: float) -> io.BytesIO:
        opened.append(url)
        return io.BytesIO(json.dumps(doc).encode())

    monkeypatch.setattr(quotas_cli.urllib.request, "urlopen", urlopen)
    return opened


def sample_doc() -> dict[str, Any]:
    clock = FakeClock()
    managers = managers_for({"entries": [{"user": "alice", "producer_byte_rate": 1000},
                                         {"user": "bob", "producer_byte_rate": 2000, "shadow": True}]}, clock)
    managers.for_broker(1).record_and_check(P, ALICE, 4000)
    managers.for_broker(None).record_and_check(P, BOB, 5000)
    return usage_report(managers, clock).to_json()


def test_describe_usage_reads_the_running_proxy_and_prints_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    opened = fake_usage(monkeypatch, sample_doc())
    result = CliRunner().invoke(main, ["quotas", "describe", "--usage", "--url", "http://sluice:9090"])
    assert result.exit_code == 0, result.output
    assert opened == ["http://sluice:9090/quotas/usage"]
    lines = result.output.splitlines()
    assert lines[0].split() == ["BROKER", "KIND", "USER", "CLIENT-ID", "TOPIC", "RATE", "LIMIT", "HEADROOM",
                                "RATIO", "UNIT", "NOTES"]
    # broker 1 before the bootstrap listener; bob's entry is shadow
    assert lines[1].split()[:10] == ["1", "produce", "alice", "-", "-", "400.0", "1000.0", "600.0", "0.600",
                                     "bytes/s"]
    assert lines[2].split()[:10] == ["bootstrap", "produce", "bob", "-", "-", "500.0", "2000.0", "1500.0",
                                     "0.750", "bytes/s"]
    assert "shadow" in lines[2] and "entry {user=bob}" in lines[2]
    assert lines[3] == "(rates over the last 11000 ms, scope broker)"


def test_describe_usage_json_filters_by_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_usage(monkeypatch, sample_doc())
    result = CliRunner().invoke(main, ["quotas", "describe", "--usage", "--url", "http://h:1/quotas/usage",
                                       "--names", "user=alice", "--output", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    got = [(e["user"], e["rate"], e["limit"], e["headroom"], e["headroom_ratio"]) for e in doc["entries"]]
    assert got == [("alice", 400.0, 1000.0, 600.0, 0.6)]


def test_describe_usage_fails_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(url: str, timeout: float) -> io.BytesIO:
        raise OSError("connection refused")

    monkeypatch.setattr(quotas_cli.urllib.request, "urlopen", refuse)
    result = CliRunner().invoke(main, ["quotas", "describe", "--usage", "--url", "http://h:1"])
    assert result.exit_code == 1
    assert "cannot read http://h:1/quotas/usage: connection refused" in result.output
    result = CliRunner().invoke(main, ["quotas", "describe", "--usage"])
    assert result.exit_code == 2 and "--usage needs --url" in result.output
    result = CliRunner().invoke(main, ["quotas", "describe", "--names", "user=a"],
                                env={"SLUICE_METRICS_URL": "http://h:1"})  # plain: the engine's answer
    assert result.exit_code == 1
    assert "cannot read http://h:1/quotas/effective?user=a&client_id=: connection refused" in result.output
    fake_usage(monkeypatch, {"version": 7})
    result = CliRunner().invoke(main, ["quotas", "describe", "--usage", "--url", "http://h:1",
                                       "--output", "json"])
    assert result.exit_code == 1 and json.loads(result.output)["error"]["message"].startswith("cannot read")


def test_headroom_series_follow_the_metrics_cap() -> None:
    clock = FakeClock()
    managers = managers_for({"entries": [{"client_id": "<default>", "producer_byte_rate": 1000}]}, clock)
    for i in range(5):
        managers.for_broker(0).record_and_check(P, ClientIdentity("u", f"c{i}"), 0)
    registry = CollectorRegistry()
    sensors = QuotaSensorCollector(managers, clock, max_series_per_metric=2)
    registry.register(sensors)
    registry.register(HeadroomCollector(managers, clock, sensors.cap))
    ratios = samples(registry, "sluice_quota_headroom_ratio")
    # two client ids have series of their own; the other three are folded and have no ratio
    assert sorted(dict(labels)["client_id"] for labels in ratios) == ["c0", "c1"]
    assert len(samples(registry, "sluice_quota_produce_byte_rate")) == 3  # c0, c1 and the overflow
    # /quotas/usage is not capped: it answers about every sensor
    assert len(usage_report(managers, clock).entries) == 5


def test_plain_describe_with_a_metrics_url_prints_the_engine_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain `describe` with --url prints each limit in force from ``/quotas/effective`` (not
    the stored entries resolved client-side): value in force, and what it is made of."""
    doc = {"caller": {"user": "ANONYMOUS", "client_id": "app"}, "topic": "t", "limits": [
        {"scope": "bootstrap", "kind": "producer_byte_rate", "unit": "bytes/s", "limit": 262144.0,
         "configured": 1048576.0, "storage_factor": 0.5, "fleet_share": 0.5, "source": "callback",
         "shadow": False, "entity": None},
        {"scope": "bootstrap", "kind": "producer_byte_rate", "unit": "bytes/s", "limit": 1000.0,
         "configured": 1000.0, "storage_factor": 1.0, "fleet_share": 1.0, "source": "topic",
         "shadow": False, "entity": "topic 't'"}]}
    opened = fake_usage(monkeypatch, doc)
    result = CliRunner().invoke(main, ["quotas", "describe", "--url", "http://h:1", "--names",
                                       "client-id=app,topic=t"])
    assert result.exit_code == 0, result.output
    assert opened == ["http://h:1/quotas/effective?user=&client_id=app&topic=t"]
    lines = result.output.splitlines()
    assert lines[0] == ("producer_byte_rate=262144 [bootstrap: callback 1.04858e+06 x storage factor 0.5 "
                        "x fleet share 0.5]")
    assert lines[1].startswith("producer_byte_rate=1000 [bootstrap: topic 1000] topic 't' (topic:")
    out = json.loads(CliRunner().invoke(main, ["quotas", "describe", "--url", "http://h:1", "--names",
                                               "client-id=app,topic=t", "--output", "json"]).output)
    assert [q["value"] for q in out["quotas"]] == [262144.0]
    assert [q["value"] for q in out["topic_quotas"]] == [1000.0]
    result = CliRunner().invoke(main, ["quotas", "describe", "--url", "http://h:1", "--names",
                                       "client-id=app", "--include-overrides"])
    assert result.exit_code == 2 and "--include-overrides" in result.output

"""The connection inventory (issue 14): per-connection counters and windowed rates on plain integer
times, the stage that feeds them, snapshots and their JSON, the workers' merge, the bearer token on
`GET /connections` (404 disabled, 401 without it), its configuration, and `sluice connections`
filtering and sorting over a fake endpoint."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from protocol.apis import ApiKey
from proxy.config import ConfigError, env_overrides, load_config
from proxy.flow.connection_stats import ConnectionStats
from proxy.flow.inflight import InFlight, QuotaNote
from proxy.flow.pipeline import ConnectionContext, Pipeline
from proxy.ops.connections import BearerToken, ConnectionInventory, merge_workers
from proxy.ops.connections_cli import connections as connections_command
from proxy.ops.connections_cli import select, sort_rows, table
from proxy.ops.http import MetricsEndpoint
from proxy.pumps.muting import ChannelMuteState
from proxy.stages.connection_stats import ConnectionStatsStage
from quotas.clock import FakeClock
from quotas.entity import DEFAULT, ClientIdentity, QuotaEntity, QuotaKind, SensorKey
from quotas.manager import ThrottleDecision

BASE = {"upstream": {"bootstrap": "127.0.0.1:9092"}}

# ------------------------------------------------------------------------------ counters and rates


def test_rates_cover_the_last_window_from_the_samples() -> None:
    stats = ConnectionStats(opened_ms=0)
    for second in range(1, 31):  # 30 s: one 1000-byte produce per second, then a sample
        stats.count(ApiKey.PRODUCE, 1000, 50, 0)
        if second > 20:          # the last 10 s also fetch 4000 bytes a second and are throttled 100 ms
            stats.count(ApiKey.FETCH, 60, 4000, 100)
        stats.sample(second * 1000, 10_000)
    rates = stats.window(30_000, 10_000)
    assert rates.window_ms == 10_000
    assert rates.produce_bytes_per_s == pytest.approx(1000.0)
    assert rates.produce_requests_per_s == pytest.approx(1.0)
    assert rates.fetch_bytes_per_s == pytest.approx(4000.0)
    assert rates.fetch_requests_per_s == pytest.approx(1.0)
    assert rates.requests_per_s == pytest.approx(2.0)
    assert rates.throttle_ms == 1000          # 10 throttled fetches in the window, not all 30 s
    assert stats.counters().produce_bytes == 30_000
    assert len(stats._samples) <= 12          # old samples are forgotten


def test_rates_of_a_young_connection_cover_its_age_and_go_quiet_when_idle() -> None:
    stats = ConnectionStats(opened_ms=5_000)
    stats.count(ApiKey.PRODUCE, 2000, 0, 0)
    rates = stats.window(7_000, 10_000)       # open 2 s: the window is its age
    assert rates.window_ms == 2_000
    assert rates.produce_bytes_per_s == pytest.approx(1000.0)
    assert stats.window(5_000, 10_000).produce_bytes_per_s == 0.0   # no time has passed
    for t in range(6_000, 30_001, 1_000):
        stats.sample(t, 10_000)
    assert stats.window(30_000, 10_000).produce_bytes_per_s == 0.0  # nothing in the last 10 s


def test_the_stage_counts_requests_client_id_throttle_and_matched_entities() -> None:
    ctx = ConnectionContext(1, "10.0.0.1:4000", "broker 1", 1)
    alice = QuotaEntity(user="alice", client_id=DEFAULT)
    topic = QuotaEntity(topic="orders")
    key = SensorKey(QuotaKind.PRODUCE, "alice", "")
    entry = InFlight(7, ApiKey.PRODUCE, 9, "writer", 1500, 0)
    entry.quota = QuotaNote(ClientIdentity("alice", "writer"), [
        ThrottleDecision(QuotaKind.PRODUCE, key, 250, 2e6, 1e6, entity=alice),
        ThrottleDecision(QuotaKind.PRODUCE, key, 0, 1.0, 9e9, entity=topic),     # the topic's own entry
        ThrottleDecision(QuotaKind.REQUEST_RATE, key, 0, 1.0, None)], 250)     # unlimited: no entity
    ConnectionStatsStage().on_complete(ctx, entry, 0)
    stats = ctx.stats
    assert (stats.requests, stats.produce_requests, stats.produce_bytes) == (1, 1, 1500)
    assert stats.throttle_ms == 250
    assert stats.client_id == "writer"
    assert stats.quota_entities == {QuotaKind.PRODUCE: alice}
    ConnectionStatsStage().on_complete(ctx, InFlight(8, ApiKey.METADATA, 12, None, 40, 0), 0)
    assert stats.client_id == "writer" and stats.requests == 2 and stats.throttle_ms == 250


# ------------------------------------------------------------------------------ snapshots and JSON


@dataclass
class FakeConnection:
    ctx: ConnectionContext
    in_flight: int = 0
    mute_state: ChannelMuteState = ChannelMuteState.NOT_MUTED


EXPECTED_KEYS = {"id", "worker", "listener", "broker_id", "client_address", "principal", "client_id",
                 "client_software_name", "client_software_version", "connected_since", "connected_ms",
                 "in_flight", "window_ms", "requests_per_s", "produce_requests_per_s", "produce_bytes_per_s",
                 "fetch_requests_per_s", "fetch_bytes_per_s", "throttle_ms", "muted", "mute_state", "quota"}


def test_inventory_snapshot_and_json_shape() -> None:
    clock = FakeClock(100_000)
    quiet = FakeConnection(ConnectionContext(3, "10.0.0.9:5000", "bootstrap", None,
                                             stats=ConnectionStats(clock.now_ms())))
    busy = FakeConnection(ConnectionContext(2, "192.0.2.7:41000", "broker 1", 1, principal="alice",
                                            client_software_name="librdkafka",
                                            client_software_version="2.6.1",
                                            stats=ConnectionStats(clock.now_ms())),
                          in_flight=2, mute_state=ChannelMuteState.MUTED_AND_THROTTLED)
    inventory = ConnectionInventory(lambda: [quiet, busy], clock, worker=None, window_ms=10_000,
                                    wall_clock_s=lambda: 1_700_000_030.0)
    stage = ConnectionStatsStage()
    for _ in range(20):
        clock.advance(500)
        entry = InFlight(1, ApiKey.PRODUCE, 9, "etl-1", 5000, 0)
        entry.quota = QuotaNote(ClientIdentity("alice", "etl-1"), [ThrottleDecision(
            QuotaKind.PRODUCE, SensorKey(QuotaKind.PRODUCE, "alice", ""), 40, 2.0, 1.0,
            entity=QuotaEntity(user="alice"))], 40)
        stage.on_complete(busy.ctx, entry, 0)
        inventory.tick()
    infos = inventory.snapshot()
    assert [i.id for i in infos] == [2, 3]
    b, q = infos
    assert b.connected_ms == 10_000 and b.connected_since == "2023-11-14T22:13:40Z"
    assert b.produce_bytes_per_s == pytest.approx(10_000.0)   # 5000 bytes every 0.5 s
    assert b.throttle_ms == 800                               # 20 x 40 ms within the 10 s window
    assert b.muted and b.mute_state == "MUTED_AND_THROTTLED" and b.in_flight == 2
    assert q.produce_bytes_per_s == 0.0 and not q.muted and q.client_id is None
    doc = json.loads(inventory.render())
    assert doc["window_ms"] == 10_000
    first = doc["connections"][0]
    assert set(first) == EXPECTED_KEYS
    assert first["quota"] == [{"kind": "producer_byte_rate", "entity": {"user": "alice"}}]
    assert (first["client_id"], first["principal"], first["client_software_name"]) == ("etl-1", "alice",
                                                                                      "librdkafka")
    assert first["client_address"] == "192.0.2.7:41000"


def test_workers_merge_names_each_worker_and_the_silent_ones() -> None:
    one = json.dumps({"window_ms": 10_000, "connections": [{"id": 1, "worker": 0}, {"id": 2, "worker": 0}]})
    two = json.dumps({"window_ms": 10_000, "connections": [{"id": 1, "worker": None}]})
    doc = json.loads(merge_workers(10_000, {0: one, 1: two, 2: None, 3: "not json"}))
    assert [(c["worker"], c["id"]) for c in doc["connections"]] == [(0, 1), (0, 2), (1, 1)]
    assert doc["unavailable_workers"] == [2, 3]


# ------------------------------------------------------------------------------ a real connection


def test_a_live_connection_feeds_its_stats_and_shows_its_mute_state() -> None:
    from proxy.pumps.connection import ClientConnection, ConnectionServices
    from proxy.pumps.services import Upstream
    from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget
    from tests.unit.proxy.test_connection import (
        FakeTimers,
        FakeTransport,
        FakeUpstream,
        Scripted,
        run_ready_callbacks,
    )

    async def scenario() -> None:
        clock = FakeClock(1_000)
        timers = FakeTimers(clock)
        upstream = FakeUpstream()

        async def connect(client: ClientConnection, target: UpstreamTarget) -> Upstream | str:
            return upstream

        registry = BrokerRegistry("127.0.0.1", "127.0.0.1", lambda n: 0, lambda s, t: None)
        services = ConnectionServices(pipeline=Pipeline([Scripted(), ConnectionStatsStage()]),
                                      registry=registry, clock=clock, bootstrap=[], connect_upstream=connect,
                                      call_later=timers.call_later)
        conn = ClientConnection(services, UpstreamTarget(1), real_address=("198.51.100.4", 6000))
        conn.connection_made(FakeTransport())  # type: ignore[arg-type]
        await run_ready_callbacks()  # the fake upstream connects at once, on the loop
        inventory = ConnectionInventory(lambda: services.connections, clock, window_ms=10_000)
        cid = b"throttle-300"
        request = struct.pack(">hhih", ApiKey.METADATA, 1, 5, len(cid)) + cid + struct.pack(">i", -1)
        conn.data_received(struct.pack(">i", len(request)) + request)
        (info,) = inventory.snapshot()
        assert info.client_address == "198.51.100.4:6000"   # the client behind the PROXY-protocol hop
        assert info.in_flight == 1 and info.muted            # throttled at request time
        conn.on_upstream_frame(struct.pack(">i", 5) + b"\x00\x00")
        clock.advance(1_000)
        (info,) = inventory.snapshot()
        assert info.in_flight == 0 and info.client_id == "throttle-300"
        assert info.requests_per_s == pytest.approx(1.0)
        timers.advance(300)
        assert not inventory.snapshot()[0].muted
        conn.connection_lost(None)
        assert inventory.snapshot() == []                     # a closed connection leaves the list

    asyncio.run(scenario())


# ------------------------------------------------------------------------------ the endpoint


async def _get(port: int, path: str, token: str | None = None) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_endpoint_is_404_when_disabled_and_401_without_the_token() -> None:
    async def body() -> bytes:
        return b'{"window_ms": 10000, "connections": []}\n'

    async def scenario() -> None:
        registry = CollectorRegistry()
        disabled = MetricsEndpoint.for_registry(registry, lambda: True)
        guarded = MetricsEndpoint.for_registry(registry, lambda: True, connections=body,
                                               token=BearerToken("s3cret-token"))
        open_ = MetricsEndpoint.for_registry(registry, lambda: True, connections=body)
        for endpoint in (disabled, guarded, open_):
            await endpoint.start("127.0.0.1", 0)
        try:
            assert (await _get(disabled.port, "/connections", "s3cret-token"))[0] == 404
            assert (await _get(guarded.port, "/connections"))[0] == 401
            status, text = await _get(guarded.port, "/connections", "wrong")
            assert status == 401 and b"s3cret" not in text
            status, text = await _get(guarded.port, "/connections?x=1", "s3cret-token")
            assert status == 200 and json.loads(text)["connections"] == []
            assert (await _get(guarded.port, "/metrics"))[0] == 200   # metrics stay open
            assert (await _get(open_.port, "/connections"))[0] == 200
        finally:
            for endpoint in (disabled, guarded, open_):
                await endpoint.stop()

    asyncio.run(scenario())


def test_bearer_token_checks() -> None:
    token = BearerToken("abc")
    assert token.allows("Bearer abc") and token.allows("bearer  abc ")
    assert not token.allows(None) and not token.allows("Bearer abd") and not token.allows("Basic abc")
    assert "abc" not in repr(token)


def test_supervisor_gathers_every_workers_connections_with_the_token(tmp_path: Path) -> None:
    from proxy.workers.status import WorkerStatus
    from proxy.workers.supervisor import Supervisor

    @dataclass
    class Running:
        returncode: int | None = None

    async def scenario(monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("SLUICE_CONNECTIONS_TOKEN", "tok")
        config = load_config(None, {**BASE, "workers": 2, "store": {"type": "sqlite",
                                                                    "path": str(tmp_path / "q.db")},
                                    "connections_endpoint": {"enabled": True,
                                                             "token_env": "SLUICE_CONNECTIONS_TOKEN"}},
                             environ={})
        supervisor = Supervisor(config, ["proxy"])
        supervisor._token = BearerToken("tok")
        endpoints = []
        for index in range(2):
            doc = json.dumps({"window_ms": 10_000, "connections": [{"id": 1, "worker": index}]}).encode()

            async def render(doc: bytes = doc) -> bytes:
                return doc

            endpoint = MetricsEndpoint.for_registry(CollectorRegistry(), lambda: True, connections=render,
                                                    token=BearerToken("tok"))
            await endpoint.start("127.0.0.1", 0)
            endpoints.append(endpoint)
            supervisor.workers[index].process = Running()  # type: ignore[assignment]
            supervisor.workers[index].status = WorkerStatus("127.0.0.1:9092", endpoint.port)
        try:
            doc = json.loads(await supervisor.connections())
            assert [(c["worker"], c["id"]) for c in doc["connections"]] == [(0, 1), (1, 1)]
            supervisor._token = BearerToken("other")   # the workers refuse it: both unavailable
            assert json.loads(await supervisor.connections())["unavailable_workers"] == [0, 1]
        finally:
            for endpoint in endpoints:
                await endpoint.stop()
            await supervisor._cleanup()

    with pytest.MonkeyPatch.context() as mp:
        asyncio.run(scenario(mp))


# ------------------------------------------------------------------------------ configuration


def test_config_off_by_default_and_the_token_source_must_yield_a_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not load_config(None, BASE, environ={}).connections_endpoint.enabled
    monkeypatch.delenv("SLUICE_CONNECTIONS_TOKEN", raising=False)
    with pytest.raises(ConfigError, match=r"connections_endpoint: token_env: .*SLUICE_CONNECTIONS_TOKEN"):
        load_config(None, {**BASE, "connections_endpoint": {"enabled": True,
                                                            "token_env": "SLUICE_CONNECTIONS_TOKEN"}},
                    environ={})
    empty = tmp_path / "token"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=r"token_file: .* is empty"):
        load_config(None, {**BASE, "connections_endpoint": {"enabled": True, "token_file": str(empty)}},
                    environ={})
    with pytest.raises(ConfigError, match="not both"):
        load_config(None, {**BASE, "connections_endpoint": {"token_env": "X", "token_file": str(empty)}},
                    environ={})
    with pytest.raises(ConfigError, match="configuration keys"):
        load_config(None, {**BASE, "connections_endpoint": {"token_env": "SLUICE_OTHER"}}, environ={})
    empty.write_text("file-token\n")
    config = load_config(None, {**BASE, "connections_endpoint": {"enabled": True, "token_file": str(empty)}},
                         environ={})
    assert config.connections_endpoint.token() == "file-token"
    assert "file-token" not in repr(config)
    # the token's variable is never read as a configuration key
    assert env_overrides({"SLUICE_CONNECTIONS_TOKEN": "x", "SLUICE_METRICS__PORT": "1"}) == {
        "metrics": {"port": "1"}}


# ------------------------------------------------------------------------------ the command

ROWS: list[dict[str, Any]] = [
    {"id": 1, "worker": None, "listener": "bootstrap", "broker_id": None, "client_address": "10.0.0.1:1",
     "principal": "alice", "client_id": "etl-1", "client_software_name": "librdkafka",
     "client_software_version": "2.6.1", "connected_ms": 65_000, "in_flight": 0, "requests_per_s": 3.0,
     "produce_bytes_per_s": 2_500_000.0, "fetch_bytes_per_s": 0.0, "throttle_ms": 900, "muted": True,
     "quota": [{"kind": "producer_byte_rate", "entity": {"user": "alice"}}]},
    {"id": 2, "worker": None, "listener": "broker 1", "broker_id": 1, "client_address": "10.0.0.2:2",
     "principal": "bob", "client_id": "reader", "client_software_name": "apache-kafka-java",
     "client_software_version": "4.1.0", "connected_ms": 5_000, "in_flight": 1, "requests_per_s": 9.0,
     "produce_bytes_per_s": 0.0, "fetch_bytes_per_s": 1024.0, "throttle_ms": 0, "muted": False,
     "quota": []},
    {"id": 3, "worker": None, "listener": "broker 2", "broker_id": 2, "client_address": "10.0.0.3:3",
     "principal": "alice", "client_id": "etl-2", "client_software_name": None,
     "client_software_version": None, "connected_ms": 1_000, "in_flight": 0, "requests_per_s": 1.0,
     "produce_bytes_per_s": 100.0, "fetch_bytes_per_s": 0.0, "throttle_ms": 0, "muted": False,
     "quota": [{"kind": "producer_byte_rate", "entity": {"user": "alice", "client-id": None}}]},
]


def test_select_and_sort() -> None:
    assert [r["id"] for r in select(ROWS, principal="alice")] == [1, 3]
    assert [r["id"] for r in select(ROWS, client_id="etl-*")] == [1, 3]
    assert [r["id"] for r in select(ROWS, listener="1")] == [2]
    assert [r["id"] for r in select(ROWS, listener="broker *")] == [2, 3]
    assert [r["id"] for r in select(ROWS, throttled=True)] == [1]
    assert [r["id"] for r in sort_rows(ROWS, "requests", reverse=True)] == [2, 1, 3]
    assert [r["id"] for r in sort_rows(ROWS, "age")] == [3, 2, 1]
    assert [r["id"] for r in sort_rows(ROWS, "software")] == [2, 1, 3]   # a missing value sorts last
    text = table(ROWS)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["ID", "LISTENER", "CLIENT"] and "WORKER" not in lines[0]
    assert "librdkafka/2.6.1" in lines[1] and "2.4 MiB" in lines[1] and "1m05s" in lines[1]
    assert "{user=alice, client-id=<default>}" in lines[3]


@pytest.fixture
def fake_endpoint() -> Iterator[tuple[str, list[str | None]]]:
    """An HTTP server that answers /connections with ROWS to the bearer token "tok"."""
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            if self.path != "/connections":
                self.send_error(404)
                return
            if self.headers.get("Authorization") != "Bearer tok":
                self.send_error(401)
                return
            body = json.dumps({"window_ms": 10_000, "connections": ROWS}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Cli:
    runner: CliRunner = field(default_factory=CliRunner)

    def run(self, *args: str, env: dict[str, str] | None = None) -> Any:
        env = env or {"SLUICE_CONNECTIONS_TOKEN": ""}
        return self.runner.invoke(connections_command, list(args), env=env)


def test_cli_table_json_filters_and_token(fake_endpoint: tuple[str, list[str | None]],
                                          tmp_path: Path) -> None:
    url, seen = fake_endpoint
    token_file = tmp_path / "token"
    token_file.write_text("tok\n")
    cli = Cli()
    result = cli.run("--url", url, "--token-file", str(token_file), "--principal", "alice",
                     "--sort", "produce", "--reverse")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("ID") and len(lines) == 3
    assert lines[1].split()[0] == "1" and lines[2].split()[0] == "3"
    result = cli.run("--url", url + "/", "--output", "json", "--throttled",
                     env={"SLUICE_CONNECTIONS_TOKEN": "tok"})
    assert result.exit_code == 0, result.output
    assert [c["id"] for c in json.loads(result.output)["connections"]] == [1]
    assert seen[-1] == "Bearer tok"
    result = cli.run("--url", url)
    assert result.exit_code == 1 and "401" in result.output and "--token-file" in result.output
    result = cli.run("--url", url + "/nothing", env={"SLUICE_CONNECTIONS_TOKEN": "tok"})
    assert result.exit_code == 1 and "404" in result.output
    assert seen[-2] is None


def test_cli_is_a_sluice_subcommand() -> None:
    from proxy.cli import main

    result = CliRunner().invoke(main, ["connections", "--help"])
    assert result.exit_code == 0 and "--throttled" in result.output

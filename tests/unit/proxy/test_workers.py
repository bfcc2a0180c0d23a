"""`--workers N` without processes: configuration, the supervisor's pure decisions, the metrics merge,
the status line, port reservation and the access-log fields of a worker."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from contracts.access_log import FIELD_NAMES, example_record, partition_path, validate_record
from proxy.config import ConfigError, load_config
from proxy.fleet.local import hub_path, worker_index
from proxy.workers.merge import merge_expositions, render
from proxy.workers.policy import RestartBackoff, worker_argv
from proxy.workers.ports import reserve_ports
from proxy.workers.status import WorkerStatus, parse_status
from proxy.workers.supervisor import supervise

BASE = {"upstream": {"bootstrap": "broker:9092"}}


# ---------------------------------------------------------------------------------- configuration

@pytest.mark.parametrize(("value", "expected"), [(None, 1), ("3", 3), (4, 4), ("auto", os.cpu_count() or 1)])
def test_workers_key(value: object, expected: int) -> None:
    overrides = BASE if value is None else {**BASE, "workers": value}
    assert load_config(None, overrides, environ={}).workers == expected


def test_workers_from_the_environment_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("upstream: {bootstrap: 'b:1'}\nworkers: 2\n")
    assert load_config(path, environ={}).workers == 2
    assert load_config(path, environ={"SLUICE_WORKERS": "5"}).workers == 5
    assert load_config(path, {"workers": "3"}, environ={"SLUICE_WORKERS": "5"}).workers == 3


@pytest.mark.parametrize("value", ["0", "-2", "many", "1.5", 0])
def test_bad_workers_fail_naming_the_key(value: object) -> None:
    with pytest.raises(ConfigError, match=r"workers: "):
        load_config(None, {**BASE, "workers": value}, environ={})


def test_memory_store_with_workers_is_refused_naming_store_type() -> None:
    with pytest.raises(ConfigError, match=r"store\.type: memory"):
        load_config(None, {**BASE, "workers": 2, "store": {"type": "memory"}}, environ={})
    assert load_config(None, {**BASE, "workers": 1, "store": {"type": "memory"}}, environ={}).workers == 1


def test_supervisor_makes_the_sqlite_store_before_any_worker_and_stops_when_it_cannot(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # the file is made once, before N workers open it together; one that cannot be made stops the
    # start at once (exit 2, naming the file), as a worker's failed open would, without any worker
    (tmp_path / "a-file").write_text("")
    store = {"type": "sqlite", "path": str(tmp_path / "a-file" / "q.db")}
    bad = load_config(None, {**BASE, "workers": 2, "store": store}, environ={})
    assert supervise(bad, ["proxy"]) == 2
    assert "cannot open the quota store" in caplog.text and "a-file/q.db" in caplog.text
    assert "starting 2 workers" not in caplog.text


def test_a_workers_role_in_the_environment_is_not_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"SLUICE_WORKER_INDEX": "2", "SLUICE_WORKER_HUB": "/tmp/x.sock", "SLUICE_WORKER_STATUS_FD": "7",
           "SLUICE_WORKER_LISTEN_PORT": "9092"}
    assert load_config(None, BASE, environ=env).workers == 1  # no "unknown key" error
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert worker_index() == 2
    assert hub_path() == Path("/tmp/x.sock")
    monkeypatch.delenv("SLUICE_WORKER_INDEX")
    assert worker_index() is None and hub_path() is None


def test_cli_flag_reaches_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import proxy.app
    from proxy.cli import main

    seen = {}

    def fake_run(config: object, reload: object = None) -> int:
        seen["workers"] = config.workers  # type: ignore[attr-defined]
        return 0

    monkeypatch.setattr(proxy.app, "run", fake_run)
    result = CliRunner().invoke(main, ["proxy", "--upstream", "b:1", "--workers", "3"])
    assert result.exit_code == 0 and seen == {"workers": 3}
    bad = CliRunner().invoke(main, ["proxy", "--upstream", "b:1", "--workers", "zero"])
    assert bad.exit_code == 2 and "workers" in bad.output


# ---------------------------------------------------------------------------------- supervisor policy

def test_backoff_doubles_for_quick_deaths_and_resets_after_a_stable_run() -> None:
    b = RestartBackoff(initial_ms=100, max_ms=1_000, stable_after_ms=10_000)
    assert b.delay_ms(None, ran_ms=50) == 100
    delays = []
    last = None
    for _ in range(6):
        last = b.delay_ms(last, ran_ms=50)
        delays.append(last)
    assert delays == [100, 200, 400, 800, 1_000, 1_000]
    assert b.delay_ms(1_000, ran_ms=10_000) == 100


def test_worker_argv_keeps_reseed_for_worker_zeros_first_start_only() -> None:
    argv = ["proxy", "--config", "s.yaml", "--reseed", "--workers", "3"]
    assert worker_argv(argv, 0, first_start=True) == argv
    assert worker_argv(argv, 0, first_start=False) == ["proxy", "--config", "s.yaml", "--workers", "3"]
    assert worker_argv(argv, 1, first_start=True) == ["proxy", "--config", "s.yaml", "--workers", "3"]


def test_status_lines() -> None:
    assert parse_status(b'{"ready": true, "bootstrap": "h:1", "metrics_port": 5}\n') == WorkerStatus("h:1", 5)
    no_metrics = parse_status(b'{"ready": true, "bootstrap": "h:1", "metrics_port": null}')
    assert no_metrics == WorkerStatus("h:1", None)
    assert parse_status(b"not json") is None
    assert parse_status(b'{"ready": false, "bootstrap": "h:1"}') is None
    assert parse_status(b'{"ready": true}') is None


def test_reserved_ports_are_held_and_shareable_with_reuse_port() -> None:
    reservation = reserve_ports("127.0.0.1", broker_slots=3)
    try:
        ports = [s.getsockname()[1] for s in reservation.sockets]
        assert ports == [reservation.port + i for i in range(4)]
        for port in ports:
            plain = socket.socket()
            with pytest.raises(OSError):
                plain.bind(("127.0.0.1", port))  # nobody else gets it
            plain.close()
            shared = socket.socket()
            shared.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            shared.bind(("127.0.0.1", port))  # a worker does
            shared.listen(1)
            client = socket.create_connection(("127.0.0.1", port), timeout=5)
            conn, _ = shared.accept()  # the listening worker gets the connection, not the reservation
            conn.close()
            client.close()
            shared.close()
    finally:
        reservation.close()


# ---------------------------------------------------------------------------------- metrics merge

def _exposition(requests: float, connections: float) -> str:
    registry = CollectorRegistry()
    Counter("sluice_requests", "Requests by API", ["api"], registry=registry).labels("Produce").inc(requests)
    Gauge("sluice_open_connections", "Open client connections", ["listener"],
          registry=registry).labels("bootstrap").set(connections)
    return generate_latest(registry).decode()


def test_merge_labels_every_sample_with_its_worker_and_writes_each_family_once() -> None:
    merged = merge_expositions({1: _exposition(5, 2), 0: _exposition(3, 1)})
    own = CollectorRegistry()
    Gauge("sluice_workers", "Worker processes up", registry=own).set(2)
    text = render(merged, own).decode()
    assert text.count("# TYPE sluice_requests_total counter") == 1
    assert text.count("# HELP sluice_open_connections ") == 1
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {s.labels["worker"]: s.value for s in families["sluice_requests"].samples
                if s.name == "sluice_requests_total"}
    assert requests == {"0": 3.0, "1": 5.0}
    conns = [(s.labels["worker"], s.labels["listener"], s.value)
             for s in families["sluice_open_connections"].samples]
    assert conns == [("0", "bootstrap", 1.0), ("1", "bootstrap", 2.0)]  # worker order, labels kept
    assert families["sluice_workers"].samples[0].value == 2.0
    assert "worker" not in families["sluice_workers"].samples[0].labels


def test_merge_of_nothing_is_empty() -> None:
    assert merge_expositions({}) == []
    assert render([], CollectorRegistry()) == b""


# ---------------------------------------------------------------------------------- access log

def test_worker_field_and_file_names() -> None:
    assert FIELD_NAMES[-1] == "worker"
    assert validate_record(example_record(worker=2)) == []
    assert validate_record(example_record(worker=None)) == []
    assert validate_record(example_record(worker=-1)) != []
    ts = 1_767_225_600_123
    assert partition_path("/r", ts, "sl-1", 3).name == "sl-1-000003.jsonl"
    assert partition_path("/r", ts, "sl-1", 3, worker=2).name == "sl-1-w2-000003.jsonl"
    with pytest.raises(ValueError, match="worker"):
        partition_path("/r", ts, "sl-1", 3, worker=-1)


# ---------------------------------------------------------------------------------- supervisor endpoint

class _Running:
    returncode: int | None = None


def test_supervisor_scrapes_every_up_worker_and_reports_health() -> None:
    """The supervisor's /metrics fetches each worker's endpoint over HTTP and merges them; /healthz
    is healthy only while every worker is up."""
    import asyncio

    from proxy.ops.http import MetricsEndpoint
    from proxy.workers.supervisor import Supervisor

    async def scenario() -> None:
        config = load_config(None, {**BASE, "workers": 2}, environ={})
        supervisor = Supervisor(config, ["proxy"])
        endpoints = []
        for index, requests in enumerate((3, 5)):
            registry = CollectorRegistry()
            counter = Counter("sluice_requests", "Requests by API", ["api"], registry=registry)
            counter.labels("Fetch").inc(requests)
            endpoint = MetricsEndpoint.for_registry(registry, lambda: True)
            await endpoint.start("127.0.0.1", 0)
            endpoints.append(endpoint)
            worker = supervisor.workers[index]
            worker.process = _Running()  # type: ignore[assignment]
            worker.status = WorkerStatus("127.0.0.1:9092", endpoint.port)
        try:
            assert supervisor.healthy()
            text = (await supervisor.scrape()).decode()
            families = {f.name: f for f in text_string_to_metric_families(text)}
            got = {s.labels["worker"]: s.value for s in families["sluice_requests"].samples
                   if s.name == "sluice_requests_total"}
            assert got == {"0": 3.0, "1": 5.0}
            assert families["sluice_workers"].samples[0].value == 2.0
            supervisor.workers[1].status = None  # died, not ready again yet
            assert not supervisor.healthy()
            text = (await supervisor.scrape()).decode()
            families = {f.name: f for f in text_string_to_metric_families(text)}
            assert {s.labels["worker"] for s in families["sluice_requests"].samples} == {"0"}
            assert families["sluice_workers"].samples[0].value == 1.0
        finally:
            for endpoint in endpoints:
                await endpoint.stop()
            await supervisor._cleanup()  # its hub and private directory

    asyncio.run(scenario())


def test_supervisor_healthz_combines_the_workers_degraded_reasons() -> None:
    """/healthz through the supervisor: 200 while every worker is up and fine, 207 naming each
    worker's degraded part (its own /healthz), 503 when a worker is down."""
    import asyncio

    from proxy.ops.http import MetricsEndpoint
    from proxy.workers.supervisor import Supervisor

    async def scenario() -> None:
        config = load_config(None, {**BASE, "workers": 2}, environ={})
        supervisor = Supervisor(config, ["proxy"])
        problems: list[list[str]] = [[], []]
        endpoints = []
        for index in range(2):
            endpoint = MetricsEndpoint.for_registry(CollectorRegistry(), lambda: True,
                                                    degraded=[lambda i=index: problems[i]])
            await endpoint.start("127.0.0.1", 0)
            endpoints.append(endpoint)
            worker = supervisor.workers[index]
            worker.process = _Running()  # type: ignore[assignment]
            worker.status = WorkerStatus("127.0.0.1:9092", endpoint.port)
        try:
            report = await supervisor.health()
            assert (report.status, report.body) == ("200 OK", b"ok\n")
            problems[1].append("access log: records dropped in the last 10 s (in all: 5 queue_full)")
            report = await supervisor.health()
            assert report.status == "207 Multi-Status"
            assert report.body == b"degraded: worker 1: access log: records dropped in the last 10 s " \
                                  b"(in all: 5 queue_full)\n"
            supervisor.workers[0].status = None
            report = await supervisor.health()
            assert report.status == "503 Service Unavailable"
            assert report.body == b"unavailable: 1/2 workers up\n"
        finally:
            for endpoint in endpoints:
                await endpoint.stop()
            await supervisor._cleanup()

    asyncio.run(scenario())


def test_the_readiness_line_is_written_whole_while_other_threads_log(
        capfd: pytest.CaptureFixture[str]) -> None:
    import threading

    from proxy.workers.status import announce_ready

    stop = threading.Event()

    def chatter() -> None:  # as a fleet thread logging while the proxy announces itself
        while not stop.is_set():
            sys.stderr.write("2026-11-24 06:50:00,172 INFO sluice.fleet: fleet exchange\n")

    thread = threading.Thread(target=chatter)
    thread.start()
    try:
        for port in range(200):
            announce_ready(f"127.0.0.1:{40000 + port}")
    finally:
        stop.set()
        thread.join()
    lines = capfd.readouterr().err.splitlines()
    ready = [line for line in lines if "sluice ready" in line]
    assert ready == [f"sluice ready: bootstrap 127.0.0.1:{40000 + p}" for p in range(200)]

"""`sluice proxy --workers 3` in front of the one-node broker (issue 11, Workers).

One instance (a supervisor and three workers, SQLite store, access log on) serves the tests of this
module in order: clients work through it and spread over the workers; /metrics shows every worker;
a quota change through one worker (AlterClientQuotas) and a YAML edit with SIGHUP reach every
worker; a SIGKILLed worker is restarted (log and metric) while a producer keeps working; SIGTERM
ends the instance with status 0 and no worker left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from protocol.quota_client import AlterEntry, QuotaClient, Stream
from tests.conftest import create_topic, unique_name
from tests.harness.clients import confluent_consume, confluent_produce, values
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import eventually

pytestmark = pytest.mark.integration

WORKERS = 3


class Instance:
    def __init__(self, proc: SluiceProcess, metrics_port: int, access_dir: Path) -> None:
        self.proc = proc
        self.metrics_port = metrics_port
        self.access_dir = access_dir

    def samples(self, family: str) -> list[tuple[dict[str, str], float]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        # the parser names a counter's family without `_total`
        return [(dict(s.labels), s.value) for f in text_string_to_metric_families(text) if f.name == family
                for s in f.samples if not s.name.endswith("_created")]

    def value(self, family: str, **labels: str) -> float | None:
        found = [v for lbl, v in self.samples(family) if all(lbl.get(k) == w for k, w in labels.items())]
        return sum(found) if found else None

    def configured(self, name: str, key: str) -> dict[str, float]:
        """worker -> the configured value of `key` for the entity whose description names `name`."""
        return {lbl["worker"]: v for lbl, v in self.samples("sluice_quota_configured")
                if name in lbl["entity"] and lbl["key"] == key}

    def healthz(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)


def log_time(log: str, text: str) -> float:
    """The time of the supervisor's log line containing `text` (seconds since the epoch)."""
    import datetime as dt

    line = next(line for line in log.splitlines() if text in line)
    stamp = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def config(metrics_port: int, access_dir: Path, flood_rate: int) -> dict[str, Any]:
    return {"metrics": {"port": metrics_port}, "admins": ["ANONYMOUS"], "allow_anonymous_admins": True,
            "instance": "wk",
            "drain_timeout_ms": 5000,
            "store": {"type": "sqlite", "path": "quotas.db"},
            "access_log": {"dir": str(access_dir), "format": "json"},
            "quotas": {"entries": [{"client_id": "wk-flood", "producer_byte_rate": flood_rate}]}}


@pytest.fixture(scope="module")
def instance(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Instance]:
    workdir = tmp_path_factory.mktemp("workers")
    port = free_port()
    access_dir = workdir / "access"
    proc = SluiceProcess(kafka.bootstrap, workdir / "sluice", config(port, access_dir, 1_000_000),
                         workers=WORKERS).start()
    try:
        yield Instance(proc, port, access_dir)
    finally:
        proc.stop()


def test_three_workers_serve_clients_and_one_metrics_port(instance: Instance, kafka: KafkaCluster) -> None:
    assert "sluice ready: bootstrap" in instance.proc.log()
    assert sorted(instance.proc.worker_pids()) == [0, 1, 2]
    assert instance.value("sluice_workers") == WORKERS
    assert instance.healthz() == 200
    assert {lbl["worker"] for lbl, _ in instance.samples("sluice_quota_configured")} == {"0", "1", "2"}

    topic = unique_name("workers")
    create_topic(kafka.bootstrap, topic)
    payloads = values(200, "w")
    confluent_produce(instance.proc.bootstrap, topic, payloads)
    assert sorted(confluent_consume(instance.proc.bootstrap, topic, len(payloads))) == payloads

    # every access-log record names the instance and its worker; each worker writes its own files
    def records() -> list[dict[str, Any]]:
        out = []
        for path in instance.access_dir.rglob("*.jsonl"):
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return out

    produced = eventually(records, lambda rs: any(r["api_name"] == "Produce" for r in rs), timeout_s=30)
    assert all(r["instance"] == "wk" and r["worker"] in (0, 1, 2) for r in produced)
    for path in instance.access_dir.rglob("*.jsonl"):
        assert path.name.startswith("wk-w"), path.name
        worker = int(path.name.split("-")[1][1:])
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        assert {json.loads(line)["worker"] for line in lines} <= {worker}


def test_connections_spread_over_more_than_one_worker(instance: Instance) -> None:
    host, port = instance.proc.bootstrap.rsplit(":", 1)
    sockets = [socket.create_connection((host, int(port)), timeout=10) for _ in range(12)]
    try:
        def per_worker() -> dict[str, float]:
            return {lbl["worker"]: v for lbl, v in instance.samples("sluice_open_connections")
                    if lbl["listener"] == "bootstrap" and v > 0}

        spread = eventually(per_worker, lambda got: sum(got.values()) >= 12, timeout_s=30)
        assert sum(spread.values()) >= 12
        assert len(spread) > 1, spread  # all 12 on one of three workers: chance 3 / 3**12
    finally:
        for s in sockets:
            s.close()


def connect(h: str, p: int, timeout_s: float) -> Stream:
    return socket.create_connection((h, p), timeout=timeout_s)


def test_a_quota_altered_through_one_worker_applies_in_every_worker(instance: Instance) -> None:
    user = unique_name("wkuser")
    with QuotaClient(instance.proc.bootstrap, connect, client_id="workers-test") as admin:
        (outcome,) = admin.alter([AlterEntry((("user", user),), [("producer_byte_rate", 4096.0)])])
    written = time.monotonic()
    assert outcome.error_code == 0
    got = eventually(lambda: instance.configured(user, "producer_byte_rate"), lambda g: len(g) == WORKERS,
                     timeout_s=30)
    took_s = time.monotonic() - written
    assert got == {"0": 4096.0, "1": 4096.0, "2": 4096.0}
    print(f"alter through one worker visible in all {WORKERS} workers' /metrics after {took_s * 1000:.0f} ms")


def test_sighup_with_an_edited_yaml_reaches_every_worker(instance: Instance) -> None:
    assert instance.configured("wk-flood", "producer_byte_rate") == {"0": 1e6, "1": 1e6, "2": 1e6}
    instance.proc.write_config({**instance.proc.config, "quotas": {"entries": [
        {"client_id": "wk-flood", "producer_byte_rate": 2_000_000}]}})
    instance.proc.signal(signal.SIGHUP)
    got = eventually(lambda: instance.configured("wk-flood", "producer_byte_rate"),
                     lambda g: g == {"0": 2e6, "1": 2e6, "2": 2e6}, timeout_s=30)
    assert got == {"0": 2e6, "1": 2e6, "2": 2e6}
    assert instance.proc.wait_for_log("SIGHUP forwarded to 3 workers")


def test_a_killed_worker_is_restarted_and_clients_keep_working(instance: Instance,
                                                               kafka: KafkaCluster) -> None:
    from confluent_kafka import Producer

    topic = unique_name("workers-kill")
    create_topic(kafka.bootstrap, topic)
    errors: list[str] = []
    producer = Producer({"bootstrap.servers": instance.proc.bootstrap, "linger.ms": 5,
                         "message.timeout.ms": 60_000})
    sent = values(300, "k")
    for payload in sent[:100]:
        producer.produce(topic, payload, on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
    assert producer.flush(30) == 0

    victim = 1
    pid = instance.proc.worker_pids()[victim]
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    assert instance.proc.wait_for_log(f"worker {victim} (pid {pid}) died with signal SIGKILL", timeout_s=20)
    for payload in sent[100:]:  # produced while the worker is down and after it is back
        producer.produce(topic, payload, on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:5]

    assert eventually(lambda: instance.value("sluice_worker_restarts", worker=str(victim)),
                      lambda v: v == 1.0, timeout_s=30) == 1.0
    # a worker starts in seconds, but in a minute on a 2-core machine loaded by other tests
    up = eventually(lambda: instance.value("sluice_workers"), lambda v: v == WORKERS, timeout_s=120)
    assert up == WORKERS
    back_s = time.monotonic() - killed
    new_pid = instance.proc.worker_pids()[victim]
    assert new_pid != pid
    assert instance.healthz() == 200
    assert sorted(confluent_consume(instance.proc.bootstrap, topic, len(sent))) == sent
    died_at = log_time(instance.proc.log(), f"worker {victim} (pid {pid}) died")
    ready_at = log_time(instance.proc.log(), f"worker {victim} ready (pid {new_pid})")
    print(f"worker {victim} SIGKILLed: supervisor saw the death and the new worker ready "
          f"{ready_at - died_at:.2f} s apart (all {WORKERS} up in /metrics {back_s:.1f} s after the kill)")


def test_sigterm_drains_every_worker_and_exits_zero(instance: Instance) -> None:
    pids = list(instance.proc.worker_pids().values())
    code = instance.proc.stop(timeout_s=60)
    assert code == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for index in range(WORKERS):
        assert f"worker {index} exited with status 0" in instance.proc.log()


def test_workers_die_with_a_killed_supervisor(kafka: KafkaCluster, tmp_path: Path) -> None:
    proc = SluiceProcess(kafka.bootstrap, tmp_path / "sluice", config(free_port(), tmp_path / "access", 1000),
                         workers=2).start()
    try:
        pids = list(proc.worker_pids().values())
        assert len(pids) == 2
        assert proc.process is not None
        proc.process.kill()  # SIGKILL: no chance to signal anyone; the kernel tells the workers
        proc.process.wait(10)

        def alive() -> list[int]:
            out = []
            for pid in pids:
                try:
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if state != "Z":  # a zombie has exited; whoever adopted it reaps it
                    out.append(pid)
            return out

        assert eventually(alive, lambda left: not left, timeout_s=30) == []
    finally:
        proc.stop()


def test_the_supervisor_answers_quotas_effective_from_its_workers(kafka: KafkaCluster,
                                                                  tmp_path: Path) -> None:
    """`--workers 2`: the supervisor's `/quotas/effective` (404 before) is every worker's engine
    answer merged per budget. The two workers share the budget through the local fleet; idle, each
    holds the standby share 1/2, so the instance's limit is 2 x 1/2 of 1 MB/s, and each worker's
    part equals that worker's own `sluice_quota_limit` for the sensor."""
    port = free_port()
    proc = SluiceProcess(kafka.bootstrap, tmp_path / "sluice", config(port, tmp_path / "access", 1_000_000),
                         workers=2).start()
    try:
        url = f"http://127.0.0.1:{port}/quotas/effective?client_id=wk-flood"

        def effective() -> dict[str, Any]:
            with urllib.request.urlopen(url, timeout=10) as r:
                assert r.status == 200
                return dict(json.loads(r.read().decode()))

        # the workers' local fleet settles the standby shares after both have reported: wait for it
        doc = eventually(effective, lambda d: len(d["limits"]) == 1 and len(d["limits"][0]["workers"]) == 2
                         and all(w["limit"] == 5e5 for w in d["limits"][0]["workers"]), timeout_s=30)
        (limit,) = doc["limits"]
        assert doc["workers"] == 2 and doc["caller"]["client_id"] == "wk-flood"
        assert (limit["kind"], limit["source"], limit["configured"]) == ("producer_byte_rate", "entry", 1e6)
        parts = {w["worker"]: w["limit"] for w in limit["workers"]}
        assert parts == {0: 5e5, 1: 5e5}
        assert limit["limit"] == sum(parts.values()) == 1e6 and limit["fleet_share"] == 1.0
        instance = Instance(proc, port, tmp_path / "access")
        metric = {int(lbl["worker"]): v for lbl, v in instance.samples("sluice_quota_limit")
                  if lbl.get("client_id") == "wk-flood" and lbl.get("kind") == "produce"}
        assert metric == parts
        # /quotas/usage merges the same sensor from both workers
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/quotas/usage", timeout=10) as r:
            usage = json.loads(r.read().decode())
        (entry,) = [e for e in usage["entries"] if e["client_id"] == "wk-flood" and e["kind"] == "produce"]
        assert entry["limit"] == 1e6 and sorted(w["worker"] for w in entry["workers"]) == [0, 1]
    finally:
        proc.stop()

"""The cluster path, for real: three Sluice instances write access logs into one directory in front
of a real broker; the quota-recommendation job runs with `spark-submit --master spark://...` on a
Spark standalone cluster (a master and two workers, separate processes, executors on both) and
gives the same plan as `--master local[*]` over the same files, with the fleet's usage summed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness import clients
from tests.harness.kafka import KafkaCluster
from tests.harness.sluice import SluiceProcess
from tests.spark.standalone import StandaloneCluster, spark_submit

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.spark_processes, pytest.mark.slow,
              pytest.mark.timeout(900)]

INSTANCES = ("sluice-a", "sluice-b", "sluice-c")
CLIENT_ID = "fleet-app"
MESSAGES, VALUE_BYTES = 200, 1000


def three_instance_logs(kafka: KafkaCluster, tmp_path: Path) -> Path:
    """Each instance carries a share of one client's produce and fetch traffic, then stops (which
    flushes its log)."""
    logs = tmp_path / "logs"
    config = {"access_log": {"dir": str(logs), "format": "json"},
              "quotas": {"entries": [{"client_id": CLIENT_ID, "producer_byte_rate": 100 * 1024 * 1024,
                                      "consumer_byte_rate": 100 * 1024 * 1024}]}}
    topic = create_topic(kafka.bootstrap, unique_name("fleetlogs"))
    for n, name in enumerate(INSTANCES):
        with SluiceProcess(kafka.bootstrap, tmp_path / name, config=config | {"instance": name}) as sluice:
            values = [f"{name}-{i}".encode().ljust(VALUE_BYTES, b".") for i in range(MESSAGES)]
            clients.confluent_produce(sluice.bootstrap, topic, values, {"client.id": CLIENT_ID})
            got = clients.confluent_consume(sluice.bootstrap, topic, MESSAGES * (n + 1), group=f"g-{name}",
                                            config={"client.id": CLIENT_ID})
            assert len(got) == MESSAGES * (n + 1)
    return logs


def produced_bytes_per_instance(logs: Path) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for path in logs.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["api_name"] == "Produce" and record["client_id"] == CLIENT_ID:
                totals[record["instance"]] += record["request_bytes"]
    return dict(totals)


def plan_entries(out: Path) -> list[dict[str, Any]]:
    return list(json.loads((out / "plan.json").read_text())["entries"])


def test_recommend_on_a_standalone_cluster_equals_local(kafka: KafkaCluster, tmp_path: Path,
                                                        repo_root: Path) -> None:
    cluster = StandaloneCluster(tmp_path / "spark", workers=2)
    submits: dict[str, subprocess.Popen[str]] = {}
    try:
        cluster.launch()  # the cluster's JVMs boot while Sluice carries traffic
        logs = three_instance_logs(kafka, tmp_path)
        cluster.wait_ready()
        per_instance = produced_bytes_per_instance(logs)
        assert sorted(per_instance) == list(INSTANCES)

        job = repo_root / "spark_analytics" / "jobs" / "recommend.py"
        args = ["--logs", str(logs), "--percentile", "0.5", "--headroom", "1", "--no-plots", "--no-progress"]
        submits["cluster"] = spark_submit(job, cluster.master_url,
                                          [*args, "--out", str(tmp_path / "cluster")],
                                          cwd=tmp_path / "submit-cluster",
                                          conf={"spark.executor.memory": "512m", "spark.executor.cores": "1",
                                                "spark.cores.max": "2"})
        submits["local"] = spark_submit(job, "local[*]", [*args, "--out", str(tmp_path / "local")],
                                        cwd=tmp_path / "submit-local")
        for name, submit in submits.items():
            _, stderr = submit.communicate(timeout=600)
            assert submit.returncode == 0, f"{name}: {stderr[-3000:]}"

        # the simulation of that plan runs unchanged on the cluster too: its replay is Python in the
        # executors (applyInArrow), which import Sluice's packages from the workers' virtualenv
        simulate = repo_root / "spark_analytics" / "jobs" / "simulate.py"
        sim_args = ["--logs", str(logs), "--plan", str(tmp_path / "cluster" / "plan.json"), "--no-plots",
                    "--no-progress"]
        submits["simulate-cluster"] = spark_submit(
            simulate, cluster.master_url, [*sim_args, "--out", str(tmp_path / "sim-cluster")],
            cwd=tmp_path / "submit-sim-cluster",
            conf={"spark.executor.memory": "512m", "spark.executor.cores": "1", "spark.cores.max": "2"})
        submits["simulate-local"] = spark_submit(simulate, "local[*]",
                                                 [*sim_args, "--out", str(tmp_path / "sim-local")],
                                                 cwd=tmp_path / "submit-sim-local")
        for name in ("simulate-cluster", "simulate-local"):
            _, stderr = submits[name].communicate(timeout=600)
            assert submits[name].returncode == 0, f"{name}: {stderr[-3000:]}"

        # the job ran on the cluster: the master gave it an executor on each worker
        master_log = cluster.log("master")
        assert re.search(r"Registered app \S+ with ID app-", master_log), master_log[-3000:]
        for worker in range(2):
            assert list(cluster.work_dir(worker).glob("app-*/*/stderr")), f"no executor on worker {worker}"
    finally:
        for submit in submits.values():
            if submit.poll() is None:
                os.killpg(submit.pid, signal.SIGKILL)  # its own session: _die_with_parent
                submit.wait(timeout=10)
        cluster.stop()

    from_cluster, from_local = plan_entries(tmp_path / "cluster"), plan_entries(tmp_path / "local")
    assert [(e["entity"], e["quota_key"]) for e in from_cluster] == [
        (f"client-id={CLIENT_ID}", "consumer_byte_rate"), (f"client-id={CLIENT_ID}", "producer_byte_rate")]
    assert len(from_local) == len(from_cluster)
    for got, want in zip(from_cluster, from_local, strict=True):
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, float):  # sums of doubles may differ in the last bit with the partitioning
                assert got[key] == pytest.approx(value, rel=1e-12), (key, got, want)
            else:
                assert got[key] == value, (key, got, want)
    # the same simulation from the cluster as from local[*], for both keys of the fleet's client
    sim_cluster = json.loads((tmp_path / "sim-cluster" / "simulation.json").read_text())["entities"]
    sim_local = json.loads((tmp_path / "sim-local" / "simulation.json").read_text())["entities"]
    assert [(e["entity"], e["quota_key"]) for e in sim_cluster] == [
        (f"client-id={CLIENT_ID}", "consumer_byte_rate"), (f"client-id={CLIENT_ID}", "producer_byte_rate")]
    assert sim_cluster == sim_local
    # one dataset: every instance's bytes are in the fleet's total
    produce = from_cluster[1]
    assert produce["total_bytes"] == sum(per_instance.values())

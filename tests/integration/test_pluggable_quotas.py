"""Pluggable quota logic against real brokers through a real Sluice process: quota groups,
cluster-wide quotas on three brokers, partition-proportional limits, fair shares, and a callback
swapped by SIGHUP.

Windows are 11 x 500 ms as in `test_quota_enforcement`; rates are measured over three whole
periods (16.5 s) from what the broker acknowledged.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import create_topic, unique_name
from tests.harness import load
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.quotas import RUN_S, WINDOW, KiB, MiB
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GROUPS = "quotas.builtin:GroupQuotaCallback"
PROPORTIONAL = "quotas.builtin:PartitionProportionalCallback"
FAIR = "quotas.builtin:FairShareCallback"


def start(kafka: KafkaCluster, tmp_path: Path, quotas: dict[str, Any]) -> tuple[SluiceProcess, Metrics]:
    port = free_port()
    sluice = SluiceProcess(kafka.bootstrap, tmp_path / "sluice",
                           config={"metrics": {"port": port}, "quotas": {"window": WINDOW, **quotas}}).start()
    return sluice, Metrics(port)


def flood_together(bootstrap: str, topic: str, client_ids: list[str], seconds: float,
                   batch_bytes: int = 64 * KiB) -> dict[str, load.Timeline]:
    results: dict[str, load.Timeline] = {}

    def run(name: str) -> None:
        results[name] = load.confluent_flood(bootstrap, topic, seconds, client_id=name,
                                             batch_bytes=batch_bytes)

    threads = [threading.Thread(target=run, args=(c,)) for c in client_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    return results


def spread_topic(bootstrap: str, assignment: list[list[int]]) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = unique_name("spread")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, num_partitions=len(assignment), replica_assignment=assignment)
    futures = admin.create_topics([topic], operation_timeout=30)
    futures[name].result(60)
    return name


# ------------------------------------------------------------------------------------ groups


def test_group_members_share_one_budget(kafka: KafkaCluster, tmp_path: Path) -> None:
    sluice, metrics = start(kafka, tmp_path, {"callback": {"class": GROUPS, "config": {"groups": [
        {"name": "payments", "client_ids": ["pay-a", "pay-b"], "producer_byte_rate": MiB}]}}})
    try:
        topic = create_topic(kafka.bootstrap, unique_name("grp"))
        results = flood_together(sluice.bootstrap, topic, ["pay-a", "pay-b"], RUN_S)
        total = sum(r.rate(0, RUN_S) for r in results.values())
        print(f"group of two: {results['pay-a'].rate(0, RUN_S) / MiB:.2f} + "
              f"{results['pay-b'].rate(0, RUN_S) / MiB:.2f} = {total / MiB:.2f} MiB/s (budget 1)")
        assert 0.8 * MiB <= total <= 1.15 * MiB, total / MiB
        assert metrics.value("sluice_quota_limit", user="<group:payments>", kind="produce") == MiB
        assert metrics.value("sluice_quota_throttled_requests_total", user="<group:payments>", kind="produce")
    finally:
        sluice.stop()


def test_a_callback_grouping_by_a_tag_of_its_own_holds_one_budget_and_shows_it(
        kafka: KafkaCluster, tmp_path: Path) -> None:
    """KIP-257's quotaMetricTags returns any tag map: `TeamQuotaCallback` groups app-a and svc-b
    (no user, client id or prefix in common) by a ``team`` tag. They share one budget; job-c, of
    another team, flows beside them; the metrics and ``/quotas/effective`` carry the tag."""
    budget = 512 * KiB
    sluice, metrics = start(kafka, tmp_path, {
        "rate_model": "token_bucket", "burst_ms": 100,  # rates comparable over any whole span
        "callback": {"class": "tests.harness.callbacks:TeamQuotaCallback", "config": {
            "teams": {"app-a": "payments", "svc-b": "payments", "job-c": "search"},
            "limits": {"payments": {"producer_byte_rate": budget},
                       "search": {"producer_byte_rate": 4 * budget}}}}})
    try:
        topic = create_topic(kafka.bootstrap, unique_name("team"))
        seconds = 10.0
        results = flood_together(sluice.bootstrap, topic, ["app-a", "svc-b", "job-c"], seconds,
                                 batch_bytes=16 * KiB)
        # after the first second (the bucket's burst and the clients' start): one budget for the
        # team within 0.8-1.15 (a shared bucket admits each connection's request whole before its
        # check mutes it: two 16 KiB batches beside 512 KiB/s; the low side is the loaded machine)
        team = sum(results[c].rate(1.0, seconds) for c in ("app-a", "svc-b"))
        search = results["job-c"].rate(1.0, seconds)
        print(f"team payments: {team / budget:.2f} x its budget; job-c (search): {search / budget:.2f} x")
        assert 0.8 * budget <= team <= 1.15 * budget, team / budget
        assert search > 1.3 * budget, search / budget      # not held by payments' budget
        assert metrics.value("sluice_quota_limit", tags="team=payments", kind="produce") == budget
        assert metrics.value("sluice_quota_limit", tags="team=search", kind="produce") == 4 * budget
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/quotas/effective?client_id=svc-b",
                                    timeout=5) as r:
            doc = json.loads(r.read())
        (produce,) = [x for x in doc["limits"] if x["kind"] == "producer_byte_rate"]
        assert produce["group"] == {"team": "payments"} and produce["limit"] == budget
    finally:
        sluice.stop()


# ----------------------------------------------------------------------------- cluster-wide


@pytest.mark.parametrize(("scope", "expected_mib"), [("cluster", 1.0), ("broker", 3.0)])
def test_cluster_scope_holds_one_budget_across_three_brokers(kafka_cluster3: KafkaCluster, tmp_path: Path,
                                                              scope: str, expected_mib: float) -> None:
    sluice, metrics = start(kafka_cluster3, tmp_path, {
        "scope": scope, "entries": [{"client_id": "<default>", "producer_byte_rate": MiB}]})
    try:
        topic = spread_topic(kafka_cluster3.bootstrap, [[1], [2], [3]])
        timeline = load.confluent_flood(sluice.bootstrap, topic, RUN_S, client_id="spread",
                                        batch_bytes=64 * KiB)
        achieved = timeline.rate(0, RUN_S)
        print(f"scope {scope}: {achieved / MiB:.2f} MiB/s over three brokers (1 MiB/s quota)")
        # one shared rate, three connections: each may land a request before its own check mutes
        # it, so a shared budget overshoots a little more than a single connection's (x 1.2).
        # Per broker the three budgets are an upper bound the machine may not reach under load
        # (2.36-3.01 MiB/s measured on 2 shared cores): it must be well above one budget.
        low = 0.8 if scope == "cluster" else 2 / 3
        assert low * expected_mib * MiB <= achieved <= 1.2 * expected_mib * MiB, achieved / MiB
        brokers = "all" if scope == "cluster" else "1"
        assert metrics.value("sluice_quota_limit", broker=brokers, client_id="spread", kind="produce") == MiB
    finally:
        sluice.stop()


def test_cluster_entries_beside_broker_entries_whichever_is_hit_first(kafka_cluster3: KafkaCluster,
                                                                       tmp_path: Path) -> None:
    # the draft's units side by side: 1 MiB/s per broker (broker_bps, 3 MiB/s over three brokers)
    # and 1.5 MiB/s across all of them (bps): the cluster-wide one is hit first
    sluice, metrics = start(kafka_cluster3, tmp_path, {
        "entries": [{"client_id": "<default>", "producer_byte_rate": MiB}],
        "cluster_entries": [{"client_id": "<default>", "producer_byte_rate": 3 * MiB // 2}]})
    try:
        topic = spread_topic(kafka_cluster3.bootstrap, [[1], [2], [3]])
        timeline = load.confluent_flood(sluice.bootstrap, topic, RUN_S, client_id="both",
                                        batch_bytes=64 * KiB)
        achieved = timeline.rate(0, RUN_S)
        print(f"1 MiB/s per broker and 1.5 MiB/s across brokers: {achieved / MiB:.2f} MiB/s")
        assert 0.8 * 1.5 * MiB <= achieved <= 1.2 * 1.5 * MiB, achieved / MiB
        assert metrics.value("sluice_quota_limit", broker="cluster", client_id="both",
                             kind="produce") == 3 * MiB // 2
        assert metrics.value("sluice_quota_limit", broker="2", client_id="both", kind="produce") == MiB
    finally:
        sluice.stop()


# --------------------------------------------------------------------- partition-proportional


def test_partition_proportional_limits_differ_per_broker(kafka_cluster3: KafkaCluster,
                                                         tmp_path: Path) -> None:
    topic = spread_topic(kafka_cluster3.bootstrap, [[1], [1], [2]])
    sluice, metrics = start(kafka_cluster3, tmp_path, {
        "entries": [{"client_id": "<default>", "producer_byte_rate": 3 * MiB}],
        "callback": {"class": PROPORTIONAL,
                     "config": {"topics": [{"client_id": "prop", "topics": [topic]}]}}})
    try:
        load.confluent_flood(sluice.bootstrap, topic, 6, client_id="prop", batch_bytes=64 * KiB)
        limits = {b: metrics.value("sluice_quota_limit", broker=b, client_id="prop", kind="produce")
                  for b in ("1", "2")}
        print(f"proportional limits: {limits}")
        # broker 1 leads 2 of the topic's 3 partitions: 3 MiB x 2/3; broker 2 leads 1: 3 MiB x 1/3
        assert limits == {"1": 2 * MiB, "2": 1 * MiB}

        # move partition 1 (and with replication 1, its leader) from broker 1 to broker 3
        plan = tmp_path / "move.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": 1, "replicas": [3], "log_dirs": ["any"]}]}))
        tools = KafkaTools(kafka_cluster3.bootstrap, workdir=tmp_path)
        reassign = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
        tools.run(reassign, "--bootstrap-server", kafka_cluster3.bootstrap,
                  "--reassignment-json-file", str(plan), "--execute").check()
        deadline = time.monotonic() + 60
        while "is completed" not in tools.run(reassign, "--bootstrap-server", kafka_cluster3.bootstrap,
                                              "--reassignment-json-file", str(plan), "--verify").stdout:
            assert time.monotonic() < deadline, "reassignment did not complete"
            time.sleep(1)
        # a new producer asks for metadata: Sluice sees the new leaders and re-reads the limits
        load.confluent_flood(sluice.bootstrap, topic, 6, client_id="prop", batch_bytes=64 * KiB)
        moved = {b: metrics.value("sluice_quota_limit", broker=b, client_id="prop", kind="produce")
                 for b in ("1", "2", "3")}
        print(f"after moving a leader: {moved}")
        assert moved == {"1": 1 * MiB, "2": 1 * MiB, "3": 1 * MiB}  # one partition each: 3 MiB x 1/3
    finally:
        sluice.stop()


# -------------------------------------------------------------------------------- fair shares


def test_fair_shares_split_a_capacity_and_one_alone_gets_it_all(kafka: KafkaCluster, tmp_path: Path) -> None:
    sluice, _ = start(kafka, tmp_path, {"callback": {"class": FAIR, "config": {
        "capacity": {"producer_byte_rate": 2 * MiB}, "active_ms": 11_000,
        "shares": [{"client_id": "fs-one", "shares": 1}, {"client_id": "fs-three", "shares": 3}]}}})
    try:
        topic = create_topic(kafka.bootstrap, unique_name("fair"))
        both = flood_together(sluice.bootstrap, topic, ["fs-one", "fs-three"], RUN_S + 5.5)
        one, three = (both[c].rate(5.5, RUN_S + 5.5) for c in ("fs-one", "fs-three"))
        time.sleep(12)  # both leave the active set (11 s)
        alone = load.confluent_flood(sluice.bootstrap, topic, RUN_S, client_id="fs-one",
                                     batch_bytes=64 * KiB).rate(0, RUN_S)
        print(f"fair shares 1:3 of 2 MiB/s: {one / MiB:.2f} and {three / MiB:.2f} MiB/s; "
              f"alone: {alone / MiB:.2f} MiB/s")
        assert 0.8 * 0.5 * MiB <= one <= 1.2 * 0.5 * MiB, one / MiB
        assert 0.8 * 1.5 * MiB <= three <= 1.2 * 1.5 * MiB, three / MiB
        assert 0.8 * 2 * MiB <= alone <= 1.15 * 2 * MiB, alone / MiB
    finally:
        sluice.stop()


# -------------------------------------------------------------------------------- live swap


def test_sighup_swaps_the_callback_without_a_restart(kafka: KafkaCluster, tmp_path: Path) -> None:
    sluice, metrics = start(kafka, tmp_path,
                            {"entries": [{"client_id": "<default>", "producer_byte_rate": MiB}]})
    try:
        topic = create_topic(kafka.bootstrap, unique_name("swap"))
        load.confluent_flood(sluice.bootstrap, topic, 3, client_id="swapper", batch_bytes=32 * KiB)
        assert metrics.value("sluice_quota_limit", client_id="swapper", kind="produce") == MiB
        config = yaml.safe_load(sluice.config_path.read_text())
        config["quotas"]["callback"] = {"class": GROUPS, "config": {"groups": [
            {"name": "team", "client_ids": ["swapper"], "producer_byte_rate": 256 * KiB}]}}
        sluice.config_path.write_text(yaml.safe_dump(config))
        sluice.signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "quota callback: quotas.callback:DefaultQuotaCallback -> " + GROUPS not in sluice.log():
            assert time.monotonic() < deadline, sluice.log()
            time.sleep(0.1)
        timeline = load.confluent_flood(sluice.bootstrap, topic, RUN_S, client_id="swapper",
                                        batch_bytes=16 * KiB)
        achieved = timeline.rate(0, RUN_S)
        print(f"after the swap: {achieved / KiB:.0f} KiB/s (group budget 256 KiB/s)")
        assert achieved <= 1.15 * 256 * KiB, achieved / KiB
        assert metrics.value("sluice_quota_limit", user="<group:team>", kind="produce") == 256 * KiB
        assert metrics.value("sluice_quota_limit", client_id="swapper", kind="produce") is None
    finally:
        sluice.stop()

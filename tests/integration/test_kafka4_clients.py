"""Kafka 4.x clients lose nothing through Sluice (issue 15), against real Kafka 4.3.1.

* ApiVersions through Sluice equals the broker's, API by API and version by version.
* Share groups (KIP-932): two members of a share group, Kafka's Java `KafkaShareConsumer` and then
  librdkafka's, consume through Sluice while a fetch quota throttles them; one member leaves
  mid-stream holding acquired, unacknowledged records. Every record produced is accepted exactly
  once, the held records come back to the other member with a higher delivery count, and
  Sluice's metrics (and the Java client's own) show the share fetches were throttled.
* kafka-share-groups (Kafka's tool) describes the group through Sluice.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness import clients
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.rawclient import RawKafkaSocket
from tests.harness.share import ConfluentShareMember, Delivery, JavaShareMember, wait_until
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools

pytestmark = pytest.mark.integration

KiB = 1024
QUOTA = 96 * KiB                       # consumer_byte_rate per client id (per broker, as in Kafka)
WINDOW = {"samples": 11, "size_ms": 500}
RECORDS = 1200                         # 1 KiB each, over 2 partitions
LEAVE_AFTER = 150                      # the second member leaves after accepting this many


def api_versions(address: str) -> dict[int, tuple[int, int]]:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    with RawKafkaSocket(address) as raw:
        raw.send(ApiVersionsRequest(client_software_name="sluice-test", client_software_version="1"))
        _, body = raw.recv(18, 3)
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}


@pytest.fixture
def quota_sluice(kafka: KafkaCluster, tmp_path: Path) -> Iterator[tuple[SluiceProcess, Metrics]]:
    port = free_port()
    entries = [{"client_id": "<default>", "consumer_byte_rate": QUOTA}]
    access_log = {"dir": str(tmp_path / "access"), "format": "json"}
    config: dict[str, Any] = {"metrics": {"port": port}, "access_log": access_log,
                              "quotas": {"window": WINDOW, "entries": entries}}
    sluice = SluiceProcess(kafka.bootstrap, tmp_path / "sluice", config=config).start()
    try:
        yield sluice, Metrics(port)
    finally:
        sluice.stop()


def test_api_versions_through_sluice_equal_the_brokers(kafka: KafkaCluster, quota_sluice: Any) -> None:
    sluice, _ = quota_sluice
    direct = api_versions(kafka.bootstrap)
    through = api_versions(sluice.bootstrap)
    assert through == direct  # Fetch 4-18, ShareFetch 1-2, ShareAcknowledge 1-2, ... nothing capped
    assert through[1] == (4, 18) and through[78] == (1, 2) and through[79] == (1, 2)


def access_records(root: Path) -> list[dict[str, Any]]:
    records = []
    for path in root.rglob("*"):
        if path.is_file() and path.name.endswith(".jsonl"):
            records += [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return records


def produce_records(bootstrap: str, topic: str) -> set[str]:
    values = [f"r{i:05d}-".encode() + b"x" * 1000 for i in range(RECORDS)]
    # small record batches: a share fetch hands out whole batches, and the leaving member must get
    # several before it leaves
    clients.confluent_produce(bootstrap, topic, values, {"batch.size": 16384, "linger.ms": 0})
    return {v.decode() for v in values}


def join_once_given_records(leaver: Any, start: Callable[[], Any]) -> Any:
    """The staying member joins once the leaving one has been given records. Both are then held to
    the same fetch quota and take at most 100 records a poll, so they share what is left and the
    leaver is sure to reach LEAVE_AFTER; had the stayer started first, its first fetches could take
    all but a few records and the leaver would never be given enough to leave with."""
    try:
        assert wait_until(lambda: leaver.log.count() > 0 or bool(leaver.log.held), 120), "leaver got nothing"
    except BaseException:
        leaver.stop()
        raise
    return start()


def check_group_outcome(produced: set[str], members: list[Any], leaver: Any) -> None:
    accepted = [d for m in members for d in m.log.accepted]
    counts = collections.Counter(d.value for d in accepted)
    assert not [v for v, n in counts.items() if n > 1], "a record was accepted twice"
    missing, extra = produced - set(counts), set(counts) - produced
    assert not missing and not extra, f"missing {len(missing)}, extra {len(extra)}"
    assert leaver.log.held, "the leaving member held no records when it left"
    redelivered: dict[str, Delivery] = {d.value: d for m in members if m is not leaver
                                        for d in m.log.accepted}
    for held in leaver.log.held:
        again = redelivered.get(held.value)
        assert again is not None, f"held record {held} was not redelivered to the other member"
        assert again.delivery_count > held.delivery_count >= 1
    for m in members:
        assert not m.log.errors, m.log.errors


def check_throttled(metrics: Metrics, client_id: str) -> None:
    """The member that consumed the bulk was throttled (the one that left early took less than its
    first window allows, so it need not have been)."""
    throttled = metrics.value("sluice_quota_throttled_requests_total", client_id=client_id, kind="fetch")
    assert throttled is not None and throttled > 0, f"{client_id} was never throttled"
    share_fetches = metrics.value("sluice_requests_total", api="ShareFetch")
    assert share_fetches is not None and share_fetches > 0


def test_java_share_group_through_sluice_under_a_fetch_quota(kafka: KafkaCluster, quota_sluice: Any) -> None:
    sluice, metrics = quota_sluice
    topic = create_topic(kafka.bootstrap, unique_name("share-java"), partitions=2)
    group = unique_name("sg-java")
    produced = produce_records(kafka.bootstrap, topic)
    leaver = JavaShareMember(sluice.bootstrap, group, topic, "share-java-b", leave_after=LEAVE_AFTER)
    stayer = join_once_given_records(leaver, lambda: JavaShareMember(sluice.bootstrap, group, topic,
                                                                     "share-java-a"))
    try:
        assert leaver.wait_closed(180), leaver.tail()
        assert wait_until(lambda: len({d.value for m in (stayer, leaver) for d in m.log.accepted}) >= RECORDS,
                          180), stayer.tail()
    finally:
        stayer.stop()
        leaver.stop()
    check_group_outcome(produced, [stayer, leaver], leaver)
    check_throttled(metrics, "share-java-a")
    # the Java client saw Sluice's throttle_time_ms in its share fetch responses (KIP-219 back-off)
    assert stayer.log.throttle_max_ms is not None and stayer.log.throttle_max_ms > 0, stayer.tail()
    # the access log has the share fetches (with their bytes) and the acknowledgements
    def logged() -> collections.Counter[str]:
        return collections.Counter(r["api_name"] for r in access_records(sluice.workdir.parent / "access")
                                   if r["client_id"] in ("share-java-a", "share-java-b")
                                   and (r["api_name"] != "ShareFetch" or (r["response_bytes"] or 0) > 0))
    assert wait_until(lambda: logged()["ShareFetch"] > 0 and logged()["ShareAcknowledge"] > 0, 30), logged()


def test_librdkafka_share_group_through_sluice_under_a_fetch_quota(kafka: KafkaCluster,
                                                                  quota_sluice: Any) -> None:
    sluice, metrics = quota_sluice
    topic = create_topic(kafka.bootstrap, unique_name("share-rdk"), partitions=2)
    group = unique_name("sg-rdk")
    # librdkafka has no admin call for group configs: set share.auto.offset.reset with Kafka's tool
    KafkaTools(sluice.bootstrap).configs("--alter", "--entity-type", "groups", "--entity-name", group,
                                         "--add-config", "share.auto.offset.reset=earliest").check()
    produced = produce_records(kafka.bootstrap, topic)
    leaver = ConfluentShareMember(sluice.bootstrap, group, topic, "share-rdk-b", leave_after=LEAVE_AFTER)
    stayer = join_once_given_records(leaver, lambda: ConfluentShareMember(sluice.bootstrap, group, topic,
                                                                          "share-rdk-a"))
    try:
        assert leaver.wait_closed(180), leaver.failure
        assert wait_until(lambda: len({d.value for m in (stayer, leaver) for d in m.log.accepted}) >= RECORDS,
                          180), (stayer.failure, stayer.log.count())
    finally:
        stayer.stop()
        leaver.stop()
    assert stayer.failure is None and leaver.failure is None, (stayer.failure, leaver.failure)
    check_group_outcome(produced, [stayer, leaver], leaver)
    check_throttled(metrics, "share-rdk-a")


def test_kafka_share_groups_tool_describes_the_group_through_sluice(kafka: KafkaCluster, quota_sluice: Any,
                                                                   tmp_path: Path) -> None:
    sluice, _ = quota_sluice
    topic = create_topic(kafka.bootstrap, unique_name("share-tool"), partitions=2)
    group = unique_name("sg-tool")
    member = JavaShareMember(sluice.bootstrap, group, topic, "share-tool-a")
    try:
        produce_records(kafka.bootstrap, topic)
        assert wait_until(lambda: member.log.count() >= 50, 120), member.tail()
        tools = KafkaTools(sluice.bootstrap, workdir=tmp_path)
        main = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"
        members = tools.run(main, "--bootstrap-server", sluice.bootstrap, "--describe", "--group", group,
                            "--members").check()
        assert "share-tool-a" in members.stdout, members.stdout  # CLIENT-ID column of the member
        offsets = tools.run(main, "--bootstrap-server", sluice.bootstrap, "--describe", "--group",
                            group).check()
        assert topic in offsets.stdout and group in offsets.stdout, offsets.stdout
        listed = tools.run(main, "--bootstrap-server", sluice.bootstrap, "--list").check()
        assert group in listed.stdout.split()
    finally:
        member.stop()

"""The Kafka quota store never loses a change (issue 28), through real Sluice processes.

Four writer processes (kafka-python's AlterClientQuotas, `tests.harness.quota_writer`) each own
one quota key and set it on the same ten entities, 25 rounds each (250 changes per writer, 1,000
in all, batched ten per request), alternating between two Sluice instances of two workers each
that share one `store: {type: kafka}` topic. Every answer must be error 0 and, afterwards, every
(entity, key) must hold its writer's last value on every process of both instances.

On the old store (one record per entity, read-modify-write), the same race loses changes: the
writers of different keys overwrite each other's entity records.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from protocol.quota_client import QuotaClient, Stream
from tests.conftest import unique_name
from tests.harness.kafka import REPO, KafkaCluster
from tests.harness.quota_writer import value_for
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import eventually

pytestmark = pytest.mark.integration

KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_rate", "request_percentage")
ROUNDS = 25


def connect(host: str, port: int, timeout_s: float) -> Stream:
    return socket.create_connection((host, port), timeout=timeout_s)


def entities(tag: str) -> list[dict[str, str]]:
    """Ten entities of Kafka's and Sluice's types, every writer writing each of them."""
    out: list[dict[str, str]] = [{"client-id": f"{tag}-c{i}"} for i in range(6)]
    out += [{"user": f"{tag}-u"}, {"user": f"{tag}-u", "client-id": f"{tag}-c0"},
            {"client-id-prefix": f"{tag}-p-"}, {"user": f"{tag}-u", "client-id-prefix": f"{tag}-p-"}]
    return out


def described(bootstrap: str, tag: str) -> dict[str, dict[str, float]]:
    """What one fresh connection to `bootstrap` (so any of its workers) describes for `tag`'s entities."""
    with QuotaClient(bootstrap, connect, client_id="store-race-check") as client:
        return {json.dumps(dict(sorted(e.entity)), sort_keys=True): dict(e.values)
                for e in client.describe() if any(tag in (n or "") for _t, n in e.entity)}


def start(kafka: KafkaCluster, workdir: Path, store: dict[str, Any], instance: str) -> SluiceProcess:
    config = {"admins": ["ANONYMOUS"], "instance": instance, "store": store}
    return SluiceProcess(kafka.bootstrap, workdir, config=config, workers=2).start()


def test_concurrent_changes_to_different_keys_through_two_instances_all_land(kafka: KafkaCluster,
                                                                            tmp_path: Path) -> None:
    store = {"type": "kafka", "topic": unique_name("sluice-quotas-race")}
    tag = unique_name("race")
    targets = entities(tag)
    first = start(kafka, tmp_path / "a", store, "race-a")
    second = start(kafka, tmp_path / "b", store, "race-b")
    try:
        bootstraps = [first.bootstrap, second.bootstrap]
        writers = [subprocess.Popen([sys.executable, "-m", "tests.harness.quota_writer", key, str(ROUNDS),
                                     *(bootstraps if i % 2 == 0 else bootstraps[::-1]),
                                     "--entities", json.dumps(targets)],
                                    cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for i, key in enumerate(KEYS)]
        answers = []
        for writer in writers:
            out, err = writer.communicate(timeout=120)
            assert writer.returncode == 0, f"writer failed: {out} {err[-2000:]}"
            answers.append(json.loads(out.strip().splitlines()[-1]))
        assert [a["errors"] for a in answers] == [[]] * len(KEYS)  # no error answered
        want = {json.dumps(dict(sorted(e.items())), sort_keys=True): {k: value_for(k, ROUNDS) for k in KEYS}
                for e in targets}
        # every process of both instances: several fresh connections per instance reach both workers
        for bootstrap in bootstraps:
            for _ in range(4):
                got = eventually(lambda b=bootstrap: described(b, tag), lambda g: g == want, timeout_s=10)
                lost = {(e, k): (v, got.get(e, {}).get(k))
                        for e, vals in want.items() for k, v in vals.items() if got.get(e, {}).get(k) != v}
                assert got == want, (f"{len(lost)} of {len(targets) * len(KEYS)} final values lost on "
                                     f"{bootstrap} (wanted, got): {lost}")
    finally:
        first.stop()
        second.stop()

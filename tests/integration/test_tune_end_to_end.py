"""The whole loop: real traffic through Sluice writes access logs, the Spark job recommends a
quota from them, `--apply` writes it to Sluice over AlterClientQuotas, and Sluice then throttles
the client to the new value."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness import load
from tests.harness.kafka import REPO, KafkaCluster
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.spark_processes, pytest.mark.slow]

KiB = 1024
PERIOD_S = 11 * 0.5


def test_logs_recommend_apply_and_sluice_throttles_to_the_new_quota(kafka: KafkaCluster,
                                                                   tmp_path: Path) -> None:
    config = {
        "access_log": {"dir": str(tmp_path / "logs")},
        "store": {"type": "sqlite", "path": str(tmp_path / "quotas.db")},
        "admins": ["ANONYMOUS"], "allow_anonymous_admins": True,  # a plaintext test listener
        "quotas": {"window": {"samples": 11, "size_ms": 500},
                   "entries": [{"client_id": "tuned", "producer_byte_rate": 50 * 1024 * KiB}]},
    }
    topic = create_topic(kafka.bootstrap, unique_name("tune"))

    # 1. a client that really uses about 200 KiB/s, logged by Sluice
    with SluiceProcess(kafka.bootstrap, tmp_path / "s1", config=config) as first:
        used = load.confluent_flood(first.bootstrap, topic, 8, client_id="tuned",
                                    rate_bytes_per_s=200 * KiB, batch_bytes=16 * KiB)
    assert used.rate_from_first(7) > 150 * KiB

    with SluiceProcess(kafka.bootstrap, tmp_path / "s2", config=config) as sluice:
        # 2. the job recommends p50 x 0.5 (~100 KiB/s) and applies it to Sluice
        done = subprocess.run(
            [sys.executable, "-m", "proxy", "tune", "run", "--logs", str(tmp_path / "logs"),
             "--out", str(tmp_path / "plan"), "--bootstrap-server", sluice.bootstrap, "--apply",
             "--percentile", "0.5", "--headroom", "0.5", "--no-max-change", "--keys", "producer_byte_rate",
             "--no-plots", "--master", "local[2]", "--no-progress"],
            cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        plan = json.loads((tmp_path / "plan" / "plan" / "plan.json").read_text())
        (entry,) = [e for e in plan["entries"] if e["entity"] == "client-id=tuned"]
        recommended = float(entry["recommended"])
        assert 60 * KiB <= recommended <= 140 * KiB, entry

        # 3. Sluice now holds that quota: kafka-configs (Java) reads it back from Sluice
        described = KafkaTools(sluice.bootstrap, workdir=tmp_path).configs(
            "--describe", "--entity-type", "clients", "--entity-name", "tuned").check().stdout
        value = float(re.search(r"producer_byte_rate=([\d.]+)", described).group(1))  # type: ignore[union-attr]
        assert value == recommended

        # 4. and throttles the client to it
        flood = load.confluent_flood(sluice.bootstrap, topic, 3 * PERIOD_S, client_id="tuned",
                                     batch_bytes=8 * KiB)
        achieved = flood.rate(0, 3 * PERIOD_S)
        assert 0.8 * recommended <= achieved <= 1.2 * recommended, (achieved, recommended)

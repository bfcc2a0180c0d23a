"""The fleet benchmark runs end to end (`--quick`: one instance alone and a two-instance fleet,
a demand shift and a SIGKILL, the exchange's idle cost, one and two workers) and writes a complete
results file.

No thresholds on the ratios: on a shared 2-core machine the numbers are noise-prone; the benchmark
itself reports them against the goal (+/-3 %, at worst +/-5 %).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kafka import REPO, KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def check_report(report: dict[str, Any], quick: bool) -> None:
    assert report["benchmark"] == "fleet" and report["quick"] is quick
    assert report["quota_bytes_per_s"] > 0 and report["window"] == {"samples": 11, "size_ms": 500}
    names = {c["name"] for c in report["cases"]}
    assert {"alone", "fleet-2"} <= names
    for case in report["cases"]:
        if "error_text" in case:
            continue
        assert case["rate_bytes_per_s"] > 0
        quota = report["quota_bytes_per_s"]
        assert case["ratio"] == pytest.approx(case["rate_bytes_per_s"] / quota, rel=1e-3)
        if case["workload"] == "produce":
            assert case["rate_method"] in ("cycles", "plain")
        assert len(case["load_avg"]) == 3
    assert [s["event"] for s in report["convergence"]] == ["demand_shift", "sigkill"]
    for shift in report["convergence"]:
        assert shift["shares"], "no share samples"
        # the members' shares were read from /metrics: every live member reported one
        assert any(all(v is not None for v in row) for _, row in shift["shares"])
        assert shift["per_second_ratio"] and all(v >= 0 for v in shift["per_second_ratio"])
        assert shift["before_ratio"] > 0 and shift["after_ratio"] > 0
    members = report["exchange"]["members"]
    assert len(members) == 3 and len(report["exchange"]["plain_cpu_fraction"]) == 3
    for m in members:   # an idle member still reports (its heartbeat)
        assert m["reports_per_s"] > 0 and m["report_bytes_per_s"] > 0 and m["cpu_fraction"] >= 0
    assert [w["workers"] for w in report["workers"]][:2] == [1, 2]
    for w in report["workers"]:
        assert w["requests"] > 0 and w["worker_cpu_s"] > 0 and w["requests_per_cpu_s"] > 0


@pytest.mark.timeout(600)
def test_quick_fleet_benchmark_writes_a_complete_report(kafka: KafkaCluster, tmp_path: Path) -> None:
    """Against the session's broker (the benchmark's topics, fleets and client ids are its own)."""
    out = tmp_path / "fleet.json"
    done = subprocess.run([sys.executable, "-m", "bench.bench_fleet", "--quick", "--out", str(out),
                           "--workdir", str(tmp_path / "work"), "--bootstrap", kafka.bootstrap],
                          cwd=REPO, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "achieved/Q" in done.stdout and "requests per CPU-second" in done.stdout   # the table
    assert out.with_suffix(".png").stat().st_size > 0
    check_report(json.loads(out.read_text()), quick=True)


def test_the_recorded_full_run_is_complete() -> None:
    report = json.loads((REPO / "bench" / "results" / "fleet.json").read_text())
    check_report(report, quick=False)
    assert {"no-fleet-3", "fleet-1", "fleet-3", "workers-3"} <= {c["name"] for c in report["cases"]}
    assert [w["workers"] for w in report["workers"]] == [1, 2, 3]

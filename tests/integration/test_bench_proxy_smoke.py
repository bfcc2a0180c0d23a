"""The proxy benchmark runs end to end (`--smoke`: every path, workload and field at a tiny size) and
writes a complete results file.

No timing thresholds: on a shared 2-core machine the numbers are noise-prone; the benchmark itself
reports them against the targets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.kafka import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PATHS = ("direct", "sluice", "raw")


@pytest.mark.timeout(600)
def test_quick_benchmark_writes_all_three_paths(tmp_path: Path) -> None:
    out = tmp_path / "proxy.json"
    done = subprocess.run([sys.executable, "-m", "bench.bench_proxy", "--smoke", "--no-chart",
                           "--out", str(out), "--workdir", str(tmp_path / "work")],
                          cwd=REPO, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "produce MB/s" in done.stdout  # the table

    report = json.loads(out.read_text())
    assert report["machine"]["cpu_count"] >= 1
    assert report["paths"] == list(PATHS)
    results = report["results"]
    for workload in ("produce", "fetch"):
        median = results[workload]["median"]
        assert set(median) == set(PATHS)
        assert all(median[p] > 0 for p in PATHS), median
        assert all(v is not None and v > 0 for v in results[workload]["ratios"].values())
        for path in ("sluice", "raw"):
            assert results[workload]["runs"][path][0]["proxy_cpu_s"] >= 0
    for workload in ("latency_produce", "latency_apiversions"):
        for q in ("p50_ms", "p99_ms"):
            assert set(results[workload][q]) == set(PATHS)
            assert all(results[workload][q][p] > 0 for p in PATHS)
        assert set(results[workload]["added_p99_ms"]) == {"sluice", "raw"}
    # Sluice ran with a quota for every client (the default): the engine recorded the clients'
    # requests (sensors exist only once a request has been recorded) and throttled none
    quotas = report["quotas"]
    assert quotas["enabled"] is True and quotas["entries"][0]["client_id"] == "<default>", quotas
    assert quotas["configured_values"] >= 2, quotas
    assert quotas["sensors"] >= 1, quotas
    assert quotas["throttled_requests"] == 0 and quotas["shadow_would_throttle"] == 0, quotas
    assert "quotas: a default client-id quota" in done.stdout
    assert {t["name"] for t in report["targets"]} >= {"produce sluice/direct", "fetch sluice/raw",
                                                      "produce added p99 ms"}

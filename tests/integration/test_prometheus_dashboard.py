"""The Grafana dashboard's queries, evaluated by a real Prometheus scraping a live, throttling Sluice.

Sluice runs with a small produce quota and a librdkafka producer flooding it (held back by the
quota), plus a shadow entry, a consumer and request quotas, so every kind of series the dashboard
draws exists. Prometheus (Debian's package, our own child process) scrapes Sluice every second;
then every panel's PromQL, with the dashboard's variables at "All", must return series through
`/api/v1/query`, and the throttle panels must show the throttled client.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness import clients, load
from tests.harness.kafka import KafkaCluster
from tests.harness.prometheus import PrometheusProcess
from tests.harness.quotas import KiB, start_sluice
from tests.harness.wait import eventually, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FLOOD = "metrics-flood"


def dashboard_queries(repo_root: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """Every panel target as (panel title, PromQL with the variables at "All"), and the template
    variables' `label_values(...)` queries."""
    dashboard = json.loads((repo_root / "deploy" / "grafana" / "sluice-dashboard.json").read_text())
    variables = {v["name"]: v.get("allValue", ".*") for v in dashboard["templating"]["list"]
                 if v["type"] == "query"}

    def expand(expr: str) -> str:
        for name, value in variables.items():
            expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
        return expr

    targets = [(p["title"], expand(t["expr"])) for p in dashboard["panels"] for t in p["targets"]]
    templates = [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return targets, templates


def client_ids(result: list[dict[str, Any]]) -> set[str]:
    return {series["metric"].get("client_id", "") for series in result}


def values_of(result: list[dict[str, Any]], client_id: str) -> list[float]:
    return [float(s["value"][1]) for s in result if s["metric"].get("client_id") == client_id]


def test_every_dashboard_panel_returns_series_from_a_real_prometheus(kafka: KafkaCluster, tmp_path: Path,
                                                                    repo_root: Path) -> None:
    targets, templates = dashboard_queries(repo_root)
    assert len(targets) >= 15
    throttle_exprs = [expr for _, expr in targets if "client_id" in expr
                      and re.search(r"sluice_quota_throttle(d_requests_total|_time_(avg|max)_ms)\b", expr)]
    assert len(throttle_exprs) == 3, throttle_exprs   # throttle time avg and max, throttled requests
    labels_used = {m for _, e in targets for m in re.findall(r"(\w+)=~?\"", e)}
    assert labels_used <= {"user", "client_id", "kind", "broker", "api", "listener", "mode"}

    sluice, metrics = start_sluice(kafka, tmp_path, [
        {"client_id": "<default>", "producer_byte_rate": 64 * KiB, "consumer_byte_rate": 64 * KiB,
         "request_percentage": 1000},
        {"client_id": "shadowy", "producer_byte_rate": 1000, "shadow": True},
        {"user": "<default>", "request_rate": 10000}])
    prometheus = PrometheusProcess(tmp_path / "prometheus", [f"127.0.0.1:{metrics.port}"])
    stop = threading.Event()
    flood: threading.Thread | None = None
    try:
        prometheus.start()
        flood_topic = create_topic(sluice.bootstrap, unique_name("prom-flood"))
        flood = threading.Thread(target=load.confluent_flood, daemon=True,
                                 args=(sluice.bootstrap, flood_topic, 60),
                                 kwargs={"client_id": FLOOD, "batch_bytes": 16 * KiB, "stop": stop})
        flood.start()
        side_topic = create_topic(sluice.bootstrap, unique_name("prom-side"))
        clients.confluent_produce(sluice.bootstrap, side_topic, [b"s" * 1000] * 50, {"client.id": "shadowy"})
        clients.confluent_consume(sluice.bootstrap, side_topic, 50, config={"client.id": "metrics-consumer"})
        wait_until(prometheus.targets_up, 10, "Prometheus to scrape Sluice")

        # Wait until Prometheus has seen it all (rate() needs two scrapes of a counter's series).
        def answers() -> dict[str, list[dict[str, Any]]]:
            return {expr: prometheus.query(expr) for _, expr in targets}

        def complete(got: dict[str, list[dict[str, Any]]]) -> bool:
            return all(got.values()) and all(any(v > 0 for v in values_of(got[e], FLOOD))
                                             for e in throttle_exprs)

        got = eventually(answers, complete, timeout_s=30, interval_s=0.5)
        empty = [f"{title}: {expr}" for title, expr in targets if not got[expr]]
        assert not empty, "panel queries that returned no series:\n" + "\n".join(empty)
        for expr in throttle_exprs:  # the throttled client's own series, with a real throttle
            assert any(v > 0 for v in values_of(got[expr], FLOOD)), f"{expr} without {FLOOD}: {got[expr]}"
        # under the default cap (2000) nothing is folded into the __overflow__ series
        assert all("__overflow__" not in client_ids(result) for result in got.values())

        # The template variables (Grafana's label_values(metric, label)) list the flooding client.
        for query in templates:
            m = re.fullmatch(r"label_values\((\w+), (\w+)\)", query)
            assert m is not None, query
            values = prometheus.label_values(m.group(2), m.group(1))
            assert values, query
        assert FLOOD in prometheus.label_values("client_id", "sluice_quota_limit")
    finally:
        stop.set()
        if flood is not None:
            flood.join(30)
        prometheus.stop()
        sluice.stop()


"""The compose example's shape, run for real without containers: deploy/compose/sluice.yaml (fleet,
Kafka quota store) on two Sluice instances that listen on the same ports at 127.0.0.2 and 127.0.0.3
(as two containers would), and deploy/compose/haproxy.cfg (Debian's haproxy) in front of them at
127.0.0.1, the one advertised host. Clients reach the broker only through the load balancer, and
both instances serve them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import create_topic, unique_name
from tests.harness import clients
from tests.harness.kafka import KafkaCluster, _die_with_parent, free_port
from tests.harness.sluice import SluiceProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose"
INSTANCES = {"sluice-1": "127.0.0.2", "sluice-2": "127.0.0.3"}
PRODUCERS, MESSAGES = 4, 50


def haproxy_config(bootstrap_port: int, broker_port: int, metrics_port: int) -> str:
    """deploy/compose/haproxy.cfg on loopback: the same frontend, backend and health check; the
    compose names and ports replaced by this test's."""
    text = (COMPOSE / "haproxy.cfg").read_text()
    text = re.sub(r"resolvers docker\n.*\n", "", text)
    text = text.replace("bind :9092", f"bind 127.0.0.1:{bootstrap_port}")
    text = re.sub(r"bind :9100-9109", f"bind 127.0.0.1:{broker_port}", text)
    text = text.replace("check port 9404 inter 2s fall 2 rise 2 resolvers docker init-addr last,libc,none",
                        f"check port {metrics_port} inter 500ms fall 2 rise 1")
    for name, host in INSTANCES.items():
        text = text.replace(f"server {name} {name}", f"server {name} {host}")
    assert "docker" not in text and "9404" not in text, text
    return text


def read_records(root: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(root.rglob("*.jsonl"))
            for line in path.read_text().splitlines()]


def test_two_instances_behind_haproxy_serve_every_port(kafka: KafkaCluster, tmp_path: Path) -> None:
    haproxy = shutil.which("haproxy")
    assert haproxy is not None, "haproxy missing: run scripts/setup"
    bootstrap_port, broker_port, metrics_port = free_port(), free_port(), free_port()
    logs = tmp_path / "logs"
    base = yaml.safe_load((COMPOSE / "sluice.yaml").read_text())
    fleet = unique_name("lbfleet")
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy_config(bootstrap_port, broker_port, metrics_port))

    (node_id,) = [n.node_id for n in kafka.nodes]
    sluices: list[SluiceProcess] = []
    lb: subprocess.Popen[str] | None = None
    try:
        for name, host in INSTANCES.items():
            config = base | {
                "listen": f"{host}:{bootstrap_port}", "advertised_host": "127.0.0.1",
                "broker_port_base": broker_port - node_id,
                "upstream": {"bootstrap": kafka.bootstrap}, "instance": name, "workers": 1,
                "metrics": {"host": host, "port": metrics_port},
                "access_log": {"dir": str(logs), "format": "json"},
                "store": base["store"] | {"topic": f"{fleet}-quotas"},
                "fleet": base["fleet"] | {"id": fleet, "topic": f"{fleet}-reports", "expected_members": 2},
            }
            sluices.append(SluiceProcess(kafka.bootstrap, tmp_path / name, config=config).start(timeout_s=60))
        lb = subprocess.Popen([haproxy, "-db", "-f", str(cfg)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, preexec_fn=_die_with_parent)

        address = f"127.0.0.1:{bootstrap_port}"
        topic = create_topic(kafka.bootstrap, unique_name("lb"))
        from confluent_kafka import Producer

        producers = [Producer({"bootstrap.servers": address, "client.id": f"lb-{i}", "linger.ms": 5})
                     for i in range(PRODUCERS)]  # open together: leastconn spreads them
        for i, producer in enumerate(producers):
            for n in range(MESSAGES):
                producer.produce(topic, f"p{i}-{n}".encode())
        for producer in producers:
            assert producer.flush(60) == 0
        got = clients.confluent_consume(address, topic, PRODUCERS * MESSAGES, config={"client.id": "lb-c"})
        assert sorted(got) == sorted(f"p{i}-{n}".encode() for i in range(PRODUCERS) for n in range(MESSAGES))
    finally:
        for sluice in sluices:
            sluice.stop()
        if lb is not None:
            lb.terminate()
            lb.wait(timeout=10)

    produce = [r for r in read_records(logs) if r["api_name"] == "Produce"]
    served = {r["instance"] for r in produce}
    assert served == set(INSTANCES), served  # both instances carried produce traffic ...
    assert {r["broker_id"] for r in produce} == {node_id}  # ... on the per-broker port, through haproxy

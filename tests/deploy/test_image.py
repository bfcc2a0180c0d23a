"""The real image: the repository's Dockerfile built from a debootstrapped Debian base with buildah,
run with podman as the Kubernetes sample runs its pod (deploy/kubernetes/deployment.yaml and
configmap.yaml): the pod's user, a read-only root, its capabilities dropped, its volumes (the config
read-only, the access-log and runtime emptyDirs), its environment and arguments, `workers: 2`.

Only what ties the sample to a cluster is changed for this machine: the addresses (the session
Kafka; free ports on the host network, the pod at 127.0.0.2), the fleet's and store's topic names,
and one pod's two workers as the fleet's expected members. Clients reach it as they would through
the Service: through a load balancer sending PROXY v2 (the compose sample's haproxy.cfg, one
server). The metrics port comes from the image's own variable (SLUICE_METRICS__PORT), which the
HEALTHCHECK follows.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from protocol.apis import ApiKey
from tests.conftest import create_topic, unique_name
from tests.harness import clients, haproxy
from tests.harness.image import Container, base_image, build_image, chown_tree, image_config, missing_tools
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.rawclient import RawKafkaSocket, fetch_request_v12
from tests.harness.wait import eventually, wait_until

# the image's build (in the module's first test's setup) is bounded by its own 1,200 s
# (tests/harness/image.py); pytest's default 300 s stopped it on this machine at load 30
pytestmark = [pytest.mark.integration, pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
RECORDS = 300
POD_HOST = "127.0.0.2"    # the pod's address; the load balancer listens on 127.0.0.1


def k8s_doc(kind: str) -> dict[str, Any]:
    docs = [d for path in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


@pytest.fixture(scope="module")
def image() -> str:
    missing = missing_tools()
    assert not missing, f"{missing} missing: run scripts/setup"
    return build_image(base_image())


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return -1


def test_the_image_sets_the_metrics_port_its_healthcheck_reads(image: str) -> None:
    inspected = image_config(image)
    config = inspected["Config"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["SLUICE_METRICS__HOST"] == "0.0.0.0" and env["SLUICE_METRICS__PORT"] == "9404"
    test = inspected["Healthcheck"]["Test"]  # podman shows it beside Config
    assert test[0] == "CMD" and "os.environ['SLUICE_METRICS__PORT']" in test[-1]
    assert config["User"] == "10001:10001"
    assert "9404/tcp" in config["ExposedPorts"]


@dataclass(frozen=True)
class Pod:
    container: Container
    address: str          # the load balancer's bootstrap address
    metrics_port: int
    access_logs: Path     # the host directory behind the access-log emptyDir


@pytest.fixture
def pod(image: str, kafka: KafkaCluster, tmp_path: Path) -> Iterator[Pod]:
    deployment = k8s_doc("Deployment")
    template = deployment["spec"]["template"]["spec"]
    (spec,) = template["containers"]
    security, pod_security = spec["securityContext"], template["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["capabilities"]["drop"] == ["ALL"]
    uid, gid = pod_security["runAsUser"], pod_security["fsGroup"]

    config = yaml.safe_load(k8s_doc("ConfigMap")["data"]["sluice.yaml"])
    assert config["workers"] == 2
    (node_id,) = [n.node_id for n in kafka.nodes]
    fleet = unique_name("imgfleet")
    bootstrap_port, broker_port = free_port(), free_port()
    assert config["proxy_protocol"] == "v2"
    config |= {"listen": f"{POD_HOST}:{bootstrap_port}", "advertised_host": "127.0.0.1",
               "broker_port_base": broker_port - node_id,
               "upstream": {"bootstrap": kafka.bootstrap},
               "store": config["store"] | {"topic": f"{fleet}-quotas"},
               "fleet": config["fleet"] | {"id": fleet, "topic": f"{fleet}-reports", "expected_members": 2}}

    volumes = {v["name"]: v for v in template["volumes"]}
    options = ["--network", "host", "--user", f"{uid}:{gid}", "--read-only", "--read-only-tmpfs=false",
               "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    host_dirs: dict[str, Path] = {}
    for mount in spec["volumeMounts"]:
        volume, host = volumes[mount["name"]], tmp_path / mount["name"]
        host.mkdir()
        if "configMap" in volume:
            (host / "sluice.yaml").write_text(yaml.safe_dump(config))
            assert mount.get("readOnly") is True
        else:
            assert "emptyDir" in volume, volume
            chown_tree(host, uid, gid)  # an emptyDir is writable by the pod's fsGroup
        host_dirs[mount["mountPath"]] = host
        options += ["-v", f"{host}:{mount['mountPath']}" + (":ro" if mount.get("readOnly") else "")]
    pod_name = f"sluice-{unique_name('pod')}"
    env = {"SLUICE_METRICS__PORT": str(free_port())}
    for var in spec["env"]:
        assert var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        env[var["name"]] = pod_name
    metrics_port = int(env["SLUICE_METRICS__PORT"])
    (tmp_path / "haproxy.cfg").write_text(
        haproxy.config({"sluice-1": POD_HOST}, bootstrap_port, broker_port, metrics_port))
    container = Container(image, pod_name, options, env, spec["args"], tmp_path / "container.log").start()
    lb: haproxy.Haproxy | None = None
    try:
        assert container.wait_for_log("sluice ready: bootstrap", 180), container.log()[-4000:]
        lb = haproxy.Haproxy(tmp_path / "haproxy.cfg")
        address = f"127.0.0.1:{bootstrap_port}"
        wait_until(lambda: haproxy.listening(address), 30, "haproxy listening")
        yield Pod(container, address, metrics_port, host_dirs[config["access_log"]["dir"]])
    finally:
        container.remove()
        if lb is not None:
            lb.stop()


def test_the_image_runs_as_the_kubernetes_sample_runs_its_pod(pod: Pod, kafka: KafkaCluster) -> None:
    container, bootstrap, access_logs = pod.container, pod.address, pod.access_logs
    assert "all 2 workers ready" in container.log(), container.log()[-3000:]
    assert "data plane: compiled (protocol._speedups)" in container.log()  # the build stage compiled it
    assert "quota stats: compiled (quotas._speedups)" in container.log()
    assert container.exec("id", "-u").stdout.strip() == "10001"
    assert container.exec("touch", "/var/lib/sluice/x").returncode != 0  # the root is read-only
    has = container.exec("python", "-c", "import importlib.util as u, sys; "
                         "print([m for m in sys.argv[1:] if u.find_spec(m)])",
                         "confluent_kafka", "pyarrow", "uvloop", "pytest", "ruff", "pyspark").stdout
    assert has.strip() == "['confluent_kafka', 'pyarrow', 'uvloop']", has  # runtime dependencies only

    # /healthz from outside the container, and the image's own HEALTHCHECK command inside it
    assert eventually(lambda: healthz(pod.metrics_port), lambda s: s == 200) == 200
    test = image_config(container.image)["Healthcheck"]["Test"]
    check = container.exec(*test[1:])
    assert check.returncode == 0, check.stdout + check.stderr

    # records through both workers' listeners, produced idempotently, all in Kafka once
    topic = create_topic(kafka.bootstrap, unique_name("image"))
    sent = clients.values(RECORDS, "img")
    clients.confluent_produce(bootstrap, topic, sent, config={"enable.idempotence": True, "acks": "all"})
    assert sorted(clients.confluent_consume(kafka.bootstrap, topic, RECORDS)) == sorted(sent)

    # SIGTERM with a request in flight (through the load balancer): it is answered, then the
    # container exits 0
    with RawKafkaSocket(bootstrap) as raw:
        correlation_id = raw.send(fetch_request_v12(topic, offset=RECORDS, max_wait_ms=3000))  # a long poll
        container.kill("TERM")
        got_id, body = raw.recv(ApiKey.FETCH, 12)
        assert (got_id, body.error_code) == (correlation_id, 0)
        assert raw.at_eof(15.0)
    assert container.wait(90) == 0, container.log()[-4000:]
    assert "request(s) in flight" in container.log()
    written = sorted(p for p in access_logs.rglob("*") if p.is_file())  # the emptyDir, by the pod's user
    assert written and all(p.name.startswith(container.name) for p in written), written
    assert all(os.stat(p).st_uid == 10001 for p in written)
    # PROXY v2: the access log names the client (127.0.0.1), not the load balancer (127.0.0.9)
    hosts = {address.rsplit(":", 1)[0] for p in written
             for address in pq.read_table(p, columns=["client_address"]).column(0).to_pylist()}
    assert hosts == {"127.0.0.1"}, hosts

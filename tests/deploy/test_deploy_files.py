"""deploy/: every Kubernetes manifest passes kubernetes-validate (strict, the Kubernetes JSON schemas
bundled in the package, offline), the compose file passes check-jsonschema's vendored compose-spec
schema, every embedded sluice.yaml loads with Sluice's own `load_config` (a wrong key fails), and
the ports agree: what Sluice serves is what the load balancer forwards and publishes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.config import ConfigError, ProxyConfig, load_config

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
COMPOSE = REPO / "deploy" / "compose"
K8S_VERSION = "1.37.0"  # the newest schema set kubernetes-validate bundles
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def manifests() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return docs


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in manifests() if doc["kind"] == kind]


def load_embedded(text: str, tmp_path: Path, environ: dict[str, str]) -> ProxyConfig:
    path = tmp_path / "sluice.yaml"
    path.write_text(text)
    return load_config(path, environ=environ)


def broker_ports(config: ProxyConfig, node_ids: range) -> set[int]:
    base = config.broker_port_base
    assert base is not None, "deploy examples set broker_port_base: the load balancer forwards that range"
    return {base + node for node in node_ids}


# ------------------------------------------------------------------------------ Kubernetes

def test_every_manifest_is_valid_kubernetes() -> None:
    docs = manifests()
    assert {doc["kind"] for _, doc in docs} == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    for name, doc in docs:
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True), name


def test_the_validator_refuses_a_wrong_manifest() -> None:
    (deployment,) = by_kind("Deployment")
    spec = {("replica" if k == "replicas" else k): v for k, v in deployment["spec"].items()}
    typo = deployment | {"spec": spec}
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)


def test_configmap_sluice_yaml_loads(tmp_path: Path) -> None:
    (configmap,) = by_kind("ConfigMap")
    config = load_embedded(configmap["data"]["sluice.yaml"], tmp_path, {"SLUICE_INSTANCE": "sluice-7d9f-x2k"})
    assert config.fleet is not None and config.store.type == "kafka"
    assert config.workers >= 1 and config.metrics.port is not None
    # a wrong key in that file would have stopped Sluice at start: the same loader refuses it here
    with pytest.raises(ConfigError, match="fleets"):
        load_embedded(configmap["data"]["sluice.yaml"].replace("fleet:", "fleets:"), tmp_path, {})


def test_deployment_service_probes_and_budget_fit_together(tmp_path: Path) -> None:
    (configmap,) = by_kind("ConfigMap")
    config = load_embedded(configmap["data"]["sluice.yaml"], tmp_path, {"SLUICE_INSTANCE": "sluice-0"})
    (deployment,) = by_kind("Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    labels = spec["template"]["metadata"]["labels"]
    (container,) = spec["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    broker_names = sorted(n for n in ports if n.startswith("broker-"))
    node_ids = range(1, len(broker_names) + 1)
    assert ports["bootstrap"] == config.listen.port
    assert {ports[n] for n in broker_names} == broker_ports(config, node_ids)
    assert ports["metrics"] == config.metrics.port
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    volume = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert config.access_log.dir is not None and str(config.access_log.dir) in volume
    assert any(e["name"] == "SLUICE_INSTANCE" for e in container["env"])  # one instance name per pod
    # a read-only root: workers > 1 keep their relay socket in runtime_dir, a declared emptyDir
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert config.workers > 1 and config.runtime_dir is not None
    emptydirs = {v["name"] for v in spec["template"]["spec"]["volumes"] if "emptyDir" in v}
    assert volume.get(str(config.runtime_dir)) in emptydirs
    # nobody is an admin just by connecting; the client's address comes from the load balancer
    assert not config.anonymous_admin and not config.allow_anonymous_admins
    assert config.proxy_protocol == "v2"

    services = {s["metadata"]["name"]: s for s in by_kind("Service")}
    lb = services["sluice"]["spec"]
    assert lb["type"] == "LoadBalancer" and lb["selector"] == labels
    annotations = services["sluice"]["metadata"]["annotations"]
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-proxy-protocol"] == "*"  # PROXY v2
    check = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-"
    assert (annotations[check + "protocol"], int(annotations[check + "port"]), annotations[check + "path"]) \
        == ("http", config.metrics.port, "/healthz")
    assert {p["targetPort"] for p in lb["ports"]} == {"bootstrap", *broker_names}
    assert {p["port"] for p in lb["ports"]} == {config.listen.port, *broker_ports(config, node_ids)}

    (pdb,) = by_kind("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] < spec["replicas"]


# ------------------------------------------------------------------------------ compose

def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_compose_file_is_valid_compose_spec() -> None:
    done = check_compose(COMPOSE / "compose.yaml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_compose_validator_refuses_a_wrong_file(tmp_path: Path) -> None:
    broken = (COMPOSE / "compose.yaml").read_text().replace("    hostname: sluice-1", "    hostnme: sluice-1")
    (tmp_path / "compose.yaml").write_text(broken)
    done = check_compose(tmp_path / "compose.yaml")
    assert done.returncode == 1 and "hostnme" in done.stdout + done.stderr


def test_compose_runs_two_instances_behind_haproxy_on_the_same_ports(tmp_path: Path) -> None:
    compose = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    services = compose["services"]
    sluices = [name for name, s in services.items() if s.get("image", "").startswith("sluice")]
    assert len(sluices) >= 2
    assert compose["configs"]["sluice-config"]["file"] == "./sluice.yaml"
    names = set()
    for name in sluices:
        environ = {k: str(v) for k, v in services[name]["environment"].items()}
        config = load_embedded((COMPOSE / "sluice.yaml").read_text(), tmp_path, environ)
        names.add(config.instance)
        assert config.fleet is not None and config.store.type == "kafka"
        assert [hp.host for hp in config.upstream.bootstrap] == ["kafka"]  # the compose service
        assert not config.anonymous_admin and not config.allow_anonymous_admins
        assert config.proxy_protocol == "v2"
    assert len(names) == len(sluices)  # each instance has its own name, so its own log files

    haproxy = (COMPOSE / "haproxy.cfg").read_text()
    binds = re.findall(r"^\s*bind :(\d+)(?:-(\d+))?", haproxy, re.M)
    bound = {p for lo, hi in binds for p in range(int(lo), int(hi or lo) + 1)}
    servers = re.findall(r"^\s*server (\S+) (\S+)\s*$", haproxy, re.M)  # no port: the client's port
    assert sorted(host for _, host in servers) == sorted(sluices)
    assert "mode tcp" in haproxy and "option httpchk GET /healthz" in haproxy
    assert re.search(r"^\s*default-server send-proxy-v2 ", haproxy, re.M)  # what proxy_protocol: v2 reads
    assert f"check port {config.metrics.port}" in haproxy
    assert config.listen.port in bound and broker_ports(config, range(10)) <= bound
    published = set()
    for mapping in services["haproxy"]["ports"]:
        host, _, container = str(mapping).partition(":")
        assert host == container, mapping  # the advertised ports are the ones clients dial
        lo, _, hi = container.partition("-")
        published |= set(range(int(lo), int(hi or lo) + 1))
    assert published == bound
    assert config.advertised_host == "localhost"  # clients on the host dial the published ports

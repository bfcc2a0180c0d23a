"""The image runs as built (issue 14), without an image builder: no registry is reachable for the
`python:3.11-slim` base, so this test does what the Dockerfile does instead. It copies exactly the
build stage's COPY sources, installs them into a clean venv with `pip install --no-compile .` (no
dev extras: the runtime dependencies only, from pip's local cache when it has them), and runs the
image's command (ENTRYPOINT + CMD) as the image's non-root user (uid 10001) with the documented
mounts: a read-only config directory and a data directory owned by that user (SLUICE_DATA_DIR, the
working directory). Against real Kafka it checks: producing through it, throttling to the quota,
`/healthz`, the SQLite store in the data directory, and a clean exit on SIGTERM (drain).

The install takes about a minute from a warm pip cache on the 2-core CI machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from tests.harness import load
from tests.harness.kafka import KafkaCluster, free_port
from tests.integration.test_quota_enforcement import Metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
UID = 10001
KiB = 1024


def build_stage_copies() -> list[str]:
    """The sources of the build stage's COPY instructions (what `pip install .` sees)."""
    parsed = DockerfileParser(path=str(REPO / "Dockerfile"))
    froms = [n for n, i in enumerate(parsed.structure) if i["instruction"] == "FROM"]
    build = parsed.structure[froms[0]:froms[1]]
    sources: list[str] = []
    for i in build:
        if i["instruction"] == "COPY" and "--from" not in i["value"]:
            sources += i["value"].split()[:-1]
    return sources


def image_command() -> list[str]:
    parsed = DockerfileParser(path=str(REPO / "Dockerfile"))
    values = {i["instruction"]: i["value"] for i in parsed.structure}
    return [*json.loads(values["ENTRYPOINT"]), *json.loads(values["CMD"])]


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="sluice-image-", dir="/tmp"))
    root.chmod(0o755)
    src = root / "src"
    src.mkdir()
    for name in build_stage_copies():
        path = REPO / name.rstrip("/")
        if path.is_dir():
            shutil.copytree(path, src / path.name,  # what .dockerignore keeps out, too
                            ignore=shutil.ignore_patterns("__pycache__", "*.so", "_speedups.c"))
        else:
            shutil.copy2(path, src / path.name)
    venv = root / "opt-sluice"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    t0 = time.monotonic()
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                           "--no-compile", str(src)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"pip install . took {time.monotonic() - t0:.0f} s")
    for path in (root, venv):
        for dirpath, dirnames, _files in os.walk(path):
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_runtime_install_has_no_dev_tools_and_has_confluent_kafka(installed: Path) -> None:
    python = str(installed / "opt-sluice" / "bin" / "python")
    has = subprocess.run([python, "-c", "import importlib.util as u, sys; "
                          "print([m for m in sys.argv[1:] if u.find_spec(m)])",
                          "confluent_kafka", "pyarrow", "uvloop", "pytest", "ruff", "pyspark"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert has.strip() == "['confluent_kafka', 'pyarrow', 'uvloop']", has


def test_the_install_builds_the_compiled_data_plane(installed: Path) -> None:
    """`pip install .` compiles protocol/_speedups.pyx (the image's build stage has a compiler)."""
    python = str(installed / "opt-sluice" / "bin" / "python")
    picked = subprocess.run([python, "-c", "from protocol import fastpath; print(fastpath.describe())"],
                            cwd=installed, capture_output=True, text=True, check=True, timeout=60).stdout
    assert picked.strip() == "compiled (protocol._speedups)", picked


def test_the_image_command_runs_as_the_non_root_user_with_a_read_only_config(
        installed: Path, kafka: KafkaCluster, topic: str) -> None:
    etc, data = installed / "etc-sluice", installed / "var-lib-sluice"
    etc.mkdir(exist_ok=True)
    data.mkdir(exist_ok=True)
    os.chown(data, UID, UID)
    metrics_port, listen_port, broker_base = free_port(), free_port(), free_port()
    quota = 256 * KiB
    config = {"upstream": {"bootstrap": kafka.bootstrap},
              "listen": f"127.0.0.1:{listen_port}",
              "broker_port_base": broker_base - kafka.nodes[0].node_id,
              "metrics": {"port": metrics_port},
              "drain_timeout_ms": 5000,
              "quotas": {"window": {"samples": 11, "size_ms": 500},
                         "entries": [{"client_id": "<default>", "producer_byte_rate": quota}]}}
    (etc / "sluice.yaml").write_text(yaml.safe_dump(config))
    (etc / "sluice.yaml").chmod(0o444)
    etc.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    command = image_command()
    assert command[1:] == ["proxy", "--config", "/etc/sluice/sluice.yaml"]
    command = [str(installed / "opt-sluice" / "bin" / command[0]), *command[1:3], str(etc / "sluice.yaml")]
    env = {"PATH": f"{installed / 'opt-sluice' / 'bin'}:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONUNBUFFERED": "1", "SLUICE_DATA_DIR": str(data), "HOME": str(data)}
    process = subprocess.Popen(["setpriv", "--reuid", str(UID), "--regid", str(UID), "--clear-groups",
                                *command], cwd=data, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "sluice ready: bootstrap" in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(60), "".join(lines)
        status = Path(f"/proc/{process.pid}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == [str(UID)] * 4, uid_line  # not root
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/healthz", timeout=5) as r:
            assert r.status == 200
        assert (data / "sluice-quotas.db").exists()  # the default SQLite store, in the data dir
        assert sorted(p.name for p in etc.iterdir()) == ["sluice.yaml"]

        run_s = 3 * 5.5  # three whole throttle periods of 11 x 500 ms
        timeline = load.confluent_flood(f"127.0.0.1:{listen_port}", topic, run_s, client_id="image",
                                        batch_bytes=32 * KiB)
        achieved = timeline.rate(0, run_s)
        assert 0.7 * quota <= achieved <= 1.15 * quota, f"{achieved / quota:.2f} x quota"
        throttled = Metrics(metrics_port).value("sluice_quota_throttled_requests_total", client_id="image",
                                                kind="produce")
        assert throttled is not None and throttled > 0

        process.send_signal(signal.SIGTERM)  # STOPSIGNAL: drain, then exit
        assert process.wait(30) == 0, "".join(lines)[-3000:]
        assert "Traceback" not in "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        etc.chmod(0o755)

"""The local-cluster command and the test run's shared broker start and stop brokers, and no broker
outlives its parent or its run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.harness import shared_kafka
from tests.harness.kafka import REPO, KafkaCluster, KafkaStartError
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import poll

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def pids_under(directory: Path, marker: bytes = b"kafka.Kafka") -> set[int]:
    """Processes whose command line holds `marker` and `directory` (by default: Kafka brokers)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and str(directory).encode() in cmdline:
            pids.add(int(proc.name))
    return pids


def port_open(address: str) -> bool:
    """Is anything listening there? (Asks the kernel: a connect could self-connect on loopback.)"""
    port = int(address.rsplit(":", 1)[1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                return True
    return False


def start_cluster_command(directory: Path) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.harness.cluster", "up", "--dir", str(directory)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    state = directory / "cluster.json"
    # a loaded machine starts a broker slowly (KafkaCluster.start allows 90 s an attempt, and retries):
    # wait up to most of the test's 300 s timeout; the command's own failure shows up as its exit
    deadline = time.monotonic() + 240
    try:
        info: dict[str, object] | None = None

        def ready() -> bool:  # the file exists and is whole (written in one call, read as it lands)
            nonlocal info
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                info = json.loads(state.read_text())
            return info is not None

        assert poll(ready, deadline - time.monotonic(), 0.2), "cluster did not come up"
        assert info is not None
        return proc, info
    except BaseException:
        proc.kill()  # its brokers die with it (parent-death signal)
        proc.wait(timeout=30)
        raise


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    return poll(predicate, timeout_s, 0.2)


def test_cluster_command_up_status_down(tmp_path: Path) -> None:
    proc, info = start_cluster_command(tmp_path)
    bootstrap = str(info["bootstrap"])
    assert port_open(bootstrap)
    status = subprocess.run([sys.executable, "-m", "tests.harness.cluster", "status", "--dir", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, check=False)
    assert status.returncode == 0 and bootstrap in status.stdout
    down = subprocess.run([sys.executable, "-m", "tests.harness.cluster", "down", "--dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, check=False, timeout=60)
    assert down.returncode == 0
    assert proc.wait(timeout=30) == 0
    assert not port_open(bootstrap)
    assert pids_under(tmp_path) == set()
    assert not (tmp_path / "cluster.json").exists()


def test_brokers_die_when_their_parent_is_killed(tmp_path: Path) -> None:
    proc, info = start_cluster_command(tmp_path)
    brokers = pids_under(tmp_path)
    assert len(brokers) == 1
    os.kill(proc.pid, signal.SIGKILL)  # no cleanup code runs in the parent
    proc.wait(timeout=10)
    # a dying process loses its cmdline before its sockets close: wait for both
    assert wait_until(lambda: not pids_under(tmp_path) and not port_open(str(info["bootstrap"])), 15), \
        "broker outlived its parent"


def test_a_started_sluice_used_as_a_context_manager_is_one_process_and_stops(kafka: KafkaCluster,
                                                                            tmp_path: Path) -> None:
    # `with SluiceProcess(...).start() as s` once started a second process and stopped only that
    # one: the first ran on until pytest exited, a Sluice per such test beside the rest of the suite
    with SluiceProcess(kafka.bootstrap, tmp_path / "one").start() as sluice:
        assert pids_under(tmp_path / "one", b"proxy") == {sluice.process.pid}  # type: ignore[union-attr]
    assert poll(lambda: not pids_under(tmp_path / "one", b"proxy"), 30.0)


def test_the_shared_broker_starts_once_for_every_worker_and_stops_with_its_run(tmp_path: Path) -> None:
    # a stand-in for the xdist controller whose workers attach: the keeper watches its pid
    controller = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],  # until killed
                                  stdin=subprocess.PIPE)
    directory = tmp_path / "shared"
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:  # three workers asking at once
            attached = list(pool.map(lambda _: shared_kafka.attach(directory, controller.pid, 240), range(3)))
        assert len({c.bootstrap for c in attached}) == 1
        assert len({c.sasl_bootstrap for c in attached}) == 1
        assert len(pids_under(directory)) == 1  # one broker, one keeper
        assert len(pids_under(directory, b"tests.harness.shared_kafka")) == 1
        assert "Kafka Server started" in attached[0].nodes[0].log_text()
        with pytest.raises(RuntimeError, match="shared broker"):
            attached[0].kill_node(1)
        bootstrap = attached[0].bootstrap
        assert port_open(bootstrap)
        # the run ends without a word (its controller killed): keeper and broker follow it
        controller.kill()
        controller.wait(timeout=10)
        # the keeper exits once it has stopped the broker
        assert wait_until(lambda: not pids_under(directory) and not port_open(bootstrap)
                          and not pids_under(directory, b"tests.harness.shared_kafka"), 60), \
            "the shared broker or its keeper outlived the run"
    finally:
        controller.kill()
        shared_kafka.stop(directory)


def test_a_shared_broker_that_cannot_start_fails_every_worker_with_the_reason(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    (directory / "broker").write_text("a file where the keeper needs a directory")
    with pytest.raises(KafkaStartError, match="keeper exited"):
        shared_kafka.attach(directory, os.getpid(), 120)
    assert not pids_under(directory)

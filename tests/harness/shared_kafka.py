"""One single-node Kafka for every xdist worker of a test run.

Under `make test` each xdist worker is a pytest session of its own, so a session-scoped broker was one
JVM per worker. The `kafka` fixture (tests/conftest.py) shares one instead: the first worker to ask for
it starts a keeper process,

    python -m tests.harness.shared_kafka DIR --watch PID

which starts the broker (SASL listeners and the default users, as the fixture's own broker has),
writes DIR/cluster.json with its addresses, and stops it on SIGTERM or when process PID (the xdist
controller) is gone. The other workers read cluster.json. The controller stops the keeper when the
run ends (`stop`). Tests on the shared broker use unique topics, client ids and groups, and none sets
a broker-wide setting (a default quota, a dynamic broker config): those start a broker of their own.

Workers take DIR/lock while they look, so one keeper is started per run. A keeper that fails to start
the broker writes DIR/failed with the reason, which each worker then raises.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.harness.kafka import REPO, KafkaCluster, KafkaNode, KafkaStartError, stop_process
from tests.harness.kafka import process_alive as _alive
from tests.harness.wait import poll

STATE = "cluster.json"
FAILED = "failed"
KEEPER_PID = "keeper.pid"


def serve(directory: Path, watch_pid: int) -> int:
    """The keeper: start the broker, publish its addresses, stop it when told or orphaned."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = KafkaCluster(directory / "broker", 1, sasl=True)
    try:
        cluster.start()
    except KafkaStartError as exc:
        _write_atomically(directory / FAILED, str(exc))
        return 1
    try:
        node = cluster.nodes[0]
        _write_atomically(directory / STATE, json.dumps({
            "bootstrap": cluster.bootstrap, "sasl_bootstrap": cluster.sasl_bootstrap,
            "node": {"node_id": node.node_id, "directory": str(node.directory), "port": node.port,
                     "controller_port": node.controller_port, "sasl_port": node.sasl_port}}))
        while not stop.wait(0.5):
            if not _alive(watch_pid):
                break
            if not node.is_running():
                _write_atomically(directory / FAILED, "the shared broker exited:\n" + node.log_tail(60))
                return 2
    finally:
        cluster.stop()
    return 0


class SharedCluster(KafkaCluster):
    """The shared broker as a worker sees it: its addresses, node directory and log; never started or
    stopped from here."""

    def __init__(self, directory: Path, state: dict[str, object]) -> None:
        super().__init__(directory, 1, sasl=True)
        node = state["node"]
        assert isinstance(node, dict)
        self.nodes = [KafkaNode(int(node["node_id"]), Path(node["directory"]), int(node["port"]),
                                int(node["controller_port"]), int(node["sasl_port"]))]

    def start(self, timeout_s: float = 90.0, attempts: int = 3) -> KafkaCluster:
        return self

    def stop(self, grace_s: float = 15.0) -> None:
        pass

    def kill_node(self, node_id: int) -> None:
        raise RuntimeError("the shared broker serves every worker: start a cluster of your own to kill it")

    def restart_node(self, node_id: int, timeout_s: float = 60.0) -> None:
        raise RuntimeError("the shared broker serves every worker: start a cluster of your own to restart it")


def attach(directory: Path, controller_pid: int, timeout_s: float = 180.0) -> SharedCluster:
    """The shared broker under `directory`, started by this call if no worker started it yet."""
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory / "lock"):
        if not (directory / KEEPER_PID).exists():
            log = open(directory / "keeper.log", "ab")  # noqa: SIM115 - the keeper's own now
            keeper = subprocess.Popen(
                [sys.executable, "-m", "tests.harness.shared_kafka", str(directory),
                 "--watch", str(controller_pid)],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)  # outlives the worker that started it, not the run
            log.close()
            (directory / KEEPER_PID).write_text(str(keeper.pid))
        keeper_pid = int((directory / KEEPER_PID).read_text())

        def ready() -> bool:
            if (directory / FAILED).exists():
                raise KafkaStartError((directory / FAILED).read_text())
            if (directory / STATE).exists():
                return True
            if not _alive(keeper_pid):
                log_text = (directory / "keeper.log").read_text(errors="replace")[-3000:]
                raise KafkaStartError(f"the shared broker's keeper exited:\n{log_text}")
            return False

        if not poll(ready, timeout_s, 0.2):
            raise KafkaStartError(f"the shared broker did not start within {timeout_s:.0f} s")
        return SharedCluster(directory, json.loads((directory / STATE).read_text()))


def stop(directory: Path, timeout_s: float = 30.0) -> None:
    """Stop the keeper (and so the broker) if one was started under `directory`; wait for it."""
    pid_file = directory / KEEPER_PID
    if not pid_file.exists():
        return
    stop_process(int(pid_file.read_text()), timeout_s)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.shared_kafka",
                                     description="keep one single-node Kafka for a test run's workers")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--watch", type=int, required=True, help="stop when this process is gone")
    args = parser.parse_args(argv)
    return serve(args.directory, args.watch)


if __name__ == "__main__":
    sys.exit(main())

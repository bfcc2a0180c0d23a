"""Start and stop a local Kafka cluster from the command line, for the demo and for benchmarks.

    python -m tests.harness.cluster up [--nodes 3] [--sasl] [--dir .cache/local-kafka]
        starts the cluster in the foreground, writes <dir>/cluster.json with its addresses, and stops
        every node on Ctrl-C or SIGTERM;
    python -m tests.harness.cluster down [--dir ...]   stops a cluster started by `up`;
    python -m tests.harness.cluster status [--dir ...] prints cluster.json if it is running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from tests.harness.kafka import REPO, KafkaCluster, kafka_version, stop_process
from tests.harness.kafka import process_alive as _alive

DEFAULT_DIR = REPO / ".cache" / "local-kafka"


def _state_file(directory: Path) -> Path:
    return directory / "cluster.json"


def up(directory: Path, nodes: int, sasl: bool) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    state = _state_file(directory)
    if state.exists() and _alive(json.loads(state.read_text())["pid"]):
        print(f"a cluster is already running from {directory}; `down` it first", file=sys.stderr)
        return 1
    for old in directory.glob("run-*"):
        shutil.rmtree(old, ignore_errors=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = KafkaCluster(directory / f"run-{int(time.time())}", nodes, sasl=sasl)
    print(f"starting Kafka {kafka_version()} with {nodes} node(s)...", file=sys.stderr, flush=True)
    cluster.start()
    info = {"pid": os.getpid(), "kafka_version": kafka_version(), "bootstrap": cluster.bootstrap,
            "sasl_bootstrap": cluster.sasl_bootstrap if sasl else None,
            "start_seconds": round(cluster.start_seconds or 0, 2),
            "logs": [str(n.log_path) for n in cluster.nodes]}
    state.write_text(json.dumps(info, indent=2))
    print(json.dumps(info, indent=2), flush=True)
    try:
        while not stop.wait(0.5):
            if not all(n.is_running() for n in cluster.nodes):
                print("a broker exited:\n" + cluster.logs(40), file=sys.stderr)
                return 2
    finally:
        cluster.stop()
        state.unlink(missing_ok=True)
    return 0


def down(directory: Path, timeout_s: float = 30.0) -> int:
    state = _state_file(directory)
    if not state.exists():
        print("no cluster running", file=sys.stderr)
        return 0
    pid = int(json.loads(state.read_text())["pid"])
    if _alive(pid):
        stop_process(pid, timeout_s)
    state.unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start a cluster in the foreground")
    p_up.add_argument("--nodes", type=int, default=1)
    p_up.add_argument("--sasl", action="store_true", help="add a SASL_PLAINTEXT listener with test users")
    for p in (p_up, sub.add_parser("down"), sub.add_parser("status")):
        p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    if args.command == "up":
        return up(args.dir, args.nodes, args.sasl)
    if args.command == "down":
        return down(args.dir)
    state = _state_file(args.dir)
    if state.exists() and _alive(json.loads(state.read_text())["pid"]):
        print(state.read_text())
        return 0
    print("no cluster running", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

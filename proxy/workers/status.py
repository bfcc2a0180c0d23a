"""How a worker tells its supervisor that it is ready and where its metrics are.

The supervisor gives each worker the write end of a pipe (`SLUICE_WORKER_STATUS_FD`); the worker
writes one JSON object per line. The supervisor's side is `parse_status`.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

ENV_STATUS_FD = "SLUICE_WORKER_STATUS_FD"
ENV_LISTEN_PORT = "SLUICE_WORKER_LISTEN_PORT"


@dataclass(frozen=True)
class WorkerStatus:
    bootstrap: str
    metrics_port: int | None


def announce_ready(bootstrap: str) -> None:
    """The instance's readiness line on stderr, `sluice ready: bootstrap HOST:PORT`, in one write
    of a whole line: `print` writes the text and its newline separately, and a log record from
    another thread written between the two ran into the address (a harness then read the port as
    `41349` followed by the log's date, and its client never connected)."""
    line = f"sluice ready: bootstrap {bootstrap}\n".encode()
    sys.stderr.flush()  # what is buffered goes first, whole
    os.write(2, line)   # one write of under PIPE_BUF bytes: never interleaved with another


def report_ready(bootstrap: str, metrics_port: int | None) -> bool:
    """Tell the supervisor; False when this process has no status pipe."""
    text = os.environ.get(ENV_STATUS_FD)
    if text is None or not text.isdigit():
        return False
    line = json.dumps({"ready": True, "bootstrap": bootstrap, "metrics_port": metrics_port}) + "\n"
    try:
        os.write(int(text), line.encode())
    except OSError:
        return False
    return True


def parse_status(line: bytes) -> WorkerStatus | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("ready") is not True:
        return None
    if not isinstance(data.get("bootstrap"), str):
        return None
    port = data.get("metrics_port")
    return WorkerStatus(data["bootstrap"], port if isinstance(port, int) else None)


def listen_port_override() -> int | None:
    """The listen port the supervisor reserved (when the configuration says port 0)."""
    text = os.environ.get(ENV_LISTEN_PORT)
    return int(text) if text is not None and text.isdigit() else None

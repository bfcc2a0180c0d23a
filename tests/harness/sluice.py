"""Sluice as a real process (`python -m proxy proxy ...`), for tests, the demo and benchmarks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.harness.kafka import REPO, _die_with_parent
from tests.harness.lines import read_lines
from tests.harness.wait import poll

READY = re.compile(r"^sluice ready: bootstrap (\S+:\d+)$")  # the whole line, nothing run into it
WORKER_STARTED = re.compile(r"worker (\d+) started \(pid (\d+)\)")


class SluiceProcess:
    def __init__(self, upstream: str, workdir: Path, config: Mapping[str, Any] | None = None,
                 args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 workers: int | None = None, launcher: Sequence[str] = ("-m", "proxy")) -> None:
        """`launcher`: what follows the interpreter, before the `proxy` command (a benchmark's
        `bench/common/run_from.py DIR` runs another checkout's code)."""
        self.upstream = upstream
        self.launcher = list(launcher)
        self.workdir = workdir
        self.config = dict(config or {})
        self.args = list(args) + (["--workers", str(workers)] if workers is not None else [])
        self.workers = workers  # `--workers N`: a supervisor and N worker processes
        self.env = dict(env or {})
        self.process: subprocess.Popen[str] | None = None
        self.bootstrap = ""
        self._lines: list[str] = []
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def config_path(self) -> Path:
        return self.workdir / "sluice.yaml"

    def write_config(self, config: Mapping[str, Any]) -> None:
        self.config = dict(config)
        self.config_path.write_text(yaml.safe_dump(self.config))

    def start(self, timeout_s: float | None = None) -> SluiceProcess:
        if timeout_s is None:  # N workers start side by side on a 2-core machine
            timeout_s = 20.0 if self.workers is None else 30.0 + 20.0 * self.workers
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg: dict[str, Any] = {"listen": "127.0.0.1:0", "upstream": {"bootstrap": self.upstream},
                               "log_level": "INFO"} | self.config
        self.write_config(cfg)
        cmd = [sys.executable, *self.launcher, "proxy", "--config", str(self.config_path), *self.args]
        self.process = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, preexec_fn=_die_with_parent,
                                        env={**os.environ, **self.env})
        assert self.process.stdout is not None
        self._reader = read_lines(self.process.stdout, self._line, keep=self.workdir / "sluice.log")
        if not self._ready.wait(timeout_s):
            self.stop()
            raise RuntimeError(f"Sluice did not start:\n{self.log()}")
        return self

    def _line(self, line: str) -> None:
        self._lines.append(line)
        m = READY.match(line.rstrip("\n"))
        if m:
            self.bootstrap = m.group(1)
            self._ready.set()

    def log(self) -> str:
        return "".join(self._lines)

    def worker_pids(self) -> dict[int, int]:
        """`--workers N`: worker index -> the pid of its latest start (from the supervisor's log)."""
        return {int(i): int(pid) for i, pid in WORKER_STARTED.findall(self.log())}

    def wait_for_log(self, text: str, timeout_s: float = 10.0) -> bool:
        """Sluice's output reaches us through a pipe, a little after what it describes."""
        return poll(lambda: text in self.log(), timeout_s)

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self._reader is not None:  # every line the process wrote is in log() after stop()
            self._reader.join(10)
        return self.process.returncode

    def __enter__(self) -> SluiceProcess:
        # `with SluiceProcess(...).start() as s` must not start a second process (the first would
        # run on, unstopped, until pytest exits)
        return self if self.process is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

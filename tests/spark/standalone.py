"""A Spark standalone cluster from the installed pyspark, for tests: a master and workers as
separate JVM processes on loopback (`spark-class ...deploy.master.Master` / `...worker.Worker`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from tests.harness.kafka import _die_with_parent, free_port
from tests.harness.wait import poll

MASTER_URL = re.compile(r"Starting Spark master at (spark://[0-9.]+:\d+)")
REGISTERED = "Successfully registered with master"


def pyspark_bin() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin"


def spark_env(workdir: Path) -> dict[str, str]:
    """Loopback only, the venv's Python on both sides, scratch space under `workdir`."""
    return os.environ | {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOCAL_DIRS": str(workdir / "local"),
                         "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                         "SPARK_DAEMON_MEMORY": "256m", "PYTHONPATH": ""}


def _wait_for(path: Path, pattern: re.Pattern[str] | str, deadline: float,
              process: subprocess.Popen[bytes]) -> str:
    """The first match of `pattern` in the log at `path`, polled until `deadline` (monotonic)."""
    regex = re.compile(re.escape(pattern)) if isinstance(pattern, str) else pattern
    text = ""

    def found_or_exited() -> bool:
        nonlocal text
        text = path.read_text(errors="replace") if path.exists() else ""
        return regex.search(text) is not None or process.poll() is not None

    poll(found_or_exited, max(0.0, deadline - time.monotonic()), interval_s=0.2)
    m = regex.search(text)
    if m:
        return m.group(m.lastindex or 0)
    if process.poll() is not None:
        raise RuntimeError(f"{path.name}: exited with {process.returncode}:\n{text[-3000:]}")
    raise TimeoutError(f"{path.name}: no {regex.pattern!r} in time:\n{text[-3000:]}")


class StandaloneCluster:
    """`with StandaloneCluster(tmp, workers=2) as c: ... c.master_url`. Each worker offers one core
    and `worker_memory`; every process (and the executors a worker starts, in its process group) is
    stopped on exit."""

    def __init__(self, workdir: Path, *, workers: int = 2, worker_memory: str = "512m",
                 start_timeout_s: float = 180.0) -> None:
        self.workdir = workdir
        self.workers = workers
        self.worker_memory = worker_memory
        self.start_timeout_s = start_timeout_s
        self.master_url = ""
        self._processes: list[subprocess.Popen[bytes]] = []

    def _spawn(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([str(pyspark_bin() / "spark-class"), *args], cwd=self.workdir,
                                       env=spark_env(self.workdir), stdout=out, stderr=subprocess.STDOUT,
                                       preexec_fn=_die_with_parent)
        self._processes.append(process)
        return process, log

    def launch(self) -> StandaloneCluster:
        """Start the master and the workers without waiting (workers retry until the master is up),
        so the JVMs boot while the caller does something else. From the caller's thread: the
        processes die with the thread that started them (PR_SET_PDEATHSIG)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.master_url = f"spark://127.0.0.1:{free_port()}"
        try:
            self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                        "--port", self.master_url.rsplit(":", 1)[1], "--webui-port", "0")
            for i in range(self.workers):
                self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                            "--port", "0", "--webui-port", "0", "--cores", "1",
                            "--memory", self.worker_memory, "--work-dir", str(self.work_dir(i)),
                            self.master_url)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> StandaloneCluster:
        """Poll the logs until the master runs at master_url and every worker has registered."""
        deadline = time.monotonic() + self.start_timeout_s
        master, *workers = self._processes
        try:
            url = _wait_for(self.workdir / "master.log", MASTER_URL, deadline, master)
            if url != self.master_url:
                raise RuntimeError(f"master started at {url}, not {self.master_url}")
            for i, worker in enumerate(workers):
                _wait_for(self.workdir / f"worker-{i}.log", REGISTERED, deadline, worker)
        except BaseException:
            self.stop()
            raise
        return self

    def start(self) -> StandaloneCluster:
        return self.launch().wait_ready()

    def work_dir(self, worker: int) -> Path:
        return self.workdir / f"work-{worker}"

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for process in reversed(self._processes):  # workers (and their executors) first
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)  # its own session: _die_with_parent
        for process in self._processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        self._processes.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spark_submit(job: Path, master: str, job_args: list[str], *, cwd: Path,
                 conf: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """spark-submit a job file (client mode, small memory, no UI, loopback), started, not awaited."""
    settings = {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1", "spark.sql.shuffle.partitions": "4",
                "spark.driver.extraJavaOptions": "-XX:+UseSerialGC",
                "spark.executor.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
                } | dict(conf or {})
    cmd = [str(pyspark_bin() / "spark-submit"), "--master", master, "--driver-memory", "512m"]
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([*cmd, str(job), *job_args], cwd=cwd, env=spark_env(cwd), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)

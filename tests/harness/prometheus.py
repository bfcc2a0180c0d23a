"""A real Prometheus (Debian's `prometheus` package, installed by scripts/setup) scraping Sluice.

It runs as our own child process with a config, a TSDB and a port of its own (never the system
service), scrapes every second and answers PromQL through its HTTP API (`/api/v1/query`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.harness.kafka import _die_with_parent, free_port
from tests.harness.wait import poll

SCRAPE_INTERVAL_S = 1


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise RuntimeError("prometheus is not installed: run scripts/setup (Debian's prometheus package)")
    return path


class PrometheusProcess:
    def __init__(self, workdir: Path, targets: list[str], job: str = "sluice") -> None:
        self.workdir = workdir
        self.targets = targets
        self.job = job
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> PrometheusProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = {"global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                             "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
                             "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
                  "scrape_configs": [{"job_name": self.job, "static_configs": [{"targets": self.targets}]}]}
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        log = (self.workdir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [prometheus_binary(), f"--config.file={config_path}",
             f"--storage.tsdb.path={self.workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        log.close()
        if not poll(self._ready, timeout_s, interval_s=0.1):
            self.stop()
            raise RuntimeError(f"Prometheus did not start:\n{self.log()}")
        return self

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"Prometheus exited with {self.process.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def log(self) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: [{"metric": {labels}, "value": [time, "value"]}, ...]."""
        data = self._get("/api/v1/query", query=expr)
        if data["resultType"] != "vector":
            raise AssertionError(f"{expr}: a {data['resultType']}, not a vector")
        return list(data["result"])

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's ``label_values(match, label)`` lists."""
        return list(self._get(f"/api/v1/label/{label}/values", **{"match[]": match}))

    def targets_up(self) -> bool:
        """Every target has been scraped successfully at least once."""
        active = self._get("/api/v1/targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def __enter__(self) -> PrometheusProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

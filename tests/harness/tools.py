"""Kafka's own command-line tools, run from the same Maven classpath as the brokers.

These are the tools operators use (kafka-configs, the perf tests, kafka-log-dirs, kafka-topics);
tests call them to prove that Sluice is transparent to them.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.harness.kafka import KAFKA_LIBS, java_command


@dataclass(frozen=True)
class ToolResult:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> ToolResult:
        if self.returncode != 0:
            raise AssertionError(f"{self.args[0]} failed ({self.returncode}):\n{self.stdout}\n{self.stderr}")
        return self


@dataclass(frozen=True)
class ProducerPerfResult:
    records: int
    records_per_s: float
    mb_per_s: float
    avg_latency_ms: float
    max_latency_ms: float


@dataclass(frozen=True)
class ConsumerPerfResult:
    mb: float
    mb_per_s: float
    records: int
    records_per_s: float
    fetch_mb_per_s: float = 0.0   # over the time spent fetching, without the group join


@functools.cache
def config_command_class() -> str:
    """kafka-configs moved from Scala core to the tools module in 4.4; pick by jar contents."""
    for jar in KAFKA_LIBS.glob("kafka_2.13-*.jar"):
        with zipfile.ZipFile(jar) as z:
            if "kafka/admin/ConfigCommand.class" in z.namelist():
                return "kafka.admin.ConfigCommand"
    return "org.apache.kafka.tools.ConfigCommand"


def client_properties(path: Path, props: Mapping[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def sasl_properties(user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, str]:
    module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if mechanism == "PLAIN"
              else "org.apache.kafka.common.security.scram.ScramLoginModule")
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.jaas.config": f'{module} required username="{user}" password="{password}";',
    }


class KafkaTools:
    def __init__(self, bootstrap: str, command_config: Mapping[str, str] | None = None,
                 workdir: Path | None = None) -> None:
        self.bootstrap = bootstrap
        self._workdir = workdir or Path(tempfile.mkdtemp(prefix="sluice-tools-"))
        self._command_config = (client_properties(self._workdir / "client.properties", command_config)
                                if command_config else None)

    def run(self, main: str, *args: str, timeout_s: float = 180.0) -> ToolResult:
        cmd = java_command(main, *args)
        done = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False, text=True)
        return ToolResult((main, *args), done.returncode, done.stdout, done.stderr)

    def _config_args(self, flag: str = "--command-config") -> list[str]:
        return [flag, str(self._command_config)] if self._command_config else []

    # ------------------------------------------------------------------ kafka-configs

    def configs(self, *args: str) -> ToolResult:
        return self.run(config_command_class(), "--bootstrap-server", self.bootstrap,
                        *self._config_args(), *args)

    # ------------------------------------------------------------------ kafka-topics

    def topics(self, *args: str) -> ToolResult:
        return self.run("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", self.bootstrap,
                        *self._config_args(), *args)

    # ------------------------------------------------------------------ kafka-log-dirs

    def log_dirs(self, topics: Sequence[str] = ()) -> dict[str, object]:
        args = ["--bootstrap-server", self.bootstrap, *self._config_args(), "--describe"]
        if topics:
            args += ["--topic-list", ",".join(topics)]
        out = self.run("org.apache.kafka.tools.LogDirsCommand", *args).check().stdout
        line = next(ln for ln in out.splitlines() if ln.startswith("{"))
        parsed: dict[str, object] = json.loads(line)
        return parsed

    # ------------------------------------------------------------------ perf tests

    def producer_perf(self, topic: str, num_records: int, record_size: int, *,
                      throughput: int = -1, props: Mapping[str, str] | None = None,
                      timeout_s: float = 300.0) -> ProducerPerfResult:
        producer_props = {"bootstrap.servers": self.bootstrap, "acks": "all"} | dict(props or {})
        args = ["--topic", topic, "--num-records", str(num_records), "--record-size", str(record_size),
                "--throughput", str(throughput),
                "--producer-props", *(f"{k}={v}" for k, v in producer_props.items())]
        args += self._config_args("--producer.config")
        out = self.run("org.apache.kafka.tools.ProducerPerformance", *args, timeout_s=timeout_s).check()
        return parse_producer_perf(out.stdout)

    def consumer_perf(self, topic: str, messages: int, *, group: str,
                      props: Mapping[str, str] | None = None, timeout_ms: int = 60000,
                      timeout_s: float = 300.0) -> ConsumerPerfResult:
        cfg = dict(props or {})
        args = ["--bootstrap-server", self.bootstrap, "--topic", topic, "--messages", str(messages),
                "--group", group, "--timeout", str(timeout_ms)]
        if cfg or self._command_config:
            base = {}
            if self._command_config:
                base = dict(ln.split("=", 1) for ln in self._command_config.read_text().splitlines() if ln)
            path = client_properties(self._workdir / f"consumer-{group}.properties", base | cfg)
            args += ["--consumer.config", str(path)]
        out = self.run("org.apache.kafka.tools.ConsumerPerformance", *args, timeout_s=timeout_s).check()
        return parse_consumer_perf(out.stdout)

    def consumer_perf_progress(self, topic: str, messages: int, *, group: str,
                               props: Mapping[str, str] | None = None, timeout_ms: int = 60000,
                               interval_ms: int = 500, timeout_s: float = 300.0) -> list[tuple[float, float]]:
        """ConsumerPerformance with `--show-detailed-stats`: (epoch seconds, MiB consumed so far)
        every `interval_ms`, for rates over chosen spans."""
        cfg = {"bootstrap.servers": self.bootstrap} | dict(props or {})
        name = f"consumer-{group}-{os.getpid()}-{time.monotonic_ns()}.properties"
        path = client_properties(self._workdir / name, cfg)
        args = ["--bootstrap-server", self.bootstrap, "--topic", topic, "--messages", str(messages),
                "--group", group, "--timeout", str(timeout_ms), "--consumer.config", str(path),
                "--show-detailed-stats", "--reporting-interval", str(interval_ms)]
        out = self.run("org.apache.kafka.tools.ConsumerPerformance", *args, timeout_s=timeout_s).check()
        rows = []
        for line in out.stdout.splitlines():
            cols = [c.strip() for c in line.split(",")]
            if len(cols) >= 3 and cols[0][:1].isdigit() and ":" in cols[0]:
                stamp = datetime.datetime.strptime(cols[0], "%Y-%m-%d %H:%M:%S:%f")
                rows.append((stamp.timestamp(), float(cols[2])))
        return rows


_PRODUCER_SUMMARY = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency")


def parse_producer_perf(stdout: str) -> ProducerPerfResult:
    """Read the final summary line (the last match: the periodic lines have the same shape)."""
    matches = _PRODUCER_SUMMARY.findall(stdout)
    if not matches:
        raise AssertionError(f"no producer-perf summary in:\n{stdout}")
    n, rps, mbps, avg, mx = matches[-1]
    return ProducerPerfResult(int(n), float(rps), float(mbps), float(avg), float(mx))


def parse_consumer_perf(stdout: str) -> ConsumerPerfResult:
    """Columns: start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, ..."""
    lines = [ln for ln in stdout.splitlines() if ln and ln[0].isdigit()]
    if not lines:
        raise AssertionError(f"no consumer-perf row in:\n{stdout}")
    cols = [c.strip() for c in lines[-1].split(",")]
    fetch_mb_per_s = float(cols[8]) if len(cols) > 8 else float(cols[3])
    return ConsumerPerfResult(float(cols[2]), float(cols[3]), int(cols[4]), float(cols[5]), fetch_mb_per_s)

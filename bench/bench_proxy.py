"""Proxy benchmark: what the Sluice hop costs, against the broker direct and a raw Python forwarder.

One run starts one real Kafka broker and measures, for each of three paths to it,

* ``direct``: clients connect to the broker's PLAINTEXT listener;
* ``sluice``: clients connect to Sluice (``python -m proxy proxy``), which connects to that same
  PLAINTEXT listener and rewrites broker addresses in Metadata and friends;
* ``raw``:    clients connect to ``bench.common.raw_forwarder`` (uvloop Protocol pair, no protocol
  knowledge), which connects to a second broker listener, ``RAW``, whose *advertised* address is
  the forwarder's own port, so clients that follow Metadata come back through the forwarder;

these workloads:

* produce throughput: Kafka's Java ``ProducerPerformance``, 1 KiB records, acks=1, MB/s;
* fetch throughput: Kafka's Java ``ConsumerPerformance`` over a pre-filled topic, MB/s
  (``fetch.MB.sec``: the consumer group join is excluded);
* small-request latency: a blocking-socket loop of hand-built requests, one in flight at a time:
  a one-record Produce (acks=1, 100 B value) and an ApiVersions; p50 and p99 in ms.

Sluice runs with a quota for every client (a default client-id quota too high to throttle; the
engine records and checks every request; ``--no-quotas`` for none) and, with ``--access-log``, its
access log on: the configuration issue 29 compares against the raw forwarder.

Each measurement is repeated (3 times by default), rotating the order of the paths, and the
median is reported. The latency paths take turns request by request within a repeat, and the
added latency is the median of the per-repeat differences. The proxies' own CPU (from
``/proc/<pid>/task/*/schedstat``) is recorded too: ms per MB moved, and µs per small request. On a
shared 2-vCPU machine those are much steadier than the throughput ratios, which move with whatever
else runs. Results go to ``bench/results/proxy.json`` (and a PNG chart when matplotlib is there);
the table, the ratios and the targets of issue 3 are printed.

Run:  ``.venv/bin/python -m bench.bench_proxy`` (~5 min), or ``--quick`` (~1 min smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import crc32c

from bench.common.cpu import own_cpu_s, process_cpu_s, wait_quiet
from bench.common.results import git_describe, machine, pyplot, save_chart
from bench.common.setup import (
    READY,
    REPO,
    KafkaCluster,
    KafkaNode,
    SluiceProcess,
    create_topic,
    die_with_parent,
    free_port,
    java_command,
    parse_producer_perf,
)

PATHS: tuple[str, ...] = ("direct", "sluice", "raw")
WORKLOADS: tuple[str, ...] = ("produce", "fetch", "latency")
DEFAULT_OUT = REPO / "bench" / "results" / "proxy.json"

TARGET_THROUGHPUT_VS_DIRECT = 0.95
TARGET_ADDED_P99_MS = 0.3
TARGET_THROUGHPUT_VS_RAW = 0.9


@dataclass(frozen=True)
class Params:
    """Sizes. Record counts are calibrated from a direct warm-up run to last about the given time."""

    repeats: int
    record_size: int
    calibrate_records: int    # direct ProducerPerformance warm-up that sets the record counts
    produce_seconds: float    # each produce run sends what direct sends in about this long
    fetch_fill_seconds: float  # the fetch topic holds what direct produces in about this long
    min_records: int
    max_records: int
    latency_samples: int      # per latency run, after the warm-up
    latency_warmup: int
    tool_heap: str = "512m"
    full_jit: bool = True     # the Java tools; C1 only (the harness's quick start) caps them: smoke runs

    @classmethod
    def full(cls) -> Params:
        return cls(repeats=3, record_size=1024, calibrate_records=100_000, produce_seconds=12,
                   fetch_fill_seconds=16, min_records=100_000, max_records=3_000_000,
                   latency_samples=3000, latency_warmup=300)

    @classmethod
    def quick(cls) -> Params:
        return cls(repeats=1, record_size=1024, calibrate_records=30_000, produce_seconds=2,
                   fetch_fill_seconds=3, min_records=30_000, max_records=500_000,
                   latency_samples=500, latency_warmup=100)

    @classmethod
    def smoke(cls) -> Params:
        """The test suite's size: every path, workload and field, with numbers too small to mean much."""
        return cls(repeats=1, record_size=1024, calibrate_records=5_000, produce_seconds=1,
                   fetch_fill_seconds=1, min_records=5_000, max_records=20_000,
                   latency_samples=100, latency_warmup=20, full_jit=False)

    def records_for(self, mb_per_s: float, seconds: float) -> int:
        n = int(mb_per_s * 1024 * 1024 * seconds / self.record_size)
        return max(self.min_records, min(self.max_records, n))


# --------------------------------------------------------------------------- broker with a RAW listener


class BenchCluster(KafkaCluster):
    """A one-node harness cluster plus a ``RAW`` listener advertised as the raw forwarder's port.

    The harness builds PLAINTEXT (clients, inter-broker) and CONTROLLER listeners on ports it picks;
    this adds ``RAW://127.0.0.1:<raw_port>`` advertised as ``127.0.0.1:<forwarder_port>``. Both
    client listeners are plain PLAINTEXT with the broker's default per-listener settings
    (same ``num.network.threads`` processors, same request handler pool and log), so the paths
    differ only by the proxy hop. A broker answers Metadata with the endpoints of the listener the
    request came in on, which is how a client behind the forwarder learns the forwarder's address.
    """

    def __init__(self, root: Path, raw_port: int, forwarder_port: int,
                 broker_properties: Mapping[str, str] | None = None) -> None:
        super().__init__(root, 1, broker_properties=dict(broker_properties or {}))
        self.raw_port = raw_port
        self.forwarder_port = forwarder_port

    def _properties(self, n: KafkaNode, voters: str) -> str:
        props = dict(line.split("=", 1) for line in super()._properties(n, voters).splitlines() if line)
        props["listeners"] += f",RAW://127.0.0.1:{self.raw_port}"
        props["advertised.listeners"] += f",RAW://127.0.0.1:{self.forwarder_port}"
        props["listener.security.protocol.map"] += ",RAW:PLAINTEXT"
        return "".join(f"{k}={v}\n" for k, v in props.items())


# --------------------------------------------------------------------------- child processes


class ChildProcess:
    """A proxy process started with a ready line on stdout/stderr (raw forwarder, profiled Sluice)."""

    def __init__(self, cmd: Sequence[str], ready: re.Pattern[str]) -> None:
        self.cmd = list(cmd)
        self.ready = ready
        self.process: subprocess.Popen[str] | None = None
        self.address = ""
        self._lines: list[str] = []
        self._event = threading.Event()

    def start(self, timeout_s: float = 20.0) -> ChildProcess:
        self.process = subprocess.Popen(self.cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, preexec_fn=die_with_parent)
        threading.Thread(target=self._pump, daemon=True).start()
        if not self._event.wait(timeout_s):
            self.stop()
            raise RuntimeError(f"{self.cmd} did not start:\n{''.join(self._lines)}")
        return self

    def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.append(line)
            m = self.ready.search(line)
            if m and not self._event.is_set():
                self.address = m.group(1)
                self._event.set()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


# --------------------------------------------------------------------------- Java perf tools


_PRODUCER_PERCENTILES = re.compile(r"(\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th")


def run_java_tool(main: str, args: Sequence[str], heap: str, timeout_s: float = 300.0,
                  full_jit: bool = True) -> str:
    """A Kafka tool, by default with full JIT (the harness's C1-only quick start would cap the client)."""
    cmd = java_command(main, *args, heap=heap, quick_start=not full_jit)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{main} failed ({done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def producer_perf(bootstrap: str, topic: str, records: int, record_size: int, heap: str,
                  full_jit: bool = True) -> dict[str, float]:
    props = {"bootstrap.servers": bootstrap, "acks": "1"}
    out = run_java_tool("org.apache.kafka.tools.ProducerPerformance",
                        ["--topic", topic, "--num-records", str(records), "--record-size", str(record_size),
                         "--throughput", "-1", "--producer-props", *(f"{k}={v}" for k, v in props.items())],
                        heap, full_jit=full_jit)
    summary = parse_producer_perf(out)
    result = {"mb_per_s": summary.mb_per_s, "records_per_s": summary.records_per_s,
              "avg_latency_ms": summary.avg_latency_ms, "records": float(summary.records)}
    pct = _PRODUCER_PERCENTILES.findall(out)
    if pct:
        result |= {"p50_latency_ms": float(pct[-1][0]), "p99_latency_ms": float(pct[-1][2])}
    return result


def consumer_perf(bootstrap: str, topic: str, records: int, heap: str,
                  full_jit: bool = True) -> dict[str, float]:
    out = run_java_tool("org.apache.kafka.tools.ConsumerPerformance",
                        ["--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(records),
                         "--group", f"bench-{uuid.uuid4().hex[:8]}", "--timeout", "60000"], heap,
                        full_jit=full_jit)
    header = next((ln for ln in out.splitlines() if ln.startswith("start.time")), None)
    rows = [ln for ln in out.splitlines() if ln[:1].isdigit()]
    if header is None or not rows:
        raise RuntimeError(f"no ConsumerPerformance result in:\n{out}")
    cols = dict(zip([c.strip() for c in header.split(",")], [c.strip() for c in rows[-1].split(",")],
                    strict=False))
    consumed = int(cols["data.consumed.in.nMsg"])
    if consumed < records:
        raise RuntimeError(f"ConsumerPerformance read {consumed} of {records} records:\n{out}")
    return {"mb_per_s": float(cols["fetch.MB.sec"]), "mb_per_s_with_join": float(cols["MB.sec"]),
            "records": float(consumed), "rebalance_ms": float(cols["rebalance.time.ms"]),
            "fetch_ms": float(cols["fetch.time.ms"])}


# --------------------------------------------------------------------------- hand-built requests


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varint(n: int) -> bytes:
    return _uvarint((n << 1) ^ (n >> 63))


def record_batch(value: bytes, timestamp_ms: int, count: int = 1) -> bytes:
    """A magic-v2 record batch of `count` records of `value` (no key, no headers, uncompressed)."""
    records = bytearray()
    for i in range(count):  # attributes, timestamp delta, offset delta i, key -1, value, no headers
        body = b"\x00" + _varint(0) + _varint(i) + _varint(-1) + _varint(len(value)) + value + _varint(0)
        records += _varint(len(body)) + body
    # attributes .. end: what the CRC covers
    tail = struct.pack(">hiqqqhii", 0, count - 1, timestamp_ms, timestamp_ms, -1, -1, -1, count) + records
    after_length = struct.pack(">ib", -1, 2) + struct.pack(">I", crc32c.crc32c(tail)) + tail
    return struct.pack(">qi", 0, len(after_length)) + after_length


def _request_header_v1(api_key: int, version: int, correlation_id: int, client_id: bytes) -> bytes:
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def produce_request(correlation_id: int, topic: str, batch: bytes,
                    client_id: bytes = b"sluice-bench") -> bytes:
    """Produce v8 (the last non-flexible version), acks=1, one partition: a size-prefixed frame."""
    name = topic.encode()
    body = (struct.pack(">hhi", -1, 1, 30_000) + struct.pack(">i", 1) + struct.pack(">h", len(name)) + name
            + struct.pack(">iii", 1, 0, len(batch)) + batch)
    payload = _request_header_v1(0, 8, correlation_id, client_id) + body
    return struct.pack(">i", len(payload)) + payload


def check_produce_response(payload: bytes, correlation_id: int) -> None:
    corr, n_topics, name_len = struct.unpack_from(">iih", payload, 0)
    pos = 10 + name_len
    n_parts, _index, error = struct.unpack_from(">iih", payload, pos)
    if corr != correlation_id or n_topics != 1 or n_parts != 1 or error != 0:
        raise RuntimeError(f"bad Produce response: corr {corr}/{correlation_id}, error {error}")


def api_versions_request(correlation_id: int, client_id: bytes = b"sluice-bench") -> bytes:
    """ApiVersions v3 (flexible: request header v2, compact strings, empty tag sections)."""
    header = _request_header_v1(18, 3, correlation_id, client_id) + b"\x00"
    body = _uvarint(len(b"bench") + 1) + b"bench" + _uvarint(len(b"1") + 1) + b"1" + b"\x00"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def check_api_versions_response(payload: bytes, correlation_id: int) -> None:
    corr, error = struct.unpack_from(">ih", payload, 0)  # ApiVersions responses keep header v0
    if corr != correlation_id or error != 0:
        raise RuntimeError(f"bad ApiVersions response: corr {corr}/{correlation_id}, error {error}")


def _recv_exact(sock: socket.socket, buf: bytearray, n: int) -> memoryview:
    if len(buf) < n:
        buf.extend(bytes(n - len(buf)))
    view = memoryview(buf)[:n]
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed mid-response")
        got += k
    return view


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def latency_run(addresses: Mapping[str, str], make_frame: Callable[[int], bytes],
                check: Callable[[bytes, int], None], samples: int, warmup: int) -> dict[str, list[float]]:
    """Round-trip times in ms, per path, of requests sent one at a time, one connection per path.

    The paths take turns request by request (starting with a different path each round), so a burst
    of load from elsewhere on the machine lands on all of them alike instead of on whichever path
    happened to be measured at that moment.
    """
    names = list(addresses)
    socks = {p: _connect(a) for p, a in addresses.items()}
    times: dict[str, list[float]] = {p: [] for p in names}
    buf = bytearray(1 << 16)
    try:
        for i in range(warmup + samples):
            frame = make_frame(i)
            for p in rotated(names, i):
                sock = socks[p]
                t0 = time.perf_counter_ns()
                sock.sendall(frame)
                size = struct.unpack(">i", _recv_exact(sock, buf, 4))[0]
                payload = _recv_exact(sock, buf, size)
                t1 = time.perf_counter_ns()
                check(bytes(payload[:64]), i)
                if i >= warmup:
                    times[p].append((t1 - t0) / 1e6)
    finally:
        for sock in socks.values():
            sock.close()
    return times


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


# --------------------------------------------------------------------------- the run


@dataclass
class Environment:
    workdir: Path
    cluster: BenchCluster
    addresses: dict[str, str]
    proxy_pids: dict[str, int | None]
    stop: list[Callable[[], object]] = field(default_factory=list)


def advertised_brokers(bootstrap: str) -> list[str]:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15)
    return sorted(f"{b.host}:{b.port}" for b in md.brokers.values())


ACCESS_LOG: dict[str, Any] = {"enabled": False}

# A quota for every client, as the issue-29 comparison runs Sluice: one default client-id entry
# with both byte rates so high (1 TB/s) that nothing is ever throttled. Every request is still
# recorded and checked by the quota engine, so the run measures the engine's cost, not throttling.
# `--no-quotas` runs Sluice without any quota.
QUOTA_BYTES_PER_S = 10**12
QUOTA_ENTRIES: list[dict[str, Any]] = [{"client_id": "<default>", "producer_byte_rate": QUOTA_BYTES_PER_S,
                                        "consumer_byte_rate": QUOTA_BYTES_PER_S}]
QUOTAS: dict[str, Any] = {"enabled": True}
SLUICE_FROM: dict[str, Path | None] = {"dir": None}  # `--sluice-from`: another checkout's Sluice


def access_log_counters(port: int) -> dict[str, float]:
    """Sluice's access-log counters from /metrics: records written and dropped (must stay 0)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = {}
    for name in ("written", "dropped"):
        m = re.search(rf"^sluice_access_log_records_{name}_total (\S+)", text, re.M)
        found[name] = float(m.group(1)) if m else float("nan")
    return found


def quota_counters(port: int) -> dict[str, float]:
    """What Sluice's quota engine saw, from /metrics: its live sensors (created by the requests it
    recorded), the configured values, and requests throttled or shadow-throttled (both must stay 0)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

    def total(name: str) -> float:
        return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)", text, re.M))

    return {"sensors": total("sluice_quota_sensors"),
            "configured_values": float(len(re.findall(r"^sluice_quota_configured\{", text, re.M))),
            "throttled_requests": total("sluice_quota_throttled_requests_total"),
            "shadow_would_throttle": total("sluice_quota_shadow_would_throttle_total")}


def sluice_config(workdir: Path) -> tuple[dict[str, Any], int | None]:
    """The bench's Sluice settings beyond the defaults, and its metrics port (None: metrics off)."""
    config: dict[str, Any] = {}
    port: int | None = None
    if ACCESS_LOG["enabled"] or QUOTAS["enabled"]:
        port = free_port()
        config["metrics"] = {"port": port}
    if ACCESS_LOG["enabled"]:
        config["access_log"] = {"dir": str(workdir / "access-log")}
    if QUOTAS["enabled"]:
        config["quotas"] = {"entries": QUOTA_ENTRIES}
    return config, port


def start_environment(workdir: Path, paths: Sequence[str], profile_sluice: Path | None,
                      log: Callable[[str], None]) -> Environment:
    raw_port, forwarder_port = free_port(), free_port()
    cluster = BenchCluster(workdir / "kafka", raw_port, forwarder_port,
                           broker_properties={"log.retention.check.interval.ms": "5000"})
    t0 = time.monotonic()
    cluster.start()
    env = Environment(workdir, cluster, {"direct": cluster.bootstrap}, {"direct": None}, [cluster.stop])
    log(f"broker up in {time.monotonic() - t0:.1f}s: PLAINTEXT {cluster.bootstrap}, RAW 127.0.0.1:{raw_port} "
        f"advertised as 127.0.0.1:{forwarder_port}")
    try:
        if "raw" in paths:
            fwd = ChildProcess([sys.executable, "-m", "bench.common.raw_forwarder", "--listen",
                                f"127.0.0.1:{forwarder_port}", "--upstream", f"127.0.0.1:{raw_port}"],
                               re.compile(r"raw forwarder ready: (\S+)")).start()
            env.stop.append(fwd.stop)
            env.addresses["raw"], env.proxy_pids["raw"] = fwd.address, fwd.pid
        if "sluice" in paths:
            config, port = sluice_config(workdir)
            if profile_sluice is None:
                launcher = (("-m", "proxy") if SLUICE_FROM["dir"] is None
                            else (str(REPO / "bench" / "common" / "run_from.py"), str(SLUICE_FROM["dir"])))
                sluice = SluiceProcess(cluster.bootstrap, workdir / "sluice", config=config,
                                       launcher=launcher).start()
                env.stop.append(sluice.stop)
                # stop hooks run last-first: these read /metrics before the stop
                if ACCESS_LOG["enabled"] and port is not None:
                    env.stop.append(lambda: ACCESS_LOG.update(access_log_counters(port)))
                if QUOTAS["enabled"] and port is not None:
                    env.stop.append(lambda: QUOTAS.update(quota_counters(port)))
                assert sluice.process is not None
                env.addresses["sluice"], env.proxy_pids["sluice"] = sluice.bootstrap, sluice.process.pid
            else:
                cfg = workdir / "sluice-profiled.yaml"
                profiled: dict[str, Any] = {"listen": "127.0.0.1:0", "log_level": "INFO",
                                            "upstream": {"bootstrap": cluster.bootstrap}, **config}
                cfg.write_text(json.dumps(profiled))  # JSON is YAML
                prof = ChildProcess([sys.executable, "-m", "bench.profile_sluice", str(profile_sluice),
                                     "proxy", "--config", str(cfg)],
                                    READY).start()
                env.stop.append(prof.stop)
                env.addresses["sluice"], env.proxy_pids["sluice"] = prof.address, prof.pid
        # the three paths must differ only by the hop: each must advertise itself
        for path, address in env.addresses.items():
            seen = advertised_brokers(address)
            if path == "direct":
                ok = seen == [cluster.bootstrap]
            elif path == "raw":
                ok = seen == [f"127.0.0.1:{forwarder_port}"]
            else:
                ok = len(seen) == 1 and seen[0] != cluster.bootstrap
            if not ok:
                raise RuntimeError(f"{path} path at {address} advertises {seen}")
            log(f"{path:>6}: bootstrap {address}, Metadata advertises {seen[0]}")
    except BaseException:
        stop_environment(env)
        raise
    return env


def stop_environment(env: Environment) -> None:
    for stop in reversed(env.stop):
        try:
            stop()
        except Exception as exc:  # keep stopping the rest
            print(f"bench: stopping failed: {exc}", file=sys.stderr)


def rotated(paths: Sequence[str], k: int) -> list[str]:
    k %= len(paths)
    return [*paths[k:], *paths[:k]]


def measured(env: Environment, path: str, record_size: int,
             fn: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Run one tool measurement, adding the proxy's CPU: % of the wall time and ms per MB moved.
    The CPU is counted from a quiet proxy to a quiet proxy: none of an earlier run's work (the
    access-log writer's on its records, a second after them) and all of this one's."""
    pid = env.proxy_pids.get(path)
    if pid is not None:
        wait_quiet(pid)
    c0, own0, t0 = process_cpu_s(pid), own_cpu_s(pid) if pid else 0.0, time.monotonic()
    result = fn()
    wall = time.monotonic() - t0
    if pid is not None:
        wait_quiet(pid)
        cpu, own = process_cpu_s(pid) - c0, own_cpu_s(pid) - own0
        mb = result["records"] * record_size / 2**20
        result["proxy_cpu_s"] = cpu
        result["proxy_cpu_pct_of_wall"] = 100 * cpu / wall if wall else 0.0
        result["proxy_cpu_ms_per_mb"] = 1000 * cpu / mb
        # the proxy process alone (event loop and threads); the rest is its children (the
        # access-log writer process)
        result["proxy_own_cpu_ms_per_mb"] = 1000 * own / mb
    result["wall_s"] = wall
    return result


def run_benchmark(params: Params, paths: Sequence[str], workloads: Sequence[str], workdir: Path,
                  profile_sluice: Path | None, log: Callable[[str], None]) -> dict[str, Any]:
    started = time.monotonic()
    load_before = os.getloadavg()
    env = start_environment(workdir, paths, profile_sluice, log)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    sizes: dict[str, float] = {}
    try:
        direct = env.addresses["direct"]
        produce_topic, fetch_topic, latency_topic = "bench-produce", "bench-fetch", "bench-latency"
        # produce runs append to one topic; retention keeps the log (and the disk) small
        create_topic(direct, produce_topic, config={"retention.bytes": str(256 * 1024 * 1024)})
        create_topic(direct, latency_topic, config={"retention.bytes": str(64 * 1024 * 1024)})
        # calibration, in two steps (they also warm up the broker's JIT): a fixed-size direct run
        # sizes the fetch topic, and filling that topic (direct) sizes the produce runs
        cal = producer_perf(direct, produce_topic, params.calibrate_records, params.record_size,
                            params.tool_heap, params.full_jit)
        fetch_records = params.records_for(cal["mb_per_s"], params.fetch_fill_seconds)
        create_topic(direct, fetch_topic)
        t0 = time.monotonic()
        fill = producer_perf(direct, fetch_topic, fetch_records, params.record_size, params.tool_heap,
                             params.full_jit)
        produce_records = params.records_for(fill["mb_per_s"], params.produce_seconds)
        sizes = {"calibration_mb_per_s": cal["mb_per_s"], "fill_mb_per_s": fill["mb_per_s"],
                 "produce_records": produce_records, "fetch_records": fetch_records}
        log(f"calibration: direct {cal['mb_per_s']:.1f} MB/s, then {fetch_records} records into "
            f"{fetch_topic} in {time.monotonic() - t0:.1f}s ({fill['mb_per_s']:.1f} MB/s) "
            f"-> {produce_records} records per produce run")
        # a short warm-up through each proxy: first connections and listeners out of the measured runs
        for path in paths:
            if path != "direct":
                producer_perf(env.addresses[path], produce_topic, params.calibrate_records // 2,
                              params.record_size, params.tool_heap, params.full_jit)
        batch = record_batch(b"x" * 100, int(time.time() * 1000))
        latency_workloads: dict[str, tuple[Callable[[int], bytes], Callable[[bytes, int], None]]] = {
            "latency_produce": (lambda i: produce_request(i, latency_topic, batch), check_produce_response),
            "latency_apiversions": (api_versions_request, check_api_versions_response),
        }
        for rep in range(params.repeats):
            order = rotated(paths, rep)
            if "produce" in workloads:
                for path in order:
                    def produce(p: str = path) -> dict[str, float]:
                        return producer_perf(env.addresses[p], produce_topic, produce_records,
                                             params.record_size, params.tool_heap, params.full_jit)
                    r = measured(env, path, params.record_size, produce)
                    runs.setdefault("produce", {}).setdefault(path, []).append(r)
                    log(f"rep {rep + 1} produce {path:>6}: {r['mb_per_s']:7.1f} MB/s"
                        + (f"  proxy CPU {r['proxy_cpu_pct_of_wall']:.0f}%" if "proxy_cpu_s" in r else ""))
            if "fetch" in workloads:
                for path in order:
                    def fetch(p: str = path) -> dict[str, float]:
                        return consumer_perf(env.addresses[p], fetch_topic, fetch_records,
                                             params.tool_heap, params.full_jit)
                    r = measured(env, path, params.record_size, fetch)
                    runs.setdefault("fetch", {}).setdefault(path, []).append(r)
                    log(f"rep {rep + 1} fetch   {path:>6}: {r['mb_per_s']:7.1f} MB/s"
                        + (f"  proxy CPU {r['proxy_cpu_pct_of_wall']:.0f}%" if "proxy_cpu_s" in r else ""))
            if "latency" in workloads:
                for name, (make, check) in latency_workloads.items():
                    proxies = [pid for p in order if (pid := env.proxy_pids.get(p)) is not None]
                    for pid in proxies:  # from quiet to quiet, as in `measured`
                        wait_quiet(pid)
                    cpu0 = {p: process_cpu_s(env.proxy_pids.get(p)) for p in order}
                    own0 = {p: own_cpu_s(pid) if (pid := env.proxy_pids.get(p)) else 0.0 for p in order}
                    by_path = latency_run({p: env.addresses[p] for p in order}, make, check,
                                          params.latency_samples, params.latency_warmup)
                    for pid in proxies:
                        wait_quiet(pid)
                    requests = params.latency_samples + params.latency_warmup
                    for path, t in by_path.items():
                        r = {"p50_ms": percentile(t, 50), "p99_ms": percentile(t, 99),
                             "mean_ms": statistics.fmean(t), "max_ms": max(t), "samples": float(len(t))}
                        if env.proxy_pids.get(path) is not None:  # each proxy saw only its own path
                            cpu = process_cpu_s(env.proxy_pids[path]) - cpu0[path]
                            r["proxy_cpu_us_per_request"] = 1e6 * cpu / requests
                            own = own_cpu_s(env.proxy_pids[path]) - own0[path]
                            r["proxy_own_cpu_us_per_request"] = 1e6 * own / requests  # without the writer
                        runs.setdefault(name, {}).setdefault(path, []).append(r)
                        log(f"rep {rep + 1} {name.removeprefix('latency_'):<11} {path:>6}: "
                            f"p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms")
    finally:
        stop_environment(env)
    return summarize(params, paths, runs, {
        "load_avg_before": list(load_before), "load_avg_after": list(os.getloadavg()),
        "duration_s": round(time.monotonic() - started, 1),
        "profiled_sluice": profile_sluice is not None, "sizes": sizes,
    })


# --------------------------------------------------------------------------- summary


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _added(by_path: Mapping[str, list[dict[str, float]]], key: str) -> dict[str, float]:
    """Latency a proxy adds: the median over repeats of (proxy - direct) within the same repeat.

    The paths of one repeat ran interleaved request by request, so pairing them cancels most of
    the machine's load swings, which the difference of the two overall medians would not.
    """
    direct = by_path.get("direct")
    if not direct:
        return {}
    return {p: round(statistics.median(r[key] - d[key] for r, d in zip(rs, direct, strict=True)), 3)
            for p, rs in by_path.items() if p != "direct"}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def summarize(params: Params, paths: Sequence[str], runs: dict[str, dict[str, list[dict[str, float]]]],
              extra: Mapping[str, Any]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for workload, by_path in runs.items():
        if workload in ("produce", "fetch"):
            median = {p: round(_median(rs, "mb_per_s"), 1) for p, rs in by_path.items()}
            entry: dict[str, Any] = {"unit": "MB/s", "median": median}
            proxies = {p: rs for p, rs in by_path.items() if rs and "proxy_cpu_s" in rs[0]}
            if proxies:
                entry["proxy_cpu_pct_median"] = {p: round(_median(rs, "proxy_cpu_pct_of_wall"), 1)
                                                 for p, rs in proxies.items()}
                entry["proxy_cpu_ms_per_mb_median"] = {p: round(_median(rs, "proxy_cpu_ms_per_mb"), 2)
                                                       for p, rs in proxies.items()}
                entry["proxy_own_cpu_ms_per_mb_median"] = {
                    p: round(_median(rs, "proxy_own_cpu_ms_per_mb"), 2) for p, rs in proxies.items()}
            m = median.get
            entry["ratios"] = {"sluice/direct": _ratio(m("sluice"), m("direct")),
                               "sluice/raw": _ratio(m("sluice"), m("raw")),
                               "raw/direct": _ratio(m("raw"), m("direct"))}
        else:
            p50 = {p: round(_median(rs, "p50_ms"), 3) for p, rs in by_path.items()}
            p99 = {p: round(_median(rs, "p99_ms"), 3) for p, rs in by_path.items()}
            entry = {"unit": "ms", "p50_ms": p50, "p99_ms": p99,
                     "added_p50_ms": _added(by_path, "p50_ms"), "added_p99_ms": _added(by_path, "p99_ms")}
            proxies = {p: rs for p, rs in by_path.items() if rs and "proxy_cpu_us_per_request" in rs[0]}
            if proxies:
                entry["proxy_cpu_us_per_request_median"] = {
                    p: round(_median(rs, "proxy_cpu_us_per_request"), 1) for p, rs in proxies.items()}
                entry["proxy_own_cpu_us_per_request_median"] = {
                    p: round(_median(rs, "proxy_own_cpu_us_per_request"), 1) for p, rs in proxies.items()}
        entry["runs"] = by_path
        results[workload] = entry

    targets: list[dict[str, Any]] = []

    def target(name: str, value: float | None, op: str, threshold: float) -> None:
        if value is None:
            return
        met = value >= threshold if op == ">=" else value <= threshold
        targets.append({"name": name, "value": value, "op": op, "threshold": threshold, "met": met})

    for w in ("produce", "fetch"):
        if w in results:
            r = results[w]["ratios"]
            target(f"{w} sluice/direct", r["sluice/direct"], ">=", TARGET_THROUGHPUT_VS_DIRECT)
            target(f"{w} sluice/raw", r["sluice/raw"], ">=", TARGET_THROUGHPUT_VS_RAW)
    for w in ("latency_produce", "latency_apiversions"):
        if w in results:
            target(f"{w.removeprefix('latency_')} added p99 ms", results[w]["added_p99_ms"].get("sluice"),
                   "<=", TARGET_ADDED_P99_MS)

    return {
        "benchmark": "proxy",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sluice_commit": git_describe(),
        "sluice_from": None if SLUICE_FROM["dir"] is None else str(SLUICE_FROM["dir"]),
        "machine": machine(),
        "params": asdict(params),
        "paths": list(paths),
        **extra,
        "results": results,
        "targets": targets,
    }


def format_table(report: Mapping[str, Any]) -> str:
    res = report["results"]
    lines = [f"Sluice proxy benchmark  ({report['machine']['cpu_count']} CPUs, unpinned, "
             f"{report['params']['repeats']} repeats, medians; commit {report['sluice_commit']})", ""]
    head = f"{'workload':<28}{'direct':>10}{'sluice':>10}{'raw':>10}{'s/direct':>10}{'s/raw':>8}{'raw/d':>8}"
    lines += [head, "-" * len(head)]

    def cell(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    for w, label in (("produce", "produce MB/s"), ("fetch", "fetch MB/s")):
        if w in res:
            m, r = res[w]["median"], res[w]["ratios"]
            lines.append(f"{label:<28}" + "".join(f"{cell(m.get(p), '.1f'):>10}" for p in PATHS)
                         + f"{cell(r['sluice/direct'], '.3f'):>10}{cell(r['sluice/raw'], '.3f'):>8}"
                         + f"{cell(r['raw/direct'], '.3f'):>8}")
    for w in ("latency_produce", "latency_apiversions"):
        if w in res:
            for q in ("p50", "p99"):
                vals = res[w][f"{q}_ms"]
                added = res[w][f"added_{q}_ms"]
                lines.append(f"{w.removeprefix('latency_') + ' ' + q + ' ms':<28}"
                             + "".join(f"{cell(vals.get(p), '.3f'):>10}" for p in PATHS)
                             + f"   added: sluice {cell(added.get('sluice'), '+.3f')}"
                             + f", raw {cell(added.get('raw'), '+.3f')}")
    lat_cpu = [w for w in ("latency_produce", "latency_apiversions")
               if w in res and "proxy_cpu_us_per_request_median" in res[w]]
    if lat_cpu:
        lines += ["", "proxy CPU per small request+response (median, µs): "
                  + "; ".join(w.removeprefix("latency_") + " " + ", ".join(
                      f"{p} {v:.0f}" for p, v in res[w]["proxy_cpu_us_per_request_median"].items())
                      for w in lat_cpu)]
        if "sluice" in res[lat_cpu[0]].get("proxy_own_cpu_us_per_request_median", {}):
            lines.append("  of which Sluice's own process (the rest is its access-log writer): " + "; ".join(
                w.removeprefix("latency_") + f" {res[w]['proxy_own_cpu_us_per_request_median']['sluice']:.0f}"
                for w in lat_cpu))
    cpu_rows = [w for w in ("produce", "fetch") if w in res and "proxy_cpu_ms_per_mb_median" in res[w]]
    if cpu_rows:
        lines += ["", "proxy CPU (median): ms of CPU per MB moved / % of one core during the run"]
        for w in cpu_rows:
            per_mb, pct = res[w]["proxy_cpu_ms_per_mb_median"], res[w]["proxy_cpu_pct_median"]
            lines.append(f"  {w:<8}" + ", ".join(f"{p} {per_mb[p]:.2f} ms/MB ({pct[p]:.0f}%)" for p in per_mb)
                         + (f"; sluice/raw CPU per MB {per_mb['sluice'] / per_mb['raw']:.1f}x"
                            if per_mb.get("raw") and "sluice" in per_mb else ""))
    if report["targets"]:
        lines += ["", "targets (issue 3):"]
        lines += [f"  {'MET ' if t['met'] else 'MISS'} {t['name']}: {t['value']} {t['op']} {t['threshold']}"
                  for t in report["targets"]]
    return "\n".join(lines)


def write_chart(report: Mapping[str, Any], path: Path) -> bool:
    try:
        plt = pyplot()
    except ImportError:
        return False
    res = report["results"]
    panels = [(w, t) for w, t in (("produce", "produce MB/s"), ("fetch", "fetch MB/s"),
                                   ("latency_produce", "1-record produce RTT ms"),
                                   ("latency_apiversions", "ApiVersions RTT ms")) if w in res]
    if not panels:
        return False
    colors = {"direct": "#4c72b0", "sluice": "#dd8452", "raw": "#55a868"}
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (w, title) in zip(axes, panels, strict=True):
        paths = [p for p in PATHS if p in (res[w].get("median") or res[w].get("p50_ms"))]
        if w in ("produce", "fetch"):
            vals = [res[w]["median"][p] for p in paths]
            bars = ax.bar(paths, vals, color=[colors[p] for p in paths])
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
        else:
            x = range(len(paths))
            p50 = [res[w]["p50_ms"][p] for p in paths]
            p99 = [res[w]["p99_ms"][p] for p in paths]
            b50 = ax.bar([i - 0.2 for i in x], p50, 0.4, label="p50", color=[colors[p] for p in paths])
            b99 = ax.bar([i + 0.2 for i in x], p99, 0.4, label="p99", color=[colors[p] for p in paths],
                         alpha=0.5)
            ax.bar_label(b50, fmt="%.2f", fontsize=7)
            ax.bar_label(b99, fmt="%.2f", fontsize=7)
            ax.set_xticks(list(x), paths)
            ax.legend(fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.suptitle(f"Sluice vs direct vs raw forwarder ({report['machine']['cpu_count']} CPUs, "
                 f"medians of {report['params']['repeats']})", fontsize=10)
    return save_chart(plt, fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_proxy",
                                     description="Throughput and latency: direct vs Sluice vs raw forwarder")
    parser.add_argument("--quick", action="store_true", help="one small repeat (~1 min smoke run)")
    parser.add_argument("--smoke", action="store_true",
                        help="the test suite's size: one tiny repeat, C1-only Java tools")
    parser.add_argument("--access-log", action="store_true",
                        help="run Sluice with its access log on; report records written and dropped")
    parser.add_argument("--quotas", action=argparse.BooleanOptionalAction, default=True,
                        help="give every client a quota (a default client-id entry, both byte rates "
                             f"{QUOTA_BYTES_PER_S:.0e} B/s: recorded and checked, never throttled) "
                             "[on]; --no-quotas: Sluice with no quota")
    parser.add_argument("--out", type=Path, help=f"results JSON [{DEFAULT_OUT.relative_to(REPO)}]")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG next to the JSON")
    parser.add_argument("--repeats", type=int, help="override the number of repeats")
    parser.add_argument("--paths", default=",".join(PATHS), help="subset of direct,sluice,raw")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="subset of produce,fetch,latency")
    parser.add_argument("--workdir", type=Path, help="broker data etc. (default: a temp dir, removed)")
    parser.add_argument("--profile-sluice", type=Path, metavar="FILE.prof",
                        help="run Sluice under cProfile and dump its stats here (numbers are then "
                             "not representative; the default --out becomes proxy-profiled.json)")
    parser.add_argument("--sluice-from", type=Path, metavar="DIR",
                        help="run the Sluice of DIR, a built checkout of another commit (made as "
                             "bench_hot_path's docstring shows), to compare two commits run by run")
    args = parser.parse_args(argv)

    params = Params.smoke() if args.smoke else Params.quick() if args.quick else Params.full()
    if args.repeats:
        params = Params(**(asdict(params) | {"repeats": args.repeats}))
    paths = [p for p in PATHS if p in args.paths.split(",")]
    if "direct" not in paths:
        paths.insert(0, "direct")  # the baseline, and the path used for set-up
    workloads = [w for w in WORKLOADS if w in args.workloads.split(",")]
    default_out = DEFAULT_OUT.with_name("proxy-profiled.json") if args.profile_sluice else DEFAULT_OUT
    out: Path = args.out or default_out

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    ACCESS_LOG["enabled"] = args.access_log
    SLUICE_FROM["dir"] = args.sluice_from.resolve() if args.sluice_from else None
    QUOTAS["enabled"] = args.quotas
    if args.quotas:
        QUOTAS["entries"] = QUOTA_ENTRIES
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    log(f"workdir {workdir}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}; params {asdict(params)}")
    try:
        report = run_benchmark(params, paths, workloads, workdir,
                               args.profile_sluice.resolve() if args.profile_sluice else None, log)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    report["quick"] = args.quick or args.smoke
    report["access_log"] = {k: v for k, v in ACCESS_LOG.items()}
    report["quotas"] = {k: v for k, v in QUOTAS.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(report))
    if args.access_log:
        print(f"access log: {ACCESS_LOG.get('written')} records written, {ACCESS_LOG.get('dropped')} dropped")
    if args.quotas:
        print(f"quotas: a default client-id quota of {QUOTA_BYTES_PER_S:.0e} B/s produce and fetch; "
              f"{QUOTAS.get('sensors')} live sensors, {QUOTAS.get('throttled_requests')} requests throttled")
    else:
        print("quotas: none (--no-quotas)")
    print(f"\nresults: {out}")
    if not args.no_chart and write_chart(report, out.with_suffix(".png")):
        print(f"chart:   {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real Apache Kafka brokers in KRaft mode, started from jars that Maven resolved from Maven Central.

`scripts/setup` copies the classpath of `jvm/kafka/pom.xml` into `.cache/kafka-libs`. This module
formats storage with `kafka.tools.StorageTool` and starts `kafka.Kafka` from that classpath on free
loopback ports: one combined broker+controller node, or several with a static controller quorum.

Every node is a child process in its own session with a parent-death signal, so a broker never
outlives the Python process that started it, even when that process is killed.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.harness.wait import poll

if TYPE_CHECKING:
    from tests.harness.tls import TestCA

REPO = Path(__file__).resolve().parents[2]
KAFKA_LIBS = Path(os.environ.get("SLUICE_KAFKA_LIBS", REPO / ".cache" / "kafka-libs"))
LOG4J_CONFIG = REPO / "jvm" / "kafka" / "log4j2.properties"
KAFKA_POM = REPO / "jvm" / "kafka" / "pom.xml"

READY_LINE = re.compile(rb"\[KafkaRaftServer nodeId=(\d+)\] Kafka Server started")
SCRAM_REPLAYED = re.compile(rb"Replayed UserScramCredentialRecord creating new entry for (\S+)")

BROKER_HEAP = "512m"
TOOL_HEAP = "256m"


@dataclass(frozen=True)
class User:
    """A test principal known to the SASL listener, over PLAIN and over both SCRAM mechanisms."""

    name: str
    password: str


DEFAULT_USERS: tuple[User, ...] = (
    User("admin", "admin-secret"),
    User("alice", "alice-secret"),
    User("bob", "bob-secret"),
)


def kafka_version() -> str:
    """The Kafka version pinned in `jvm/kafka/pom.xml`, the one place it is written."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", KAFKA_POM.read_text())
    assert match, f"no <kafka.version> in {KAFKA_POM}"
    return match.group(1)


_PORTS_HANDED_OUT: set[int] = set()
_PORTS_LOCK = threading.Lock()


def _ephemeral_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a server the caller starts next.

    It is taken below the kernel's ephemeral range, so nothing else can take it before the server
    binds it: a port the kernel picked for `bind(0)` goes back into the range the kernel gives to
    every other `bind(0)` (a Sluice listener) and every outgoing connection (a client), and a test
    run lost a Sluice metrics port that way ("address already in use"). Random, so that processes
    rarely choose alike, and never the same twice in one process.
    """
    top = _ephemeral_range_start()
    bottom = max(1024, top - 20_000)
    with _PORTS_LOCK:
        for _ in range(1000 if top - bottom >= 1000 else 0):
            port = random.randrange(bottom, top)
            if port in _PORTS_HANDED_OUT:
                continue
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _PORTS_HANDED_OUT.add(port)
            return port
    with socket.socket() as s:  # no room below the ephemeral range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def new_cluster_id() -> str:
    """A base64url 16-byte id, never starting with '-' (StorageTool would read it as an option)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def process_alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_process(pid: int, timeout_s: float = 30.0) -> None:
    """SIGTERM `pid`, wait up to `timeout_s` for it to exit, then SIGKILL it (its brokers die with it:
    parent-death signal)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not poll(lambda: not process_alive(pid), timeout_s, 0.1):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def java_command(main: str, *args: str, heap: str = TOOL_HEAP, logs_dir: Path | None = None,
                 quick_start: bool = True, jvm_options: Sequence[str] = ()) -> list[str]:
    if not KAFKA_LIBS.is_dir() or not any(KAFKA_LIBS.glob("kafka_2.13-*.jar")):
        raise RuntimeError(f"Kafka jars missing in {KAFKA_LIBS}: run scripts/setup first")
    cmd = [
        "java", "-Xms128m", f"-Xmx{heap}", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true",
        "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
    ]
    if logs_dir is not None:
        cmd.append(f"-Dkafka.logs.dir={logs_dir}")
    if quick_start:
        cmd += ["-XX:TieredStopAtLevel=1", "-Xshare:auto"]
    cmd += [*jvm_options, "-cp", f"{KAFKA_LIBS}/*", main, *args]
    return cmd


@dataclass
class KafkaNode:
    node_id: int
    directory: Path
    port: int
    controller_port: int
    sasl_port: int | None
    ssl_port: int | None = None
    process: subprocess.Popen[bytes] | None = None
    _log_file: object | None = field(default=None, repr=False)

    @property
    def properties_file(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        assert self.sasl_port is not None, "this node has no SASL listener"
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def ssl_bootstrap(self) -> str:
        assert self.ssl_port is not None, "this node has no SSL listener"
        return f"127.0.0.1:{self.ssl_port}"

    def log_text(self) -> str:
        try:
            return self.log_path.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 80) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def log_problems(self, lines: int = 20) -> str:
        """The last WARN and ERROR lines: what a failed test's report needs from a broker (its INFO
        lines would bury the test's own assertion in a CI log's tail)."""
        problems = [ln for ln in self.log_text().splitlines() if "] WARN " in ln or "] ERROR " in ln]
        return "\n".join(problems[-lines:])

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class KafkaStartError(RuntimeError):
    pass


class KafkaCluster:
    """N combined broker+controller nodes on loopback, formatted with one cluster id.

    `sasl=True` adds a SASL_PLAINTEXT listener offering PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 to
    every node, with `users` created at format time. `tls=TestCA(...)` adds an SSL listener that
    requires client certificates signed by that CA. Inter-broker and controller traffic stay on
    PLAINTEXT listeners.

    The brokers run on the C1 JIT only (`quick_start`), as the Kafka tools do: tests move megabytes at
    most, and C2's compile threads cost more than they save there. Measured on one quiet broker, C1
    against the full JIT: 2.2-2.5 against 3.7-5.4 CPU-s to start, 0.97 against 1.43 CPU-s to take in
    and hand out 100 MB, 1.71 against 2.04 CPU-s per idle minute. Benchmarks that push a broker for
    minutes pass `quick_start=False`.
    """

    def __init__(self, root: Path, nodes: int = 1, *, sasl: bool = False,
                 users: Sequence[User] = DEFAULT_USERS, broker_properties: dict[str, str] | None = None,
                 heap: str = BROKER_HEAP, tls: TestCA | None = None, quick_start: bool = True) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.root = root
        self.size = nodes
        self.sasl = sasl
        self.users = tuple(users)
        self.extra_properties = dict(broker_properties or {})
        self.heap = heap
        self.tls = tls
        self.quick_start = quick_start
        self.cluster_id = new_cluster_id()
        self.nodes: list[KafkaNode] = []
        self.start_seconds: float | None = None
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- addresses

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def sasl_bootstrap(self) -> str:
        return ",".join(n.sasl_bootstrap for n in self.nodes)

    @property
    def ssl_bootstrap(self) -> str:
        return ",".join(n.ssl_bootstrap for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    # ---------------------------------------------------------------- lifecycle

    def start(self, timeout_s: float = 90.0, attempts: int = 3) -> KafkaCluster:
        """Format and start every node, retrying on new ports if one was taken meanwhile."""
        last: Exception | None = None
        for attempt in range(1, attempts + 1):
            t0 = time.monotonic()
            try:
                self._allocate(attempt)
                self._format_all()
                self._launch_all()
                self._wait_ready(timeout_s)
                self.start_seconds = time.monotonic() - t0
                return self
            except KafkaStartError as exc:
                last = exc
                self.stop()
        raise KafkaStartError(f"Kafka did not start after {attempts} attempts: {last}")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM every node at once (one by one would leave the last waiting for a quorum)."""
        with self._lock:
            running = [n for n in self.nodes if n.process is not None]
            for n in running:
                if n.process is not None and n.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(n.process.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for n in running:
                assert n.process is not None
                try:
                    n.process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(n.process.pid, signal.SIGKILL)
                    n.process.wait(timeout=10)
                if n._log_file is not None:
                    n._log_file.close()  # type: ignore[attr-defined]
                    n._log_file = None

    def kill_node(self, node_id: int) -> None:
        """Stop one node hard (for failover tests); `restart_node` brings it back."""
        n = self.node(node_id)
        if n.process is not None and n.process.poll() is None:
            os.killpg(n.process.pid, signal.SIGKILL)
            n.process.wait(timeout=10)

    def restart_node(self, node_id: int, timeout_s: float = 60.0) -> None:
        n = self.node(node_id)
        offset = len(n.log_text().encode())
        self._launch(n)
        self._wait_node_ready(n, timeout_s, offset)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self, lines: int = 80) -> str:
        return "\n".join(f"===== node {n.node_id} ({n.log_path}) =====\n{n.log_tail(lines)}"
                         for n in self.nodes)

    def problems(self, lines: int = 20) -> str:
        return "\n".join(f"===== node {n.node_id} ({n.log_path}), WARN and ERROR =====\n"
                         f"{n.log_problems(lines)}" for n in self.nodes)

    # ---------------------------------------------------------------- internals

    def _allocate(self, attempt: int) -> None:
        self.nodes = []
        for i in range(1, self.size + 1):
            d = self.root / f"attempt{attempt}" / f"node{i}"
            d.mkdir(parents=True, exist_ok=True)
            self.nodes.append(KafkaNode(i, d, free_port(), free_port(),
                                        free_port() if self.sasl else None,
                                        free_port() if self.tls else None))
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        for n in self.nodes:
            n.properties_file.write_text(self._properties(n, voters))

    def _properties(self, n: KafkaNode, voters: str) -> str:
        rf = min(3, self.size)
        listeners = [f"PLAINTEXT://127.0.0.1:{n.port}", f"CONTROLLER://127.0.0.1:{n.controller_port}"]
        advertised = [f"PLAINTEXT://127.0.0.1:{n.port}"]
        if n.sasl_port is not None:
            listeners.insert(0, f"CLIENT://127.0.0.1:{n.sasl_port}")
            advertised.insert(0, f"CLIENT://127.0.0.1:{n.sasl_port}")
        if n.ssl_port is not None:
            listeners.append(f"SSL://127.0.0.1:{n.ssl_port}")
            advertised.append(f"SSL://127.0.0.1:{n.ssl_port}")
        props = {
            "process.roles": "broker,controller",
            "node.id": str(n.node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map":
                "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,CLIENT:SASL_PLAINTEXT,SSL:SSL",
            "log.dirs": str(n.directory / "data"),
            "num.partitions": "1",
            "default.replication.factor": str(rf),
            "min.insync.replicas": str(max(1, rf - 1)),
            "offsets.topic.replication.factor": str(rf),
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": str(rf),
            "transaction.state.log.min.isr": str(max(1, rf - 1)),
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": str(rf),
            "share.coordinator.state.topic.min.isr": str(max(1, rf - 1)),
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            "auto.create.topics.enable": "false",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "log.cleaner.dedupe.buffer.size": "1048577",
            "log.segment.bytes": "16777216",
            "log.flush.interval.messages": str(2**62),
            "controlled.shutdown.enable": "true",
        }
        if self.sasl:
            plain_users = " ".join(f'user_{u.name}="{u.password}"' for u in self.users)
            props |= {
                "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                "listener.name.client.plain.sasl.jaas.config":
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
                "listener.name.client.scram-sha-256.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "listener.name.client.scram-sha-512.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            }
        if self.tls is not None:
            server = self.tls.issue(f"broker{n.node_id}", f"broker{n.node_id}", server=True)
            props |= {
                "listener.name.ssl.ssl.keystore.type": "PEM",
                "listener.name.ssl.ssl.keystore.location": str(server.combined),
                "listener.name.ssl.ssl.truststore.type": "PEM",
                "listener.name.ssl.ssl.truststore.location": str(self.tls.cert_path),
                "listener.name.ssl.ssl.client.auth": "required",
            }
        props |= self.extra_properties
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _format_all(self) -> None:
        with ThreadPoolExecutor(max_workers=self.size) as pool:
            list(pool.map(self._format, self.nodes))

    def _format(self, n: KafkaNode) -> None:
        args = ["format", "-t", self.cluster_id, "-c", str(n.properties_file), "--ignore-formatted"]
        if self.sasl:
            for u in self.users:
                for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                    args += ["--add-scram", f"{mech}=[name={u.name},password={u.password}]"]
        cmd = java_command("kafka.tools.StorageTool", *args, logs_dir=n.directory / "logs")
        done = subprocess.run(cmd, capture_output=True, timeout=120, check=False)
        if done.returncode != 0:
            # never echo the command: it carries the SCRAM passwords
            raise KafkaStartError(f"formatting node {n.node_id} failed (exit {done.returncode}):\n"
                                  + done.stdout.decode(errors="replace")[-3000:]
                                  + done.stderr.decode(errors="replace")[-3000:])

    def _launch_all(self) -> None:
        # concurrently: a combined node's startup blocks until a controller majority exists
        for n in self.nodes:
            self._launch(n)

    def _launch(self, n: KafkaNode) -> None:
        log = open(n.log_path, "ab")  # noqa: SIM115 - closed in stop()
        n._log_file = log
        cmd = java_command("kafka.Kafka", str(n.properties_file), heap=self.heap,
                           logs_dir=n.directory / "logs", quick_start=self.quick_start)
        n.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent, cwd=n.directory)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for n in self.nodes:
            self._wait_node_ready(n, deadline - time.monotonic(), 0)
        if self.sasl:
            names = {u.name.encode() for u in self.users}
            for n in self.nodes:
                self._wait_for(n, lambda text: names <= set(SCRAM_REPLAYED.findall(text)),
                               deadline - time.monotonic(), 0, "SCRAM credentials replayed")
        self._wait_serving(deadline)

    def _wait_node_ready(self, n: KafkaNode, timeout_s: float, offset: int) -> None:
        self._wait_for(n, lambda text: READY_LINE.search(text) is not None, timeout_s, offset,
                       "'Kafka Server started'")

    def _wait_for(self, n: KafkaNode, ready: object, timeout_s: float, offset: int, what: str) -> None:
        deadline = time.monotonic() + max(timeout_s, 1.0)
        while True:
            try:
                text = n.log_path.read_bytes()[offset:]
            except FileNotFoundError:
                text = b""
            if ready(text):  # type: ignore[operator]
                return
            if n.process is None or n.process.poll() is not None:
                code = None if n.process is None else n.process.returncode
                raise KafkaStartError(f"node {n.node_id} exited ({code}) before {what}:\n{n.log_tail(60)}")
            if time.monotonic() > deadline:
                raise KafkaStartError(f"node {n.node_id}: no {what} within {timeout_s:.0f}s:\n"
                                      f"{n.log_tail(60)}")
            time.sleep(0.1)

    def _wait_serving(self, deadline: float) -> None:
        """Ready when a client sees every broker in Metadata (log lines come a little early)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000})
        while True:
            try:
                md = admin.list_topics(timeout=2)
                if len(md.brokers) == self.size:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise KafkaStartError(f"brokers not all visible in metadata:\n{self.logs(30)}")
            time.sleep(0.2)


@contextlib.contextmanager
def running_cluster(root: Path, nodes: int = 1, **kwargs: object) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(root, nodes, **kwargs)  # type: ignore[arg-type]
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


class RunningCluster(KafkaCluster):
    """A cluster someone else runs (SLUICE_KAFKA_BOOTSTRAP, a benchmark's `--bootstrap`, a test
    session's): used, never started or stopped."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(Path("/nonexistent"), 1)
        self._bootstrap = bootstrap

    @property
    def bootstrap(self) -> str:
        return self._bootstrap

    def start(self) -> KafkaCluster:
        return self

    def stop(self) -> None:
        pass

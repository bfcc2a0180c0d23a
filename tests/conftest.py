"""Session-scoped real Kafka fixtures.

- `kafka`: one KRaft node with a PLAINTEXT listener and a SASL_PLAINTEXT listener (PLAIN,
  SCRAM-SHA-256, SCRAM-SHA-512; users from `tests.harness.kafka.DEFAULT_USERS`).
- `kafka_cluster3`: three KRaft nodes on loopback with a static controller quorum.
- `tls_kafka`: one KRaft node with an SSL listener requiring client certificates, and its CA.
- `topic` / `topic_factory`: a fresh, uniquely named topic per test on the single node.

Under pytest-xdist (`make test` runs `-n 5 --dist loadgroup`) every worker is its own session; the
workers share one single node (tests/harness/shared_kafka.py), started the first time a test asks for
`kafka` and stopped when the run ends. Tests are grouped so that what is
expensive to start is started once: every test that uses the three-node cluster runs on one worker,
every Spark test (marked `spark`) on one worker, the TLS broker's tests on one worker, and the tests
of a module that starts its own module-scoped set-up (a broker with options of its own, say) on one
worker. The groups follow from the fixtures a test uses and its marks, so a new module needs no mark
of its own. Work is handed out longest first (a group counts as the sum of its tests), by the seconds
measured per test in tests/durations.json (a test not in it is estimated by its marks).

Set SLUICE_KAFKA_BOOTSTRAP to run the single-node tests against a cluster you already run.
When a test that used a broker fails, every node's last WARN and ERROR lines are attached to the report
(the whole logs stay under pytest's base temporary directory).
"""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import pytest
from _pytest.nodeid import coerce_node_id
from hypothesis import HealthCheck, settings

from tests.harness import shared_kafka
from tests.harness.kafka import KafkaCluster, RunningCluster
from tests.harness.sluice import SluiceProcess
from tests.harness.tls import TestCA
from tests.harness.tools import KafkaTools, sasl_properties
from tests.harness.topics import create_topic, metadata_with_leaders, unique_name

if TYPE_CHECKING:
    from xdist.workermanage import WorkerController

# tests import these three from here as well
__all__ = ["create_topic", "metadata_with_leaders", "unique_name"]

# Every Spark JVM a test starts (the session's driver, spark-submit and `sluice tune` drivers, a standalone
# cluster's master, worker and executors) runs on the C1 JIT only, as the harness's brokers and Kafka
# tools do: tests move kilobytes, and C2's compile threads were most of a short JVM's CPU (the Spark
# module test_fleet_dataset: 24.9 CPU-s with C2, 15.5 with C1 only). spark-class reads these two.
_C1_ONLY = "-XX:TieredStopAtLevel=1"
for _var in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ[_var] = f"{os.environ.get(_var, '')} {_C1_ONLY}".strip()

# Hypothesis's wall-clock checks (a slow example, slow input generation) fail a test for the machine's
# load, not for the code: on this shared 2-core machine at load 25 one input took 2.1 s to draw. The
# properties, example counts and every other health check stay as each test sets them.
settings.register_profile("sluice", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sluice")

_CLUSTERS: list[KafkaCluster] = []

DURATIONS = Path(__file__).with_name("durations.json")


class Estimates:
    """Seconds a test takes (set-up, call and teardown), from tests/durations.json: measured per test
    for the tests of a second or more, else the mean of its module's tests, else a guess by mark.
    `python -m tests.harness.timing FILE --estimates tests/durations.json` rewrites it from a run."""

    GUESS_S: ClassVar[dict[str, float]] = {"slow": 30.0, "spark": 15.0, "integration": 10.0}
    UNIT_S: ClassVar[float] = 0.05

    def __init__(self, tests: dict[str, float], modules: dict[str, float]) -> None:
        self.tests, self.modules = tests, modules

    @classmethod
    def load(cls) -> Estimates:
        data = json.loads(DURATIONS.read_text(encoding="utf-8")) if DURATIONS.exists() else {}
        return cls(data.get("tests", {}), data.get("modules", {}))

    def seconds(self, item: pytest.Item) -> float:
        nodeid = item.nodeid.split("@")[0] if "@" in item.nodeid.rsplit("]", 1)[-1] else item.nodeid
        if nodeid in self.tests:
            return self.tests[nodeid]
        module = nodeid.split("::")[0]
        if module in self.modules:
            return self.modules[module]
        for mark, guess in self.GUESS_S.items():
            if item.get_closest_marker(mark) is not None:
                return guess
        return self.UNIT_S


@pytest.fixture(scope="session")
def kafka(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    shared = getattr(request.config, "workerinput", {}).get(SHARED_KAFKA)
    if shared is not None:  # an xdist worker: the run's one shared broker
        attached = shared_kafka.attach(Path(shared["directory"]), int(shared["controller_pid"]))
        _CLUSTERS.append(attached)
        yield attached
        return
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka1"), 1, sasl=True)
    _CLUSTERS.append(cluster)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


# The xdist controller names the directory of the run's shared broker (tests/harness/shared_kafka.py)
# for its workers, and stops that broker when the run ends; the first worker that needs it starts it.
SHARED_KAFKA = "sluice_shared_kafka"
_SHARED_DIRECTORY: list[Path] = []


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: WorkerController) -> None:
    if not _SHARED_DIRECTORY:
        _SHARED_DIRECTORY.append(node.config._tmp_path_factory.getbasetemp() / "shared-kafka")
    node.workerinput[SHARED_KAFKA] = {"directory": str(_SHARED_DIRECTORY[0]),
                                      "controller_pid": os.getpid()}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Before pytest removes a green run's base directory (tmp_path_retention_policy), which holds
    the shared broker's data."""
    for directory in _SHARED_DIRECTORY:
        shared_kafka.stop(directory)


@pytest.fixture(scope="session")
def kafka_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka3"), 3)
    _CLUSTERS.append(cluster)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def tls_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaCluster, TestCA]]:
    """One KRaft node with an SSL listener that requires client certificates signed by the CA given
    with it (`ca.issue(...)` makes one), beside its PLAINTEXT listener."""
    root = tmp_path_factory.mktemp("tls-kafka")
    ca = TestCA(root / "ca")
    cluster = KafkaCluster(root, 1, tls=ca)
    _CLUSTERS.append(cluster)
    cluster.start()
    try:
        yield cluster, ca
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_tools(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> KafkaTools:
    return KafkaTools(kafka.bootstrap, workdir=tmp_path_factory.mktemp("tools"))


@pytest.fixture(scope="session")
def kafka_admin_tools(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> KafkaTools:
    """Kafka's tools over the SASL listener as the `admin` user."""
    return KafkaTools(kafka.sasl_bootstrap, sasl_properties("admin", "admin-secret"),
                      workdir=tmp_path_factory.mktemp("admin-tools"))


@pytest.fixture
def topic_factory(kafka: KafkaCluster, request: pytest.FixtureRequest) -> Callable[..., str]:
    base = request.node.name.split("[")[0].replace("_", "-")[:40]

    def make(partitions: int = 1, **config: str) -> str:
        return create_topic(kafka.bootstrap, unique_name(base), partitions, 1, config or None)

    return make


@pytest.fixture
def topic(topic_factory: Callable[..., str]) -> str:
    return topic_factory()


# Fixtures whose set-up is costly (a JVM or a cluster) and shared: a test that uses one runs on the
# worker of that fixture's group. Listed in priority order: a test that uses both joins the first.
SHARED_GROUPS: tuple[tuple[str, str], ...] = (("spark", "spark"), ("kafka_cluster3", "cluster3"),
                                               ("tls_kafka", "tls_kafka"))


def xdist_group_of(item: pytest.Item) -> str | None:
    """The xdist group an item belongs to: a shared costly fixture's, or its module's when the module
    sets up something of its own at module (or class) scope, or None: any worker will do."""
    names = getattr(item, "fixturenames", ())
    # a Spark test that builds its own session gets the worker's one (getOrCreate), not one more JVM;
    # one whose Spark runs only in processes it starts (spark_processes) may run on any worker
    if item.get_closest_marker("spark") is not None and (
            "spark" in names or item.get_closest_marker("spark_processes") is None):
        return "spark"
    for fixture, group in SHARED_GROUPS:
        if fixture in names:
            return group
    info = getattr(item, "_fixtureinfo", None)
    module = item.nodeid.split("::")[0]
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        for fixturedef in defs:
            if fixturedef.scope in ("module", "class", "package") and fixturedef.baseid.startswith(module):
                return f"module:{module}"
    return None


# A Spark test without a timeout of its own gets this one (pytest's default is 300 s): the session's
# JVM starts inside the first Spark test, and a timeout that fires inside a py4j call leaves the
# session unusable for every Spark test after it. On the shared machine at load 30 one session start
# took 168 s and the small collect() after it 193 s; twice that is the bound.
SPARK_TIMEOUT_S = 720


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks each item's xdist group as it is collected, before any pytest_collection_modifyitems
    (where xdist reads the marks), and a Spark test's timeout."""
    if item.get_closest_marker("spark") is not None and item.get_closest_marker("timeout") is None:
        item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT_S))
    if item.get_closest_marker("xdist_group") is None and item.config.pluginmanager.hasplugin("xdist"):
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True)  # after xdist's own hook, whose suffix pytest 9 does not read
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest first: xdist hands out work units (a group, or one ungrouped test) in this order, each
    worker taking the next as it runs low, so the longest unit starts at once and the short ones
    fill in at the end (longest-processing-time-first). A unit's length is its tests' measured
    seconds (tests/durations.json), or an estimate by mark for a test not measured yet. Only under
    `--dist loadgroup`: xdist's plain `load` sends each worker a contiguous slice of the list first,
    which would give one worker all the longest tests."""
    if not config.getoption("loadgroup", default=False):  # set on the workers (whose dist is "no")
        return
    estimates = Estimates.load()
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        group = str(marker.args[0]) if marker is not None and marker.args else None
        units.setdefault(group or item.nodeid, []).append(item)
    cost = {key: sum(estimates.seconds(it) for it in unit) for key, unit in units.items()}
    order = sorted(units, key=lambda key: -cost[key])  # stable: equal costs keep collection order
    items[:] = [item for key in order for item in units[key]]
    _suffix_groups(items)


def _suffix_groups(items: list[pytest.Item]) -> None:
    """What `--dist loadgroup` needs, done where pytest 9 reads it: xdist's scheduler groups the node
    ids that end in ``@<group>``. xdist 3.8 appends the suffix to `item._nodeid`, but pytest 9 derives
    `nodeid` from `item._id`, so without this every test would be a unit of its own and a group's
    costly fixture (the three-node cluster, Spark, the TLS broker) would start on several workers."""
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        if marker is None or not marker.args:
            continue
        nodeid = item.nodeid
        if "@" not in nodeid.rsplit("]", 1)[-1]:
            item._id = coerce_node_id(f"{nodeid}@{marker.args[0]}")


def _cpu_s() -> float:
    """CPU seconds of this process and of every child it has reaped (a Sluice process, a Java tool, a
    broker stopped by a fixture's teardown), user and system."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


_LAST_CPU_S = [0.0]


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _LAST_CPU_S[0] = _cpu_s()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    # the CPU this phase cost (the worker and the children it reaped), for --timing-jsonl
    now_s = _cpu_s()
    report.user_properties = [*report.user_properties,  # type: ignore[attr-defined]
                              ("cpu_s", round(now_s - _LAST_CPU_S[0], 3))]  # a copy: pytest shares item's
    _LAST_CPU_S[0] = now_s
    names = getattr(item, "fixturenames", ())
    uses_kafka = any(name.startswith(("kafka", "sluice")) for name in names)
    if report.failed and report.when == "call":  # type: ignore[attr-defined]
        for name in names:
            proc = getattr(item, "funcargs", {}).get(name)
            if isinstance(proc, SluiceProcess):
                report.sections.append((f"{name} log", proc.log()[-8000:]))  # type: ignore[attr-defined]
    if report.failed and uses_kafka:  # type: ignore[attr-defined]
        for cluster in _CLUSTERS:
            if cluster.nodes:
                report.sections.append(  # type: ignore[attr-defined]
                    (f"kafka {cluster.root.name} logs", cluster.problems(20)))
    return report


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--timing-jsonl", metavar="FILE", default=None,
                     help="append one JSON line per test phase (set-up, call, teardown) with its xdist "
                          "worker, start, stop and CPU seconds; `python -m tests.harness.timing FILE` "
                          "sums them per module and per worker")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under xdist the controller writes the lines (it sees every worker's reports)."""
    config = _CONFIG[0] if _CONFIG else None
    path = config.getoption("timing_jsonl") if config is not None else None
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    row = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
           "worker": getattr(report, "worker_id", "main"),
           "start": getattr(report, "start", 0.0), "stop": getattr(report, "stop", 0.0),
           "duration": report.duration, "cpu_s": dict(report.user_properties).get("cpu_s", 0.0)}
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")


_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG.append(config)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


if os.environ.get("SLUICE_KAFKA_BOOTSTRAP"):
    # Bring-your-own cluster: tests that only need "a broker" use it instead of starting one.
    @pytest.fixture(scope="session")  # type: ignore[no-redef]
    def kafka() -> Iterator[KafkaCluster]:
        yield RunningCluster(os.environ["SLUICE_KAFKA_BOOTSTRAP"])


@pytest.fixture
def sluice(kafka: KafkaCluster, tmp_path: Path) -> Iterator[SluiceProcess]:
    """Sluice in front of the single-node cluster, as a real `python -m proxy proxy` process."""
    proc = SluiceProcess(kafka.bootstrap, tmp_path / "sluice").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def sluice3(kafka_cluster3: KafkaCluster, tmp_path: Path) -> Iterator[SluiceProcess]:
    """Sluice in front of the three-node cluster."""
    proc = SluiceProcess(kafka_cluster3.bootstrap, tmp_path / "sluice3").start()
    try:
        yield proc
    finally:
        proc.stop()

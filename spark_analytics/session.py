"""Building the SparkSession for the jobs, the Kafka connector's jars, and progress reporting.

Nothing here runs at import time. A job's `main` calls `build_session`; under `spark-submit` the
session already exists and `getOrCreate` returns it (master, jars and memory then come from
spark-submit's own options), so the same job module runs unchanged locally and on a cluster.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("spark_analytics")

_REPO = Path(__file__).resolve().parents[1]
_SHIM_SOURCES = Path(__file__).resolve().parent / "jvm"
# kafka-clients-3.9.2.jar -> kafka-clients
_JAR_VERSION = re.compile(r"-\d+(?:\.\d+)*(?:[-.][A-Za-z0-9]+)*\.jar$")


def spark_libs_dir() -> Path | None:
    """Where `scripts/setup` put the Kafka connector's classpath (`$SLUICE_SPARK_LIBS` overrides)."""
    configured = os.environ.get("SLUICE_SPARK_LIBS")
    libdir = Path(configured) if configured else _REPO / ".cache" / "spark-libs"
    return libdir if libdir.is_dir() else None


def _pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def _artifact(jar: Path) -> str:
    return _JAR_VERSION.sub("", jar.name)


def token_provider_shim(out_dir: Path) -> Path:
    """Compile spark_analytics/jvm (the token-provider stand-in) into a jar, once per source hash."""
    sources = sorted(_SHIM_SOURCES.rglob("*.java"))
    digest = hashlib.sha256()
    for src in sources:
        digest.update(src.name.encode())
        digest.update(src.read_bytes())
    import pyspark

    digest.update(pyspark.__version__.encode())
    jar = out_dir / f"sluice-kafka010-token-shim-{digest.hexdigest()[:12]}.jar"
    if jar.exists():
        return jar
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("javac not found: it builds the Kafka token-provider stand-in (install a JDK 17+)")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sluice-shim-") as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "--release", "17", "-nowarn", "-cp", f"{_pyspark_jars_dir()}/*",
               "-d", str(classes), *map(str, sources)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"building the Kafka token-provider stand-in failed:\n{done.stderr}")
        partial = Path(tmp) / jar.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for cls in sorted(classes.rglob("*.class")):
                z.write(cls, cls.relative_to(classes).as_posix())
        shutil.move(partial, jar)  # atomic enough: a concurrent builder writes the same bytes
    return jar


def spark_kafka_jars(libdir: Path) -> list[str]:
    """The jars in `libdir` that pyspark does not already ship, plus the token-provider stand-in
    when the real spark-token-provider-kafka-0-10 is absent (Central lacks it here)."""
    shipped = {_artifact(p) for p in _pyspark_jars_dir().glob("*.jar")}
    jars = [p for p in sorted(libdir.glob("*.jar")) if _artifact(p) not in shipped]
    if not any(_artifact(p).startswith("spark-token-provider-kafka") for p in jars):
        jars.append(token_provider_shim(libdir.parent / "spark-kafka-shim"))
    return [str(p) for p in jars]


def _local_cores(master: str) -> int:
    """local -> 1, local[4] -> 4, local[*] -> all cores, local[2,3] (with retries) -> 2."""
    inside = master[master.find("[") + 1: master.find("]")] if "[" in master else "1"
    first = inside.split(",")[0].strip()
    if first == "*":
        return os.cpu_count() or 1
    return int(first) if first.isdigit() and int(first) > 0 else 1


def build_session(app_name: str, master: str | None = None, *, kafka: bool = False,
                  conf: Mapping[str, str] | None = None, log_level: str = "WARN") -> SparkSession:
    """A SparkSession for a job. `master=None` keeps whatever spark-submit (or Spark's default,
    `local[*]`) chose. `kafka=True` adds the Kafka connector from `spark_libs_dir()` when found."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",  # we print our own progress line
    }
    if master is not None and master.startswith("local"):
        # one machine: loopback only, no UI, and a few shuffle partitions instead of 200 (the
        # aggregated per-second rows are small; 200 tasks would cost more than the work)
        # the serial collector: on a few cores, parallel GC threads compete with the task threads
        settings |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                     "spark.ui.enabled": "false",
                     "spark.sql.shuffle.partitions": str(4 * _local_cores(master)),
                     "spark.driver.extraJavaOptions": "-XX:+UseSerialGC"}
    if kafka:
        libdir = spark_libs_dir()
        if libdir is not None:
            settings["spark.jars"] = ",".join(spark_kafka_jars(libdir))
        else:
            log.warning("no Spark Kafka connector found (run scripts/setup or set SLUICE_SPARK_LIBS); "
                        "under spark-submit pass it with --packages or --jars")
    settings |= dict(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark


class Progress:
    """Per-step log lines plus, while Spark works, a status line from the SparkStatusTracker.

    `step("reading logs")` starts a step and logs when it began and how long the previous one took;
    a daemon thread prints `[job] step: stage 3 12/40 tasks (2 running)` every `interval_s` while a
    stage is active. Output goes to `stream` (stderr by default) so stdout stays for results.
    """

    def __init__(self, spark: SparkSession | None, job: str, *, enabled: bool = True,
                 interval_s: float = 2.0, stream: TextIO | None = None) -> None:
        self._spark = spark
        self.job = job
        self.enabled = enabled
        self.interval_s = interval_s
        self._stream = stream if stream is not None else sys.stderr
        self._step = ""
        self._step_t0 = time.monotonic()
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_line = ""

    def _say(self, text: str) -> None:
        if self.enabled:
            print(f"[{self.job}] {text}", file=self._stream, flush=True)

    def step(self, name: str) -> None:
        self._finish_step()
        self._step, self._step_t0 = name, time.monotonic()
        self._say(f"{name} ...")

    def _finish_step(self) -> None:
        if self._step:
            self._say(f"{self._step}: done in {time.monotonic() - self._step_t0:.1f}s")
            self._step = ""

    def _status_line(self) -> str:
        if self._spark is None:
            return ""
        tracker = self._spark.sparkContext.statusTracker()
        parts = []
        for stage_id in sorted(tracker.getActiveStageIds()):
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                parts.append(f"stage {stage_id} {info.numCompletedTasks}/{info.numTasks} tasks "
                             f"({info.numActiveTasks} running)")
        return "; ".join(parts)

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                line = self._status_line()
            except Exception:  # the JVM is going away; progress is best effort
                return
            if line and self._step and line != self._last_line:
                self._last_line = line
                self._say(f"{self._step}: {line}")

    def __enter__(self) -> Progress:
        if self.enabled and self._spark is not None:
            self._thread = threading.Thread(target=self._poll, name=f"{self.job}-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._finish_step()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 1)
        self._say(f"finished in {time.monotonic() - self._t0:.1f}s")


@contextmanager
def progress(spark: SparkSession | None, job: str, *, enabled: bool = True) -> Iterator[Progress]:
    with Progress(spark, job, enabled=enabled) as p:
        yield p

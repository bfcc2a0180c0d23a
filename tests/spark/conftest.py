"""One SparkSession (one JVM) for the whole test session: local[2], 2 shuffle partitions, no UI,
loopback only, UTC, and the Kafka connector on the classpath for the Kafka-source tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from spark_analytics.session import spark_kafka_jars, spark_libs_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    libdir = spark_libs_dir()
    assert libdir is not None, "Spark Kafka connector missing: run scripts/setup"
    tmp = tmp_path_factory.mktemp("spark")
    session = (SparkSession.builder.master("local[2]").appName("sluice-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
               .config("spark.driver.memory", "1g")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.warehouse.dir", str(tmp / "wh"))
               .config("spark.local.dir", str(tmp / "local"))
               .config("spark.jars", ",".join(spark_kafka_jars(libdir)))
               .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -Dderby.system.home=" + str(tmp))
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()

"""Storage-driven throttling fails closed against real brokers (issue 14).

* A failed poll holds the last complete factor for `factor_validity_ms` (Strimzi's validity
  window), and only then applies the fallback factor.
* The fallback does not lift a hard stop: a Sluice whose last complete view stopped production
  stays at factor 0 after the window, although its fallback factor is 1.0 (the default).
* The poller authenticates with SASL (SCRAM, PLAIN) to a SASL listener; without credentials, or
  with a wrong password, every poll fails and the fallback applies; the password is never logged.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import wait_until as wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TiB = 1024 ** 4


def value_in(text: str, name: str, **labels: str) -> float | None:
    """A sample of one scrape (so two values read together are consistent)."""
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.split(" ")[0] == name) and \
                all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture
def own_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A broker of this test's own: the test stops it."""
    cluster = KafkaCluster(tmp_path_factory.mktemp("storage-fail-closed"), 1).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _storage(hard_bytes: int, **extra: Any) -> dict[str, Any]:
    return {"check_interval_ms": 200, "factor_validity_ms": 4000,
            "limits": [{"type": "available_bytes_below", "hard": hard_bytes}], **extra}


def test_failed_polls_hold_the_last_factor_for_the_window_and_never_lift_a_hard_stop(
        own_kafka: KafkaCluster, tmp_path: Path) -> None:
    free = shutil.disk_usage(own_kafka.nodes[0].directory).free
    open_port, stop_port = free_port(), free_port()
    # "open": far from its hard limit (factor 1); its fallback is 0, so expiry is visible
    open_cfg = {"metrics": {"port": open_port}, "storage": _storage(max(1, free // 4), fallback_factor=0.0)}
    # "stopped": hard limit above the free space (factor 0); fallback 1.0, Strimzi's default. A TiB
    # above what was free: other tests on the machine delete their brokers' logs meanwhile (with
    # 1 GiB, a loaded make test saw the free space pass the limit and the factor come out 1)
    stop_cfg = {"metrics": {"port": stop_port}, "storage": _storage(free + TiB)}
    with SluiceProcess(own_kafka.bootstrap, tmp_path / "open", config=open_cfg) as open_sluice, \
            SluiceProcess(own_kafka.bootstrap, tmp_path / "stop", config=stop_cfg) as stop_sluice:
        opened, stopped = Metrics(open_port), Metrics(stop_port)
        # each from a complete view (a first poll that timed out on a loaded machine is retried)
        wait_for(lambda: opened.value("sluice_storage_throttle_factor") == 1.0
                 and opened.value("sluice_storage_fallback_active", reason="poll_failed") == 0.0,
                 30, "the open Sluice's factor 1 from a complete view")
        wait_for(lambda: stopped.value("sluice_storage_throttle_factor") == 0.0, 30,
                 "the stopped Sluice's hard stop")
        assert opened.value("sluice_storage_factor_held") == 0.0

        own_kafka.stop()
        # the window: polls fail, the last complete factor (1) still applies
        held_seen: list[float] = []

        def held_or_expired() -> bool:
            text = opened.text()
            if value_in(text, "sluice_storage_factor_held") == 1.0:
                held_seen.append(value_in(text, "sluice_storage_throttle_factor") or -1.0)
            return value_in(text, "sluice_storage_fallback_active", reason="poll_failed") == 1.0

        wait_for(held_or_expired, 60, "the open Sluice's fallback after the validity window")
        assert held_seen and set(held_seen) == {1.0}, held_seen  # held at 1 before the fallback
        assert opened.value("sluice_storage_throttle_factor") == 0.0  # then the fallback, 0
        assert open_sluice.wait_for_log("holding the last complete factor (poll_failed"), \
            open_sluice.log()[-3000:]

        # the stopped Sluice: after its window the fallback (1.0) applies, but not to a hard stop
        wait_for(lambda: stopped.value("sluice_storage_fallback_active", reason="poll_failed") == 1.0,
                 60, "the stopped Sluice's fallback after the validity window")
        assert stopped.value("sluice_storage_throttle_factor") == 0.0
        assert stop_sluice.wait_for_log("the hard stop stays until a complete view"), \
            stop_sluice.log()[-3000:]


def test_the_poller_speaks_sasl_to_a_sasl_listener(kafka: KafkaCluster, tmp_path: Path) -> None:
    free = shutil.disk_usage(kafka.nodes[0].directory).free
    low = max(1, free // 4)
    for mechanism, user, password in (("SCRAM-SHA-512", "alice", "alice-secret"),
                                      ("PLAIN", "bob", "bob-secret")):
        port = free_port()
        storage = _storage(low, fallback_factor=0.0, factor_validity_ms=0,
                           sasl={"mechanism": mechanism, "username": user, "password": password})
        with SluiceProcess(kafka.sasl_bootstrap, tmp_path / mechanism,
                           config={"metrics": {"port": port}, "storage": storage}):
            metrics = Metrics(port)
            wait_for(lambda m=metrics: (m.value("sluice_storage_polls_total") or 0) >= 3,  # type: ignore[misc]
                     20, "three polls")
            assert metrics.value("sluice_storage_throttle_factor") == 1.0, mechanism
            assert metrics.value("sluice_storage_active_brokers") == 1.0
            assert (metrics.value("sluice_storage_active_log_dirs") or 0) >= 1
            assert metrics.value("sluice_storage_fallback_applied_total", reason="poll_failed") == 0.0
    # no credentials, or a wrong password: the SASL listener answers nothing useful, polls fail
    for name, sasl in (("none", None),
                       ("wrong", {"mechanism": "SCRAM-SHA-256", "username": "alice",
                                  "password": "not-alices-password"})):
        port = free_port()
        storage = _storage(low, fallback_factor=0.0, factor_validity_ms=0,
                           **({"sasl": sasl} if sasl else {}))
        with SluiceProcess(kafka.sasl_bootstrap, tmp_path / name,
                           config={"metrics": {"port": port}, "storage": storage}) as sluice:
            metrics = Metrics(port)
            assert metrics.value("sluice_storage_throttle_factor") == 0.0, name
            assert metrics.value("sluice_storage_fallback_active", reason="poll_failed") == 1.0, name
            if sasl:
                assert sluice.wait_for_log("SASL SCRAM-SHA-256 as 'alice'"), sluice.log()[-3000:]
            assert "not-alices-password" not in sluice.log()

"""Configuration: file < environment < flags, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError, HostPort, load_config


def test_flags_alone_are_enough() -> None:
    config = load_config(None, {"upstream": {"bootstrap": "b1:9092,b2:9093"}, "listen": "0.0.0.0:19092"},
                         environ={})
    assert config.upstream.bootstrap == [HostPort(host="b1", port=9092), HostPort(host="b2", port=9093)]
    assert config.listen == HostPort(host="0.0.0.0", port=19092)
    assert config.broker_port(3) == 19096               # listen.port + 1 + node id by default


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("upstream:\n  bootstrap: file:1\nlisten: 127.0.0.1:1000\nmetrics:\n  port: 1\n")
    config = load_config(path, {"listen": "127.0.0.1:3000"},
                         environ={"SLUICE_METRICS__PORT": "2", "SLUICE_LISTEN": "127.0.0.1:2000"})
    assert config.upstream.bootstrap[0].host == "file"
    assert config.metrics.port == 2                      # env beats the file
    assert config.metrics.max_series_per_metric == 2000  # the default cap on per-sensor series
    assert config.listen.port == 3000                    # flags beat env


def test_the_data_plane_switch_is_not_a_config_key(tmp_path: Path) -> None:
    """SLUICE_PURE_PYTHON picks the data plane (protocol.fastpath); the config must not read it as
    an unknown key `pure_python` and refuse to start."""
    path = tmp_path / "s.yaml"
    path.write_text("upstream:\n  bootstrap: b:1\n")
    config = load_config(path, environ={"SLUICE_PURE_PYTHON": "1", "SLUICE_METRICS__PORT": "2"})
    assert config.metrics.port == 2


@pytest.mark.parametrize(("text", "key", "why"), [
    ("upstream: {bootstrap: []}", "upstream.bootstrap", "at least 1"),
    ("upstream: {bootstrap: 'a:1'}\nmax_frame_bytes: 10", "max_frame_bytes", "greater than or equal"),
    ("upstream: {bootstrap: 'a:1'}\nlisten: nope", "listen", "expected HOST:PORT"),
    ("upstream: {bootstrap: 'a:1'}\nlisten_port: 1", "listen_port", "Extra inputs"),
    ("upstream: {bootstrap: 'a:1', tls: {cert_file: /etc/hostname}}", "upstream.tls", "go together"),
    ("upstream: {bootstrap: 'a:1'}\nmetrics: {max_series_per_metric: 0}", "metrics.max_series_per_metric",
     "greater than or equal"),
])
def test_bad_config_names_the_key(tmp_path: Path, text: str, key: str, why: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert f"{key}:" in str(err.value) and why in str(err.value)


def test_unreadable_and_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_config(tmp_path / "missing.yaml", environ={})
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(bad, environ={})


# ------------------------------------------------------------------------------------ fleet

@pytest.mark.parametrize(("text", "key", "why"), [
    # a per-instance store would give every member its own quotas
    ("upstream: {bootstrap: 'a:1'}\nfleet: {id: f}", "fleet", "store.type: kafka"),
    ("upstream: {bootstrap: 'a:1'}\nstore: {type: memory}\nfleet: {id: f}", "fleet", "store.type: memory"),
    ("upstream: {bootstrap: 'a:1'}\nstore: {type: kafka}\nfleet: {id: f, report_interval_ms: 10}",
     "fleet.report_interval_ms", "greater than or equal"),
    ("upstream: {bootstrap: 'a:1'}\nstore: {type: kafka}\nfleet: {id: f, report_interval_ms: 500, "
     "member_timeout_ms: 500}", "fleet", "longer than report_interval_ms"),
    ("upstream: {bootstrap: 'a:1'}\nstore: {type: kafka}\nfleet: {id: f, fallback: maybe}", "fleet.fallback",
     "'split' or 'full'"),
    ("upstream: {bootstrap: 'a:1'}\nstore: {type: kafka}\nfleet: {report_interval_ms: 500}", "fleet.id",
     "Field required"),
])
def test_bad_fleet_config_names_the_key(tmp_path: Path, text: str, key: str, why: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert key in str(err.value) and why in str(err.value), str(err.value)


def test_fleet_defaults(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("upstream: {bootstrap: 'a:1'}\nstore: {type: kafka}\n"
                    "fleet: {id: prod, kafka_config: {sasl.password: hunter2}}\n")
    fleet = load_config(path, environ={}).fleet
    assert fleet is not None
    assert (fleet.topic, fleet.report_interval_ms, fleet.timeout_ms, fleet.fallback) == \
        ("_sluice_fleet", 500, 1500, "split")
    assert "hunter2" not in repr(fleet)                  # librdkafka secrets never printed
    assert fleet.librdkafka_config() == {"sasl.password": "hunter2"}


# ------------------------------------------------------------------------------------ limits

def test_limits_defaults_and_ip_quota_entries(tmp_path: Path) -> None:
    path = tmp_path / "l.yaml"
    path.write_text("upstream: {bootstrap: 'a:1'}\nquotas:\n  entries:\n"
                    "    - {ip: '<default>', connection_creation_rate: 10}\n"
                    "    - {ip: 127.0.0.2, connection_creation_rate: 2}\n"
                    "    - {user: alice, producer_byte_rate: 1024}\n")
    config = load_config(path, environ={"SLUICE_LIMITS__IDLE_TIMEOUT_MS": "30000"})
    limits = config.limits
    assert (limits.max_connections, limits.max_connections_per_ip, limits.handshake_timeout_ms) == \
        (10_000, 1_000, 10_000)
    assert limits.idle_timeout_ms == 30_000              # from the environment
    assert (limits.max_buffered_bytes_per_connection, limits.max_buffered_bytes_total) == (1 << 20, 256 << 20)
    assert limits.max_in_flight_requests_per_connection == 100
    assert limits.max_connections_per_ip_overrides == {}
    assert config.ip_connection_rates() == {"<default>": 10.0, "127.0.0.2": 2.0}
    assert len(config.quota_config().entries) == 1       # the ip entries are not client quotas


@pytest.mark.parametrize(("text", "key", "why"), [
    ("limits: {max_connections: 0}", "limits.max_connections", "greater than or equal"),
    ("limits: {max_connections_per_ip: -1}", "limits.max_connections_per_ip", "greater than or equal"),
    ("limits: {handshake_timeout_ms: 5}", "limits.handshake_timeout_ms", "greater than or equal"),
    ("limits: {idle_timeout_ms: 10}", "limits.idle_timeout_ms", "greater than or equal"),
    ("limits: {max_in_flight_requests_per_connection: 0}", "limits.max_in_flight_requests_per_connection",
     "greater than or equal"),
    ("limits: {max_buffered_bytes_per_connection: 100}", "limits.max_buffered_bytes_per_connection",
     "greater than or equal"),
    ("limits: {max_buffered_bytes_per_connection: 2000000, max_buffered_bytes_total: 1000000}", "limits",
     "cannot exceed max_buffered_bytes_total"),
    ("limits: {max_connection: 5}", "limits.max_connection", "Extra inputs"),
    ("limits: {max_connections_per_ip_overrides: {nope: 5}}", "limits.max_connections_per_ip_overrides",
     "not an IP address"),
    ("limits: {max_connections_per_ip_overrides: {10.0.0.1: -1}}", "limits.max_connections_per_ip_overrides",
     "must be >= 0"),
    ("quotas: {entries: [{ip: nope, connection_creation_rate: 1}]}", "quotas.entries[0].ip", "an IP address"),
    ("quotas: {entries: [{ip: '<default>', connection_creation_rate: 0}]}",
     "quotas.entries[0].connection_creation_rate", ">= 1"),
])
def test_bad_limits_name_the_key(tmp_path: Path, text: str, key: str, why: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("upstream: {bootstrap: 'a:1'}\n" + text)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert f"{key}:" in str(err.value) and why in str(err.value), str(err.value)

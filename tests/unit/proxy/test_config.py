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
    assert config.listen.port == 3000                    # flags beat env


@pytest.mark.parametrize(("text", "key", "why"), [
    ("upstream: {bootstrap: []}", "upstream.bootstrap", "at least 1"),
    ("upstream: {bootstrap: 'a:1'}\nmax_frame_bytes: 10", "max_frame_bytes", "greater than or equal"),
    ("upstream: {bootstrap: 'a:1'}\nlisten: nope", "listen", "expected HOST:PORT"),
    ("upstream: {bootstrap: 'a:1'}\nlisten_port: 1", "listen_port", "Extra inputs"),
    ("upstream: {bootstrap: 'a:1', tls: {cert_file: /etc/hostname}}", "upstream.tls", "go together"),
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

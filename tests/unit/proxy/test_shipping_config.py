"""What the shipped samples rely on at start: ANONYMOUS is refused as an admin where anyone is
ANONYMOUS (unless explicitly allowed, then warned about), and a supervisor's private directory lives
in `runtime_dir`, failing at start with the key named when it cannot be created."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config import ConfigError, load_config
from proxy.workers.supervisor import private_dir
from tests.harness.tls import TestCA

BASE = "upstream: {bootstrap: 'a:1'}\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sluice.yaml"
    path.write_text(BASE + text)
    return path


def test_anonymous_admin_on_a_plaintext_listener_is_refused_naming_the_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "admins: [alice, ANONYMOUS]\n"), environ={})
    assert "admins: ANONYMOUS" in str(err.value)
    assert "allow_anonymous_admins: true" in str(err.value)


def test_anonymous_admin_is_accepted_only_when_allowed(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "admins: [ANONYMOUS]\nallow_anonymous_admins: true\n"), environ={})
    assert config.anonymous_admin and config.allow_anonymous_admins


def test_named_admins_need_no_allowance(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "admins: [alice]\n"), environ={})
    assert not config.anonymous_admin and not config.allow_anonymous_admins


def test_anonymous_is_unreachable_with_client_addresses_as_principals(tmp_path: Path) -> None:
    # every unauthenticated client is its IP address: ANONYMOUS in admins names nobody
    config = load_config(write(tmp_path, "admins: [ANONYMOUS]\nprincipal_from: client_address\n"), environ={})
    assert not config.anonymous_is_reachable and not config.anonymous_admin


def test_anonymous_is_unreachable_with_required_client_certificates(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    server = ca.issue("sluice", "localhost", server=True)
    text = (f"admins: [ANONYMOUS]\nlisten_tls: {{cert_file: {server.cert}, key_file: {server.key}, "
            f"ca_file: {ca.cert_path}, client_auth: required}}\n")
    assert not load_config(write(tmp_path, text), environ={}).anonymous_admin
    requested = text.replace("client_auth: required", "client_auth: requested")
    with pytest.raises(ConfigError, match="allow_anonymous_admins"):  # a client may come without one
        load_config(write(tmp_path, requested), environ={})


def test_the_allowed_anonymous_admin_is_warned_about_at_start(tmp_path: Path) -> None:
    # a real `sluice proxy` start: the warning comes before the listener fails (TEST-NET-1 is no
    # address of this host, so the start ends at once)
    path = write(tmp_path, "admins: [ANONYMOUS]\nallow_anonymous_admins: true\nlisten: 192.0.2.1:9092\n"
                           "store: {type: memory}\n")
    done = subprocess.run([sys.executable, "-m", "proxy", "proxy", "--config", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert "every client that connects without credentials may alter quotas" in done.stderr, done.stderr


def test_runtime_dir_must_be_absolute(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"runtime_dir: must be an absolute path"):
        load_config(write(tmp_path, "runtime_dir: run/sluice\n"), environ={})


def test_runtime_dir_too_long_for_a_socket_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"runtime_dir: .* too long for a unix socket path"):
        load_config(write(tmp_path, f"runtime_dir: /{'r' * 100}\n"), environ={})


def test_the_private_dir_is_made_in_runtime_dir(tmp_path: Path) -> None:
    made = private_dir(tmp_path)
    assert made.parent == tmp_path and made.name.startswith("sluice-workers-")
    assert made.stat().st_mode & 0o777 == 0o700


def test_an_unwritable_runtime_dir_fails_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"runtime_dir: cannot create the workers' directory in /proc"):
        private_dir(Path("/proc"))  # read-only for everyone, root included


def test_workers_on_an_unwritable_runtime_dir_stop_the_start_with_the_key_named(tmp_path: Path) -> None:
    path = write(tmp_path, "workers: 2\nruntime_dir: /proc\nstore: {type: sqlite, path: q.db}\n")
    done = subprocess.run([sys.executable, "-m", "proxy", "proxy", "--config", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "runtime_dir: cannot create the workers' directory in /proc" in done.stderr


def test_the_anonymous_name_is_the_quota_engines() -> None:
    from proxy.config import ANONYMOUS
    from quotas.entity import UNAUTHENTICATED_PRINCIPAL

    assert ANONYMOUS == UNAUTHENTICATED_PRINCIPAL

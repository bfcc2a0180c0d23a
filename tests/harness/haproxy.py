"""Debian's haproxy with deploy/compose/haproxy.cfg, on loopback: the sample's frontend, backend,
PROXY v2 (`send-proxy-v2`) and `/healthz` check, with the compose names and ports replaced.

haproxy binds 127.0.0.1 (the one advertised host) and forwards each port to the same port of the
servers, which listen on other loopback addresses; it connects to them from `SOURCE`, its own
address, so a test can tell the load balancer's address from a client's."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

from tests.harness.kafka import REPO, _die_with_parent
from tests.harness.lines import read_lines

SAMPLE = REPO / "deploy" / "compose" / "haproxy.cfg"
SOURCE = "127.0.0.9"


def config(servers: Mapping[str, str], bootstrap_port: int, broker_port: int, metrics_port: int) -> str:
    """`servers`: the sample's server name -> the address it listens on here."""
    text = SAMPLE.read_text()
    text = re.sub(r"resolvers docker\n.*\n", "", text)
    text = text.replace("bind :9092", f"bind 127.0.0.1:{bootstrap_port}")
    text = re.sub(r"bind :9100-9109", f"bind 127.0.0.1:{broker_port}", text)
    text = text.replace("check port 9404 inter 2s fall 2 rise 2 resolvers docker init-addr last,libc,none",
                        f"check port {metrics_port} inter 300ms fall 2 rise 1")
    text = text.replace("    balance leastconn\n", f"    balance leastconn\n    source {SOURCE}\n")
    sample_servers = re.findall(r"^\s*server (\S+) \1\s*$", text, re.M)
    for name in sample_servers:
        if name in servers:
            text = text.replace(f"server {name} {name}", f"server {name} {servers[name]}")
        else:
            text = re.sub(rf"^\s*server {name} {name}\s*\n", "", text, flags=re.M)
    assert "docker" not in text and "9404" not in text and "send-proxy-v2" in text, text
    return text


def listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return True


class Haproxy:
    def __init__(self, cfg: Path) -> None:
        binary = shutil.which("haproxy")
        assert binary is not None, "haproxy missing: run scripts/setup"
        self.process = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, preexec_fn=_die_with_parent)
        self.lines: list[str] = []
        assert self.process.stdout is not None
        read_lines(self.process.stdout, self.lines.append)

    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

"""A Sluice process's `/metrics`, scraped: the Prometheus text, or one sample's value."""

from __future__ import annotations

import urllib.request


class Metrics:
    """`Metrics(port).value("sluice_fleet_members")`, `.value(name, client_id="app")`: the first
    sample of `name` whose labels include those given, or None while there is none."""

    def __init__(self, port: int) -> None:
        self.port = port

    def text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def value(self, name: str, **labels: str) -> float | None:
        for line in self.text().splitlines():
            if not line.startswith(name + "{") and line.split(" ")[0] != name:
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None

"""`sluice connections`: the open client connections of a running Sluice, from `GET /connections`.

    sluice connections --url http://HOST:METRICS_PORT [--token-file F] [--output table|json]
                       [--sort FIELD [--reverse]] [--principal P] [--client-id C] [--listener L]
                       [--throttled]

The token is read from `--token-file` or the environment variable SLUICE_CONNECTIONS_TOKEN, never
from the command line (where `ps` would show it). Filters take exact values or shell patterns
(``--client-id 'etl-*'``); `--listener` also takes a broker id. `--output json` prints the
endpoint's document, filtered and sorted. Exit status: 0 done, 1 the endpoint refused or could not
be reached, 2 bad usage.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, NoReturn

import click

TOKEN_ENV = "SLUICE_CONNECTIONS_TOKEN"

Row = Mapping[str, Any]

#: --sort names (the JSON keys, plus a few short ones) -> the JSON key they sort by
SORT_FIELDS: dict[str, str] = {
    "id": "id", "worker": "worker", "listener": "listener", "client": "client_address",
    "client_address": "client_address", "principal": "principal", "client-id": "client_id",
    "client_id": "client_id", "software": "client_software_name",
    "client_software_name": "client_software_name", "age": "connected_ms", "connected_ms": "connected_ms",
    "since": "connected_ms", "in-flight": "in_flight", "in_flight": "in_flight",
    "requests": "requests_per_s", "requests_per_s": "requests_per_s",
    "produce": "produce_bytes_per_s", "produce_bytes_per_s": "produce_bytes_per_s",
    "produce_requests_per_s": "produce_requests_per_s",
    "fetch": "fetch_bytes_per_s", "fetch_bytes_per_s": "fetch_bytes_per_s",
    "fetch_requests_per_s": "fetch_requests_per_s",
    "throttle": "throttle_ms", "throttle_ms": "throttle_ms", "muted": "muted",
}


class EndpointError(Exception):
    """The endpoint could not be read; the message says why (never the token)."""


def fetch(url: str, token: str | None, timeout_s: float) -> dict[str, Any]:
    """GET `url`/connections and parse the document."""
    target = url.rstrip("/")
    if not target.endswith("/connections"):
        target += "/connections"
    request = urllib.request.Request(target, headers={"Accept": "application/json"})
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            hint = "wrong token" if token else f"give --token-file or {TOKEN_ENV}"
            raise EndpointError(f"{target}: 401 unauthorized ({hint})") from None
        if exc.code == 404:
            raise EndpointError(f"{target}: 404 not found (is connections_endpoint.enabled set?)") from None
        raise EndpointError(f"{target}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EndpointError(f"{target}: {getattr(exc, 'reason', exc)}") from None
    except ValueError:
        raise EndpointError(f"{target}: not a JSON document") from None
    if not isinstance(data, dict) or not isinstance(data.get("connections"), list):
        raise EndpointError(f"{target}: no connection list in the answer")
    return data


def _matches(value: Any, pattern: str) -> bool:
    return value is not None and fnmatchcase(str(value), pattern)


def select(rows: Sequence[Row], principal: str | None = None, client_id: str | None = None,
           listener: str | None = None, throttled: bool = False) -> list[Row]:
    """The rows every given filter accepts."""
    out = []
    for row in rows:
        if principal is not None and not _matches(row.get("principal"), principal):
            continue
        if client_id is not None and not _matches(row.get("client_id") or "", client_id):
            continue
        if listener is not None and not (_matches(row.get("listener"), listener)
                                         or _matches(row.get("broker_id"), listener)):
            continue
        if throttled and not (row.get("throttle_ms", 0) > 0 or row.get("muted")):
            continue
        out.append(row)
    return out


def sort_rows(rows: Sequence[Row], field: str, reverse: bool = False) -> list[Row]:
    """Sorted by `field` (a `SORT_FIELDS` name), missing values last, then by worker and id."""
    key = SORT_FIELDS[field]

    def sort_key(row: Row) -> tuple[Any, ...]:
        value = row.get(key)
        missing = value is None
        if isinstance(value, bool | int | float):
            return (missing, 0, value, "", _tiebreak(row))
        return (missing, 1, 0, "" if missing else str(value), _tiebreak(row))

    present = sorted((r for r in rows if r.get(key) is not None), key=sort_key, reverse=reverse)
    return present + sorted((r for r in rows if r.get(key) is None), key=_tiebreak)


def _tiebreak(row: Row) -> tuple[int, int]:
    worker = row.get("worker")
    return (worker if isinstance(worker, int) else -1, int(row.get("id", 0)))


# ------------------------------------------------------------------------------ the table

def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_age(ms: int) -> str:
    s = ms // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _entity_text(entity: Mapping[str, str | None]) -> str:
    return "{" + ", ".join(f"{t}={'<default>' if n is None else n}" for t, n in entity.items()) + "}"


def quota_text(quota: Sequence[Mapping[str, Any]]) -> str:
    """The matched entities, each once, with the quota keys it supplies when there are several."""
    by_entity: dict[str, list[str]] = {}
    for match in quota:
        by_entity.setdefault(_entity_text(match.get("entity") or {}), []).append(str(match.get("kind")))
    if len(by_entity) <= 1:
        return next(iter(by_entity), "-")
    return " ".join(f"{entity}:{'+'.join(kinds)}" for entity, kinds in by_entity.items())


def _software(row: Row) -> str:
    name, version = row.get("client_software_name"), row.get("client_software_version")
    if not name:
        return "-"
    return f"{name}/{version}" if version else str(name)


COLUMNS: list[tuple[str, Callable[[Row], str]]] = [
    ("WORKER", lambda r: "-" if r.get("worker") is None else str(r["worker"])),
    ("ID", lambda r: str(r.get("id", ""))),
    ("LISTENER", lambda r: str(r.get("listener", ""))),
    ("CLIENT", lambda r: str(r.get("client_address", ""))),
    ("PRINCIPAL", lambda r: str(r.get("principal", ""))),
    ("CLIENT-ID", lambda r: r.get("client_id") or "-"),
    ("SOFTWARE", _software),
    ("AGE", lambda r: human_age(int(r.get("connected_ms", 0)))),
    ("INFLIGHT", lambda r: str(r.get("in_flight", 0))),
    ("PRODUCE/S", lambda r: human_bytes(float(r.get("produce_bytes_per_s", 0)))),
    ("FETCH/S", lambda r: human_bytes(float(r.get("fetch_bytes_per_s", 0)))),
    ("REQ/S", lambda r: f"{float(r.get('requests_per_s', 0)):.1f}"),
    ("THROTTLE-MS", lambda r: str(r.get("throttle_ms", 0))),
    ("MUTED", lambda r: "yes" if r.get("muted") else "no"),
    ("QUOTA", lambda r: quota_text(r.get("quota") or [])),
]


def table(rows: Sequence[Row]) -> str:
    """rpk-style: upper-case headers, columns padded to their widest cell, two spaces apart. The
    WORKER column only when some connection has a worker (`--workers N`)."""
    columns = COLUMNS if any(r.get("worker") is not None for r in rows) else COLUMNS[1:]
    cells = [[name for name, _ in columns]] + [[fmt(r) for _, fmt in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in cells)


# ------------------------------------------------------------------------------ the command

def _read_token(token_file: Path | None) -> str | None:
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise click.UsageError(f"--token-file: cannot read {token_file}: {exc.strerror}") from None
        if not token:
            raise click.UsageError(f"--token-file: {token_file} is empty")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


def _fail(output: str, message: str) -> NoReturn:
    if output == "json":
        click.echo(json.dumps({"error": {"message": message}}, indent=2))
    else:
        click.echo(f"Error: {message}", err=True)
    sys.exit(1)


@click.command("connections", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", required=True, envvar="SLUICE_CONNECTIONS_URL", metavar="http://HOST:PORT",
              help="Sluice's metrics port (or SLUICE_CONNECTIONS_URL)")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              help=f"file holding the bearer token (default: ${TOKEN_ENV}, if set)")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--sort", "sort_field", type=click.Choice(sorted(SORT_FIELDS)), default="id", show_default=True,
              metavar="FIELD", help="id, worker, listener, client, principal, client-id, software, age, "
                                    "in-flight, requests, produce, fetch, throttle, muted (or a JSON key)")
@click.option("--reverse", is_flag=True, help="sort descending")
@click.option("--principal", metavar="P", help="only this principal (a shell pattern)")
@click.option("--client-id", metavar="C", help="only this client id (a shell pattern)")
@click.option("--listener", metavar="L", help="only this listener: bootstrap, 'broker N', or a broker id")
@click.option("--throttled", is_flag=True, help="only connections throttled in the window, or muted now")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="seconds")
def connections(url: str, token_file: Path | None, output: str, sort_field: str, reverse: bool,
                principal: str | None, client_id: str | None, listener: str | None, throttled: bool,
                timeout_s: float) -> None:
    """The open client connections of a running Sluice (all its workers): address, principal,
    client id and software, age, requests in flight, recent rates, throttle time, mute state and
    the quota entity that matched."""
    token = _read_token(token_file)
    try:
        doc = fetch(url, token, timeout_s)
    except EndpointError as exc:
        _fail(output, str(exc))
    rows = select(doc["connections"], principal, client_id, listener, throttled)
    rows = sort_rows(rows, sort_field, reverse)
    if output == "json":
        click.echo(json.dumps({**doc, "connections": rows}, indent=2))
        return
    click.echo(table(rows))
    missing = doc.get("unavailable_workers")
    if missing:
        click.echo(f"(workers {', '.join(map(str, missing))} did not answer)", err=True)


__all__ = ["connections"]

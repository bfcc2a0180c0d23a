"""`sluice quotas`: list, describe and alter quotas over the Kafka protocol (KIP-546's APIs).

It talks to Sluice (or to a broker: it is the same protocol) with DescribeClientQuotas and
AlterClientQuotas through `protocol.quota_client`:

    sluice quotas list     --bootstrap-server HOST:PORT [--names user=alice] [--defaults client-id]
                           [--prefix user=team-]
    sluice quotas describe --bootstrap-server HOST:PORT --names user=alice,client-id=app
                           [--include-overrides]
    sluice quotas describe --usage --url http://HOST:METRICS_PORT [--names user=alice,...]
    sluice quotas alter    --bootstrap-server HOST:PORT --names user=alice [--defaults client-id]
                           [--add producer_byte_rate=1048576,...] [--delete consumer_byte_rate,...]
                           [--validate-only]

`describe` with the proxy's metrics port (`--url`, or SLUICE_METRICS_URL) prints each quota of the
caller as the running engine enforces it (``GET /quotas/effective``: the callback or entry, the
cluster entries, the storage factor and the fleet share applied). Without it, it resolves the
stored entries client-side with Kafka's precedence (`quotas.effective`): what the entries say,
before any callback, cluster entry, storage factor or fleet share.
`describe --effective --url` asks the running proxy's engine (``GET /quotas/effective``) for every
limit in force for the caller: the value enforced, its unit, the configured or callback value, the
storage factor, the fleet share and its source; it equals enforcement by construction.
`describe --usage` recomputes nothing: it reads ``GET /quotas/usage`` on the running proxy's
metrics port (`--url`) and shows, per live sensor, the windowed rate, the limit in force (after
the callback, cluster entries, the fleet share and the storage factor) and the headroom
(`quotas.headroom`). `--output json`
prints one JSON document for scripts (default entity names are JSON null there). Exit status: 0
done, 1 the server refused or could not be reached (nothing changed), 2 bad usage (nothing sent).
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from kio.schema.errors import ErrorCode

from protocol.quota_client import (
    MATCH_ANY,
    MATCH_DEFAULT,
    MATCH_EXACT,
    AlterEntry,
    Component,
    DescribedEntity,
    Filter,
    QuotaAdminError,
    QuotaClient,
    Stream,
)
from protocol.sasl_client import MECHANISMS, SaslCredentials
from quotas.config import QuotaConfig
from quotas.effective import EffectiveQuota, QuotaSource, effective_quotas, effective_topic_quotas
from quotas.entity import CLIENT_ID, CLIENT_ID_PREFIX, TOPIC, TOPIC_PREFIX, USER, ClientIdentity, QuotaEntity
from quotas.errors import QuotaConfigError
from quotas.headroom import KIND_LABEL, KIND_UNIT, UsageEntry, UsageFormatError, UsageReport, select
from quotas.stats import RateModel
from quotas.table import TOKEN_BUCKET_KEY, QuotaTable, format_value

ENTITY_TYPES = (USER, CLIENT_ID, CLIENT_ID_PREFIX, TOPIC, TOPIC_PREFIX)
_ALIASES = {"user": USER, "users": USER, "client-id": CLIENT_ID, "client_id": CLIENT_ID, "clients": CLIENT_ID,
            "client-id-prefix": CLIENT_ID_PREFIX, "client_id_prefix": CLIENT_ID_PREFIX, "topic": TOPIC,
            "topics": TOPIC, "topic-prefix": TOPIC_PREFIX, "topic_prefix": TOPIC_PREFIX}
_DEFAULTABLE = (USER, CLIENT_ID)
#: ``rate_model=token_bucket`` on the command line is the store key sluice.token_bucket
_RATE_MODELS = {"token_bucket": 1.0, "windowed": 0.0}

F = TypeVar("F", bound=Callable[..., Any])


class Usage(click.UsageError):
    pass


# ------------------------------------------------------------------------------ options

@dataclass(frozen=True)
class Connection:
    bootstrap: str
    sasl: SaslCredentials | None
    tls: ssl.SSLContext | None
    timeout_s: float
    output: str

    def client(self) -> QuotaClient:
        tls = self.tls

        def connect(host: str, port: int, timeout_s: float) -> Stream:
            sock = socket.create_connection((host, port), timeout=timeout_s)
            return sock if tls is None else tls.wrap_socket(sock, server_hostname=host)

        return QuotaClient(self.bootstrap, connect, sasl=self.sasl, client_id="sluice-quotas",
                           timeout_s=self.timeout_s)


def connection_options(fn: F) -> F:
    options = [
        click.option("--bootstrap-server", "bootstrap", envvar="SLUICE_BOOTSTRAP_SERVER",
                     metavar="HOST:PORT[,...]", help="Sluice's bootstrap address (or a broker's)"),
        click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True),
        click.option("--sasl-mechanism", type=click.Choice(MECHANISMS), help="authenticate (as an admin)"),
        click.option("--sasl-username", metavar="NAME"),
        click.option("--sasl-password", envvar="SLUICE_SASL_PASSWORD", metavar="PASSWORD",
                     help="or SLUICE_SASL_PASSWORD; asked for when a mechanism is given without it"),
        click.option("--tls", is_flag=True, help="connect with TLS"),
        click.option("--ca-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="CA bundle for --tls (default: the system's)"),
        click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=30.0,
                     show_default=True, help="seconds"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _connection(bootstrap: str | None, output: str, sasl_mechanism: str | None, sasl_username: str | None,
                sasl_password: str | None, tls: bool, ca_file: Path | None, timeout_s: float) -> Connection:
    if not bootstrap:
        raise Usage("Missing option '--bootstrap-server' (or SLUICE_BOOTSTRAP_SERVER)")
    sasl = None
    if sasl_mechanism is not None:
        if not sasl_username:
            raise Usage("--sasl-mechanism needs --sasl-username")
        if sasl_password is None:
            sasl_password = click.prompt(f"Password for {sasl_username}", hide_input=True, err=True)
        sasl = SaslCredentials(sasl_mechanism, sasl_username, sasl_password or "")
    elif sasl_username is not None:
        raise Usage("--sasl-username needs --sasl-mechanism")
    context = None
    if tls:
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    elif ca_file is not None:
        raise Usage("--ca-file needs --tls")
    return Connection(bootstrap, sasl, context, timeout_s, output)


def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _entity_type(text: str, option: str) -> str:
    entity_type = _ALIASES.get(text.strip())
    if entity_type is None:
        raise Usage(f"{option}: unknown entity type {text!r}: use user, client-id, client-id-prefix, topic "
                    f"or topic-prefix")
    return entity_type


def parse_pairs(text: str | None, option: str) -> dict[str, str]:
    """``user=alice,client-id=app`` -> {"user": "alice", "client-id": "app"}."""
    out: dict[str, str] = {}
    for item in _split(text):
        entity_type, sep, name = item.partition("=")
        if not sep or not name:
            raise Usage(f"{option}: {item!r} is not TYPE=NAME (e.g. user=alice)")
        key = _entity_type(entity_type, option)
        if key in out:
            raise Usage(f"{option}: {key} given twice")
        out[key] = name
    return out


def parse_defaults(text: str | None) -> list[str]:
    out = []
    for item in _split(text):
        key = _entity_type(item, "--defaults")
        if key not in _DEFAULTABLE:
            raise Usage(f"--defaults: {key} has no default entity (only user and client-id)")
        if key in out:
            raise Usage(f"--defaults: {key} given twice")
        out.append(key)
    return out


def entity_components(names: Mapping[str, str], defaults: Sequence[str]) -> tuple[Component, ...]:
    both = set(names) & set(defaults)
    if both:
        raise Usage(f"{', '.join(sorted(both))} given both in --names and --defaults")
    parts: dict[str, str | None] = {**names, **dict.fromkeys(defaults)}
    return tuple((t, parts[t]) for t in ENTITY_TYPES if t in parts)


def parse_add(text: str | None) -> list[tuple[str, float]]:
    out = []
    for item in _split(text):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise Usage(f"--add: {item!r} is not KEY=VALUE (e.g. producer_byte_rate=1048576)")
        if key.strip() == "rate_model":
            if value.strip() not in _RATE_MODELS:
                raise Usage(f"--add: rate_model: {value!r} is not token_bucket or windowed")
            out.append((TOKEN_BUCKET_KEY, _RATE_MODELS[value.strip()]))
            continue
        try:
            out.append((key.strip(), float(value)))
        except ValueError:
            raise Usage(f"--add: {key.strip()}: {value!r} is not a number") from None
    return out


# ------------------------------------------------------------------------------ formatting

def format_name(name: str | None) -> str:
    """An entity name for text output: ``<default>`` for the default; names that could be read
    otherwise (separators, spaces, a literal ``<default>``) are JSON-quoted."""
    if name is None:
        return "<default>"
    if not name or name == "<default>" or any(c in name for c in ",={}\"' \t\n") or not name.isprintable():
        return json.dumps(name)
    return name


def format_entity(components: Sequence[Component]) -> str:
    ordered = sorted(components, key=lambda c: ENTITY_TYPES.index(c[0]) if c[0] in ENTITY_TYPES else 9)
    return "{" + ", ".join(f"{t}={format_name(n)}" for t, n in ordered) + "}"


def entity_json(components: Sequence[Component]) -> dict[str, str | None]:
    return dict(components)


def source_components(entity: QuotaEntity) -> tuple[Component, ...]:
    return tuple(entity.to_kafka())


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def _error_name(code: int) -> str:
    """Kafka's name of an error code (INVALID_REQUEST), from kio's `ErrorCode`."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"error {code}"


def _fail(conn: Connection, message: str, code: int | None = None, exit_code: int = 1) -> NoReturn:
    name = _error_name(code) if code is not None else None
    if conn.output == "json":
        _emit({"error": {"message": message, "code": code, "name": name}})
    else:
        click.echo(f"Error: {message}" + (f" ({name})" if name else ""), err=True)
    sys.exit(exit_code)


# ------------------------------------------------------------------------------ commands

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def quotas() -> None:
    """List, describe and alter quotas through Sluice (Kafka's client-quota admin APIs)."""


@quotas.command("list")
@click.option("--names", metavar="TYPE=NAME[,...]", help="exact names, e.g. user=alice,client-id=app")
@click.option("--defaults", metavar="TYPE[,...]", help="default entities, e.g. client-id")
@click.option("--prefix", metavar="TYPE=PREFIX[,...]", help="names starting with PREFIX, e.g. user=team-")
@connection_options
def list_command(names: str | None, defaults: str | None, prefix: str | None, **conn_args: Any) -> None:
    """Entries matching the given names, defaults and prefixes (an omitted type matches anything),
    with their values."""
    conn = _connection(**conn_args)
    exact = parse_pairs(names, "--names")
    default_types = parse_defaults(defaults)
    prefixes = parse_pairs(prefix, "--prefix")
    overlap = (set(exact) | set(default_types)) & set(prefixes)
    if overlap:
        raise Usage(f"{', '.join(sorted(overlap))}: give a name, a default or a prefix, not several")
    entity_components(exact, default_types)  # checks names vs defaults
    components: list[Filter] = [(t, MATCH_EXACT, n) for t, n in exact.items()]
    components += [(t, MATCH_DEFAULT, None) for t in default_types]
    components += [(t, MATCH_ANY, None) for t in prefixes]
    try:
        with conn.client() as client:
            found = client.describe(components, strict=False)
    except QuotaAdminError as exc:
        _fail(conn, str(exc), exc.error_code)
    kept = [e for e in found if _prefixes_match(e, prefixes)]
    kept.sort(key=lambda e: _sort_key(e.entity))
    if conn.output == "json":
        _emit({"entries": [{"entity": entity_json(e.entity), "values": dict(sorted(e.values.items()))}
                           for e in kept]})
        return
    blocks = []
    for e in kept:
        lines = [format_entity(e.entity)] + [f"{k}={format_value(v)}" for k, v in sorted(e.values.items())]
        blocks.append("\n".join(lines))
    if blocks:
        click.echo("\n\n".join(blocks))


def _prefixes_match(entry: DescribedEntity, prefixes: Mapping[str, str]) -> bool:
    names = dict(entry.entity)
    return all(names.get(t) is not None and str(names[t]).startswith(p) for t, p in prefixes.items())


def _sort_key(components: Sequence[Component]) -> tuple[object, ...]:
    """User/client-id entities by user, then client id (defaults after names); others (ip) last."""
    names = dict(components)
    others = sorted((t, n or "") for t, n in components if t not in ENTITY_TYPES)
    return (bool(others), *((0, "") if t not in names else (2, "") if names[t] is None else (1, str(names[t]))
                            for t in ENTITY_TYPES), others)


@quotas.command("describe")
@click.option("--names", metavar="user=NAME[,client-id=NAME][,topic=NAME]",
              help="the caller: its principal and client id (a missing user is ANONYMOUS, a missing "
                   "client id is empty, as Kafka sees unauthenticated callers and null client ids); "
                   "with topic=NAME also the topic quotas of that topic, which apply beside the caller's. "
                   "Required, but with --usage optional: a filter (default: every sensor)")
@click.option("--include-overrides", is_flag=True, help="also show the less specific entries overridden "
                                                        "(marked *)")
@click.option("--usage", is_flag=True, help="live rate, limit in force and headroom per sensor, read "
                                            "from the running proxy's metrics port (--url)")
@click.option("--effective", is_flag=True, help="every limit in force for the caller as the running proxy "
                                                "enforces it (--url): value, unit, configured or callback "
                                                "value, storage factor, fleet share and source")
@click.option("--url", envvar="SLUICE_METRICS_URL", metavar="http://HOST:PORT",
              help="the proxy's metrics port (or SLUICE_METRICS_URL): plain describe then prints the "
                   "limits the engine enforces (callback, cluster entries, storage factor, fleet "
                   "share applied) instead of resolving the stored entries; needed by --usage and "
                   "--effective; --bootstrap-server is not used then")
@connection_options
def describe_command(names: str | None, include_overrides: bool, usage: bool, effective: bool,
                     url: str | None, **conn_args: Any) -> None:
    """The effective quotas of a caller: each quota's value and the entry it comes from (with its
    rate model when it is the token bucket); with topic=NAME, the topic's quotas too. With --usage:
    what the running proxy enforces, per sensor: rate, limit in force, headroom and its ratio."""
    who = parse_pairs(names, "--names")
    bad = sorted(set(who) - {USER, CLIENT_ID, TOPIC})
    if bad:
        raise Usage(f"--names: {', '.join(bad)}: a caller is a user, a client-id and a topic it writes "
                    f"or reads")
    if effective:
        if usage or not url:
            raise Usage("--effective needs --url http://HOST:PORT (the proxy's metrics port), "
                        "without --usage")
        _describe_effective(url, who, conn_args["output"], conn_args["timeout_s"])
        return
    if usage:
        if include_overrides:
            raise Usage("--include-overrides does not apply to --usage")
        if not url:
            raise Usage("--usage needs --url http://HOST:PORT (the proxy's metrics port)")
        _describe_usage(url, who, conn_args["output"], conn_args["timeout_s"])
        return
    if url:
        if include_overrides:
            raise Usage("--include-overrides resolves the stored entries: give it without --url "
                        "(and without SLUICE_METRICS_URL)")
        if not who:
            raise Usage("--names: give user=NAME, client-id=NAME and/or topic=NAME")
        _describe_in_force(url, who, conn_args["output"], conn_args["timeout_s"])
        return
    conn = _connection(**conn_args)
    if not who:
        raise Usage("--names: give user=NAME, client-id=NAME and/or topic=NAME")
    identity = ClientIdentity.of(who.get(USER), who.get(CLIENT_ID))
    try:
        with conn.client() as client:
            found = client.describe([], strict=False)
    except QuotaAdminError as exc:
        _fail(conn, str(exc), exc.error_code)
    config = _table(found).to_config()
    resolved = effective_quotas(config, identity) if USER in who or CLIENT_ID in who else {}
    topic = who.get(TOPIC)
    per_topic = effective_topic_quotas(config, topic) if topic is not None else {}
    if conn.output == "json":
        out: dict[str, Any] = {"caller": {USER: identity.principal, CLIENT_ID: identity.client_id},
                               "quotas": [_effective_json(q, include_overrides, config)
                                          for q in resolved.values()]}
        if topic is not None:
            out["topic"] = topic
            out["topic_quotas"] = [_effective_json(q, include_overrides, config) for q in per_topic.values()]
        _emit(out)
        return
    lines = []
    for quota in resolved.values():
        lines.append(_source_line(quota.kind.value, quota.source, config))
        if include_overrides:
            lines += ["*" + _source_line(quota.kind.value, s, config) for s in quota.overridden]
    for quota in per_topic.values():
        lines.append(_source_line(quota.kind.value, quota.source, config) + " (topic: applies beside the "
                     "caller's own; the larger throttle wins)")
        if include_overrides:
            lines += ["*" + _source_line(quota.kind.value, s, config) for s in quota.overridden]
    if lines:
        click.echo("\n".join(lines))


#: Where the proxy serves its usage report on the metrics port (`proxy.ops.headroom.USAGE_PATH`).
USAGE_PATH = "/quotas/usage"
#: Where it serves the engine's limits in force for one caller (`proxy.ops.headroom.EFFECTIVE_PATH`).
EFFECTIVE_PATH = "/quotas/effective"


def usage_url(url: str) -> str:
    """``http://host:port`` -> ``http://host:port/quotas/usage``; a URL with that path stays."""
    base = url.rstrip("/")
    return base if base.endswith(USAGE_PATH) else base + USAGE_PATH


def fetch_usage(url: str, timeout_s: float) -> UsageReport:
    """Read the running proxy's usage report (raises OSError, ValueError or UsageFormatError)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--url: {url!r} is not an http:// or https:// URL")
    with urllib.request.urlopen(usage_url(url), timeout=timeout_s) as response:
        return UsageReport.from_json(json.loads(response.read().decode()))


def _describe_usage(url: str, who: Mapping[str, str], output: str, timeout_s: float) -> None:
    try:
        report = fetch_usage(url, timeout_s)
    except (OSError, ValueError, UsageFormatError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        message = f"cannot read {usage_url(url)}: {reason}"
        if output == "json":
            _emit({"error": {"message": message, "code": None, "name": None}})
        else:
            click.echo(f"Error: {message}", err=True)
        sys.exit(1)
    entries = select(report.entries, who.get(USER), who.get(CLIENT_ID), who.get(TOPIC))
    entries.sort(key=_usage_order)
    if output == "json":
        _emit({**report.to_json(), "entries": [e.to_json() for e in entries]})
        return
    rows = [["BROKER", "KIND", "USER", "CLIENT-ID", "TOPIC", "RATE", "LIMIT", "HEADROOM", "RATIO", "UNIT",
             "NOTES"]]
    rows += [_usage_row(e) for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    numeric = {5, 6, 7, 8}
    for row in rows:
        cells = [c.rjust(w) if i in numeric else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        click.echo("  ".join(cells).rstrip())
    workers = f", {report.workers} workers merged" if report.workers else ""
    click.echo(f"(rates over the last {report.window_ms} ms, scope {report.scope}{workers})")


def _fetch_effective(url: str, who: Mapping[str, str], output: str, timeout_s: float) -> dict[str, Any]:
    """The running proxy's ``/quotas/effective`` document for the caller; exits 1 if unreadable."""
    query = urllib.parse.urlencode({"user": who.get(USER, ""), "client_id": who.get(CLIENT_ID, ""),
                                    **({"topic": who[TOPIC]} if TOPIC in who else {})})
    target = url.rstrip("/").removesuffix(USAGE_PATH) + EFFECTIVE_PATH + "?" + query
    try:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--url: {url!r} is not an http:// or https:// URL")
        with urllib.request.urlopen(target, timeout=timeout_s) as response:
            return dict(json.loads(response.read().decode()))
    except (OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        message = f"cannot read {target}: {reason}"
        if output == "json":
            _emit({"error": {"message": message, "code": None, "name": None}})
        else:
            click.echo(f"Error: {message}", err=True)
        sys.exit(1)


def _describe_in_force(url: str, who: Mapping[str, str], output: str, timeout_s: float) -> None:
    """Plain `describe` with the proxy's metrics port known (`--url`, or SLUICE_METRICS_URL): each
    quota that applies to the caller as the engine enforces it (``/quotas/effective``): the value
    in force (callback or entry, storage factor, fleet share) and where it came from."""
    doc = _fetch_effective(url, who, output, timeout_s)
    limits = doc["limits"]
    if output == "json":
        def quota(x: Mapping[str, Any]) -> dict[str, Any]:
            return {"key": x["kind"], "value": x["limit"], "unit": x["unit"], "scope": x["scope"],
                    "source": x["source"], "entity": x["entity"], "configured": x["configured"],
                    "storage_factor": x["storage_factor"], "fleet_share": x["fleet_share"],
                    "shadow": x["shadow"]}
        out: dict[str, Any] = {"caller": doc["caller"], "in_force": True,
                               "quotas": [quota(x) for x in limits if x["source"] != "topic"]}
        if TOPIC in who:
            out["topic"] = who[TOPIC]
            out["topic_quotas"] = [quota(x) for x in limits if x["source"] == "topic"]
        _emit(out)
        return
    for x in limits:
        parts = [f"{x['source']} {x['configured']:g}"]
        if x["storage_factor"] != 1:
            parts.append(f"storage factor {x['storage_factor']:g}")
        if x["fleet_share"] != 1:
            parts.append(f"fleet share {x['fleet_share']:.3g}")
        where = "" if x["entity"] is None else f" {x['entity']}"
        topic = (" (topic: applies beside the caller's own; the larger throttle wins)"
                 if x["source"] == "topic" else "")
        shadow = " (shadow)" if x["shadow"] else ""
        click.echo(f"{x['kind']}={x['limit']:g} [{x['scope']}: {' x '.join(parts)}]{where}{topic}{shadow}")


def _describe_effective(url: str, who: Mapping[str, str], output: str, timeout_s: float) -> None:
    """`describe --effective`: the engine's limits in force for the caller (``/quotas/effective``)."""
    doc = _fetch_effective(url, who, output, timeout_s)
    if output == "json":
        _emit(doc)
        return
    rows = [["SCOPE", "KIND", "LIMIT", "UNIT", "PER", "CONFIGURED", "STORAGE", "SHARE", "SOURCE", "ENTITY",
             "GROUP"]]
    rows += [[x["scope"], x["kind"], f"{x['limit']:g}", x["unit"], x.get("per", "-"), f"{x['configured']:g}",
              f"{x['storage_factor']:g}", f"{x['fleet_share']:.3g}",
              x["source"] + (" (shadow)" if x["shadow"] else ""),
              x["entity"] or "-",
              ",".join(f"{k}={v}" for k, v in (x.get("group") or {}).items()) or "-"] for x in doc["limits"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _usage_order(entry: UsageEntry) -> tuple[object, ...]:
    broker = entry.broker
    return (not broker.isdigit(), int(broker) if broker.isdigit() else 0, broker,
            list(KIND_LABEL).index(entry.kind), entry.user, entry.client_id, entry.topic)


def _number(value: float | None, digits: int = 1) -> str:
    return "unlimited" if value is None else f"{value:.{digits}f}"


def _usage_row(e: UsageEntry) -> list[str]:
    notes = []
    if e.shadow:
        notes.append("shadow")
    if e.entity:
        notes.append(f"entry {format_entity(e.entity)}")
    if e.tags:
        notes.append(f"group {e.tags}")
    if e.share < 1.0:
        notes.append(f"share {e.share:.3f}")
    if e.storage_factor < 1.0:
        notes.append(f"storage factor {e.storage_factor:.3f}")
    if e.workers:
        notes.append("workers " + ",".join(str(w.worker) for w in e.workers))
    ratio = e.headroom_ratio
    return [e.broker, KIND_LABEL[e.kind], format_name(e.user) if e.user else "-",
            format_name(e.client_id) if e.client_id else "-", format_name(e.topic) if e.topic else "-",
            _number(e.rate), _number(e.limit), _number(e.headroom) if e.limit is not None else "-",
            "-" if ratio is None else f"{ratio:.3f}", KIND_UNIT[e.kind], "; ".join(notes)]


def _table(found: Sequence[DescribedEntity]) -> QuotaTable:
    items: dict[QuotaEntity, Mapping[str, float]] = {}
    for entry in found:
        try:
            items[QuotaEntity.from_kafka(entry.entity)] = entry.values
        except QuotaConfigError:
            continue  # ip entities: not client quotas
    return QuotaTable(items)


def _bucket_text(source: QuotaSource, config: QuotaConfig) -> str:
    """`` token_bucket(burst_ms=N)`` when the entry uses the token bucket, else empty."""
    shape = config.bucket_of(config.get(source.entity))
    return "" if shape is None else f" {RateModel.TOKEN_BUCKET.value}(burst_ms={shape.burst_ms})"


def _source_line(key: str, source: QuotaSource, config: QuotaConfig) -> str:
    shadow = " (shadow)" if source.shadow else ""
    return (f"{key}={format_value(source.value)} {format_entity(source_components(source.entity))}"
            f"{_bucket_text(source, config)}{shadow}")


def _source_json(source: QuotaSource, config: QuotaConfig) -> dict[str, Any]:
    shape = config.bucket_of(config.get(source.entity))
    return {"value": source.value, "entity": entity_json(source_components(source.entity)),
            "shadow": source.shadow,
            "rate_model": (RateModel.WINDOWED if shape is None else RateModel.TOKEN_BUCKET).value,
            **({} if shape is None else {"burst_ms": shape.burst_ms})}


def _effective_json(quota: EffectiveQuota, include_overrides: bool, config: QuotaConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"key": quota.kind.value, **_source_json(quota.source, config)}
    if include_overrides:
        out["overridden"] = [_source_json(s, config) for s in quota.overridden]
    return out


@quotas.command("alter")
@click.option("--names", metavar="TYPE=NAME[,...]", help="the entity's names, e.g. user=alice")
@click.option("--defaults", metavar="TYPE[,...]", help="default components, e.g. client-id")
@click.option("--add", metavar="KEY=VALUE[,...]", help="keys to set, e.g. producer_byte_rate=1048576")
@click.option("--delete", metavar="KEY[,...]", help="keys to remove, e.g. consumer_byte_rate")
@click.option("--validate-only", is_flag=True, help="check the change, write nothing")
@connection_options
def alter_command(names: str | None, defaults: str | None, add: str | None, delete: str | None,
                  validate_only: bool, **conn_args: Any) -> None:
    """Set (--add) and remove (--delete) quota keys of one entity. Keys: producer_byte_rate,
    consumer_byte_rate, request_percentage, request_rate, producer_record_rate, consumer_record_rate,
    sluice.shadow (=1), rate_model (=token_bucket or windowed; the key sluice.token_bucket),
    sluice.burst_ms, sluice.each_client_id (=1, client-id-prefix entities), and the quota-native
    draft's units: sluice.bps.producer_byte_rate / sluice.bps.consumer_byte_rate (one budget across
    every broker) and sluice.broker_bps.producer_byte_rate / .consumer_byte_rate (one per broker),
    each enforced beside the plain key (the limit hit first throttles), and sluice.shares (the
    entity's shares of a FairShareCallback's capacity)."""
    conn = _connection(**conn_args)
    components = entity_components(parse_pairs(names, "--names"), parse_defaults(defaults))
    if not components:
        raise Usage("give the entity with --names and/or --defaults")
    sets = parse_add(add)
    removals = _split(delete)
    if not sets and not removals:
        raise Usage("nothing to do: give --add and/or --delete")
    keys = [k for k, _ in sets] + removals
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise Usage(f"{', '.join(repeated)} given more than once")
    ops: list[tuple[str, float | None]] = [*sets, *((k, None) for k in removals)]
    try:
        with conn.client() as client:
            outcomes = client.alter([AlterEntry(components, ops)], validate_only=validate_only)
    except QuotaAdminError as exc:
        _fail(conn, str(exc), exc.error_code)
    failed = next((o for o in outcomes if not o.ok), None)
    if failed is not None:
        _fail(conn, f"{format_entity(components)}: {failed.error_message or 'refused'} (nothing was changed)",
              failed.error_code)
    if conn.output == "json":
        _emit({"entity": entity_json(components), "validate_only": validate_only, "ok": True,
               "set": dict(sets), "deleted": removals})
    elif validate_only:
        click.echo(f"{format_entity(components)}: valid; nothing was changed (--validate-only)")


__all__ = ["quotas"]

"""Argument parsing and the extract/load steps the job mains share (only these touch storage)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.access_log import LOG_FORMATS
from spark_analytics.kafka_quota_client import SASL_MECHANISMS, KafkaQuotaClient, QuotaEntry, SaslConfig
from spark_analytics.policy import BYTE_RATE_KEYS, RATE_SCOPES, PolicyError, QuotaPolicy, parse_byte_rate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class UsageError(ValueError):
    """Bad command-line input; mains turn it into exit status 2."""


# ------------------------------------------------------------------------------ arguments

def add_input_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input (log files, or a Kafka topic)")
    g.add_argument("--logs", nargs="+", metavar="PATH",
                   help="access-log root (date=/hour= layout), directories or files")
    g.add_argument("--format", choices=[*sorted(LOG_FORMATS), "auto"], default="auto",
                   help="log file format; auto: parquet when the paths hold .parquet files (Sluice's "
                        "default), else json")
    g.add_argument("--kafka-bootstrap", metavar="HOST:PORT", help="read the logs from a Kafka topic instead")
    g.add_argument("--kafka-topic", metavar="TOPIC")
    g.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                   help="option for Spark's Kafka source, e.g. kafka.security.protocol=SASL_PLAINTEXT")
    g.add_argument("--since", metavar="TIME", help="only records at or after TIME (ISO 8601 or epoch ms)")
    g.add_argument("--until", metavar="TIME", help="only records before TIME (ISO 8601 or epoch ms)")


def add_session_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Spark")
    g.add_argument("--master", default=None,
                   help="Spark master; default: what spark-submit set, else local[*]")
    g.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    g.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


def add_policy_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policy (a --policy file, then these flags on top)")
    g.add_argument("--policy", type=Path, metavar="FILE", help="JSON or YAML file of policy settings")
    g.add_argument("--percentile", type=float, help="demand percentile, 0 < p <= 1 (default 0.95)")
    g.add_argument("--headroom", type=float, help="multiplier on the percentile (default 1.5)")
    g.add_argument("--floor", metavar="RATE", help="lowest recommendation, e.g. 256KiB")
    g.add_argument("--ceiling", metavar="RATE", help="highest recommendation, e.g. 100MB")
    g.add_argument("--max-change", type=float, help="largest step per run, fraction of current (default 0.5)")
    g.add_argument("--no-max-change", action="store_true", help="jump straight to the target")
    g.add_argument("--min-change", type=float, help="keep the current quota below this change (default 0.05)")
    g.add_argument("--round-to", metavar="RATE", help="round recommendations up to a multiple of this")
    g.add_argument("--capacity", action="append", default=[], metavar="KEY=RATE",
                   help="total to share fairly, e.g. producer_byte_rate=100MB (per broker)")
    g.add_argument("--weight", action="append", default=[], metavar="ENTITY=W",
                   help="fair-share weight, e.g. user=alice=2")
    g.add_argument("--default-weight", type=float)
    g.add_argument("--keys", nargs="+", choices=BYTE_RATE_KEYS, help="quota keys to recommend")
    g.add_argument("--rate-scope", choices=RATE_SCOPES,
                   help="per-second rates per broker (default; one budget per broker for the whole fleet, "
                        "every instance and worker summed) or per cluster (brokers summed too)")
    g.add_argument("--unmatched", choices=("user", "client-id", "user-client-id", "skip"),
                   help="entity for traffic no quota matched (default user)")


def add_admin_args(p: argparse.ArgumentParser, *, required: bool) -> None:
    g = p.add_argument_group("quota admin connection (Sluice or a broker)")
    g.add_argument("--bootstrap-server", required=required, metavar="HOST:PORT",
                   help="where DescribeClientQuotas/AlterClientQuotas go")
    g.add_argument("--sasl-mechanism", choices=SASL_MECHANISMS)
    g.add_argument("--sasl-username")
    g.add_argument("--sasl-password-env", default="SLUICE_ADMIN_PASSWORD", metavar="VAR",
                   help="environment variable holding the SASL password (default SLUICE_ADMIN_PASSWORD)")
    g.add_argument("--timeout", type=float, default=30.0, help="socket timeout, seconds")


def _pairs(items: Iterable[str], what: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.rpartition("=")
        if not sep or not key:
            raise UsageError(f"{what}: expected KEY=VALUE, got {item!r}")
        out.append((key, value))
    return out


def policy_from_args(args: argparse.Namespace) -> QuotaPolicy:
    try:
        base = QuotaPolicy.from_file(args.policy).to_dict() if args.policy else QuotaPolicy().to_dict()
        plain = {"percentile": args.percentile, "headroom": args.headroom, "min_change": args.min_change,
                 "max_change": args.max_change, "default_weight": args.default_weight,
                 "rate_scope": args.rate_scope, "unmatched": args.unmatched}
        base |= {k: v for k, v in plain.items() if v is not None}
        for name in ("floor", "ceiling"):
            if getattr(args, name) is not None:
                base[name] = parse_byte_rate(getattr(args, name))
        if args.round_to is not None:
            base["round_to"] = int(parse_byte_rate(args.round_to))
        if args.no_max_change:
            base["max_change"] = None
        if args.keys:
            base["keys"] = args.keys
        base["capacity"] = dict(base["capacity"]) | {
            k: parse_byte_rate(v) for k, v in _pairs(args.capacity, "--capacity")}
        base["weights"] = dict(base["weights"]) | {k: float(v) for k, v in _pairs(args.weight, "--weight")}
        return QuotaPolicy.from_dict(base)
    except (PolicyError, ValueError, OSError) as exc:
        raise UsageError(str(exc)) from exc


def sasl_from_args(args: argparse.Namespace) -> SaslConfig | None:
    if args.sasl_mechanism is None:
        return None
    if not args.sasl_username:
        raise UsageError("--sasl-mechanism needs --sasl-username")
    password = os.environ.get(args.sasl_password_env)
    if password is None:
        raise UsageError(f"set the SASL password in ${args.sasl_password_env}")
    return SaslConfig(args.sasl_mechanism, args.sasl_username, password)


def quota_client(args: argparse.Namespace) -> KafkaQuotaClient:
    return KafkaQuotaClient(args.bootstrap_server, sasl=sasl_from_args(args), timeout_s=args.timeout)


def parse_time(text: str | None) -> int | None:
    """ISO 8601 (naive means UTC) or epoch milliseconds -> epoch milliseconds."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise UsageError(f"bad time {text!r}: use ISO 8601 or epoch milliseconds") from exc
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


def spark_conf(args: argparse.Namespace) -> dict[str, str]:
    return dict(_pairs(args.conf, "--conf"))


def check_input_args(args: argparse.Namespace) -> None:
    if bool(args.logs) == bool(args.kafka_bootstrap):
        raise UsageError("give either --logs or --kafka-bootstrap/--kafka-topic")
    if args.kafka_bootstrap and not args.kafka_topic:
        raise UsageError("--kafka-bootstrap needs --kafka-topic")


def describe_inputs(args: argparse.Namespace) -> dict[str, Any]:
    if args.logs:
        source: dict[str, Any] = {"logs": list(args.logs), "format": resolve_format(args.logs, args.format)}
    else:
        source = {"kafka_bootstrap": args.kafka_bootstrap, "kafka_topic": args.kafka_topic}
    return source | {"since_ms": parse_time(args.since), "until_ms": parse_time(args.until)}


# ------------------------------------------------------------------------------ extract

def extract_logs(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    from spark_analytics.schema import read_access_logs, read_access_logs_from_kafka

    check_input_args(args)
    since, until = parse_time(args.since), parse_time(args.until)
    if args.logs:
        return read_access_logs(spark, args.logs, resolve_format(args.logs, args.format),
                                since_ms=since, until_ms=until)
    options = dict(_pairs(args.kafka_option, "--kafka-option"))
    return read_access_logs_from_kafka(spark, args.kafka_bootstrap, args.kafka_topic, options,
                                       since_ms=since, until_ms=until)


def resolve_format(paths: Sequence[str], log_format: str) -> str:
    """`auto`: parquet when any local path is or holds a ``.parquet`` file, else json."""
    if log_format != "auto":
        return log_format
    for path in paths:
        if "://" in path and not path.startswith("file://"):
            continue  # a remote store: say --format
        local = Path(path.removeprefix("file://"))
        if local.suffix == ".parquet" or (local.is_dir() and any(local.rglob("*.parquet"))):
            return "parquet"
    return "json"


def read_current_quotas(path: Path) -> list[QuotaEntry]:
    """A JSON list of {"entity": "user=alice", "values": {"producer_byte_rate": 1048576}}, the
    shape `sluice tune describe` writes."""
    try:
        data = json.loads(path.read_text())
        return [QuotaEntry(str(item["entity"]), {str(k): float(v) for k, v in item["values"].items()})
                for item in data]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"cannot read current quotas from {path}: {exc}") from exc


def quotas_frame(spark: SparkSession, entries: Sequence[QuotaEntry]) -> DataFrame:
    """The current quotas as (entity, quota_key, value) rows held in the plan itself (an inline
    VALUES table: a LocalRelation, whose size Spark knows, so it joins by broadcast with no job of
    its own; `createDataFrame` from Python rows makes an RDD, which cost two shuffle stages and two
    broadcast jobs per run, competing with the scan for the cores)."""
    rows = [(e.entity, key, float(value)) for e in entries for key, value in sorted(e.values.items())]
    if not rows:
        return spark.createDataFrame([], "entity string, quota_key string, value double")
    args: dict[str, Any] = {}
    values = []
    for i, (entity, key, value) in enumerate(rows):
        args |= {f"e{i}": entity, f"k{i}": key, f"v{i}": value}
        values.append(f"(:e{i}, :k{i}, :v{i})")
    return spark.sql("SELECT entity, quota_key, CAST(value AS DOUBLE) AS value FROM VALUES "
                     + ", ".join(values) + " AS current(entity, quota_key, value)", args=args)


# ------------------------------------------------------------------------------ load

def rows(df: DataFrame, order_by: Sequence[str]) -> list[dict[str, Any]]:
    """Collect a small result as plain dicts, sorted on the driver (nulls first): a Spark orderBy
    would cost an extra sampling job for a few hundred rows."""
    collected = [r.asDict(recursive=True) for r in df.collect()]
    return sorted(collected, key=lambda r: tuple((r[k] is not None, r[k]) for k in order_by))


def write_json(path: Path, doc: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n")
    return path

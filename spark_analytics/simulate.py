"""What if: replay the recorded requests through the quota engine under a candidate plan.

The steps (DataFrame -> DataFrame, no storage; the job in jobs/simulate.py reads and writes):

    access logs --arrivals(keys, topics)--> one row per request (or per request and topic) and quota
        key: who (principal, client_id), topic, broker, ts_ms, value (bytes, records or 1), records,
        whether the recording throttled it
    identities  --(driver: the engine's own precedence, quotas.replay.SharingGroups)--> the sharing
        group (concrete entity) each identity is counted in under the plan; unlimited ones drop out
    arrivals x groups --simulate(setup)--> one row per (entity, quota_key, broker): the replay under
        the plan and under the baseline (`quotas.replay`), grouped with `applyInPandas`, so the
        engine runs in the Python workers, one sharing group at a time.

Limits of the model: each quota key is replayed alone (a request limited by two keys waits for the
larger throttle in reality); `request_percentage` (broker thread time) is not in the log and is
not simulated; a sharing group spread over several brokers is one budget per broker
(`rate_scope="broker"`, Kafka's meaning) or one for the cluster (`"cluster"`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contracts.access_log import (
    FETCH_API_KEY,
    PRODUCE_API_KEY,
    SHARE_FETCH_API_KEY,
    format_quota_entity,
    parse_quota_entity,
)
from quotas import QuotaConfig, QuotaEntity, QuotaEntry, QuotaKind, RateConfig, RateModel
from quotas.callback import topic_identity
from quotas.entity import ClientIdentity, SensorKey
from quotas.replay import Arrival, ReplayResult, SharingGroups, replay, summarize, unqueued_response_ms

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

SIMULATED_KEYS: tuple[str, ...] = ("producer_byte_rate", "consumer_byte_rate", "producer_record_rate",
                                   "consumer_record_rate", "request_rate")
_PRODUCE_KEYS = ("producer_byte_rate", "producer_record_rate")
_FETCH_KEYS = ("consumer_byte_rate", "consumer_record_rate")
SIMULATION_FORMAT = "sluice.quota-simulation/1"

SUMMARY_FIELDS: tuple[tuple[str, str], ...] = (
    ("active_seconds", "long"), ("throttled_seconds", "long"), ("throttles", "long"),
    ("throttle_total_ms", "long"), ("throttle_mean_ms", "double"), ("throttle_p50_ms", "double"),
    ("throttle_p99_ms", "double"), ("throttle_max_ms", "double"), ("demand_per_s", "double"),
    ("admitted_per_s", "double"), ("records_demand_per_s", "double"), ("records_admitted_per_s", "double"),
    ("deferred", "double"), ("max_backlog", "double"), ("max_wait_ms", "long"), ("throttled_share", "double"))
RESULT_SCHEMA = ("entity string, quota_key string, broker_id int, requests long, span_s double, "
                 "recorded_throttled_seconds long, recorded_active_seconds long, "
                 + ", ".join(f"{side}_{name} {kind}"
                             for side in ("plan", "base") for name, kind in SUMMARY_FIELDS)
                 + ", timeline string")


class SimulationError(ValueError):
    pass


# ------------------------------------------------------------------------------ plan -> configs

def entity_of(text: str) -> QuotaEntity:
    """A plan's entity string (`user=alice`, `client-id-prefix=batch-`, `topic=orders`) as the engine's."""
    try:
        return QuotaEntity.from_kafka(parse_quota_entity(text))
    except Exception as exc:  # ValueError from the contract, QuotaConfigError from the engine
        raise SimulationError(f"entity {text!r}: {exc}") from exc


def entity_text(key: SensorKey) -> str:
    """The concrete entity a sharing group is (the `recommend` naming): `user=alice`,
    `user=alice,client-id=app`, `client-id-prefix=batch-`, `topic=orders`..."""
    parts: list[tuple[str, str | None]] = []
    if key.user:
        parts.append(("user", key.user))
    if key.client_id:
        parts.append(("client-id", key.client_id))
    if key.client_id_prefix:
        parts.append(("client-id-prefix", key.client_id_prefix))
    if key.topic:
        parts.append(("topic", key.topic))
    if key.topic_prefix:
        parts.append(("topic-prefix", key.topic_prefix))
    return format_quota_entity(parts)


def quota_config(values: Mapping[tuple[str, str], float], *, window: RateConfig, rate_model: RateModel,
                 burst_ms: int | None) -> QuotaConfig:
    """{(entity string, quota key): value} -> the engine's config, with the window and rate model."""
    by_entity: dict[QuotaEntity, dict[QuotaKind, float]] = {}
    for (entity, key), value in values.items():
        by_entity.setdefault(entity_of(entity), {})[QuotaKind(key)] = float(value)
    entries = tuple(QuotaEntry(e, v) for e, v in by_entity.items())
    return QuotaConfig(entries, window=window, rate_model=rate_model, burst_ms=burst_ms)


@dataclass(frozen=True, slots=True)
class SimulationSetup:
    """What the workers need: the plan's and the baseline's configs (as `QuotaConfig.to_dict`
    data, so they travel to the executors as plain values), the keys to replay, and the scope."""

    plan: Mapping[str, Any]
    baseline: Mapping[str, Any]
    keys: tuple[str, ...]
    rate_scope: str = "broker"
    end_ms: int | None = None
    """Where the recording ends (every group's replay stops there; what waits then is deferred);
    None: one millisecond after each group's last arrival."""

    @classmethod
    def of(cls, plan: QuotaConfig, baseline: QuotaConfig, keys: Sequence[str],
           rate_scope: str = "broker", end_ms: int | None = None) -> SimulationSetup:
        unknown = [k for k in keys if k not in SIMULATED_KEYS]
        if unknown:
            raise SimulationError(f"cannot simulate {unknown}: the access log has no measure of them")
        if rate_scope not in ("broker", "cluster"):
            raise SimulationError(f"rate_scope must be broker or cluster, got {rate_scope!r}")
        return cls(plan.to_dict(), baseline.to_dict(), tuple(keys), rate_scope, end_ms)

    def configs(self) -> tuple[QuotaConfig, QuotaConfig]:
        return QuotaConfig.from_dict(dict(self.plan)), QuotaConfig.from_dict(dict(self.baseline))


def is_topic_entity(text: str) -> bool:
    return text.startswith(("topic=", "topic-prefix="))


# ------------------------------------------------------------------------------ Spark steps

def arrivals(keys: Sequence[str], *, topics: bool) -> Any:
    """Access-log records -> one row per request and quota key in `keys`: principal, client_id,
    topic (null unless `topics`: then one row per request and topic, with that topic's bytes and
    records), broker_id, ts_ms, quota_key, value (what the key counts), records,
    `recorded_throttled` (Sluice or the broker throttled it in the recording), and `response_ms`
    (a produce's wait for its response, the upstream latency: its throttle delay starts after it,
    KIP-219; 0 for other keys and for a produce without a response)."""
    from pyspark.sql import functions as F

    def transform(logs: DataFrame) -> DataFrame:
        api = F.col("api_key")
        produce = api == PRODUCE_API_KEY
        fetch = api.isin(FETCH_API_KEY, SHARE_FETCH_API_KEY)
        broker_throttle = F.coalesce(F.col("broker_throttle_time_ms"), F.lit(0))
        throttled = (F.col("throttle_time_ms") > 0) | (broker_throttle > 0)
        response_ms = F.round(F.coalesce(F.col("upstream_latency_ms"), F.lit(0.0))).cast("long")
        base: list[Column | str] = ["principal", "client_id", "broker_id", "ts_ms",
                                    throttled.alias("recorded_throttled"),
                                    response_ms.alias("response_ms")]
        if topics:
            rows = (logs.where(produce | fetch)
                    .select(*base, "api_key", F.explode("topics").alias("t"))
                    .groupBy("principal", "client_id", "broker_id", "ts_ms", "recorded_throttled",
                             "response_ms", "api_key", F.col("t.topic").alias("topic"))
                    .agg(F.sum("t.bytes").alias("bytes"),
                         F.sum(F.coalesce(F.col("t.records"), F.lit(0))).alias("records")))
            produce, fetch = F.col("api_key") == PRODUCE_API_KEY, F.col("api_key") != PRODUCE_API_KEY
            size = F.col("bytes")
        else:
            records = F.aggregate(F.coalesce(F.col("topics"), F.array()), F.lit(0).cast("long"),
                                  lambda acc, t: acc + F.coalesce(t["records"], F.lit(0)).cast("long"))
            rows = logs.select(*base, "api_key", F.lit(None).cast("string").alias("topic"),
                               F.when(produce, F.col("request_bytes"))
                                .otherwise(F.coalesce(F.col("response_bytes"), F.lit(0))).alias("bytes"),
                               records.alias("records"))
            size = F.col("bytes")
        parts: list[DataFrame] = []
        for key in keys:
            if key in _PRODUCE_KEYS:
                where, value = produce, size if key == "producer_byte_rate" else F.col("records")
            elif key in _FETCH_KEYS:
                where, value = fetch, size if key == "consumer_byte_rate" else F.col("records")
            else:
                where, value = F.lit(True), F.lit(1)
            waited = F.col("response_ms") if key in _PRODUCE_KEYS else F.lit(0).cast("long")
            parts.append(rows.where(where).select(
                "principal", "client_id", "topic", "broker_id", "ts_ms", F.lit(key).alias("quota_key"),
                value.cast("double").alias("value"), F.col("records").cast("long").alias("records"),
                "recorded_throttled", waited.alias("response_ms")))
        out = parts[0]
        for p in parts[1:]:
            out = out.unionByName(p)
        return out
    return transform


def identities(arr: DataFrame) -> list[tuple[str, str | None, str | None, str]]:
    """The distinct (principal, client_id, topic, quota_key) of the arrivals (a small collect)."""
    return [(r["principal"], r["client_id"], r["topic"], r["quota_key"])
            for r in arr.select("principal", "client_id", "topic", "quota_key").distinct().collect()]


def group_rows(plan: QuotaConfig, found: Sequence[tuple[str, str | None, str | None, str]], *,
               topics: bool) -> list[tuple[str, str | None, str | None, str, str]]:
    """Per identity the concrete entity of the sharing group the plan counts it in (the engine
    decides, `SharingGroups`); identities the plan does not limit are left out."""
    groups = SharingGroups(plan, topics=topics)
    out = []
    for principal, client_id, topic, key in found:
        who = topic_identity(topic or "") if topics else ClientIdentity.of(principal, client_id)
        sensor = groups.of(QuotaKind(key), who)
        if sensor is not None:
            out.append((principal, client_id, topic, key, entity_text(sensor)))
    return out


def with_groups(spark: SparkSession, rows: Sequence[tuple[str, str | None, str | None, str, str]],
                rate_scope: str) -> Any:
    """arrivals -> arrivals with `entity` (inner join with the small group table: only what the
    plan limits); with rate_scope="cluster" the broker is dropped (one budget for the cluster)."""
    from pyspark.sql import functions as F

    table = spark.createDataFrame(
        list(rows), "principal string, client_id string, topic string, quota_key string, entity string")

    def transform(arr: DataFrame) -> DataFrame:
        keys = [arr["principal"].eqNullSafe(table["principal"]),
                arr["client_id"].eqNullSafe(table["client_id"]),
                arr["topic"].eqNullSafe(table["topic"]), arr["quota_key"] == table["quota_key"]]
        joined = arr.join(F.broadcast(table), keys, "inner").select(arr["*"], table["entity"])
        if rate_scope == "cluster":
            joined = joined.withColumn("broker_id", F.lit(None).cast("int"))
        return joined
    return transform


def simulate(setup: SimulationSetup, *, topics: bool) -> Any:
    """grouped arrivals -> one row per (entity, quota_key, broker_id): `RESULT_SCHEMA`."""
    def transform(arr: DataFrame) -> DataFrame:
        def run(table: pa.Table) -> pa.Table:
            return simulate_group(table, setup, topics=topics)
        return (arr.select("entity", "quota_key", "broker_id", "principal", "client_id", "topic", "ts_ms",
                           "value", "records", "recorded_throttled", "response_ms")
                .groupBy("entity", "quota_key", "broker_id").applyInArrow(run, RESULT_SCHEMA))
    return transform


# ------------------------------------------------------------------------------ in the workers

def _arrivals_of(columns: Mapping[str, list[Any]], topics: bool) -> list[Arrival]:
    """The group's arrivals; each produce's response time is its client's unqueued one
    (`quotas.replay.unqueued_response_ms`: the recording's waits include the client's own queue)."""
    waits: dict[ClientIdentity, list[tuple[int, float]]] = {}
    clients = [ClientIdentity.of(p, c)
               for p, c in zip(columns["principal"], columns["client_id"], strict=True)]
    for client, ts_ms, response_ms in zip(clients, columns["ts_ms"], columns["response_ms"], strict=True):
        waits.setdefault(client, []).append((ts_ms, float(response_ms or 0)))
    service_ms = {client: unqueued_response_ms(w) for client, w in waits.items()}
    return [Arrival(ts_ms, client, value, topic if topics else None, service_ms[client])
            for client, topic, ts_ms, value in zip(clients, columns["topic"], columns["ts_ms"],
                                                   columns["value"], strict=True)]


def _summary(arrs: Sequence[Arrival], result: ReplayResult, records: Sequence[int]) -> dict[str, Any]:
    s = summarize(arrs, result)
    total_records = float(sum(records))
    admitted_records = sum(r * (a.admitted_value / a.value if a.value else 1.0)
                           for r, a in zip(records, result.admissions, strict=True))
    out = {name: getattr(s, name) for name, _ in SUMMARY_FIELDS
           if name not in ("records_demand_per_s", "records_admitted_per_s", "throttled_share")}
    return out | {"records_demand_per_s": total_records / s.span_s,
                  "records_admitted_per_s": admitted_records / s.span_s,
                  "throttled_share": s.throttled_share}


def _per_second(result: ReplayResult) -> tuple[dict[int, float], dict[int, int]]:
    admitted: dict[int, float] = {}
    for a in result.admissions:
        if a.admitted_ms is not None:
            admitted[a.admitted_ms // 1000] = admitted.get(a.admitted_ms // 1000, 0.0) + a.admitted_value
    throttle: dict[int, int] = {}
    for t in result.throttles:
        throttle[t.at_ms // 1000] = throttle.get(t.at_ms // 1000, 0) + t.throttle_ms
    return admitted, throttle


_ARROW_TYPES = {"string": "string", "long": "int64", "double": "float64", "int": "int32"}


def result_schema() -> pa.Schema:
    import pyarrow as pa

    fields = [c.split(" ") for c in RESULT_SCHEMA.split(", ")]
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in fields])


def simulate_group(table: pa.Table, setup: SimulationSetup, *, topics: bool) -> pa.Table:
    """One sharing group's arrivals replayed under the plan and the baseline (in a worker)."""
    import pyarrow as pa

    plan, baseline = setup.configs()
    # a total order, so that ties in ts_ms replay the same however Spark partitioned the input
    table = table.sort_by([(c, "ascending") for c in ("ts_ms", "principal", "client_id", "topic", "value")])
    columns = {name: table.column(name).to_pylist()
               for name in ("principal", "client_id", "topic", "ts_ms", "value", "records",
                            "recorded_throttled", "response_ms")}
    key = str(table.column("quota_key")[0].as_py())
    kind = QuotaKind(key)
    arrs = _arrivals_of(columns, topics)
    records = [r or 0 for r in columns["records"]]
    end_ms = max(arrs[-1].ts_ms + 1, setup.end_ms or 0)
    by_plan = replay(arrs, plan, kind, topics=topics, end_ms=end_ms)
    by_base = replay(arrs, baseline, kind, topics=topics, end_ms=end_ms)
    recorded_seconds = {t // 1000 for t in columns["ts_ms"]}
    throttled_seconds = {t // 1000
                         for t, x in zip(columns["ts_ms"], columns["recorded_throttled"], strict=True)
                         if x}
    demand: dict[int, float] = {}
    for a in arrs:
        demand[a.ts_ms // 1000] = demand.get(a.ts_ms // 1000, 0.0) + a.value
    plan_in, plan_thr = _per_second(by_plan)
    base_in, base_thr = _per_second(by_base)
    seconds = sorted(set(demand) | set(plan_in) | set(base_in))
    timeline = [[s, demand.get(s, 0.0), plan_in.get(s, 0.0), base_in.get(s, 0.0), plan_thr.get(s, 0),
                 base_thr.get(s, 0)] for s in seconds]
    row: dict[str, Any] = {
        "entity": str(table.column("entity")[0].as_py()), "quota_key": key,
        "broker_id": table.column("broker_id")[0].as_py(),
        "requests": len(arrs), "span_s": max(end_ms - arrs[0].ts_ms, 1) / 1000.0,
        "recorded_throttled_seconds": len(throttled_seconds),
        "recorded_active_seconds": len(recorded_seconds)}
    for side, result in (("plan", by_plan), ("base", by_base)):
        row |= {f"{side}_{k}": v for k, v in _summary(arrs, result, records).items()}
    row["timeline"] = json.dumps(timeline, separators=(",", ":"))
    return pa.Table.from_pylist([row], schema=result_schema())


# ------------------------------------------------------------------------------ on the driver

def censored_note(row: Mapping[str, Any]) -> str | None:
    """Why an entity's demand is only a lower bound (`recommend`'s wording), or None."""
    throttled = row["recorded_throttled_seconds"]
    if not throttled:
        return None
    share = throttled / max(row["recorded_active_seconds"], 1)
    return (f"throttled in {share:.0%} of active seconds in the recording: demand may exceed what was "
            "measured; the simulation is a lower bound")


def entity_doc(row: Mapping[str, Any]) -> dict[str, Any]:
    """One result row as the JSON document's entity: plan, baseline and their difference."""
    def side(prefix: str) -> dict[str, Any]:
        return {name: _finite(row[f"{prefix}_{name}"]) for name, _ in SUMMARY_FIELDS}

    plan, base = side("plan"), side("base")
    difference = {name: (None if plan[name] is None or base[name] is None else plan[name] - base[name])
                  for name, _ in SUMMARY_FIELDS}
    note = censored_note(row)
    return {"entity": row["entity"], "quota_key": row["quota_key"], "broker_id": row["broker_id"],
            "requests": row["requests"], "span_s": row["span_s"], "censored": note is not None,
            "censored_note": note, "recorded_throttled_seconds": row["recorded_throttled_seconds"],
            "plan": plan, "baseline": base, "difference": difference}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def simulation_doc(rows: Sequence[Mapping[str, Any]], *, plan: str, baseline: str,
                   window: RateConfig, rate_model: RateModel, burst_ms: int | None,
                   rate_scope: str) -> dict[str, Any]:
    return {"format": SIMULATION_FORMAT, "plan": plan, "baseline": baseline,
            "rate_model": rate_model.value, "burst_ms": burst_ms,
            "window": {"samples": window.samples, "size_ms": window.window_ms}, "rate_scope": rate_scope,
            "entities": [entity_doc(r) for r in rows]}


def too_throttled(doc: Mapping[str, Any], max_share: float) -> list[str]:
    """Every entity the simulated plan throttles in more than `max_share` of its active seconds,
    with why (for `apply`)."""
    out = []
    for e in doc.get("entities", []):
        share = e["plan"]["throttled_share"] or 0.0
        if share > max_share:
            broker = "" if e["broker_id"] is None else f" on broker {e['broker_id']}"
            out.append(f"{e['entity']} {e['quota_key']}{broker}: "
                       f"throttled in {share:.0%} of its active seconds "
                       f"({e['plan']['throttled_seconds']} of {e['plan']['active_seconds']}), more than "
                       f"{max_share:.0%}; admitted {e['plan']['admitted_per_s']:,.0f}/s of "
                       f"{e['plan']['demand_per_s']:,.0f}/s demand"
                       + ("; censored: the real demand is higher" if e.get("censored") else ""))
    return out


def _num(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.0f}{unit}"


def format_table(doc: Mapping[str, Any]) -> str:
    """A table for people: per entity the baseline -> plan of the numbers that matter."""
    entities = doc.get("entities", [])
    if not entities:
        return "simulation: the plan limits no recorded traffic"
    names = [f"{e['entity']} {e['quota_key']}" + ("" if e["broker_id"] is None else f" @{e['broker_id']}")
             for e in entities]
    width = max(len(n) for n in names)
    head = (f"{'ENTITY':<{width}}  {'ACTIVE s':>8}  {'THROTTLED s':>13}  {'THROTTLE ms total':>19}  "
            f"{'p99 ms':>13}  {'ADMITTED/s of DEMAND/s':>30}  {'DEFERRED':>21}  {'MAX BACKLOG':>21}")
    lines = [f"simulation of {doc['plan']} against baseline {doc['baseline']} "
             f"({doc['rate_model']}, window {doc['window']['samples']} x {doc['window']['size_ms']} ms)",
             head]

    def pair(name: str, e: Mapping[str, Any]) -> str:
        return f"{_num(e['baseline'][name])} -> {_num(e['plan'][name])}"

    for n, e in zip(names, entities, strict=True):
        p = e["plan"]
        lines.append(
            f"{n:<{width}}  {p['active_seconds']:>8}  {pair('throttled_seconds', e):>13}  "
            f"{pair('throttle_total_ms', e):>19}  {pair('throttle_p99_ms', e):>13}  "
            f"{pair('admitted_per_s', e) + ' of ' + _num(p['demand_per_s']):>30}  "
            f"{pair('deferred', e):>21}  {pair('max_backlog', e):>21}")
        if e["censored"]:
            lines.append(f"{'':<{width}}  censored: {e['censored_note']}")
    lines.append("(baseline -> plan; rates per second of the unit the quota counts)")
    return "\n".join(lines)


def timelines(rows: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, list[list[float]]]]:
    for r in rows:
        broker = "" if r["broker_id"] is None else f" broker {r['broker_id']}"
        label = f"{r['entity']} {r['quota_key']}{broker}"
        yield label, json.loads(r["timeline"])

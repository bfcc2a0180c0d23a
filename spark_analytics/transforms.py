"""DataFrame -> DataFrame steps of the usage report and the quota recommendation.

Every step is a plain function of DataFrames, or a factory returning one (use with
`df.transform(...)`); none reads or writes storage. The pipeline, one scan of the logs:

    access logs --client_seconds--> per (principal, client_id, quota key, matched entity, broker, second)
        --entity_seconds(policy)--> per (quota entity, key, broker, second)  --rate_stats(p)--> per entity
        --recommend(policy, current)--> the plan
    client_seconds --client_stats--> per (principal, client_id, metric);  --top_talkers(n)-->

Percentiles are exact (`percentile`, linear interpolation between the two nearest ranks, as
numpy's default), over the seconds in which the entity sent or received anything: per-second rate
rows are few (entities × seconds), so exactness costs little next to reading the logs.

A fleet (several instances, each with workers) writes one log per process, and the records of all
of them are one dataset: the per-second usage is summed over every instance and worker in the very
first step (nothing groups by `instance` or `worker`), so a peak or percentile is that of the whole
fleet's usage, which is what a fleet budget limits (one budget per entity and broker, Kafka's
meaning; `rate_scope="cluster"` sums the brokers too).

Quota entities follow Kafka's sharing rules: a request that matched `user=<default>` is limited as
`user=alice` (each user has its own quota), `user=alice,client-id=<default>` as
`user=alice,client-id=app` and so on (kafka-quota-semantics.md §6), so the recommendation is for
that concrete entity; `matched_entity` keeps the configured one it inherits its current value from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from contracts.access_log import FETCH_API_KEY, PRODUCE_API_KEY, SHARE_FETCH_API_KEY
from spark_analytics.policy import QuotaPolicy, UnmatchedLevel

PRODUCE_KEY = "producer_byte_rate"
FETCH_KEY = "consumer_byte_rate"
CLIENT_METRICS: tuple[str, ...] = ("produce_bytes", "fetch_bytes", "requests")
PERCENTILES: tuple[float, ...] = (0.5, 0.95, 0.99)

Transform = Callable[[DataFrame], DataFrame]


# --------------------------------------------------------------------------- one scan of the logs

def client_seconds(logs: DataFrame) -> DataFrame:
    """Access-log records -> one row per (principal, client_id, quota_key, quota_entity, broker_id,
    second): the only step that touches every record, so it keeps what every later step needs.
    Records of every instance and worker of a fleet add up here (one budget for the fleet).

    quota_key is producer_byte_rate for Produce (bytes = request_bytes, what Kafka's produce quota
    counts), consumer_byte_rate for Fetch and ShareFetch (bytes = response_bytes, as the broker
    charges both), null for other APIs (bytes 0; ShareAcknowledge counts as a request).
    """
    api = F.col("api_key")
    produce, fetch = api == PRODUCE_API_KEY, api.isin(FETCH_API_KEY, SHARE_FETCH_API_KEY)
    usage = logs.select(
        "principal", "client_id", "quota_entity", "broker_id", "ts_ms", "quota_limit",
        F.expr("ts_ms div 1000").alias("second"),
        # grouped as a byte (0 produce, 1 fetch, null other) and named after the aggregation: a
        # string key per record costs the hash aggregation more than the name is worth
        F.when(produce, F.lit(0)).when(fetch, F.lit(1)).cast("byte").alias("key_code"),
        F.when(produce, F.col("request_bytes"))
         .when(fetch, F.coalesce(F.col("response_bytes"), F.lit(0)))
         .otherwise(F.lit(0)).cast("long").alias("bytes"),
        "throttle_time_ms", "broker_throttle_time_ms", "would_throttle_ms",
    )
    code = F.col("key_code")
    quota_key = F.when(code == 0, F.lit(PRODUCE_KEY)).when(code == 1, F.lit(FETCH_KEY)).alias("quota_key")
    aggregated = (usage.groupBy("principal", "client_id", "key_code", "quota_entity", "broker_id", "second")
                  .agg(F.sum("bytes").alias("bytes"),
                       F.count(F.lit(1)).alias("requests"),
                       F.max("throttle_time_ms").alias("throttle_ms"),
                       F.max("broker_throttle_time_ms").alias("broker_throttle_ms"),
                       F.max("would_throttle_ms").alias("would_throttle_ms"),
                       F.max_by("quota_limit", "ts_ms").alias("quota_limit"),
                       F.max("ts_ms").alias("last_ts_ms")))
    return aggregated.select("principal", "client_id", quota_key, *aggregated.columns[3:])


# --------------------------------------------------------------------------- quota entities

def _encode_name(col: Column) -> Column:
    """The Spark twin of contracts.access_log.encode_entity_name ('%' first, then the rest)."""
    for ch, code in (("%", "%25"), (",", "%2C"), ("=", "%3D"), ("<", "%3C"), (">", "%3E")):
        col = F.replace(col, F.lit(ch), F.lit(code))
    return col


def _client_name(col: Column) -> Column:
    """A client-id usable as an entity name: Kafka cannot name the empty client-id in a quota."""
    return F.when(F.coalesce(col, F.lit("")) != "", _encode_name(col))


def sharing_entity(matched: Column, principal: Column, client_id: Column,
                   unmatched: UnmatchedLevel) -> Column:
    """The concrete entity whose quota limits a request: the matched entity with `<default>`
    replaced by the request's own user or client-id; for unmatched traffic, per `unmatched`.
    Null when it cannot be named (an empty client-id, or unmatched="skip")."""
    user = F.concat(F.lit("user="), _encode_name(principal))
    client = F.concat(F.lit("client-id="), _client_name(client_id))
    fallback = {
        "user": user,
        "client-id": client,
        "user-client-id": F.concat(user, F.lit(","), client),
        "skip": F.lit(None).cast("string"),
    }[unmatched]
    concrete = F.replace(matched, F.lit("user=<default>"), user)
    needs_client = matched.contains("client-id=<default>")
    concrete = F.when(needs_client, F.replace(concrete, F.lit("client-id=<default>"), client)) \
                .otherwise(concrete)
    return F.when(matched.isNull(), fallback).otherwise(concrete)


def nameable(matched: Column, principal: Column, client_id: Column, unmatched: UnmatchedLevel) -> Column:
    """True exactly where `sharing_entity` of the same arguments is not null, without building the
    name: null checks and one `contains`. `entity_seconds` filters on this, because Spark pushes a
    filter on client_seconds' grouping columns down to the records, and the name's five string
    replacements per record cost more than the whole filter should (a replacement with a null
    user or client-id is null, so a matched entity needs the user, and the client-id too when it
    has `client-id=<default>`)."""
    has_user = principal.isNotNull()
    has_client = F.coalesce(client_id, F.lit("")) != ""
    fallback = {
        "user": has_user,
        "client-id": has_client,
        "user-client-id": has_user & has_client,
        "skip": F.lit(False),
    }[unmatched]
    concrete = has_user & (~matched.contains("client-id=<default>") | has_client)
    return F.when(matched.isNull(), fallback).otherwise(concrete)


def entity_seconds(policy: QuotaPolicy) -> Transform:
    """client_seconds -> one row per (entity, quota_key, broker_id, second) of Produce/Fetch traffic,
    every instance and worker summed. With rate_scope="cluster" the brokers are summed too and
    `broker_id` is null."""
    def transform(cs: DataFrame) -> DataFrame:
        who = (F.col("quota_entity"), F.col("principal"), F.col("client_id"), policy.unmatched)
        rows = (cs.where(F.col("quota_key").isNotNull() & nameable(*who))
                .withColumn("entity", sharing_entity(*who)))
        if policy.rate_scope == "cluster":
            rows = rows.withColumn("broker_id", F.lit(None).cast("int"))
        return (rows.groupBy("entity", "quota_key", "broker_id", "second")
                .agg(F.sum("bytes").alias("bytes"),
                     F.sum("requests").alias("requests"),
                     (F.max("throttle_ms") > 0).alias("throttled"),
                     F.coalesce(F.max("broker_throttle_ms") > 0, F.lit(False)).alias("broker_throttled"),
                     F.coalesce(F.max("would_throttle_ms") > 0, F.lit(False)).alias("would_throttle"),
                     F.max_by("quota_entity", "last_ts_ms").alias("matched_entity"),
                     F.max_by("quota_limit", "last_ts_ms").alias("logged_limit"),
                     F.max("last_ts_ms").alias("last_ts_ms")))
    return transform


def _share(flag: str) -> Column:
    return F.avg(F.col(flag).cast("double"))


def rate_stats(percentile: float) -> Transform:
    """entity_seconds -> one row per (entity, quota_key): rates in bytes/s over active seconds
    (mean, p50, p95, p99, max and `rate_at_percentile` for the policy's percentile), the share of
    those seconds Sluice throttled, the broker throttled, and shadow mode would have throttled."""
    def transform(es: DataFrame) -> DataFrame:
        pct = F.percentile(F.col("bytes").cast("double"), [*PERCENTILES, percentile])
        stats = (es.groupBy("entity", "quota_key")
                 .agg(F.count(F.lit(1)).alias("active_seconds"),
                      F.sum("bytes").alias("total_bytes"),
                      F.sum("requests").alias("requests"),
                      F.avg("bytes").alias("mean_rate"),
                      pct.alias("_pct"),
                      F.max("bytes").cast("double").alias("max_rate"),
                      _share("throttled").alias("throttled_share"),
                      _share("broker_throttled").alias("broker_throttled_share"),
                      _share("would_throttle").alias("would_throttle_share"),
                      F.max_by("matched_entity", "last_ts_ms").alias("matched_entity"),
                      F.max_by("logged_limit", "last_ts_ms").alias("logged_limit")))
        return stats.select(
            "entity", "quota_key", "active_seconds", "total_bytes", "requests", "mean_rate",
            *(F.col("_pct")[i].alias(name) for i, name in enumerate(("p50", "p95", "p99"))),
            "max_rate", F.col("_pct")[len(PERCENTILES)].alias("rate_at_percentile"),
            "throttled_share", "broker_throttled_share", "would_throttle_share",
            "matched_entity", "logged_limit")
    return transform


def rate_timeline(bucket_s: int) -> Transform:
    """entity_seconds -> (entity, quota_key, bucket_start_s, rate): the mean bytes/s per bucket,
    brokers summed, for plots (idle seconds count as 0)."""
    if bucket_s < 1:
        raise ValueError("bucket_s must be at least 1")

    def transform(es: DataFrame) -> DataFrame:
        bucket = (F.col("second") - F.pmod(F.col("second"), F.lit(bucket_s))).alias("bucket_start_s")
        return (es.groupBy("entity", "quota_key", bucket)
                .agg((F.sum("bytes") / F.lit(bucket_s)).alias("rate")))
    return transform


# --------------------------------------------------------------------------- per client

def client_stats(cs: DataFrame) -> DataFrame:
    """client_seconds -> one row per (principal, client_id, metric) for produce_bytes, fetch_bytes
    and requests: per-second rates over the seconds the client was active (summed over brokers)."""
    per_second = (cs.groupBy("principal", "client_id", "second")
                  .agg(F.sum(F.when(F.col("quota_key") == PRODUCE_KEY, F.col("bytes")).otherwise(0))
                        .alias("produce_bytes"),
                       F.sum(F.when(F.col("quota_key") == FETCH_KEY, F.col("bytes")).otherwise(0))
                        .alias("fetch_bytes"),
                       F.sum("requests").alias("requests")))
    long = per_second.unpivot(["principal", "client_id", "second"], list(CLIENT_METRICS), "metric", "value")
    pct = F.percentile(F.col("value").cast("double"), list(PERCENTILES))
    stats = (long.groupBy("principal", "client_id", "metric")
             .agg(F.count(F.lit(1)).alias("active_seconds"),
                  F.sum("value").alias("total"),
                  F.avg("value").alias("mean_rate"),
                  pct.alias("_pct"),
                  F.max("value").cast("double").alias("max_rate")))
    return stats.select("principal", "client_id", "metric", "active_seconds", "total", "mean_rate",
                        *(F.col("_pct")[i].alias(n) for i, n in enumerate(("p50", "p95", "p99"))),
                        "max_rate")


def top_talkers(n: int) -> Transform:
    """client_seconds -> the n clients with the most bytes (produce + fetch), with their share."""
    if n < 1:
        raise ValueError("n must be at least 1")

    def transform(cs: DataFrame) -> DataFrame:
        totals = (cs.groupBy("principal", "client_id")
                  .agg(F.sum(F.when(F.col("quota_key") == PRODUCE_KEY, F.col("bytes")).otherwise(0))
                        .alias("produce_bytes"),
                       F.sum(F.when(F.col("quota_key") == FETCH_KEY, F.col("bytes")).otherwise(0))
                        .alias("fetch_bytes"),
                       F.sum("requests").alias("requests"))
                  .withColumn("total_bytes", F.col("produce_bytes") + F.col("fetch_bytes")))
        everyone = Window.partitionBy()
        order = Window.orderBy(F.desc("total_bytes"), F.desc("requests"), "principal",
                               F.asc_nulls_first("client_id"))
        ranked = totals.select(
            F.row_number().over(order).alias("rank"), "principal", "client_id", "produce_bytes",
            "fetch_bytes", "requests", "total_bytes",
            F.when(F.sum("total_bytes").over(everyone) > 0,
                   F.col("total_bytes") / F.sum("total_bytes").over(everyone))
             .otherwise(F.lit(0.0)).alias("share_of_bytes"))
        return ranked.where(F.col("rank") <= n)
    return transform


# --------------------------------------------------------------------------- recommendation

def _lookup(mapping: Mapping[str, float], key: Column) -> Column:
    if not mapping:
        return F.lit(None).cast("double")
    pairs = [F.lit(x) for kv in sorted(mapping.items()) for x in (kv[0], float(kv[1]))]
    return F.try_element_at(F.create_map(*pairs), key)


def _num(col: Column) -> Column:
    """A rate for a reason string: '1,800' (rounded half-even to a whole number)."""
    return F.format_number(col, 0)


def _with_current(stats: DataFrame, current: DataFrame | None) -> DataFrame:
    if current is None:  # offline: the limit the log recorded for the matched entity
        return stats.select(
            "*", F.col("logged_limit").alias("current"),
            F.when(F.col("logged_limit").isNotNull(),
                   F.concat(F.lit("logged for "), F.col("matched_entity"))).alias("current_source"))
    exact = current.select("entity", "quota_key", F.col("value").alias("_exact"))
    inherited = current.select(F.col("entity").alias("matched_entity"), "quota_key",
                               F.col("value").alias("_inherited"))
    joined = (stats.join(exact, ["entity", "quota_key"], "left")
              .join(inherited, ["matched_entity", "quota_key"], "left"))
    return joined.select(
        *stats.columns,
        F.coalesce("_exact", "_inherited").alias("current"),
        F.when(F.col("_exact").isNotNull(), F.lit("set on entity"))
         .when(F.col("_inherited").isNotNull(), F.concat(F.lit("inherited from "), F.col("matched_entity")))
         .alias("current_source"))


def _fair_share(bounded: Column, weight: Column, capacity: Column) -> Column:
    """Weighted water-filling within each quota_key: with entities sorted by bounded/weight, entity
    k keeps its demand if it is within lambda_k = (capacity - demand of those before) / (weight of
    k and those after); from the first one that is not, everyone gets weight x that lambda.
    The satisfied ones form a prefix of the order, and the total comes to exactly the capacity."""
    ratio = bounded / weight
    ordered = Window.partitionBy("quota_key").orderBy(ratio, "entity")
    before = F.coalesce(F.sum(bounded).over(ordered.rowsBetween(Window.unboundedPreceding, -1)), F.lit(0.0))
    weight_from_here = F.sum(weight).over(ordered.rowsBetween(Window.currentRow, Window.unboundedFollowing))
    lam = (capacity - before) / weight_from_here
    satisfied = ratio <= lam
    lam_star = F.max(F.when(~satisfied, lam)).over(Window.partitionBy("quota_key"))
    return F.when(capacity.isNull() | satisfied, bounded).otherwise(weight * lam_star)


def recommend(policy: QuotaPolicy, current: DataFrame | None = None) -> Transform:
    """rate_stats -> the plan: current and recommended value per (entity, quota_key), and why.

    `current` has columns (entity, quota_key, value): the quotas configured now, as
    DescribeClientQuotas reports them. An entity's current value is its own entry, else the one of
    the entity it matched in the logs; with `current=None` the limit recorded in the logs is used.
    See spark_analytics.policy for the steps; `reason` spells out the ones that applied.
    """
    def transform(stats: DataFrame) -> DataFrame:
        df = _with_current(stats.where(F.col("quota_key").isin(*policy.keys)), current)
        rate = F.col("rate_at_percentile")
        floor = F.lit(policy.floor).cast("double")
        ceiling = F.lit(policy.ceiling).cast("double")
        df = df.withColumn("demand", rate * F.lit(policy.headroom))
        bounded = F.col("demand")
        if policy.floor is not None:
            bounded = F.greatest(bounded, floor)
        if policy.ceiling is not None:
            bounded = F.least(bounded, ceiling)
        df = (df.withColumn("bounded", bounded)
              .withColumn("weight", F.coalesce(_lookup(policy.weights, F.col("entity")),
                                               F.lit(float(policy.default_weight))))
              .withColumn("capacity", _lookup(policy.capacity, F.col("quota_key")))
              .withColumn("fair_share", _fair_share(F.col("bounded"), F.col("weight"), F.col("capacity"))))
        target = F.col("fair_share")
        if policy.floor is not None:
            target = F.greatest(target, floor)
        df = df.withColumn("target", target)
        stepped = F.col("target")
        if policy.max_change is not None:
            low = F.col("current") * F.lit(1 - policy.max_change)
            high = F.col("current") * F.lit(1 + policy.max_change)
            stepped = F.when(F.col("current").isNull(), stepped) \
                       .otherwise(F.least(F.greatest(stepped, low), high))
        df = df.withColumn("stepped", stepped)
        step = F.lit(policy.round_to)
        rounded = F.ceil(F.col("stepped") / step) * step
        df = df.withColumn("recommended", F.greatest(rounded, step).cast("long"))
        change = (F.col("recommended") - F.col("current")) / F.col("current")
        df = df.withColumn("change", change).withColumn(
            "action",
            F.when(F.col("current").isNull(), F.lit("create"))
             .when(F.abs(change) < F.lit(policy.min_change), F.lit("keep"))
             .when(F.col("recommended") > F.col("current"), F.lit("increase"))
             .otherwise(F.lit("decrease")))
        # a kept entry recommends the current value, so the plan reads the same as `apply` applies
        # it; `change` and the reason still tell what the policy computed
        df = df.withColumn("computed", F.col("recommended")).withColumn(
            "recommended", F.when(F.col("action") == "keep", F.round(F.col("current")).cast("long"))
                            .otherwise(F.col("recommended")))
        return df.select(
            "entity", "quota_key", "matched_entity", "current", "current_source", "active_seconds",
            "total_bytes", "mean_rate", "p50", "p95", "p99", "max_rate", "rate_at_percentile",
            "throttled_share", "would_throttle_share", "demand", "weight", "target", "recommended",
            "change", "action", _reason(policy).alias("reason"))
    return transform


def _reason(policy: QuotaPolicy) -> Column:
    parts: list[Column] = [
        F.format_string(f"{policy.percentile_label} %s B/s × headroom {policy.headroom:g} = %s",
                        _num(F.col("rate_at_percentile")), _num(F.col("demand")))]
    if policy.floor is not None:
        parts.append(F.when(F.col("demand") < F.lit(policy.floor),
                            F.lit(f"raised to floor {policy.floor:,.0f}")))
    if policy.ceiling is not None:
        parts.append(F.when(F.col("demand") > F.lit(policy.ceiling),
                            F.lit(f"lowered to ceiling {policy.ceiling:,.0f}")))
    if policy.capacity:
        parts.append(F.when(F.col("fair_share") < F.col("bounded"), F.format_string(
            "fair share %s of capacity %s (weight %s)", _num(F.col("fair_share")), _num(F.col("capacity")),
            F.col("weight").cast("string"))))
        if policy.floor is not None:
            parts.append(F.when(F.col("fair_share") < F.lit(policy.floor),
                                F.lit(f"fair share below floor: floor {policy.floor:,.0f} kept")))
    if policy.max_change is not None:
        pct = f"{policy.max_change * 100:g}%%"  # a format_string template: %% is a percent sign
        parts.append(F.when(F.col("stepped") < F.col("target"), F.format_string(
            f"limited to +{pct} of current %s", _num(F.col("current")))))
        parts.append(F.when(F.col("stepped") > F.col("target"), F.format_string(
            f"limited to -{pct} of current %s", _num(F.col("current")))))
    parts.append(F.when(F.col("action") == "create", F.lit("no quota configured now")))
    parts.append(F.when(F.col("action") == "keep", F.format_string(
        f"computed %s, within {policy.min_change * 100:g}%% of current: keep", _num(F.col("computed")))))
    parts.append(F.when(F.col("throttled_share") > 0, F.format_string(
        "throttled in %s%% of active seconds: demand may exceed what was measured",
        F.format_number(F.col("throttled_share") * 100, 0))))
    return F.concat_ws("; ", *parts)

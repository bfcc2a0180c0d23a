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

import functools
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
from quotas.replay import ReplayColumns, SharingGroups, percentile, replay_columns
from quotas.replay_loop import NOT_ADMITTED

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

def arrivals(keys: Sequence[str], *, topics: bool, service_ms: int | None = None,
             demand_resolution_ms: int = 1, streamed: bool = True) -> Any:
    """Access-log records -> one row per request and quota key in `keys`: principal, client_id,
    topic (null unless `topics`: then one row per request and topic, with that topic's bytes and
    records), broker_id, ts_ms, quota_key, value (what the key counts), records,
    `recorded_throttled` (Sluice or the broker throttled it in the recording), and `response_ms`:
    for a produce (its throttle delay starts when its response is sent, KIP-219) its broker's
    service time (`service_ms`, or `broker_service_ms` of the recording: a property of the broker,
    not of the client's demand or of the queues the plan removes); 0 for other keys and for a
    produce without a response (acks=0). A consumer's demand is timed to `demand_resolution_ms`
    (`retime_partition`); `streamed` as `fetch_demand`'s."""
    from pyspark.sql import functions as F

    def transform(logs: DataFrame) -> DataFrame:
        api = F.col("api_key")
        produce = api == PRODUCE_API_KEY
        fetch = api.isin(FETCH_API_KEY, SHARE_FETCH_API_KEY)
        broker_throttle = F.coalesce(F.col("broker_throttle_time_ms"), F.lit(0))
        throttled = (F.col("throttle_time_ms") > 0) | (broker_throttle > 0)
        answered = produce & F.col("upstream_latency_ms").isNotNull()
        if service_ms is not None:
            response_ms = F.when(answered, F.lit(int(service_ms))).otherwise(F.lit(0)).cast("long")
        elif any(k in _PRODUCE_KEYS for k in keys):
            service = logs.transform(broker_service_ms)
            logs = logs.join(F.broadcast(service), logs["broker_id"].eqNullSafe(service["service_broker"]),
                             "left")
            response_ms = F.when(answered, F.coalesce(F.col("service_ms"), F.lit(0))).otherwise(
                F.lit(0)).cast("long")
        else:
            response_ms = F.lit(0).cast("long")
        # `seq`: the request's place on its connection (its correlation id): requests of one
        # client in one millisecond replay in the order it sent them
        base: list[Column | str] = ["principal", "client_id", "broker_id", "ts_ms",
                                    throttled.alias("recorded_throttled"),
                                    response_ms.alias("response_ms"),
                                    F.col("correlation_id").cast("long").alias("seq")]
        if topics:
            rows = (logs.where(produce | fetch)
                    .select(*base, "api_key", F.explode("topics").alias("t"))
                    .groupBy("principal", "client_id", "broker_id", "ts_ms", "recorded_throttled",
                             "response_ms", "seq", "api_key", F.col("t.topic").alias("topic"))
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
        # a consumer's demand is the data produced for it, when it was produced (see `fetch_demand`)
        demand = (logs.transform(fetch_demand(topics=topics, resolution_ms=demand_resolution_ms,
                                              streamed=streamed))
                  if any(k in _FETCH_KEYS for k in keys) else None)
        parts: list[DataFrame] = []
        for key in keys:
            source = rows
            if key in _PRODUCE_KEYS:
                where, value = produce, size if key == "producer_byte_rate" else F.col("records")
            elif key in _FETCH_KEYS and demand is not None:
                source, where = demand, F.lit(True)
                value = F.col("bytes") if key == "consumer_byte_rate" else F.col("records")
            else:
                where, value = F.lit(True), F.lit(1)
            waited = F.col("response_ms") if key in _PRODUCE_KEYS else F.lit(0).cast("long")
            # a consumer's demand rows are in no request's order: they tie on `value`
            seq = F.col("seq") if source is rows else F.lit(0).cast("long")
            parts.append(source.where(where).select(
                "principal", "client_id", "topic", "broker_id", "ts_ms", F.lit(key).alias("quota_key"),
                value.cast("double").alias("value"), F.col("records").cast("long").alias("records"),
                "recorded_throttled", waited.alias("response_ms"), seq.alias("seq")))
        out = parts[0]
        for p in parts[1:]:
            out = out.unionByName(p)
        return out
    return transform


def broker_service_ms(logs: DataFrame) -> DataFrame:
    """Access-log records -> per broker (`service_broker`, null: unknown) its produce service time
    `service_ms` (`quotas.replay.service_time_ms`, over every answered produce sent to it), in
    Spark SQL: per broker, in (ts, wait) order, a produce found the broker idle when it came no
    earlier than every earlier one's answer (the running maximum of ts + wait over the rows before
    it); the mean of those waits, rounded half to even, in whole numbers."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    produces = (logs.where((F.col("api_key") == PRODUCE_API_KEY) & F.col("upstream_latency_ms").isNotNull())
                .select(F.col("broker_id").alias("service_broker"),
                        F.coalesce(F.col("ts_ms"), F.lit(0)).cast("long").alias("ts"),
                        # whole ms, half up, as the recorded waits are rounded everywhere
                        F.round("upstream_latency_ms").cast("long").alias("wait")))
    before = (Window.partitionBy("service_broker").orderBy("ts", "wait")
              .rowsBetween(Window.unboundedPreceding, -1))
    free_before = F.max(F.col("ts") + F.col("wait")).over(before)
    idle = free_before.isNull() | (F.col("ts") >= free_before)
    totals = (produces.select("service_broker", "wait", idle.alias("idle"))
              .groupBy("service_broker")
              .agg(F.sum(F.when(F.col("idle"), F.col("wait"))).alias("total"),
                   F.count(F.when(F.col("idle"), F.lit(1))).alias("n")))
    # total / n rounded half to even, exactly, in integers (the first produce is always idle: n > 0)
    q = F.expr("total div n")
    twice_r = 2 * (F.col("total") - q * F.col("n"))
    up = (twice_r > F.col("n")) | ((twice_r == F.col("n")) & (q % 2 == 1))
    return totals.select("service_broker",
                         (q + F.when(up, F.lit(1)).otherwise(F.lit(0))).cast("long").alias("service_ms"))


_DEMAND_SCHEMA = ("principal string, client_id string, broker_id int, ts_ms long, "
                  "recorded_throttled boolean, response_ms long, api_key int, topic string, bytes double, "
                  "records long")


def fetch_demand(*, topics: bool, resolution_ms: int = 1, streamed: bool = True) -> Any:
    """Access-log records -> the consumers' demand: per consumer, the records it fetched, at the
    time they were produced (rows as `arrivals`' fetch rows: principal, client_id, broker_id,
    ts_ms, recorded_throttled, response_ms = 0, api_key, topic (null unless `topics`), bytes,
    records).

    A fetch returns what is there: the bytes a consumer fetched were wanted as soon as they were
    in the partition, not when this recording's consumer happened to ask (it may have been a
    few hundred ms late, or far behind on a loaded machine), and a consumer that is throttled
    later fetches everything that was produced meanwhile. Per topic-partition
    (`retime_partition`) the consumer's records are matched, in offset order, to the produce
    batches that wrote them; the bytes are the consumer's own (the response bytes it got per
    record). A streamed fetch (its record has no topics) counts in its consumer's partition when
    the consumer fetched only one from that broker. Share fetches (no offset order per consumer),
    streamed fetches of a consumer of several partitions and consumers of a partition no recorded
    producer wrote keep their recorded fetches. `streamed=False`: the caller found no streamed
    Fetch in the recording (`Recorded.streamed`), and their search is left out."""
    from pyspark.sql import functions as F

    def transform(logs: DataFrame) -> DataFrame:
        api = F.col("api_key")
        # a produce offers its records when it is sent (a broker that is slow to append them is
        # the recording's, not the plan's); a fetch had them when its response came back
        ready = (F.col("ts_ms") + F.round(F.coalesce(F.col("upstream_latency_ms"), F.lit(0.0)))).cast("long")
        broker_throttle = F.coalesce(F.col("broker_throttle_time_ms"), F.lit(0))
        throttled = (F.col("throttle_time_ms") > 0) | (broker_throttle > 0)
        pieces_bytes = F.aggregate(F.coalesce(F.col("topics"), F.array()), F.lit(0).cast("long"),
                                   lambda acc, t: acc + t["bytes"].cast("long"))
        # a produce piece only says when which records were there (`retime_partition` reads
        # nothing else of it): it goes to the workers with four columns, a fetch piece with ten
        produced = (logs.where(api == PRODUCE_API_KEY)
                    .select(F.col("ts_ms").cast("long").alias("ready_ms"), F.explode("topics").alias("t"))
                    .select(F.col("t.topic").alias("topic"), F.col("t.partition").alias("partition"),
                            "ready_ms", F.col("t.records").cast("long").alias("records")))
        fetched = (logs.where(api == FETCH_API_KEY)
                   .select("principal", "client_id", "broker_id", "ts_ms", ready.alias("ready_ms"),
                           throttled.alias("recorded_throttled"),
                           F.coalesce(F.col("response_bytes"), F.lit(0)).cast("double").alias("wire"),
                           pieces_bytes.alias("pieces_bytes"), F.explode("topics").alias("t"))
                   .select("principal", "client_id", "broker_id", "ts_ms", "ready_ms", "recorded_throttled",
                           F.col("t.topic").alias("topic"), F.col("t.partition").alias("partition"),
                           F.col("t.records").cast("long").alias("records"),
                           # a fetch's response bytes (the wire, what the quota counts) shared
                           # among its partitions by their record bytes
                           F.when(F.col("pieces_bytes") > 0,
                                  F.col("wire") * F.col("t.bytes") / F.col("pieces_bytes"))
                           .otherwise(F.col("t.bytes").cast("double")).alias("bytes")))

        # A Fetch response of more than 64 KiB is streamed, and its record has no topics
        # (docs/operating.md): when its consumer fetched one partition from that broker in the
        # recording, it was of that partition, with records unknown (`retime_partition` counts
        # them from its bytes). Left out, a consumer that read a backlog in streamed responses
        # is matched to that many records too few: its demand lost the last ones produced, and
        # gained the streamed bytes as recorded, at the moment it caught up.
        who = ["principal", "client_id", "broker_id"]
        taken = fetched
        unplaced: DataFrame | None = None  # streamed fetches of a consumer of several partitions
        if streamed:
            streamed_fetches = (logs.where((api == FETCH_API_KEY) & F.col("topics").isNull())
                                .select(*who, "ts_ms", "api_key", ready.alias("ready_ms"),
                                        throttled.alias("recorded_throttled"),
                                        F.coalesce(F.col("response_bytes"), F.lit(0)).cast("double")
                                        .alias("bytes")))
            # the consumers' distinct partitions first (a hash aggregation, a few rows per
            # consumer); a minimum of (topic, partition) over the pieces would sort them all
            read = fetched.select(*who, F.struct("topic", "partition").alias("tp")).distinct()
            single = (read.groupBy(*[F.col(c).alias(f"one_{c}") for c in who])
                      .agg(F.count(F.lit(1)).alias("partitions"), F.min("tp").alias("first"))
                      # (a piece of no known topic or partition is nobody's single partition)
                      .where((F.col("partitions") == 1) & F.col("first.topic").isNotNull()
                             & F.col("first.partition").isNotNull()))
            placed = streamed_fetches.join(
                single, [streamed_fetches[c].eqNullSafe(single[f"one_{c}"]) for c in who], "left")
            taken = fetched.unionByName(
                placed.where(F.col("first").isNotNull())
                .select(*who, "ts_ms", "ready_ms", "recorded_throttled",
                        F.col("first.topic").alias("topic"), F.col("first.partition").alias("partition"),
                        F.lit(None).cast("long").alias("records"), "bytes"))
            unplaced = placed.where(F.col("first").isNull())

        def run(made: pa.Table, fetches: pa.Table) -> pa.Table:
            return retime_partition(made, fetches, topics=topics, resolution_ms=resolution_ms)
        # cogrouped, not one union grouped: each side goes to the workers with its own columns
        retimed = (produced.groupBy("topic", "partition")
                   .cogroup(taken.groupBy("topic", "partition"))
                   .applyInArrow(run, _DEMAND_SCHEMA))
        # fetches that carried no partition (an empty response), streamed ones of a consumer of
        # several partitions, and share fetches, as recorded
        topic = F.lit(None).cast("string")
        as_recorded: list[Column | str] = [
            *who, "ts_ms", "recorded_throttled", F.lit(0).cast("long").alias("response_ms"), "api_key",
            topic.alias("topic"), "bytes", F.lit(0).cast("long").alias("records")]
        bare = (logs.where((api == SHARE_FETCH_API_KEY) | ((api == FETCH_API_KEY) & (F.size("topics") == 0)))
                .select(*who, "ts_ms", throttled.alias("recorded_throttled"), "api_key",
                        F.coalesce(F.col("response_bytes"), F.lit(0)).cast("double").alias("bytes"))
                .select(*as_recorded))
        if unplaced is not None:
            bare = bare.unionByName(unplaced.select(*as_recorded))
        if topics:  # a topic budget counts the topics' bytes: a response with none adds nothing
            return retimed
        return retimed.unionByName(bare)
    return transform


def retime_partition(produced: pa.Table, fetched: pa.Table, *, topics: bool,
                     resolution_ms: int = 1) -> pa.Table:
    """One topic-partition's produce pieces (ready_ms, records) and fetch pieces (principal,
    client_id, broker_id, ts_ms, ready_ms, recorded_throttled, topic, records, bytes) -> each
    consumer's demand (`fetch_demand`).

    With P(t) the records produced by t (each produce batch counted when it was sent: a broker
    slow to append it in the recording would otherwise shift the consumer's demand) and F_k the
    records a consumer had fetched by its k-th fetch's response at t_k, the consumer read
    offsets ``offset + 1 .. offset + F_end`` of the recording, where
    ``offset = min_k (P(t_k) - F_k)``: the newest offsets consistent with it never fetching a
    record before it was produced (a consumer that keeps up has ``offset`` near 0; one that reads
    a backlog from before the recording, below 0). Each produce batch's share of those offsets
    is one demand row at the batch's time (the records written before the recording at the
    consumer's first fetch; never before its first fetch), its bytes the consumer's bytes per
    record, its broker and recorded throttle those of the fetch that delivered its last record.
    The batches one fetch delivered within one `resolution_ms` step are one row, at the last
    one's time: a consumer's demand is never earlier than its data, and at most `resolution_ms`
    later (`fetch_demand`: a tenth of the quota's sample). A partition read by F consumers makes up
    to F rows of every produce batch: in bench_tune's 1 M-record recording, one partition's 75 k
    produce and fetch pieces made 96 k demand rows to the millisecond and 32 k in 100 ms steps.
    A fetch whose records are unknown (null: a streamed response) counts its bytes at the
    consumer's bytes per record in its other fetches of the partition; a consumer with no record
    count at all keeps its recorded fetches."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def col(table: pa.Table, name: str, fill: int = 0) -> Any:
        return pc.fill_null(table.column(name), fill).to_numpy(zero_copy_only=False)

    produced_ready, produced_records = col(produced, "ready_ms").astype(np.int64), col(produced, "records")
    order = np.argsort(produced_ready, kind="stable")
    produced_ms = produced_ready[order]
    produced_end = np.cumsum(produced_records.astype(np.int64)[order])
    starts = produced_end - produced_records.astype(np.int64)[order]
    ready, ts = col(fetched, "ready_ms").astype(np.int64), col(fetched, "ts_ms").astype(np.int64)
    records = col(fetched, "records").astype(np.int64)
    known = pc.is_valid(fetched.column("records")).to_numpy(zero_copy_only=False)
    size = col(fetched, "bytes").astype(np.float64)
    who = pc.binary_join_element_wise(pc.fill_null(fetched.column("principal"), ""),
                                      pc.fill_null(fetched.column("client_id"), ""), "\x00")
    consumer = pc.dictionary_encode(who).combine_chunks().indices.to_numpy(zero_copy_only=False)
    fetch = np.arange(fetched.num_rows)
    fetch = fetch[np.lexsort((ts[fetch], ready[fetch], consumer[fetch]))]  # by consumer, then in time
    keys = consumer[fetch]
    picked: list[Any] = []  # per output row: the source row (broker, principal, throttled)
    at: list[Any] = []
    counts: list[Any] = []
    values: list[Any] = []
    for group in np.split(fetch, np.nonzero(np.diff(keys))[0] + 1) if len(fetch) else []:
        taken = records[group]
        counted = known[group]
        if not len(produced_ms) or taken[counted].sum() <= 0:
            picked.append(group)  # nothing to match them with: as recorded
            at.append(ts[group])
            counts.append(taken)
            values.append(size[group])
            continue
        if not counted.all():
            # a fetch whose records the log does not have (a streamed response, `fetch_demand`):
            # its bytes at the consumer's bytes per record in the fetches that have them
            taken = np.where(counted, taken, np.rint(
                size[group] * (taken[counted].sum() / size[group][counted].sum()))).astype(np.int64)
        fetched_end = np.cumsum(taken)
        idx = np.searchsorted(produced_ms, ready[group], side="right")
        produced_by = np.where(idx > 0, produced_end[np.maximum(idx - 1, 0)], 0)
        offset = int(np.min(produced_by - fetched_end))
        last = offset + int(fetched_end[-1])
        per_record = float(size[group].sum()) / float(fetched_end[-1])
        first_ms = int(ts[group[0]])
        # (offset, last] against each batch's (start, end]; the offsets before the recording
        lo = np.maximum(starts, offset)
        hi = np.minimum(produced_end, last)
        batches = np.nonzero(hi > lo)[0]
        ends = hi[batches]
        n = hi[batches] - lo[batches]
        times = np.maximum(produced_ms[batches], first_ms)
        if offset < 0 and min(0, last) > offset:
            ends = np.concatenate(([min(0, last)], ends))
            n = np.concatenate(([min(0, last) - offset], n))
            times = np.concatenate(([first_ms], times))
        k = np.minimum(np.searchsorted(fetched_end, ends - offset, side="left"), len(group) - 1)
        # one row per run of batches delivered by the same fetch within one `resolution_ms` step,
        # at the run's last batch (its data is all there then): times and k never decrease
        step = times // resolution_ms
        runs = np.flatnonzero(np.concatenate(([True], (np.diff(k) != 0) | (np.diff(step) != 0))))
        ends_at = np.concatenate((runs[1:], [len(times)])) - 1
        n = np.add.reduceat(n, runs)
        picked.append(group[k[runs]])
        at.append(times[ends_at])
        counts.append(n)
        values.append(n * per_record)
    rows = np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64)
    source = fetched.take(pa.array(rows, type=pa.int64()))
    length = len(rows)
    return pa.table({
        "principal": source.column("principal"), "client_id": source.column("client_id"),
        "broker_id": source.column("broker_id").cast(pa.int32()),
        "ts_ms": pa.array(np.concatenate(at) if at else [], type=pa.int64()),
        "recorded_throttled": source.column("recorded_throttled"),
        "response_ms": pa.array(np.zeros(length, dtype=np.int64)),
        "api_key": pa.array(np.full(length, FETCH_API_KEY, dtype=np.int32)),
        "topic": source.column("topic") if topics else pa.nulls(length, pa.string()),
        "bytes": pa.array(np.concatenate(values) if values else [], type=pa.float64()),
        "records": pa.array(np.concatenate(counts) if counts else [], type=pa.int64())},
        schema=_demand_arrow_schema())


def _demand_arrow_schema() -> pa.Schema:
    import pyarrow as pa

    fields = [c.split(" ") for c in _DEMAND_SCHEMA.split(", ")]
    return pa.schema([(name, {"string": pa.string(), "int": pa.int32(), "long": pa.int64(),
                              "boolean": pa.bool_(), "double": pa.float64()}[kind]) for name, kind in fields])


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
                           "value", "records", "recorded_throttled", "response_ms", "seq")
                .groupBy("entity", "quota_key", "broker_id").applyInArrow(run, RESULT_SCHEMA))
    return transform


# ------------------------------------------------------------------------------ the job's plan
#
# The job replays what the steps above replay, with less to move: the recording's clients and the
# plan's sharing groups are found in one pass over the logs (with the recording's end), numbered
# on the driver, and the replay's shuffle carries each request's group and client as two
# integers instead of five names (`simulate_numbered`). The answers are `simulate`'s, row for row
# (tests/spark/test_simulate.py holds them equal).

def _who(principal: str | None, client_id: str | None) -> str:
    return f"{principal or ''}\x00{client_id or ''}"


@dataclass(frozen=True, slots=True)
class Numbering:
    """The recording's clients and the plan's sharing groups as numbers. `clients[n]` is client
    n's `principal NUL client_id`, numbered in sorted order (the order `simulate_group` ranks a
    group's clients in); `groups[g]` is sharing group g's (entity, quota key); `rows` is the join
    table: (principal, client_id, topic, quota_key, group_no, client_no) per identity the plan
    limits (`group_rows`)."""

    clients: tuple[str, ...]
    groups: tuple[tuple[str, str], ...]
    rows: tuple[tuple[str | None, str | None, str | None, str, int, int], ...]

    @classmethod
    def of(cls, rows: Sequence[tuple[str | None, str | None, str | None, str, str]]) -> Numbering:
        clients = sorted({_who(p, c) for p, c, _, _, _ in rows})
        client_no = {who: n for n, who in enumerate(clients)}
        groups = sorted({(entity, key) for _, _, _, key, entity in rows})
        group_no = {g: n for n, g in enumerate(groups)}
        return cls(tuple(clients), tuple(groups),
                   tuple((p, c, t, key, group_no[(entity, key)], client_no[_who(p, c)])
                         for p, c, t, key, entity in rows))


@dataclass(frozen=True, slots=True)
class Recorded:
    """What one pass over the recording found (`recorded_identities`): every (principal,
    client_id, topic, quota_key) that can have an arrival, the last record's `ts_ms` (None: no
    record), and whether any Fetch record has no topics (a streamed response, `fetch_demand`)."""

    identities: list[tuple[str, str | None, str | None, str]]
    end_ms: int | None
    streamed: bool


def recorded_identities(logs: DataFrame, keys: Sequence[str], *, topics: bool) -> Recorded:
    """Access-log records -> every (principal, client_id, topic, quota_key) that can have an
    arrival for one of `keys` (each client of the recording with each key; with `topics`, with
    each topic its records name), a superset of `identities` of the arrivals, in one pass that
    also finds the last record's `ts_ms` and whether a streamed Fetch is among them."""
    from pyspark.sql import functions as F

    streamed = F.max(((F.col("api_key") == FETCH_API_KEY) & F.col("topics").isNull()).cast("int"))
    if topics:
        found = (logs.select("principal", "client_id", F.explode("topics").alias("t"))
                 .select("principal", "client_id", F.col("t.topic").alias("topic")).distinct().collect())
        who = [(r["principal"], r["client_id"], r["topic"]) for r in found]
        last = logs.agg(F.max("ts_ms").alias("last_ms"), streamed.alias("streamed")).first()
        end = None if last is None else last["last_ms"]
        any_streamed = last is not None and bool(last["streamed"])
    else:
        clients = (logs.groupBy("principal", "client_id")
                   .agg(F.max("ts_ms").alias("last_ms"), streamed.alias("streamed")).collect())
        who = [(r["principal"], r["client_id"], None) for r in clients]
        ends = [r["last_ms"] for r in clients if r["last_ms"] is not None]
        end = max(ends) if ends else None
        any_streamed = any(r["streamed"] for r in clients)
    return Recorded([(p, c, t, key) for p, c, t in who for key in keys], end, any_streamed)


def simulate_numbered(spark: SparkSession, setup: SimulationSetup, numbering: Numbering, *,
                      topics: bool) -> Any:
    """arrivals -> one row per (entity, quota_key, broker_id), `simulate`'s (`RESULT_SCHEMA`):
    the arrivals of the identities in `numbering` (an inner join with its small table, as
    `with_groups`), grouped by group and broker number, replayed by `simulate_numbered_group`."""
    from pyspark.sql import functions as F

    table = spark.createDataFrame(list(numbering.rows), "principal string, client_id string, topic string, "
                                                        "quota_key string, group_no int, client_no int")
    cache: dict[str, tuple[QuotaConfig, QuotaConfig]] = {}  # per task: the configs, parsed once

    def run(part: pa.Table) -> pa.Table:
        if "configs" not in cache:
            cache["configs"] = setup.configs()
        return simulate_numbered_group(part, setup, numbering, cache["configs"], topics=topics)

    def transform(arr: DataFrame) -> DataFrame:
        keys = [arr["principal"].eqNullSafe(table["principal"]),
                arr["client_id"].eqNullSafe(table["client_id"]),
                arr["topic"].eqNullSafe(table["topic"]), arr["quota_key"] == table["quota_key"]]
        broker = F.lit(None).cast("int") if setup.rate_scope == "cluster" else arr["broker_id"]
        joined = arr.join(F.broadcast(table), keys, "inner").select(
            table["group_no"], broker.alias("broker_id"), table["client_no"],
            *([arr["topic"]] if topics else []), arr["ts_ms"], arr["value"], arr["records"],
            arr["recorded_throttled"], arr["response_ms"], arr["seq"])
        return joined.groupBy("group_no", "broker_id").applyInArrow(run, RESULT_SCHEMA)
    return transform


def simulate_numbered_group(table: pa.Table, setup: SimulationSetup, numbering: Numbering,
                            configs: tuple[QuotaConfig, QuotaConfig], *, topics: bool) -> pa.Table:
    """`simulate_group` over numbered rows (group_no, broker_id, client_no, [topic,] ts_ms, value,
    records, recorded_throttled, response_ms, seq)."""
    import numpy as np

    numbers = table.column("client_no").to_numpy(zero_copy_only=False)
    present, client = np.unique(numbers, return_inverse=True)  # ranks in the clients' sorted order
    entity, key = numbering.groups[int(table.column("group_no")[0].as_py())]
    identities = [_identity(numbering.clients[n]) for n in present.tolist()]
    return _replay_group(table, client.astype(np.int32), identities, setup, configs, entity=entity, key=key,
                         topics=topics)


# ------------------------------------------------------------------------------ in the workers

def _seconds(throttle_at: Any, throttle_ms: Any, end_ms: int) -> tuple[Any, Any]:
    """The whole seconds that overlap a mute, as merged inclusive spans (first, last)."""
    import numpy as np

    stop = np.minimum(throttle_at + throttle_ms, end_ms)
    keep = stop > throttle_at
    first, last = throttle_at[keep] // 1000, (stop[keep] - 1) // 1000
    if not len(first):
        return first, last
    order = np.argsort(first, kind="stable")
    first, last = first[order], last[order]
    reach = np.maximum.accumulate(last)
    new = np.concatenate(([True], first[1:] > reach[:-1] + 1))
    starts = np.nonzero(new)[0]
    return first[starts], np.maximum.reduceat(last, starts)


def _muted_per_second(throttle_at: Any, throttle_ms: Any, end_ms: int) -> dict[int, int]:
    """Per second, the milliseconds some client of the group was muted (mutes merged: at most 1000)."""
    import numpy as np

    stop = np.minimum(throttle_at + throttle_ms, end_ms)
    keep = stop > throttle_at
    start, stop = throttle_at[keep], stop[keep]
    out: dict[int, int] = {}
    if not len(start):
        return out
    order = np.argsort(start, kind="stable")
    start, stop = start[order], stop[order]
    reach = np.maximum.accumulate(stop)
    new = np.concatenate(([True], start[1:] > reach[:-1]))
    firsts = np.nonzero(new)[0]
    for a, b in zip(start[firsts].tolist(), np.maximum.reduceat(stop, firsts).tolist(), strict=True):
        while a < b:
            second_end = (a // 1000 + 1) * 1000
            out[a // 1000] = out.get(a // 1000, 0) + min(b, second_end) - a
            a = second_end
    return out


@dataclass(frozen=True, slots=True)
class _Replayed:
    summary: dict[str, Any]
    admitted_per_second: dict[int, float]
    muted_per_second: dict[int, int]


def _summarize(ts: Any, value: Any, records: Any, out: ReplayColumns) -> _Replayed:
    """`quotas.replay.summarize` over columns (the same numbers: see `ReplaySummary`), with
    records admitted in proportion to each request's admitted value."""
    import numpy as np

    r = out.result
    end_ms = out.end_ms
    remaining = np.asarray(r.remaining, dtype=np.float64)
    admitted_ms = np.asarray(r.admitted_ms, dtype=np.int64)
    t_at = np.asarray(r.throttle_at_ms, dtype=np.int64)
    t_ms = np.asarray(r.throttle_ms, dtype=np.int64)
    first, last = _seconds(t_at, t_ms, end_ms)
    throttled = int((last - first + 1).sum())
    arrived = np.unique(ts // 1000)
    idx = np.searchsorted(first, arrived, side="right") - 1
    inside = ((idx >= 0) & (arrived <= last[np.maximum(idx, 0)]) if len(first)
              else np.zeros(len(arrived), dtype=bool))
    active = throttled + int((~inside).sum())
    span_s = max(end_ms - int(ts[0]), 1) / 1000.0
    ms = np.sort(t_ms.astype(np.float64))
    demand = float(value.sum())
    got = value - remaining
    admitted = float(got.sum())
    done = admitted_ms != NOT_ADMITTED
    waits = admitted_ms[done] - ts[done]
    share = np.divide(got, value, out=np.ones_like(got), where=value != 0)
    total_records = float(records.sum())
    summary = {
        "active_seconds": active, "throttled_seconds": throttled, "throttles": len(ms),
        "throttle_total_ms": int(np.maximum(np.minimum(t_at + t_ms, end_ms) - t_at, 0).sum()),
        "throttle_mean_ms": float(ms.sum() / len(ms)) if len(ms) else math.nan,
        "throttle_p50_ms": percentile(ms.tolist(), 0.5), "throttle_p99_ms": percentile(ms.tolist(), 0.99),
        "throttle_max_ms": float(ms[-1]) if len(ms) else math.nan,
        "demand_per_s": demand / span_s, "admitted_per_s": admitted / span_s,
        "records_demand_per_s": total_records / span_s,
        "records_admitted_per_s": float((records * share).sum()) / span_s,
        "deferred": demand - admitted, "max_backlog": float(r.max_backlog),
        "max_wait_ms": int(waits.max()) if len(waits) else 0,
        "throttled_share": throttled / active if active else 0.0}
    return _Replayed(summary, _per_second(admitted_ms[done] // 1000, got[done]),
                     _muted_per_second(t_at, t_ms, end_ms))


def _per_second(seconds: Any, values: Any) -> dict[int, float]:
    """{second: the sum of its values} (for the plot)."""
    import numpy as np

    if not len(seconds):
        return {}
    unique, where = np.unique(seconds, return_inverse=True)
    return dict(zip(unique.tolist(), np.bincount(where, weights=values).tolist(), strict=True))


_ARROW_TYPES = {"string": "string", "long": "int64", "double": "float64", "int": "int32"}


@functools.cache
def result_schema() -> pa.Schema:
    import pyarrow as pa

    fields = [c.split(" ") for c in RESULT_SCHEMA.split(", ")]
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in fields])


def _ranked(column: Any) -> tuple[Any, list[Any]]:
    """Each row's value as its rank among the column's distinct values (sorted), and those."""
    import numpy as np
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(column).combine_chunks()
    names = encoded.dictionary.to_pylist()
    order = sorted(range(len(names)), key=lambda k: names[k])
    rank = np.empty(len(names), dtype=np.int32)
    rank[order] = np.arange(len(names), dtype=np.int32)
    return rank[encoded.indices.to_numpy(zero_copy_only=False)], [names[k] for k in order]


def _identity(who: str) -> ClientIdentity:
    """A client as the workers name it: `principal NUL client_id`, nulls as empty strings."""
    return ClientIdentity.of(*(who.split("\x00", 1) if who else ("", "")))


def simulate_group(table: pa.Table, setup: SimulationSetup, *, topics: bool) -> pa.Table:
    """One sharing group's arrivals replayed under the plan and the baseline (in a worker), over
    typed columns (`quotas.replay.replay_columns`)."""
    import pyarrow.compute as pc

    who = pc.binary_join_element_wise(pc.fill_null(table.column("principal"), ""),
                                      pc.fill_null(table.column("client_id"), ""), "\x00")
    client, names = _ranked(who)
    return _replay_group(table, client, [_identity(str(x)) for x in names], setup, setup.configs(),
                         entity=str(table.column("entity")[0].as_py()),
                         key=str(table.column("quota_key")[0].as_py()), topics=topics)


def _replay_group(table: pa.Table, client: Any, identities: Sequence[ClientIdentity],
                  setup: SimulationSetup, configs: tuple[QuotaConfig, QuotaConfig], *,
                  entity: str, key: str, topics: bool) -> pa.Table:
    """`simulate_group` once each row's client is known: `client` (per row, in the table's order)
    is the rank of its client among the group's, in the order of `identities`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    plan, baseline = configs
    topic_rank, _ = _ranked(pc.fill_null(table.column("topic"), "")) if topics else (
        np.zeros(table.num_rows, dtype=np.int32), None)
    # a total order, so that ties in ts_ms replay the same however Spark partitioned the input:
    # a client's requests of one millisecond in the order it sent them (`seq`), then by topic and
    # value (Spark hands a group's rows over in no set order)
    raw_ts = pc.fill_null(table.column("ts_ms"), 0).to_numpy(zero_copy_only=False)
    raw_value = pc.fill_null(table.column("value"), 0.0).to_numpy(zero_copy_only=False)
    raw_seq = pc.fill_null(table.column("seq"), 0).to_numpy(zero_copy_only=False)
    order = np.lexsort((raw_value, topic_rank, raw_seq, client, raw_ts))

    def col(name: str, dtype: Any, fill: Any = 0) -> Any:
        raw = pc.fill_null(table.column(name), fill).to_numpy(zero_copy_only=False)
        return np.ascontiguousarray(raw[order], dtype=dtype)

    ts, value = np.ascontiguousarray(raw_ts[order], dtype=np.int64), np.ascontiguousarray(raw_value[order],
                                                                                           dtype=np.float64)
    records, flagged = col("records", np.int64), col("recorded_throttled", np.bool_, False)
    client = np.ascontiguousarray(client[order], dtype=np.int32)
    response = col("response_ms", np.int64)
    kind = QuotaKind(key)
    end_ms = max(int(ts[-1]) + 1, setup.end_ms or 0)
    topic = table.column("topic").take(pa.array(order)).to_pylist() if topics else None
    sides = {side: _summarize(ts, value, records, replay_columns(
                 ts, client, value, response, identities, config, kind, topic=topic, topics=topics,
                 end_ms=end_ms)) for side, config in (("plan", plan), ("base", baseline))}
    demand = _per_second(ts // 1000, value)
    plan_side, base_side = sides["plan"], sides["base"]
    # every second from the first to the last that has anything (a second with nothing is 0)
    known = set(demand) | set(plan_side.admitted_per_second) | set(base_side.admitted_per_second)
    timeline = [[s, demand.get(s, 0.0), plan_side.admitted_per_second.get(s, 0.0),
                 base_side.admitted_per_second.get(s, 0.0), plan_side.muted_per_second.get(s, 0),
                 base_side.muted_per_second.get(s, 0)] for s in range(min(known), max(known) + 1)]
    row: dict[str, Any] = {
        "entity": entity, "quota_key": key,
        "broker_id": table.column("broker_id")[0].as_py(),
        "requests": len(ts), "span_s": max(end_ms - int(ts[0]), 1) / 1000.0,
        "recorded_throttled_seconds": len(np.unique(ts[flagged] // 1000)),
        "recorded_active_seconds": len(np.unique(ts // 1000))}
    for side, replayed in sides.items():
        row |= {f"{side}_{k}": v for k, v in replayed.summary.items()}
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
    head = (f"{'ENTITY':<{width}}  {'ACTIVE s':>11}  {'THROTTLED s':>13}  {'THROTTLE ms total':>19}  "
            f"{'p99 ms':>13}  {'ADMITTED/s of DEMAND/s':>30}  {'DEFERRED':>21}  {'MAX BACKLOG':>21}")
    lines = [f"simulation of {doc['plan']} against baseline {doc['baseline']} "
             f"({doc['rate_model']}, window {doc['window']['samples']} x {doc['window']['size_ms']} ms)",
             head]

    def pair(name: str, e: Mapping[str, Any]) -> str:
        return f"{_num(e['baseline'][name])} -> {_num(e['plan'][name])}"

    for n, e in zip(names, entities, strict=True):
        p = e["plan"]
        lines.append(
            f"{n:<{width}}  {pair('active_seconds', e):>11}  {pair('throttled_seconds', e):>13}  "
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

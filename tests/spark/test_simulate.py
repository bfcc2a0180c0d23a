"""`tune simulate`: the Spark steps DataFrame -> DataFrame on tiny explicit inputs, the job's files,
`recommend --verify` and `apply`'s refusal of a plan whose simulation throttles too much."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from quotas import QuotaConfig, QuotaEntity, QuotaEntry, QuotaKind, RateConfig, RateModel
from quotas.entity import ClientIdentity
from quotas.replay import Arrival, replay, service_time_ms, summarize
from spark_analytics.simulate import (
    SimulationSetup,
    arrivals,
    broker_service_ms,
    entity_text,
    group_rows,
    identities,
    quota_config,
    simulate,
    too_throttled,
    with_groups,
)
from tests.spark.logs import T0, fetch, frame, other, produce, write_logs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

WINDOW = RateConfig()


def _config(values: dict[tuple[str, str], float]) -> QuotaConfig:
    return quota_config(values, window=WINDOW, rate_model=RateModel.WINDOWED, burst_ms=None)


def test_arrivals_take_what_each_key_counts(spark: SparkSession) -> None:
    logs = frame(spark, [
        produce(T0, 1093, upstream_latency_ms=12.4,
                topics=[{"topic": "a", "partition": 0, "records": 10, "bytes": 600},
                        {"topic": "b", "partition": 0, "records": 5, "bytes": 400}]),
        fetch(T0 + 5, 900, throttle_time_ms=20, upstream_latency_ms=40.0),
        other(T0 + 7),
    ])
    keys = ["producer_byte_rate", "consumer_byte_rate", "producer_record_rate", "request_rate"]
    rows = sorted((r["quota_key"], r["ts_ms"] - T0, r["value"], r["records"], r["recorded_throttled"],
                   r["response_ms"])
                  for r in logs.transform(arrivals(keys, topics=False)).collect())
    # response_ms: a produce's wait for its response (its delay starts after it, KIP-219); 0 for
    # the keys whose delay starts at the decision
    assert rows == [
        ("consumer_byte_rate", 5, 900.0, 3, True, 0),      # Fetch: response bytes
        ("producer_byte_rate", 0, 1093.0, 15, False, 12),  # Produce: request bytes (what Kafka counts)
        ("producer_record_rate", 0, 15.0, 15, False, 12),  # the batch headers' records
        ("request_rate", 0, 1.0, 15, False, 0),            # every API, 1 each
        ("request_rate", 5, 1.0, 3, True, 0),
        ("request_rate", 7, 1.0, 0, False, 0),
    ]
    per_topic = sorted((r["topic"], r["value"], r["response_ms"]) for r in
                       logs.transform(arrivals(["producer_byte_rate"], topics=True)).collect())
    assert per_topic == [("a", 600.0, 12), ("b", 400.0, 12)]  # one row per topic, with that topic's bytes


def test_a_produce_mute_follows_its_brokers_service_time_not_the_recorded_queues(spark: SparkSession) -> None:
    # Broker 1: "pipe" sends 5 produces at once, the first answered in 2 ms and each later one 400
    # ms after the one before (its own queue: 402, 802, ... 1602 ms); "lone" sends 10, alone,
    # answered in 2 ms. Idle-broker waits: pipe's first and lone's ten, all 2 ms: 2 ms for both
    # clients. Broker 2: one produce answered in 7 ms. A fetch's delay starts at the decision: 0.
    pipe = [produce(T0 + i, 1000, client_id="pipe", upstream_latency_ms=2.0 + 400 * i) for i in range(5)]
    lone = [produce(T0 + 3000 + 100 * k, 1000, client_id="lone", upstream_latency_ms=2.0) for k in range(10)]
    records = (pipe + lone
               + [produce(T0 + 100, 1000, client_id="other", broker_id=2, upstream_latency_ms=7.0),
                  fetch(T0 + 200, 900, client_id="lone", upstream_latency_ms=300.0)])
    logs = frame(spark, records)
    keys = ["producer_byte_rate", "consumer_byte_rate"]
    got = {(r["client_id"], r["broker_id"], r["quota_key"], r["response_ms"])
           for r in logs.transform(arrivals(keys, topics=False)).collect()}
    assert got == {("pipe", 1, "producer_byte_rate", 2), ("lone", 1, "producer_byte_rate", 2),
                   ("other", 2, "producer_byte_rate", 7), ("lone", 1, "consumer_byte_rate", 0)}
    # --produce-service-ms: the operator's figure for every broker
    given = {r["response_ms"] for r in logs.transform(arrivals(keys, topics=False, service_ms=5)).collect()
             if r["quota_key"] == "producer_byte_rate"}
    assert given == {5}


def test_the_spark_service_time_is_the_readable_one_per_broker(spark: SparkSession) -> None:
    # `broker_service_ms` (Spark SQL: a window's running maximum, the mean in integers) against
    # `quotas.replay.service_time_ms` over each broker's produces: bursts of pipelined produces
    # (queued waits) among lone ones, ties in ts and in (ts, wait), waits rounded half up from
    # fractional latencies, a broker whose idle mean is a tie (x.5), and a null broker
    rng = random.Random(11)
    records, pairs = [], {}
    for broker, n in ((1, 300), (2, 40), (3, 1), (None, 25)):
        for _ in range(n):
            ts, latency = rng.randrange(0, 3000), rng.choice([0.5, 1.49, 2.5, 3.0, rng.uniform(0, 800)])
            records.append(produce(T0 + ts, 1000, broker_id=broker, upstream_latency_ms=latency))
            pairs.setdefault(broker, []).append((T0 + ts, float(math.floor(latency + 0.5))))
    # broker 4: two lone produces waiting 1 and 2 ms: a mean of 1.5, rounded to even (2)
    records += [produce(T0, 1000, broker_id=4, upstream_latency_ms=1.0),
                produce(T0 + 10, 1000, broker_id=4, upstream_latency_ms=2.0),
                produce(T0 + 20, 1000, broker_id=4, upstream_latency_ms=None)]  # unanswered: left out
    pairs[4] = [(T0, 1.0), (T0 + 10, 2.0)]
    got = {r["service_broker"]: r["service_ms"]
           for r in frame(spark, records).transform(broker_service_ms).collect()}
    assert got == {broker: service_time_ms(p) for broker, p in pairs.items()}
    assert got[4] == 2 and len(set(got.values())) > 2


def test_groups_follow_the_engine_precedence() -> None:
    plan = _config({("client-id-prefix=batch-", "producer_byte_rate"): 1000,
                    ("user=alice", "producer_byte_rate"): 2000,
                    ("user=alice,client-id=batch-x", "producer_byte_rate"): 3000})
    found = [("u", "batch-a", None, "producer_byte_rate"), ("v", "batch-b", None, "producer_byte_rate"),
             ("alice", "batch-x", None, "producer_byte_rate"), ("alice", "web", None, "producer_byte_rate"),
             ("bob", "web", None, "producer_byte_rate")]
    got = {(p, c): e for p, c, _, _, e in group_rows(plan, found, topics=False)}
    # the most specific entity wins (user+client-id over user over prefix); bob is unlimited: left out
    assert got == {("u", "batch-a"): "client-id-prefix=batch-", ("v", "batch-b"): "client-id-prefix=batch-",
                   ("alice", "batch-x"): "user=alice,client-id=batch-x", ("alice", "web"): "user=alice"}


def _steady(principal: str, client_id: str, value: int, every_ms: int, until_ms: int,
            start_ms: int = 0) -> list[dict[str, object]]:
    return [produce(T0 + t, value, principal=principal, client_id=client_id)
            for t in range(start_ms, until_ms, every_ms)]


def _simulated(spark: SparkSession, records: list[dict[str, object]], plan: QuotaConfig,
               base: QuotaConfig, scope: str = "broker") -> dict[str, dict[str, Any]]:
    logs = frame(spark, records)
    arr = logs.transform(arrivals(["producer_byte_rate"], topics=False))
    groups = group_rows(plan, identities(arr), topics=False)
    setup = SimulationSetup.of(plan, base, ["producer_byte_rate"], scope)
    out = arr.transform(with_groups(spark, groups, scope)).transform(simulate(setup, topics=False))
    return {f"{r['entity']}@{r['broker_id']}": r.asDict() for r in out.collect()}


def test_simulate_replays_each_sharing_group_through_the_engine(spark: SparkSession) -> None:
    # alice: 300 B every 100 ms for 20 s under user=alice 1000 B/s (plan) and 5000 B/s (baseline);
    # batch-a and batch-b 600 B/s each, 500 ms apart, under one client-id-prefix=batch- 1000 B/s budget.
    records = (_steady("alice", "app", 300, 100, 20_000) + _steady("u", "batch-a", 600, 1000, 20_000)
               + _steady("u", "batch-b", 600, 1000, 20_000, start_ms=500))
    plan = _config({("user=alice", "producer_byte_rate"): 1000,
                    ("client-id-prefix=batch-", "producer_byte_rate"): 1000})
    base = _config({("user=alice", "producer_byte_rate"): 5000})
    rows = _simulated(spark, records, plan, base)
    assert sorted(rows) == ["client-id-prefix=batch-@1", "user=alice@1"]

    # The Spark result is the engine's replay of the same arrivals, group by group.
    # (the broker's service time: every produce found it idle and waited the log's 2.5 ms, rounded
    # half up: 3 ms)
    alice = [Arrival(T0 + t, ClientIdentity("alice", "app"), 300, response_ms=3)
             for t in range(0, 20_000, 100)]
    want = summarize(alice, replay(alice, plan, QuotaKind.PRODUCE))
    got = rows["user=alice@1"]
    assert got["plan_throttled_seconds"] == want.throttled_seconds > 0
    assert got["plan_throttle_total_ms"] == want.throttle_total_ms
    assert got["plan_admitted_per_s"] == pytest.approx(want.admitted_per_s)
    assert got["plan_deferred"] == want.deferred
    # first throttle at 3400 ms (tests/unit/quotas/test_replay.py): seconds 3.. are throttled
    assert json.loads(got["timeline"])[3][4] > 0 and all(p[4] == 0 for p in json.loads(got["timeline"])[:3])
    # baseline 5000 B/s > 3000 B/s sent: nothing throttled, everything admitted
    assert got["base_throttled_seconds"] == 0 and got["base_deferred"] == 0
    assert got["base_admitted_per_s"] == pytest.approx(got["plan_demand_per_s"])
    assert got["requests"] == 200 and got["recorded_throttled_seconds"] == 0

    # The prefix group: both clients in one budget (first throttle at 8000 ms, 200 ms: test_replay.py)
    batch = rows["client-id-prefix=batch-@1"]
    assert batch["requests"] == 40
    assert batch["plan_throttles"] > 0 and batch["base_throttles"] == 0  # no baseline quota: unlimited
    timeline = json.loads(batch["timeline"])
    assert next(p[0] - T0 // 1000 for p in timeline if p[4] > 0) == 8
    assert timeline[8][4] >= 200  # the 200 ms one, and any later in that second


def test_broker_scope_keeps_brokers_apart_and_cluster_scope_sums_them(spark: SparkSession) -> None:
    # 600 B/s to each of two brokers under 1000 B/s: per broker nobody is throttled; for the cluster
    # 1200 B/s is (the arithmetic of the prefix group: first throttle at 8000 ms).
    records = (_steady("alice", "app", 600, 1000, 20_000)
               + [r | {"broker_id": 2} for r in _steady("alice", "app", 600, 1000, 20_000, start_ms=500)])
    plan = _config({("user=alice", "producer_byte_rate"): 1000})
    base = _config({})
    per_broker = _simulated(spark, records, plan, base, "broker")
    assert sorted(per_broker) == ["user=alice@1", "user=alice@2"]
    assert all(r["plan_throttles"] == 0 for r in per_broker.values())
    cluster = _simulated(spark, records, plan, base, "cluster")
    assert list(cluster) == ["user=alice@None"]
    assert cluster["user=alice@None"]["plan_throttles"] > 0


def test_entity_names_of_sharing_groups() -> None:
    from quotas.entity import SensorKey

    assert entity_text(SensorKey(QuotaKind.PRODUCE, "alice", "")) == "user=alice"
    assert entity_text(SensorKey(QuotaKind.PRODUCE, "alice", "a,b")) == "user=alice,client-id=a%2Cb"
    assert entity_text(SensorKey(QuotaKind.FETCH, "", "", topic="orders")) == "topic=orders"
    assert QuotaConfig((QuotaEntry(QuotaEntity(user="alice"), {QuotaKind.PRODUCE: 5.0}),)) == _config(
        {("user=alice", "producer_byte_rate"): 5})


def _steps(spark: SparkSession, logs: Any, plan: QuotaConfig, base: QuotaConfig, keys: list[str],
           scope: str, *, topics: bool, end_ms: int) -> list[dict[str, Any]]:
    """The steps one by one (arrivals, identities, groups, the join, `simulate`): the reference."""
    arr = logs.transform(arrivals(keys, topics=topics, demand_resolution_ms=100))
    groups = group_rows(plan, identities(arr), topics=topics)
    setup = SimulationSetup.of(plan, base, keys, scope, end_ms)
    out = arr.transform(with_groups(spark, groups, scope)).transform(simulate(setup, topics=topics))
    return sorted((r.asDict() for r in out.collect()),
                  key=lambda r: tuple((r[k] is not None, r[k]) for k in ("entity", "quota_key", "broker_id")))


def _nan_free(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """NaN (no throttle to take a mean of) is not equal to itself: as a string, to compare rows."""
    return [{k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows]


@pytest.mark.parametrize("scope", ["broker", "cluster"])
def test_the_jobs_numbered_plan_answers_as_the_steps_do(spark: SparkSession, scope: str) -> None:
    from spark_analytics.jobs.simulate import simulate_rows
    from spark_analytics.plan import Plan, PlanEntry

    # Producers on two brokers and a consumer of what they wrote: alice (steady, 3000 B/s), a
    # client-id-prefix group of two, an unlimited client, a null client id, and bob's consumer
    # reading topic "orders" as alice writes it; topic budgets on "orders" and "logs". Ties (batch-a and
    # batch-b send at the same instants) replay in the order of the clients' names on both paths.
    def part(topic: str, n: int) -> list[dict[str, object]]:
        return [{"topic": topic, "partition": 0, "records": n, "bytes": 100 * n}]

    records = ([produce(T0 + t, 300, client_id="app", topics=part("orders", 3), broker_id=1 + (t // 100) % 2)
                for t in range(0, 20_000, 100)]
               + _steady("u", "batch-a", 600, 500, 20_000)
               + _steady("u", "batch-b", 600, 500, 20_000)  # at the same instants as batch-a
               + _steady("carol", "free", 900, 200, 20_000)
               + [r | {"client_id": None} for r in _steady("x", "nobody", 400, 300, 20_000)]
               + [fetch(T0 + t, 3000, principal="bob", client_id="reader", topics=part("orders", 30),
                        upstream_latency_ms=5.0) for t in range(1000, 20_000, 1000)]
               + [produce(T0 + t, 2000, principal="dave", client_id="logger", topics=part("logs", 20))
                  for t in range(0, 20_000, 400)])
    logs = frame(spark, records)
    end_ms = max(int(r["ts_ms"]) for r in records) + 1  # type: ignore[call-overload]
    values: dict[tuple[str, str], float] = {
        ("user=alice", "producer_byte_rate"): 1000, ("client-id-prefix=batch-", "producer_byte_rate"): 1500,
        ("user=bob", "consumer_byte_rate"): 1000, ("user=<default>", "producer_byte_rate"): 300,
        ("topic=orders", "producer_byte_rate"): 2000, ("topic=logs", "producer_byte_rate"): 4000}
    plan = _config(values)
    base = _config({("user=alice", "producer_byte_rate"): 5000, ("user=bob", "consumer_byte_rate"): 2500})
    entries = tuple(PlanEntry(entity, key, None, None, int(value), "decrease", "test")
                    for (entity, key), value in values.items())
    job = simulate_rows(spark, logs, Plan(entries, "2026-01-01T00:00:00+00:00", {}), plan, base, scope,
                        demand_resolution_ms=100)
    clients = _steps(spark, logs, plan, base, ["consumer_byte_rate", "producer_byte_rate"], scope,
                     topics=False, end_ms=end_ms)
    topics = _steps(spark, logs, plan, base, ["producer_byte_rate"], scope, topics=True, end_ms=end_ms)
    # every sharing group of both modes, each with the same numbers, timeline included
    assert len(clients) >= 4 and len(topics) >= 2
    assert _nan_free(job) == _nan_free(clients + topics)
    assert any(r["plan_throttles"] > 0 for r in clients) and any(r["plan_throttles"] > 0 for r in topics)


def test_one_pass_finds_the_clients_the_end_and_whether_a_fetch_was_streamed(spark: SparkSession) -> None:
    from spark_analytics.simulate import recorded_identities

    part = [{"topic": "orders", "partition": 0, "records": 3, "bytes": 300}]
    plain = [produce(T0, 300, client_id="app", topics=part),
             fetch(T0 + 500, 320, client_id="reader", topics=part),
             other(T0 + 900, client_id="admin")]  # no topics, but not a Fetch
    streamed = fetch(T0 + 700, 90_000, client_id="reader", topics=None)  # over 64 KiB: no topics
    for topics in (False, True):
        without = recorded_identities(frame(spark, plain), ["consumer_byte_rate"], topics=topics)
        with_it = recorded_identities(frame(spark, [*plain, streamed]), ["consumer_byte_rate"], topics=topics)
        # the job leaves the search for streamed fetches' partitions out only when there is none
        assert (without.streamed, with_it.streamed) == (False, True)
        assert without.end_ms == with_it.end_ms == T0 + 900
        named = {(p, c, t) for p, c, t, _ in without.identities}
        assert ("alice", "reader", "orders" if topics else None) in named


# ------------------------------------------------------------------------------ the jobs

def _plan_file(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    doc = {"format": "sluice.quota-plan/1", "generated_at": "2026-01-01T00:00:00+00:00", "policy": {},
           "input": {}, "entries": entries}
    (path / "plan.json").write_text(json.dumps(doc))
    return path / "plan.json"


def _entry(entity: str, current: float | None, recommended: int) -> dict[str, Any]:
    return {"entity": entity, "quota_key": "producer_byte_rate", "matched_entity": None, "current": current,
            "recommended": recommended, "action": "decrease", "reason": "test"}


def test_simulate_job_writes_json_table_and_plots(spark: SparkSession, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from spark_analytics.jobs import simulate as job

    records = (_steady("alice", "app", 300, 100, 20_000)
               + [r | {"throttle_time_ms": 50} for r in _steady("bob", "app", 100, 1000, 5000)])
    write_logs(tmp_path / "logs", records)
    plan = _plan_file(tmp_path / "plan",
                      [_entry("user=alice", 5000.0, 1000), _entry("user=bob", 500.0, 1000)])
    code = job.main(["--logs", str(tmp_path / "logs"), "--plan", str(plan), "--master", "local[2]",
                     "--no-progress"])
    assert code == 0
    doc = json.loads((tmp_path / "plan" / "simulation.json").read_text())
    by_entity = {e["entity"]: e for e in doc["entities"]}
    assert sorted(by_entity) == ["user=alice", "user=bob"]
    alice = by_entity["user=alice"]
    assert alice["plan"]["throttled_seconds"] > 0 and alice["baseline"]["throttled_seconds"] == 0
    assert alice["difference"]["throttled_seconds"] == alice["plan"]["throttled_seconds"]
    assert not alice["censored"]
    # bob was throttled in the recording: censored, said so
    assert by_entity["user=bob"]["censored"] and "lower bound" in by_entity["user=bob"]["censored_note"]
    pngs = sorted(p.name for p in (tmp_path / "plan" / "simulation").glob("*.png"))
    assert pngs == ["user=alice_producer_byte_rate_broker_1.png", "user=bob_producer_byte_rate_broker_1.png"]
    table = capsys.readouterr().out
    assert "user=alice producer_byte_rate @1" in table and "censored:" in table
    # the refusal apply uses: alice is throttled in most of her active seconds under the plan
    assert [r.split(":")[0] for r in too_throttled(doc, 0.1)] == ["user=alice producer_byte_rate on broker 1"]
    assert too_throttled(doc, 1.0) == []


def test_recommend_verify_attaches_the_simulation_and_apply_refuses_it(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spark_analytics.jobs import apply, recommend

    # alice sends 3000 B/s steadily, under a logged 5000 B/s quota; a plan with a ceiling of 1000 B/s
    # and no step limit throttles her most of the time.
    records = [r | {"quota_entity": "user=alice", "quota_kind": "producer_byte_rate", "quota_limit": 5000.0}
               for r in _steady("alice", "app", 300, 100, 20_000)]
    write_logs(tmp_path / "logs", records)
    out = tmp_path / "plan"
    code = recommend.main(["--logs", str(tmp_path / "logs"), "--out", str(out), "--ceiling", "1000",
                           "--no-max-change", "--no-plots", "--no-progress", "--master", "local[2]",
                           "--verify"])
    assert code == 0
    plan_doc = json.loads((out / "plan.json").read_text())
    sim = plan_doc["simulation"]
    assert [e["entity"] for e in sim["entities"]] == ["user=alice"]
    assert sim["entities"][0]["plan"]["throttled_share"] > 0.5
    capsys.readouterr()

    # apply refuses before it connects anywhere (no server at this address), naming the entity and why
    refused = apply.main(["--plan", str(out / "plan.json"), "--bootstrap-server", "127.0.0.1:9",
                          "--max-throttled-share", "0.2"])
    err = capsys.readouterr().err
    assert refused == 1
    assert "user=alice producer_byte_rate" in err and "of its active seconds" in err and "--force" in err


def _pieces(rows: list[dict[str, Any]]) -> tuple[Any, Any]:
    """One partition's pieces as `fetch_demand` hands them over: the produce pieces (ready_ms,
    records), the fetch pieces (all of theirs)."""
    import pyarrow as pa

    from contracts.access_log import PRODUCE_API_KEY

    base = {"principal": "u", "broker_id": 1, "recorded_throttled": False, "topic": "t", "partition": 0}
    made = [{"topic": "t", "partition": 0, "ready_ms": r["ready_ms"], "records": r["records"]}
            for r in rows if r["api_key"] == PRODUCE_API_KEY]
    taken = [{k: v for k, v in (base | r).items() if k != "api_key"}
             for r in rows if r["api_key"] != PRODUCE_API_KEY]
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("ready_ms", pa.int64()),
                        ("records", pa.int64())])
    return pa.Table.from_pylist(made, schema=schema), pa.Table.from_pylist(taken)


def test_a_consumers_demand_is_the_data_produced_for_it_when_it_was_produced() -> None:
    from contracts.access_log import FETCH_API_KEY, PRODUCE_API_KEY
    from spark_analytics.simulate import retime_partition

    # A feeder sends 2 records at 1000, 3 at 2000, 5 at 3000 (a batch offers its records when it is
    # sent; `ready_ms` is the request's time). The consumer fetched late: 5 records at 2600 (asked at
    # 2500, waited 100 ms) and 5 at 3900, 2000 response bytes each, 400 per record.
    def made(ts: int, n: int) -> dict[str, Any]:
        return {"client_id": "feeder", "api_key": PRODUCE_API_KEY, "ts_ms": ts, "ready_ms": ts,
                "records": n, "bytes": 100.0 * n}

    def fetched(ts: int, ready: int, n: int | None, size: float) -> dict[str, Any]:
        return {"client_id": "c", "api_key": FETCH_API_KEY, "ts_ms": ts, "ready_ms": ready, "records": n,
                "bytes": size}

    table = _pieces([made(1000, 2), made(2000, 3), made(3000, 5),
                     fetched(2500, 2600, 5, 2000.0), fetched(3800, 3900, 5, 2000.0)])
    got = retime_partition(*table, topics=False).to_pylist()
    # offset = min over fetches of (produced by its response - fetched by then) = min(5 - 5, 10 - 10)
    # = 0: it read offsets 1..10, all of them; each batch is wanted when it was written, but never
    # before the consumer's first fetch (2500): 2 records at 2500, 3 at 2500 (one row: the same
    # fetch delivered both, in the same millisecond), 5 at 3000
    assert [(r["client_id"], r["ts_ms"], r["records"], r["bytes"]) for r in got] == [
        ("c", 2500, 5, 2000.0), ("c", 3000, 5, 2000.0)]
    assert all(r["topic"] is None and r["api_key"] == FETCH_API_KEY for r in got)
    # A consumer that started behind: it fetched 4 records by 2600 when 5 existed and 4 more at
    # 3900 when 10 existed: offset = min(5 - 4, 10 - 8) = 1, it read offsets 2..9: one of the
    # first batch, the 3 of the second, 4 of the third (its last record, offset 10, it never read)
    behind = _pieces([made(1000, 2), made(2000, 3), made(3000, 5),
                      fetched(600, 2600, 4, 800.0), fetched(3800, 3900, 4, 800.0)])
    again = retime_partition(*behind, topics=True).to_pylist()
    assert [(r["ts_ms"], r["records"], r["topic"]) for r in again] == [(1000, 1, "t"), (2000, 3, "t"),
                                                                     (3000, 4, "t")]
    # A consumer that asked at 500 (nothing there yet) and got all 10 records at 3900 (4000
    # bytes: 400 per record): offset = min(0 - 0, 10 - 10) = 0, one fetch delivered every batch.
    # To the millisecond: 2 at 1000, 3 at 2000, 5 at 3000. In steps of 2500 ms: the batches of
    # 1000 and 2000 (step 0) are one row at the later's time, 2000; 3000 (step 1) its own.
    late = _pieces([made(1000, 2), made(2000, 3), made(3000, 5),
                    fetched(500, 900, 0, 0.0), fetched(3800, 3900, 10, 4000.0)])
    fine = retime_partition(*late, topics=False).to_pylist()
    assert [(r["ts_ms"], r["records"], r["bytes"]) for r in fine] == [(1000, 2, 800.0), (2000, 3, 1200.0),
                                                                     (3000, 5, 2000.0)]
    coarse = retime_partition(*late, topics=False, resolution_ms=2500).to_pylist()
    assert [(r["ts_ms"], r["records"], r["bytes"]) for r in coarse] == [(2000, 5, 2000.0), (3000, 5, 2000.0)]
    # The same consumer, its second fetch streamed (a response over 64 KiB: the log has no record
    # count): its 2000 bytes at the 400 bytes per record of its first fetch are 5 records. Without
    # them it would be matched to offsets 1..5 only, and the batch of 3000 left out of its demand.
    streamed = _pieces([made(1000, 2), made(2000, 3), made(3000, 5),
                        fetched(2500, 2600, 5, 2000.0), fetched(3800, 3900, None, 2000.0)])
    counted = retime_partition(*streamed, topics=False).to_pylist()
    assert [(r["ts_ms"], r["records"], r["bytes"]) for r in counted] == [(2500, 5, 2000.0), (3000, 5, 2000.0)]
    # a partition no producer wrote in the recording: the fetches as recorded
    alone = retime_partition(*_pieces([fetched(2500, 2600, 5, 2000.0)]), topics=False).to_pylist()
    assert [(r["ts_ms"], r["records"], r["bytes"]) for r in alone] == [(2500, 5, 2000.0)]


def test_the_spark_replay_is_the_direct_replay_of_the_same_recording(spark: SparkSession) -> None:
    """`tune simulate`'s Spark steps and `quotas.replay` called directly on the demand the recording
    shows give the same numbers, per entity, where the recording has the two things Spark's input
    order and the log's gaps can hide: requests of one client in one millisecond, and a Fetch
    response streamed through Sluice (over 64 KiB: its record has no topics)."""
    from spark_analytics.jobs.simulate import simulate_rows
    from spark_analytics.plan import Plan, PlanEntry

    feed = [{"topic": "feed", "partition": 0}]
    # The feeder writes a batch of 4 records every 50 ms, 50 ms to 20 s (400 batches, 1600 records).
    feeder = [produce(T0 + 50 * k, 4200, client_id="feeder", upstream_latency_ms=1.0, correlation_id=k,
                      topics=[feed[0] | {"records": 4, "bytes": 4100}]) for k in range(1, 401)]

    # The reader keeps up: every 100 ms it fetches the 2 batches written since (8 records, 1030
    # wire bytes each), except from 3 s to 4 s, where it was late: at 4 s it got the 20 batches
    # written since 3 s (80 records, 82,400 bytes) in one response, streamed (topics null).
    def read(j: int) -> dict[str, object]:
        return fetch(T0 + 100 * j, 8 * 1030, client_id="reader", upstream_latency_ms=0.0, correlation_id=j,
                     topics=[feed[0] | {"records": 8, "bytes": 8 * 1025}])

    reader = ([read(j) for j in range(1, 31)]
              + [fetch(T0 + 4000, 80 * 1030, client_id="reader", upstream_latency_ms=0.0, correlation_id=40,
                       topics=None)]
              + [read(j) for j in range(41, 201)])
    # The pipe sends two produces in the same millisecond every second, 2000 B then 500 B (its
    # correlation ids say so; in the log, the one answered first comes first: the 500 B one).
    sends = [(T0 + 1000 * k + 7, 2 * k + n, size) for k in range(20) for n, size in ((1, 500), (0, 2000))]
    pipe = [produce(ts, size, client_id="pipe", upstream_latency_ms=1.0, correlation_id=correlation_id)
            for ts, correlation_id, size in sends]
    logs = frame(spark, feeder + reader + pipe)
    end_ms = T0 + 20_000 + 1  # the recording's last request, + 1

    high = 50 * 1024 * 1024
    plan = Plan((PlanEntry("client-id=reader", "consumer_byte_rate", None, high, 40 * 1024, "decrease", ""),
                 PlanEntry("client-id=pipe", "producer_byte_rate", None, high, 1000, "decrease", "")), "", {})
    candidate = _config({(e.entity, e.quota_key): e.recommended for e in plan.entries})
    base = _config({(e.entity, e.quota_key): float(high) for e in plan.entries})
    rows = {r["entity"]: r for r in simulate_rows(spark, logs, plan, candidate, base, "broker",
                                                  demand_resolution_ms=WINDOW.window_ms // 10)}
    assert sorted(rows) == ["client-id=pipe", "client-id=reader"]

    # The reader's demand: every batch when it was written (the first two at its first fetch, 100
    # ms), at its bytes per record, 1030: (1520 x 1030 + 82,400) B / 1600 records.
    who = ClientIdentity("alice", "reader")
    wanted = [Arrival(T0 + max(50 * k, 100), who, 4 * 1030.0) for k in range(1, 401)]
    # The pipe's produces in the order it sent them; a throttled produce's delay starts after the
    # broker's service time, 1 ms (every produce found the broker idle and waited 1 ms).
    sent = [Arrival(ts, ClientIdentity("alice", "pipe"), float(size), response_ms=1)
            for ts, _, size in sorted(sends)]
    for entity, arrivals_, kind in (("client-id=reader", wanted, QuotaKind.FETCH),
                                    ("client-id=pipe", sent, QuotaKind.PRODUCE)):
        want = summarize(arrivals_, replay(arrivals_, candidate, kind, end_ms=end_ms))
        got = rows[entity]
        assert want.throttles > 0, entity
        assert (got["plan_throttles"], got["plan_throttled_seconds"], got["plan_throttle_total_ms"],
                got["plan_max_wait_ms"]) == (want.throttles, want.throttled_seconds, want.throttle_total_ms,
                                             want.max_wait_ms), entity
        assert got["span_s"] == pytest.approx(want.span_s), entity
        for name in ("demand_per_s", "admitted_per_s", "deferred", "max_backlog"):
            assert got[f"plan_{name}"] == pytest.approx(getattr(want, name), abs=1e-6), (entity, name)

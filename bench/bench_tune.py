"""Benchmark of the quota recommendation job against a bare aggregation, on local[2].

For each size (1, 3 and 10 million records by default) it writes access logs as JSON lines in the
date=/hour= layout, exactly what `dumps_record` writes (a sample is checked with `validate_record`),
converts them to Parquet with the writer's Arrow schema (the proxy's default format; `--format json`
keeps the JSON lines), then, in one Spark session, times

* the recommendation job (`spark_analytics.jobs.recommend.run`: read, per-second aggregation,
  exact percentiles, recommendation, plan files), and
* the baseline: the same files read with the same explicit schema, bytes summed per
  (principal, client_id, second), then exact p50/p95/p99 per client, collected.

Results go to bench/results/tune.json and bench/results/tune.png (`--name` for others). Targets:
10 million records in under 30 s (issue 12: 10 s over Parquet, the proxy's default format;
`--format json` for JSON lines), and no more than 2x the baseline; the simulation of 10 million
records in 30 s (issue 30).

    .venv/bin/python -m bench.bench_tune                   # 1M, 3M, 10M
    .venv/bin/python -m bench.bench_tune --max 1000000     # only sizes up to 1M
    .venv/bin/python -m bench.bench_tune --workdir W --keep --generate-only   # the logs only, now,
    .venv/bin/python -m bench.bench_tune --workdir W --reuse                  # timed later, quietly
    .venv/bin/python -m bench.bench_tune --workdir W --reuse --stages         # + the job's parts

`--stages` adds, at the largest size and in the same warm session, the job's parts timed alone
(each written to Spark's `noop` sink, three runs each): the columns it reads, its first
aggregation (`client_seconds`), that plus `entity_seconds`, and two bare sums over the same
records, one grouped by the bare aggregation's three keys and one by the first aggregation's six:
the last is the floor of any plan that keeps the per-broker, per-quota-key detail the plan needs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.results import commit, pyplot
from contracts.access_log import FIELD_NAMES, partition_path, validate_record

RESULTS = Path(__file__).resolve().parent / "results"
T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
RECORDS_PER_SECOND = 2_000  # the generated traffic: span = records / 2000 s
INSTANCES = ("sluice-1", "sluice-2")
USERS, CLIENTS_PER_USER = 16, 4

_HEAD = ('{"schema_version":1,"ts_ms":%d,"instance":"%s","broker_id":%d,"client_address":"10.1.%d.%d:%d",'
         '"principal":"%s","client_id":"%s","client_software_name":"apache-kafka-java",'
         '"client_software_version":"4.3.1",')
_PRODUCE = ('"api_key":0,"api_name":"Produce","api_version":11,"correlation_id":%d,"request_bytes":%d,'
            '"response_bytes":64,"topics":[{"topic":"%s","partition":%d,"records":%d,"bytes":%d}],')
_FETCH = ('"api_key":1,"api_name":"Fetch","api_version":17,"correlation_id":%d,"request_bytes":120,'
          '"response_bytes":%d,"topics":[{"topic":"%s","partition":%d,"records":%d,"bytes":%d}],')
_OTHER = ('"api_key":3,"api_name":"Metadata","api_version":12,"correlation_id":%d,"request_bytes":48,'
          '"response_bytes":%d,"topics":null,')
_TAIL = ('"upstream_latency_ms":%.3f,"throttle_time_ms":%d,"broker_throttle_time_ms":0,'
         '"quota_entity":%s,"quota_kind":%s,"quota_limit":%s,"shadow":false,"would_throttle_ms":null,'
         '"error_codes":[],"worker":null}\n')


def _clients() -> list[dict[str, Any]]:
    """64 clients with Zipf-like traffic shares; every other user has a user quota configured."""
    out = []
    for u in range(USERS):
        for c in range(CLIENTS_PER_USER):
            rank = len(out) + 1
            quota = u % 2 == 0
            out.append({"user": f"user-{u:02d}", "client": f"app-{u:02d}-{c}", "weight": 1.0 / rank,
                        "size": 200 + 40_000 // rank, "entity": f'"user=user-{u:02d}"' if quota else "null",
                        "limit": "1048576.0" if quota else "null", "host": (u, c)})
    return out


def _generate_slice(args: tuple[str, int, int, int, int]) -> int:
    root, worker, count, start_ms, span_ms = args
    rng = random.Random(worker * 7919 + count)
    clients = _clients()
    weights = [c["weight"] for c in clients]
    files: dict[Path, list[str]] = {}
    paths: dict[tuple[int, str], Path] = {}  # partition_path per (hour, instance): it is not cheap
    written = 0
    batch = 20_000
    for first in range(0, count, batch):
        n = min(batch, count - first)
        chosen = rng.choices(clients, weights, k=n)
        for i, cl in enumerate(chosen):
            k = first + i
            ts = start_ms + (k * span_ms) // count
            instance = INSTANCES[k & 1]
            head = _HEAD % (ts, instance, 1 + (k % 3), cl["host"][0], cl["host"][1], 40000 + cl["host"][1],
                            cl["user"], cl["client"])
            roll = rng.random()
            size = int(cl["size"] * (0.5 + rng.random()))
            if roll < 0.45:
                body = _PRODUCE % (k, size + 90, "orders", k % 12, 1 + size // 100, size)
                kind = '"producer_byte_rate"'
            elif roll < 0.9:
                body = _FETCH % (k, size * 4 + 60, "orders", k % 12, 1 + size // 25, size * 4)
                kind = '"consumer_byte_rate"'
            else:
                body = _OTHER % (k, 900)
                kind = "null"
            throttle = 0 if rng.random() < 0.97 else rng.randint(1, 400)
            quoted = cl["entity"] != "null" and kind != "null"
            tail = _TAIL % (0.2 + rng.random() * 3, throttle, cl["entity"] if quoted else "null",
                            kind if quoted else "null", cl["limit"] if quoted else "null")
            where = (ts // 3_600_000, instance)
            path = paths.get(where)
            if path is None:
                path = paths[where] = partition_path(root, ts, instance, worker)
            files.setdefault(path, []).append(head + body + tail)
        for path, lines in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write("".join(lines))
            written += len(lines)
        files.clear()
    return written


def generate(root: Path, records: int, workers: int) -> float:
    """Write `records` records under `root`; returns seconds taken."""
    t = time.perf_counter()
    span_ms = max(1, records // RECORDS_PER_SECOND) * 1000
    per = [records // workers + (1 if w < records % workers else 0) for w in range(workers)]
    starts = [T0_MS + span_ms * sum(per[:w]) // records for w in range(workers)]
    jobs = [(str(root), w, per[w], starts[w], span_ms * per[w] // records) for w in range(workers)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        total = sum(pool.map(_generate_slice, jobs))
    assert total == records, (total, records)
    return time.perf_counter() - t


def _to_parquet(path: str) -> int:
    """One generated JSON-lines file rewritten as the Parquet file Sluice would have written."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    from proxy.ops.access_log_arrow import arrow_schema

    schema = arrow_schema()
    table = pj.read_json(path, parse_options=pj.ParseOptions(explicit_schema=schema,
                                                             unexpected_field_behavior="error"))
    pq.write_table(table.select(list(FIELD_NAMES)).cast(schema), Path(path).with_suffix(".parquet"))
    Path(path).unlink()
    return table.num_rows


def convert(root: Path, workers: int) -> float:
    """Every JSON-lines file under `root` to Parquet; returns seconds taken."""
    t = time.perf_counter()
    files = [str(p) for p in sorted(root.rglob("*.jsonl"))]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.map(_to_parquet, files)
    return time.perf_counter() - t


def check_sample(root: Path, lines: int = 200) -> None:
    """The generated lines are valid records in field order (the generator is templated by hand)."""
    path = next(root.rglob("*.jsonl"))
    with path.open() as f:
        for _, line in zip(range(lines), f, strict=False):
            record = json.loads(line)
            problems = validate_record(record)
            assert not problems and tuple(record) == FIELD_NAMES, (problems, line)


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------ the two timed runs

def baseline(spark: Any, root: Path, log_format: str) -> tuple[float, int]:
    from pyspark.sql import functions as F

    from spark_analytics.schema import read_access_logs

    t = time.perf_counter()
    logs = read_access_logs(spark, str(root), log_format)
    per_second = (logs.where(F.col("api_key").isin(0, 1))
                  .groupBy("principal", "client_id", F.expr("ts_ms div 1000").alias("second"))
                  .agg(F.sum(F.when(F.col("api_key") == 0, F.col("request_bytes"))
                             .otherwise(F.col("response_bytes"))).alias("bytes")))
    result = (per_second.groupBy("principal", "client_id")
              .agg(F.percentile(F.col("bytes").cast("double"), [0.5, 0.95, 0.99]).alias("p")).collect())
    return time.perf_counter() - t, len(result)


def recommendation(spark: Any, root: Path, out: Path, log_format: str) -> tuple[float, int]:
    from spark_analytics.jobs import recommend
    from spark_analytics.plan import read_plan
    from spark_analytics.session import Progress

    current = out / "current.json"
    out.mkdir(parents=True, exist_ok=True)
    limits = {"producer_byte_rate": 1048576.0, "consumer_byte_rate": 1048576.0}
    current.write_text(json.dumps([{"entity": f"user=user-{u:02d}", "values": limits}
                                   for u in range(0, USERS, 2)]))
    args = recommend.build_parser().parse_args(["--logs", str(root), "--out", str(out / "plan"),
                                                "--current-quotas", str(current), "--no-plots",
                                                "--format", log_format])
    t = time.perf_counter()
    with Progress(spark, "bench", enabled=False) as progress:
        path = recommend.run(spark, args, progress)
    spark.catalog.clearCache()
    return time.perf_counter() - t, len(read_plan(path).entries)


def simulation(spark: Any, root: Path, out: Path, log_format: str) -> tuple[float, float, int, int]:
    """`tune simulate` of the plan the recommendation just wrote (its user=... entities, both byte
    keys, against the current 1 MiB/s quotas): every produce and fetch record of every user is
    replayed through the quota engine twice (plan and baseline), in the Python workers. Returns
    the time, the CPU seconds (`tree_cpu_s`), the sharing groups and the requests replayed."""
    from spark_analytics.jobs import simulate
    from spark_analytics.session import Progress

    args = simulate.build_parser().parse_args(["--logs", str(root), "--plan", str(out / "plan" / "plan.json"),
                                               "--out", str(out / "simulation"), "--no-plots",
                                               "--format", log_format])
    t, cpu = time.perf_counter(), tree_cpu_s()
    # the stages of this run are found in Spark's event log by this job group (`--event-log`)
    spark.sparkContext.setJobGroup(f"simulate-{root.name}", "tune simulate")
    with Progress(spark, "bench", enabled=False) as progress:
        doc = simulate.run(spark, args, progress, quiet=True)
    spark.sparkContext.setJobGroup("", "")
    spark.catalog.clearCache()
    return (time.perf_counter() - t, tree_cpu_s() - cpu, len(doc["entities"]),
            sum(e["requests"] for e in doc["entities"]))


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds (user + system) of this process and every live descendant (the Spark JVM and
    its Python workers under local[N]), with what they reaped: on a machine shared with a load of
    20 to 30 on 2 cores, wall seconds measure the scheduler's share more than the work. Linux /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry.name)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0, [root or os.getpid()]
    while todo:
        pid = todo.pop()
        fields = stats.get(pid)
        if fields is not None:  # utime, stime, cutime, cstime: fields 14-17 of stat, 11-14 here
            total += sum(int(x) for x in fields[11:15])
        todo.extend(children.get(pid, []))
    return total / tick


def event_log_stages(log_dir: Path, group: str) -> list[dict[str, Any]]:
    """Per stage of the jobs in `group` (Spark's event log, uncompressed): its name, tasks, wall
    seconds from submission to completion, and summed over its tasks the executor run time (which
    includes waiting for the Python workers), the JVM's CPU time in them, GC time and the shuffle
    records written. Python workers' CPU is not in the JVM's CPU time."""
    stage_ids: set[int] = set()
    stages: dict[int, dict[str, Any]] = {}
    files = [p for p in log_dir.rglob("*") if p.is_file() and not p.name.startswith((".", "appstatus"))]
    for path in sorted(files):
        for line in path.read_text(errors="replace").splitlines():
            event = json.loads(line) if line.strip() else {}
            kind = event.get("Event")
            if kind == "SparkListenerJobStart" and (event.get("Properties") or {}).get(
                    "spark.jobGroup.id") == group:
                stage_ids.update(event.get("Stage IDs", []))
            elif kind == "SparkListenerStageCompleted":
                info = event["Stage Info"]
                stage = stages.setdefault(info["Stage ID"], {"run_s": 0.0, "jvm_cpu_s": 0.0, "gc_s": 0.0,
                                                             "shuffle_records_written": 0})
                # what the stage does: its operators (scan, exchange, Arrow UDF...), by the RDDs' scopes
                scopes = sorted({json.loads(r["Scope"])["name"].strip() for r in info.get("RDD Info", [])
                                 if r.get("Scope")})
                stage |= {"name": info["Stage Name"].split(" at ")[0], "operators": scopes,
                          "tasks": info["Number of Tasks"],
                          "wall_s": round((info.get("Completion Time", 0) - info.get("Submission Time", 0))
                                          / 1000, 2)}
            elif kind == "SparkListenerTaskEnd":
                metrics = event.get("Task Metrics") or {}
                stage = stages.setdefault(event["Stage ID"], {"run_s": 0.0, "jvm_cpu_s": 0.0, "gc_s": 0.0,
                                                              "shuffle_records_written": 0})
                stage["run_s"] += metrics.get("Executor Run Time", 0) / 1000
                stage["jvm_cpu_s"] += metrics.get("Executor CPU Time", 0) / 1e9
                stage["gc_s"] += metrics.get("JVM GC Time", 0) / 1000
                stage["shuffle_records_written"] += (metrics.get("Shuffle Write Metrics") or {}).get(
                    "Shuffle Records Written", 0)
    return [{"stage": k} | {key: round(v, 2) if isinstance(v, float) else v for key, v in stages[k].items()}
            for k in sorted(stage_ids) if k in stages and "name" in stages[k]]


def _noop_s(df: Any) -> float:
    t = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t


def stages(spark: Any, root: Path, log_format: str, repeats: int = 3) -> dict[str, list[float]]:
    """The job's parts timed alone over `root` (see the module's docstring), seconds per run."""
    from pyspark.sql import functions as F

    from spark_analytics.policy import QuotaPolicy
    from spark_analytics.schema import read_access_logs
    from spark_analytics.transforms import client_seconds, entity_seconds

    def logs() -> Any:
        return read_access_logs(spark, str(root), log_format)

    second = F.expr("ts_ms div 1000").alias("second")
    parts: dict[str, Any] = {
        # client_seconds' input columns: reading and decoding them is the floor of any plan
        "read the job's columns": lambda: logs().select(
            "principal", "client_id", "quota_entity", "broker_id", "ts_ms", "quota_limit", "api_key",
            "request_bytes", "response_bytes", "throttle_time_ms", "broker_throttle_time_ms",
            "would_throttle_ms"),
        "sum by 3 keys (the bare aggregation's)": lambda: logs().groupBy(
            "principal", "client_id", second).agg(F.sum("request_bytes")),
        "sum by 6 keys (client_seconds')": lambda: logs().groupBy(
            "principal", "client_id", "api_key", "quota_entity", "broker_id", second)
            .agg(F.sum("request_bytes")),
        "client_seconds": lambda: logs().transform(client_seconds),
        "client_seconds + entity_seconds": lambda: logs().transform(client_seconds)
            .transform(entity_seconds(QuotaPolicy())),
    }
    return {name: [round(_noop_s(build()), 2) for _ in range(repeats)] for name, build in parts.items()}


def session(master: str, driver_memory: str, event_log: Path | None = None) -> Any:
    from spark_analytics.session import build_session

    conf = {"spark.driver.memory": driver_memory}
    if event_log is not None:
        event_log.mkdir(parents=True, exist_ok=True)
        conf |= {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(event_log),
                 "spark.eventLog.compress": "false"}
    return build_session("sluice-bench-tune", master, conf=conf, log_level="ERROR")


def plot(runs: Sequence[dict[str, Any]], path: Path, log_format: str) -> None:
    plt = pyplot()

    n = [r["records"] / 1e6 for r in runs]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(n, [r["job_s"] for r in runs], "o-", label="recommendation job")
    ax.plot(n, [r["baseline_s"] for r in runs], "s--", label="bare aggregation (baseline)")
    if all("simulate_s" in r for r in runs):
        ax.plot(n, [r["simulate_s"] for r in runs], "^-", label="tune simulate (plan + baseline replay)")
        ax.axhline(30, color="#C44E52", linestyle=":", label="simulate target at 10M: 30 s")
    ax.axhline(10 if log_format == "parquet" else 30, color="grey", linestyle=":",
               label=f"target at 10M: {10 if log_format == 'parquet' else 30} s")
    ax.set_xlabel(f"million records ({'Parquet' if log_format == 'parquet' else 'JSON lines'})")
    ax.set_ylabel("seconds on local[2]")
    ax.set_title("sluice tune: recommendation and simulation vs bare aggregation")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(args: argparse.Namespace, runs: list[dict[str, Any]], load_before: tuple[float, ...],
                  startup_s: float, warmup: dict[str, float], parts: dict[str, list[float]] | None,
                  ) -> dict[str, Any]:
    """<name>.json and <name>.png in --results from the sizes timed so far; returns the summary."""
    first, last = runs[0], runs[-1]
    scale = last["records"] / first["records"]
    summary: dict[str, Any] = {
        "commit": commit(),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(),
                    # the machine is shared: the 1-minute load average before and after the runs
                    "load_average_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]},
        "spark": {"master": args.master, "driver_memory": args.driver_memory,
                  "session_start_s": round(startup_s, 2),
                  # the first (cold) run of each, on the smallest size, before the timed runs
                  "warmup_s": warmup},
        "format": f"{args.format}, date=/hour= layout, explicit schema",
        "runs": runs,
        "growth": {"records_x": scale, "job_x": round(last["job_s"] / first["job_s"], 2),
                   "baseline_x": round(last["baseline_s"] / first["baseline_s"], 2)},
    }
    if parts is not None:
        summary["stages_s"] = {"records": last["records"], "noop_sink_runs": parts}
    if last["records"] >= 10_000_000:
        summary["targets"] = {"job_under_30s_at_10M": last["job_s"] < 30,
                              **({"simulate_under_30s_at_10M": last["simulate_s"] <= 30}
                                 if "simulate_s" in last else {}),
                              "job_under_10s_at_10M": last["job_s"] <= 10,  # issue 12, over Parquet
                              "job_at_most_2x_baseline": last["ratio_job_to_baseline"] <= 2.0}
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{args.name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(runs, args.results / f"{args.name}.png", args.format)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 3_000_000, 10_000_000])
    p.add_argument("--max", type=int, default=None, help="skip sizes above this")
    p.add_argument("--workdir", type=Path, default=None, help="where the logs go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the generated logs")
    p.add_argument("--reuse", action="store_true",
                   help="use the logs an earlier run left in --workdir (same size and format)")
    p.add_argument("--generate-only", action="store_true", help="write the logs and stop (with --keep)")
    p.add_argument("--workers", type=int, default=2, help="processes writing logs")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="2g")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--name", default="tune",
                   help="results file names: <name>.json and <name>.png in --results (default tune)")
    p.add_argument("--stages", action="store_true",
                   help="also time the job's parts alone at the largest size (see above)")
    p.add_argument("--format", choices=["parquet", "json"], default="parquet",
                   help="log format (Sluice's default: parquet, converted from the generated JSON lines)")
    p.add_argument("--event-log", action="store_true",
                   help="write Spark's event log under the workdir and put the simulation's stages at "
                        "each size in the results (name, tasks, wall, run, JVM CPU, GC seconds)")
    p.add_argument("--no-simulate", action="store_true",
                   help="skip `tune simulate` of each size's plan (timed after the job, same session)")
    args = p.parse_args(argv)
    sizes = [s for s in args.sizes if args.max is None or s <= args.max]
    if not sizes:
        p.error("no sizes left under --max")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="sluice-bench-tune-"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    datasets = {}
    for n in sizes:
        root = work / f"logs-{n}"
        marker = work / f"logs-{n}.done.json"
        done = json.loads(marker.read_text()) if args.reuse and marker.exists() and root.exists() else None
        if done is not None and done.get("format") == args.format:
            gen_s = float(done["generate_s"])
            print(f"reusing {root}", flush=True)
        else:
            if root.exists():
                shutil.rmtree(root)
            gen_s = generate(root, n, args.workers)
            check_sample(root)
            if args.format == "parquet":
                gen_s += convert(root, args.workers)
            marker.write_text(json.dumps({"records": n, "format": args.format,
                                          "generate_s": round(gen_s, 2)}))
        datasets[n] = root
        print(f"generated {n:,} records in {gen_s:.1f}s ({n / gen_s:,.0f}/s, "
              f"{dir_bytes(root) / 1e9:.2f} GB)", flush=True)
        runs.append({"records": n, "generate_s": round(gen_s, 2), "bytes_on_disk": dir_bytes(root)})
    if args.generate_only:
        return 0

    t = time.perf_counter()
    event_log = work / "eventlog" if args.event_log else None
    if event_log is not None:
        shutil.rmtree(event_log, ignore_errors=True)
    spark = session(args.master, args.driver_memory, event_log)
    startup_s = time.perf_counter() - t
    # warm-up, not measured, of both timed runs alike (JIT, codegen, file listing, the analyzer's
    # paths): each pays its own first-run cost here, on the smallest logs, and not at the first size
    first = datasets[sizes[0]]
    warmup = {"baseline_s": round(baseline(spark, first, args.format)[0], 2),
              "job_s": round(recommendation(spark, first, work / "out-warmup", args.format)[0], 2)}
    for run in runs:
        root = datasets[run["records"]]
        cpu = tree_cpu_s()
        base_s, clients = baseline(spark, root, args.format)
        base_cpu_s = tree_cpu_s() - cpu
        job_s, entries = recommendation(spark, root, work / f"out-{run['records']}", args.format)
        run |= {"baseline_s": round(base_s, 2), "baseline_cpu_s": round(base_cpu_s, 2),
                "job_s": round(job_s, 2),
                "job_records_per_s": round(run["records"] / job_s),
                "ratio_job_to_baseline": round(job_s / base_s, 2),
                "baseline_clients": clients, "plan_entries": entries}
        print(f"{run['records']:>11,} records: job {job_s:6.1f}s ({run['job_records_per_s']:>9,}/s), "
              f"baseline {base_s:6.1f}s, ratio {job_s / base_s:.2f}", flush=True)
        if not args.no_simulate:
            sim_s, sim_cpu_s, groups, replayed = simulation(spark, root, work / f"out-{run['records']}",
                                                            args.format)
            run |= {"simulate_s": round(sim_s, 2), "simulate_records_per_s": round(run["records"] / sim_s),
                    "simulate_cpu_s": round(sim_cpu_s, 2),
                    "simulate_records_per_cpu_s": round(run["records"] / max(sim_cpu_s, 1e-9)),
                    "baseline_records_per_cpu_s": round(run["records"] / max(base_cpu_s, 1e-9)),
                    "simulate_groups": groups, "simulate_requests_replayed": replayed,
                    "baseline_records_per_s": round(run["records"] / base_s),
                    "ratio_simulate_to_baseline": round(sim_s / base_s, 2)}
            print(f"{'':>11}  simulate {sim_s:6.1f}s, {sim_cpu_s:.1f} CPU-s "
                  f"({run['simulate_records_per_s']:>9,}/s; "
                  f"{replayed:,} requests replayed twice in {groups} sharing groups), "
                  f"bare aggregation {run['baseline_records_per_s']:,}/s", flush=True)
        # written after every size: a long run stopped before its end keeps the sizes it finished
        write_results(args, [r for r in runs if "baseline_s" in r], load_before, startup_s, warmup, None)
    parts = stages(spark, datasets[sizes[-1]], args.format) if args.stages else None
    for name, times in (parts or {}).items():
        print(f"  {name:<40} {' '.join(f'{t:5.2f}' for t in times)} s", flush=True)
    spark.stop()
    if event_log is not None and not args.no_simulate:  # complete once the session has stopped
        for run in runs:
            run["simulate_stages"] = event_log_stages(event_log, f"simulate-logs-{run['records']}")
            print(f"{run['records']:>11,} records, the simulation's stages:", flush=True)
            for stage in run["simulate_stages"]:
                print(f"    {stage['stage']:>4} {stage['name']:<10} {stage['tasks']:>4} tasks "
                      f"{stage['wall_s']:7.2f} s wall {stage['run_s']:7.2f} s run "
                      f"{stage['jvm_cpu_s']:6.2f} JVM CPU-s {stage['gc_s']:5.2f} GC-s "
                      f"{', '.join(stage['operators'])}", flush=True)

    summary = write_results(args, runs, load_before, startup_s, warmup, parts)
    print(json.dumps(summary["growth"] | summary.get("targets", {})))
    if not args.keep and args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

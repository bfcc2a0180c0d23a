"""Usage report per quota entity and per client: rates, percentiles, throttling, top talkers, plots.

    spark-submit spark_analytics/jobs/usage_report.py --logs /var/log/sluice --out report/
    python -m spark_analytics.jobs.usage_report --logs ... --out report/ --master 'local[*]'

Writes to --out: report.json (everything), entity_stats.csv, client_stats.csv, top_talkers.csv,
rates.png and top_talkers.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (spark-submit .../usage_report.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse
import math
from typing import TYPE_CHECKING, Any

from spark_analytics.jobs import common
from spark_analytics.plan import write_csv
from spark_analytics.policy import RATE_SCOPES, QuotaPolicy

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_analytics.session import Progress

MAX_PLOT_POINTS = 600


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="usage_report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_input_args(p)
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--top", type=int, default=10, help="how many top talkers and plotted entities")
    p.add_argument("--percentile", type=float, default=0.95,
                   help="extra percentile column (rate_at_percentile)")
    p.add_argument("--rate-scope", choices=RATE_SCOPES, default="broker",
                   help="per-second rates per broker, every instance and worker summed (default), or per "
                        "cluster")
    p.add_argument("--unmatched", choices=("user", "client-id", "user-client-id", "skip"), default="user")
    p.add_argument("--no-plots", action="store_true")
    common.add_session_args(p)
    return p


def client_seconds_of(spark: SparkSession, args: argparse.Namespace, *, cache: bool) -> DataFrame:
    """Extract + the one pass over the records. Cache it when more than one step reads it."""
    from spark_analytics.transforms import client_seconds

    cs = common.extract_logs(spark, args).transform(client_seconds)
    return cs.cache() if cache else cs


def run(spark: SparkSession, args: argparse.Namespace, progress: Progress,
        cs: DataFrame | None = None) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from spark_analytics import plots
    from spark_analytics.transforms import (
        client_stats,
        entity_seconds,
        rate_stats,
        rate_timeline,
        top_talkers,
    )

    policy = QuotaPolicy(percentile=args.percentile, rate_scope=args.rate_scope, unmatched=args.unmatched)
    progress.step("reading the logs and aggregating per second")
    if cs is None:
        cs = client_seconds_of(spark, args, cache=True)
    totals = cs.agg(F.sum("requests").alias("records"), F.min("second").alias("first"),
                    F.max("second").alias("last")).first()
    assert totals is not None
    es = cs.transform(entity_seconds(policy)).cache()

    progress.step("per-entity and per-client statistics")
    entities = common.rows(es.transform(rate_stats(policy.percentile)), ["quota_key", "entity"])
    clients = common.rows(cs.transform(client_stats), ["principal", "client_id", "metric"])
    talkers = common.rows(cs.transform(top_talkers(args.top)), ["rank"])

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "entity_stats.csv", entities)
    write_csv(out / "client_stats.csv", clients)
    write_csv(out / "top_talkers.csv", talkers)
    plot_files: list[str] = []
    if not args.no_plots:
        progress.step("plots")
        first, last = totals["first"], totals["last"]
        span = 1 if first is None else last - first + 1
        bucket_s = max(1, math.ceil(span / MAX_PLOT_POINTS))
        busiest = sorted(entities, key=lambda r: -r["total_bytes"])[: args.top]
        wanted = [(r["entity"], r["quota_key"]) for r in busiest]
        timeline = es.join(spark.createDataFrame(wanted, "entity string, quota_key string"),
                           ["entity", "quota_key"])
        points = common.rows(timeline.transform(rate_timeline(bucket_s)),
                             ["entity", "quota_key", "bucket_start_s"])
        plot_files.append(plots.plot_timeline(points, out / "rates.png", bucket_s=bucket_s).name)
        plot_files.append(plots.plot_top_talkers(talkers, out / "top_talkers.png").name)
    es.unpersist()

    report = {
        "input": common.describe_inputs(args),
        "records": totals["records"] or 0,
        "window": {"first_second": totals["first"], "last_second": totals["last"]},
        "settings": {"percentile": policy.percentile, "rate_scope": policy.rate_scope,
                     "unmatched": policy.unmatched},
        "entities": entities, "clients": clients, "top_talkers": talkers, "plots": plot_files,
    }
    common.write_json(out / "report.json", report)
    return report


def main(argv: list[str] | None = None) -> int:
    from spark_analytics.session import Progress, build_session

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        common.check_input_args(args)
        spark = build_session("sluice-usage-report", args.master, kafka=bool(args.kafka_bootstrap),
                              conf=common.spark_conf(args))
        with Progress(spark, "report", enabled=not args.no_progress) as progress:
            report = run(spark, args, progress)
    except common.UsageError as exc:
        parser.error(str(exc))
    print(f"report: {len(report['entities'])} quota entities, {len(report['clients'])} client metrics, "
          f"{report['records']} records -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Quota recommendation: a plan with the current and recommended value per entity, and why.

    spark-submit spark_analytics/jobs/recommend.py --logs /var/log/sluice --out plan/ \\
        --bootstrap-server sluice:9092 --headroom 1.5 --floor 256KiB --capacity producer_byte_rate=100MB
    python -m spark_analytics.jobs.recommend --logs ... --current-quotas current.json --out plan/
    python -m spark_analytics.jobs.recommend --logs ... --topics --out topic-plan/   # topic=NAME entities

The current quotas come from Sluice (DescribeClientQuotas at --bootstrap-server), from a JSON file
(--current-quotas, as `sluice tune describe` writes it), or else from the limits the logs recorded.
Writes plan.json (what `apply` reads), plan.csv and plan.png to --out.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (spark-submit .../recommend.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse
from typing import TYPE_CHECKING, Any

from spark_analytics.jobs import common
from spark_analytics.kafka_quota_client import QuotaEntry
from spark_analytics.plan import write_plan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_analytics.session import Progress


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recommend", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_input_args(p)
    p.add_argument("--out", type=Path, required=True, help="output directory for plan.json/.csv/.png")
    p.add_argument("--current-quotas", type=Path, metavar="FILE",
                   help="current quotas as JSON instead of asking --bootstrap-server")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--topics", action="store_true",
                   help="recommend per-topic quotas (entities topic=NAME, from each request's per-topic "
                        "bytes in the access log) instead of per-client ones")
    p.add_argument("--verify", action="store_true",
                   help="replay the logs through the plan (as `simulate` does, against the current quotas) "
                        "and attach the simulation to plan.json; `apply` then refuses a plan that "
                        "throttles an entity too often")
    common.add_policy_args(p)
    from spark_analytics.jobs.simulate import add_model_args

    add_model_args(p)
    common.add_admin_args(p, required=False)
    common.add_session_args(p)
    return p


def current_quotas(args: argparse.Namespace) -> list[QuotaEntry] | None:
    if args.current_quotas is not None and args.bootstrap_server:
        raise common.UsageError("give --current-quotas or --bootstrap-server, not both")
    if args.current_quotas is not None:
        return common.read_current_quotas(args.current_quotas)
    if args.bootstrap_server:
        with common.quota_client(args) as client:
            return client.describe()
    return None


def run(spark: SparkSession, args: argparse.Namespace, progress: Progress,
        cs: DataFrame | None = None) -> Path:
    from spark_analytics import plots
    from spark_analytics.jobs.usage_report import client_seconds_of
    from spark_analytics.transforms import entity_seconds, rate_stats, recommend

    policy = common.policy_from_args(args)
    progress.step("reading current quotas")
    live = current_quotas(args)
    current = common.quotas_frame(spark, live) if live is not None else None

    progress.step("reading the logs, aggregating and recommending")
    if getattr(args, "topics", False):  # per topic: from the records themselves, not per client
        from spark_analytics.topics import topic_seconds

        seconds = common.extract_logs(spark, args).transform(topic_seconds(policy))
    else:
        if cs is None:
            cs = client_seconds_of(spark, args, cache=False)
        seconds = cs.transform(entity_seconds(policy))
    plan = (seconds.transform(rate_stats(policy.percentile))
            .transform(recommend(policy, current)))
    entries: list[dict[str, Any]] = common.rows(plan, ["quota_key", "entity"])

    progress.step("writing the plan")
    inputs = common.describe_inputs(args) | {
        "current_quotas": ("DescribeClientQuotas at " + args.bootstrap_server if args.bootstrap_server
                           else str(args.current_quotas) if args.current_quotas else "the logs' quota_limit")}
    path = write_plan(args.out, entries, policy=policy.to_dict(), inputs=inputs)
    if not args.no_plots and entries:
        plots.plot_plan(entries, args.out / "plan.png", percentile_label=policy.percentile_label)
    if getattr(args, "verify", False):
        verify(spark, args, path, progress)
    return path


def verify(spark: SparkSession, args: argparse.Namespace, path: Path, progress: Progress) -> None:
    """`--verify`: simulate the plan just written against its current values, attach the result."""
    from spark_analytics.jobs import simulate

    sim_args = argparse.Namespace(**vars(args))
    sim_args.plan, sim_args.baseline, sim_args.out = path, "current", args.out
    doc = simulate.run(spark, sim_args, progress)
    simulate.attach(path, doc)


def summary(path: Path) -> str:
    from spark_analytics.plan import read_plan

    plan = read_plan(path)
    counts: dict[str, int] = {}
    for e in plan.entries:
        counts[e.action] = counts.get(e.action, 0) + 1
    parts = ", ".join(f"{n} {action}" for action, n in sorted(counts.items())) or "no entities"
    return f"plan: {len(plan.entries)} entries ({parts}) -> {path}"


def main(argv: list[str] | None = None) -> int:
    from spark_analytics.kafka_quota_client import QuotaAdminError
    from spark_analytics.session import Progress, build_session

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        common.check_input_args(args)
        common.policy_from_args(args)  # fail on a bad policy before starting Spark
        if args.verify:
            from spark_analytics.jobs.simulate import model_of

            model_of(args)
        spark = build_session("sluice-recommend", args.master, kafka=bool(args.kafka_bootstrap),
                              conf=common.spark_conf(args))
        with Progress(spark, "recommend", enabled=not args.no_progress) as progress:
            path = run(spark, args, progress)
    except common.UsageError as exc:
        parser.error(str(exc))
    except QuotaAdminError as exc:
        print(f"recommend: {exc}", file=sys.stderr)
        return 1
    print(summary(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Report, recommend and apply in one go, with one Spark session and one pass over the logs.

    python -m spark_analytics.jobs.tune --logs /var/log/sluice --out tune/ --bootstrap-server sluice:9092
    ... --apply          # write the plan's changes (default: a dry run)

Writes tune/report/ and tune/plan/ as the report and recommend jobs do, then applies
tune/plan/plan.json. Without --bootstrap-server, current quotas come from the logs and the apply
step is skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse

from spark_analytics.jobs import apply, common, recommend, usage_report
from spark_analytics.kafka_quota_client import QuotaAdminError
from spark_analytics.plan import PlanError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_input_args(p)
    p.add_argument("--out", type=Path, required=True, help="output directory (report/ and plan/ inside)")
    p.add_argument("--top", type=int, default=10, help="top talkers and plotted entities in the report")
    p.add_argument("--current-quotas", type=Path, metavar="FILE", help="current quotas as JSON")
    p.add_argument("--no-plots", action="store_true")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--apply", action="store_true", help="write the changes (default: dry run)")
    mode.add_argument("--validate-only", action="store_true", help="have the server check, not write")
    p.add_argument("--force", action="store_true", help="apply even where the quota changed since the plan, "
                                                         "or the simulation throttles more than "
                                                         "--max-throttled-share")
    apply.add_max_throttled_share(p)
    common.add_policy_args(p)
    common.add_admin_args(p, required=False)
    common.add_session_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from spark_analytics.session import Progress, build_session

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        common.check_input_args(args)
        policy = common.policy_from_args(args)
        spark = build_session("sluice-tune", args.master, kafka=bool(args.kafka_bootstrap),
                              conf=common.spark_conf(args))
        with Progress(spark, "tune", enabled=not args.no_progress) as progress:
            cs = usage_report.client_seconds_of(spark, args, cache=True)
            report_args = argparse.Namespace(**vars(args) | {
                "out": args.out / "report", "percentile": policy.percentile,
                "rate_scope": policy.rate_scope, "unmatched": policy.unmatched})
            report = usage_report.run(spark, report_args, progress, cs)
            plan_path = recommend.run(spark, argparse.Namespace(**vars(args) | {"out": args.out / "plan"}),
                                      progress, cs)
            cs.unpersist()
        print(f"report: {len(report['entities'])} quota entities, {report['records']} records "
              f"-> {args.out / 'report'}")
        print(recommend.summary(plan_path))
        if not args.bootstrap_server:
            print("apply: skipped (no --bootstrap-server)")
            return 0
        outcome = apply.run(argparse.Namespace(**vars(args) | {"plan": plan_path}))
    except common.UsageError as exc:
        parser.error(str(exc))
    except (PlanError, QuotaAdminError) as exc:
        print(f"tune: {exc}", file=sys.stderr)
        return 1
    return 1 if outcome.failed else 0


if __name__ == "__main__":
    sys.exit(main())

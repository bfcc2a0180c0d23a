"""What if: replay the recorded traffic through a quota plan, before it is applied.

    sluice tune simulate --logs /var/log/sluice --plan plan/plan.json                  # against `current`
    sluice tune simulate --logs /var/log/sluice --plan plan/plan.json --baseline other/plan.json
    spark-submit spark_analytics/jobs/simulate.py --logs ... --plan plan/plan.json

For every sharing group the plan limits (the concrete entity, per broker, or per cluster with
--rate-scope cluster), the recorded requests are replayed through Sluice's quota engine in the
Spark workers, as Kafka enforces a quota: record, throttle, and mute the client so that its next
requests wait (an open-loop queue: the backlog carries over). The same requests are replayed under
the baseline: the plan's `current` values, or another plan's recommended ones. Prints a table and
writes simulation.json and one plot per entity beside the plan (or to --out).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (spark-submit .../simulate.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse
import json
import re
from typing import TYPE_CHECKING, Any

from spark_analytics.jobs import common
from spark_analytics.plan import Plan, PlanError, read_plan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from quotas import QuotaConfig, RateConfig, RateModel
    from spark_analytics.session import Progress


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the quota model replayed (default: Kafka's)")
    g.add_argument("--rate-model", choices=("windowed", "token_bucket"), default="windowed")
    g.add_argument("--burst-ms", type=int, help="token bucket burst in ms (default: samples x size_ms)")
    g.add_argument("--window-samples", type=int, default=11, help="quota.window.num (default 11)")
    g.add_argument("--window-size-ms", type=int, default=1000, help="quota.window.size.seconds x 1000")
    g.add_argument("--sim-rate-scope", choices=("broker", "cluster"),
                   help="one budget per broker (Kafka's) or per cluster; default: the plan policy's")
    g.add_argument("--produce-service-ms", type=int, default=None,
                   help="the brokers' produce service time in ms, which a throttled produce's delay "
                        "follows (KIP-219); default: per broker, the median wait of the recorded "
                        "produces that found it idle")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="simulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_input_args(p)
    p.add_argument("--plan", type=Path, required=True, help="plan.json written by recommend (or by hand)")
    p.add_argument("--baseline", default="current",
                   help="`current` (the plan's current values) or another plan.json (its recommended values)")
    p.add_argument("--out", type=Path,
                   help="where simulation.json and the plots go (default: the plan's directory)")
    p.add_argument("--no-plots", action="store_true")
    add_model_args(p)
    common.add_session_args(p)
    return p


def model_of(args: argparse.Namespace) -> tuple[RateConfig, RateModel, int | None]:
    from quotas import QuotaConfigError, RateConfig, RateModel
    from quotas.stats import check_burst_ms

    try:
        window = RateConfig(samples=args.window_samples, window_ms=args.window_size_ms)
        if args.burst_ms is not None:
            if args.rate_model != "token_bucket":
                raise common.UsageError("--burst-ms applies only to --rate-model token_bucket")
            check_burst_ms(window, args.burst_ms)
    except (QuotaConfigError, ValueError) as exc:
        raise common.UsageError(f"--window-samples/--window-size-ms/--burst-ms: {exc}") from exc
    if (getattr(args, "produce_service_ms", None) or 0) < 0:
        raise common.UsageError("--produce-service-ms: must be >= 0 ms")
    return window, RateModel(args.rate_model), args.burst_ms


def configs(plan: Plan, baseline: str, window: RateConfig, rate_model: RateModel,
            burst_ms: int | None) -> tuple[QuotaConfig, QuotaConfig, str]:
    """The plan's recommended values, and the baseline's (the plan's current ones, or another
    plan's recommended ones) as engine configs; the baseline's label."""
    from spark_analytics.simulate import quota_config

    def config(values: dict[tuple[str, str], float]) -> QuotaConfig:
        return quota_config(values, window=window, rate_model=rate_model, burst_ms=burst_ms)

    candidate = config({(e.entity, e.quota_key): e.recommended for e in plan.entries})
    if baseline == "current":
        return candidate, config({(e.entity, e.quota_key): e.current for e in plan.entries
                                  if e.current is not None}), "current"
    other = read_plan(Path(baseline))
    return candidate, config({(e.entity, e.quota_key): e.recommended for e in other.entries}), baseline


def simulate_rows(spark: SparkSession, logs: DataFrame, plan: Plan, candidate: QuotaConfig,
                  baseline: QuotaConfig, rate_scope: str, *,
                  service_ms: int | None = None, demand_resolution_ms: int = 1) -> list[dict[str, Any]]:
    """The replay of `logs` under `candidate` and `baseline`: one dict per (entity, key, broker);
    `service_ms`: the brokers' produce service time (None: each broker's, from the recording)."""
    from spark_analytics.simulate import (
        Numbering,
        SimulationSetup,
        arrivals,
        group_rows,
        is_topic_entity,
        recorded_identities,
        simulate_numbered,
    )

    keys = tuple(sorted({e.quota_key for e in plan.entries}))
    modes = [(topics, sorted({e.quota_key for e in plan.entries if is_topic_entity(e.entity) == topics}))
             for topics in (False, True)]
    found = {topics: recorded_identities(logs, mode_keys, topics=topics)
             for topics, mode_keys in modes if mode_keys}
    # the recording ends with its last request, whoever sent it: a client whose traffic stopped
    # earlier may still have a backlog draining until then
    ends = [r.end_ms for r in found.values() if r.end_ms is not None]
    end_ms = max(ends) + 1 if ends else None
    setup = SimulationSetup.of(candidate, baseline, keys, rate_scope, end_ms)
    rows: list[dict[str, Any]] = []
    for topics, mode_keys in modes:
        if not mode_keys:
            continue
        groups = group_rows(candidate, found[topics].identities, topics=topics)
        if not groups:
            continue
        result = (logs.transform(arrivals(mode_keys, topics=topics, service_ms=service_ms,
                                          demand_resolution_ms=demand_resolution_ms,
                                          streamed=found[topics].streamed))
                  .transform(simulate_numbered(spark, setup, Numbering.of(groups), topics=topics)))
        rows += common.rows(result, ["entity", "quota_key", "broker_id"])
    return rows


def plan_rate_scope(plan: Plan) -> str:
    scope = plan.policy.get("rate_scope", "broker") if isinstance(plan.policy, dict) else "broker"
    return scope if scope in ("broker", "cluster") else "broker"


def run(spark: SparkSession, args: argparse.Namespace, progress: Progress,
        logs: DataFrame | None = None, *, quiet: bool = False) -> dict[str, Any]:
    from spark_analytics import plots
    from spark_analytics.simulate import format_table, simulation_doc, timelines

    window, rate_model, burst_ms = model_of(args)
    service_ms = getattr(args, "produce_service_ms", None)
    plan = read_plan(args.plan)
    candidate, base, label = configs(plan, args.baseline, window, rate_model, burst_ms)
    scope = args.sim_rate_scope or plan_rate_scope(plan)
    progress.step("reading the logs and replaying them through the quota engine")
    if logs is None:
        logs = common.extract_logs(spark, args)
    # a consumer's demand timed to a tenth of the quota's sample (`retime_partition`): it moves
    # the windowed rate by at most a tenth of one sample's worth of it
    rows = simulate_rows(spark, logs, plan, candidate, base, scope, service_ms=service_ms,
                         demand_resolution_ms=max(window.window_ms // 10, 1))
    doc = simulation_doc(rows, plan=str(args.plan), baseline=label, window=window, rate_model=rate_model,
                         burst_ms=burst_ms, rate_scope=scope)
    progress.step("writing the simulation")
    out = args.out if args.out is not None else args.plan.parent
    common.write_json(out / "simulation.json", doc)
    if not args.no_plots:
        for (name, points), entity in zip(timelines(rows), doc["entities"], strict=True):
            path = out / "simulation" / f"{_file_name(name)}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            plots.plot_simulation(points, path, title=name, censored=entity["censored"])
    if not quiet:
        print(format_table(doc))
    return doc


def _file_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", label).strip("_")[:150]


def main(argv: list[str] | None = None) -> int:
    from spark_analytics.session import Progress, build_session
    from spark_analytics.simulate import SimulationError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        common.check_input_args(args)
        model_of(args)
        plan = read_plan(args.plan)  # fail on a bad plan before starting Spark
        configs(plan, args.baseline, *model_of(args))
        spark = build_session("sluice-simulate", args.master, kafka=bool(args.kafka_bootstrap),
                              conf=common.spark_conf(args))
        with Progress(spark, "simulate", enabled=not args.no_progress) as progress:
            doc = run(spark, args, progress)
    except common.UsageError as exc:
        parser.error(str(exc))
    except (PlanError, SimulationError) as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 1
    out = args.out if args.out is not None else args.plan.parent
    print(f"simulation: {len(doc['entities'])} sharing group(s) -> {out / 'simulation.json'}")
    return 0


def attach(plan_path: Path, doc: dict[str, Any]) -> None:
    """Put the simulation into the plan file itself (`recommend --verify`)."""
    plan_doc = json.loads(plan_path.read_text())
    plan_doc["simulation"] = doc
    plan_path.write_text(json.dumps(plan_doc, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    sys.exit(main())

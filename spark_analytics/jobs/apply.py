"""Apply a quota plan through AlterClientQuotas: a dry run by default, `--apply` to write.

    python -m spark_analytics.jobs.apply --plan plan/plan.json --bootstrap-server sluice:9092
    python -m spark_analytics.jobs.apply --plan plan/plan.json --bootstrap-server sluice:9092 --apply

The quotas in force are read first (DescribeClientQuotas); an entry whose value changed since the
plan was made is skipped unless --force. --validate-only sends the alteration with validate_only
set: the server checks it and writes nothing. Needs no Spark.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse
import json
from dataclasses import dataclass
from typing import TextIO

from spark_analytics.jobs import common
from spark_analytics.kafka_quota_client import AlterResult, QuotaAdminError
from spark_analytics.plan import (
    Change,
    PlanError,
    Skipped,
    diff,
    format_changes,
    operations,
    read_plan,
    read_simulation,
)


def add_max_throttled_share(p: argparse.ArgumentParser) -> None:
    """The refusal's threshold, for `apply` and for `tune run`, which applies too."""
    p.add_argument("--max-throttled-share", type=float, default=0.5, metavar="SHARE",
                   help="refuse a plan whose simulation (recommend --verify, or simulate's simulation.json "
                        "beside the plan) throttles any entity in more than this share of its active "
                        "seconds (default 0.5)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="apply", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", type=Path, required=True, help="plan.json written by recommend")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--apply", action="store_true", help="write the changes (default: dry run)")
    mode.add_argument("--validate-only", action="store_true",
                      help="send the changes with validate_only: checked by the server, not written")
    p.add_argument("--force", action="store_true",
                   help="apply even where the quota changed since the plan, or the simulation throttles "
                        "more than --max-throttled-share")
    add_max_throttled_share(p)
    common.add_admin_args(p, required=True)
    return p


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    changes: list[Change]
    skipped: list[Skipped]
    results: list[AlterResult]
    mode: str  # dry-run | validate-only | apply

    @property
    def failed(self) -> list[AlterResult]:
        return [r for r in self.results if not r.ok]


class TooThrottledError(ValueError):
    """The plan's simulation throttles some entity too much (and --force was not given)."""


def check_simulation(args: argparse.Namespace) -> None:
    """Refuse a plan whose simulation throttles an entity in more than --max-throttled-share of
    its active seconds, naming each and why; --force goes ahead."""
    from spark_analytics.simulate import too_throttled

    if not 0 <= args.max_throttled_share <= 1:
        raise common.UsageError(f"--max-throttled-share must be in [0, 1], got {args.max_throttled_share}")
    sim = read_simulation(args.plan)
    if sim is None or args.force:
        return
    over = too_throttled(sim, args.max_throttled_share)
    if over:
        raise TooThrottledError(
            "the plan's simulation throttles "
            + ("this entity" if len(over) == 1 else f"{len(over)} entities")
            + " too often:\n  " + "\n  ".join(over)
            + "\nraise those quotas, pass a larger --max-throttled-share, or --force")


def run(args: argparse.Namespace, out: TextIO | None = None) -> ApplyOutcome:
    out = out if out is not None else sys.stdout
    plan = read_plan(args.plan)
    check_simulation(args)
    mode = "apply" if args.apply else "validate-only" if args.validate_only else "dry-run"
    with common.quota_client(args) as client:
        changes, skipped = diff(plan, client.describe(), force=args.force)
        print(format_changes(changes, skipped), file=out)
        results: list[AlterResult] = []
        if changes and mode != "dry-run":
            results = client.alter(operations(changes), validate_only=mode == "validate-only")
    for r in results:
        status = "ok" if r.ok else f"error {r.error_code}: {r.error_message}"
        print(f"{mode}: {r.entity}: {status}", file=out)
    if mode == "dry-run" and changes:
        print(f"dry run: {len(changes)} change(s) not written; add --apply to write them", file=out)
    return ApplyOutcome(changes, skipped, results, mode)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        outcome = run(args)
    except common.UsageError as exc:
        parser.error(str(exc))
    except (PlanError, QuotaAdminError, TooThrottledError) as exc:
        print(f"apply: {exc}", file=sys.stderr)
        return 1
    return 1 if outcome.failed else 0


# ------------------------------------------------------------------------------ describe

def build_describe_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="describe", description="Print the configured client quotas as JSON "
                                "(the --current-quotas format of recommend).")
    p.add_argument("--out", type=Path, help="write to this file instead of stdout")
    common.add_admin_args(p, required=True)
    return p


def describe_main(argv: list[str] | None = None) -> int:
    parser = build_describe_parser()
    args = parser.parse_args(argv)
    try:
        with common.quota_client(args) as client:
            entries = client.describe()
    except common.UsageError as exc:
        parser.error(str(exc))
    except QuotaAdminError as exc:
        print(f"describe: {exc}", file=sys.stderr)
        return 1
    text = json.dumps([{"entity": e.entity, "values": dict(e.values)} for e in entries], indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

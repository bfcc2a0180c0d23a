"""`sluice tune ...`: the analytics jobs on the command line.

The lead registers this group under the `sluice` entry point by importing `spark_analytics.cli:tune`
lazily. Each subcommand hands its arguments unchanged to the job module's `main` (argparse there,
so `spark-submit spark_analytics/jobs/<job>.py` takes exactly the same options), adding
`--master local[*]` unless one is given. `sluice tune recommend --help` shows the job's options.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import click

DEFAULT_MASTER = "local[*]"
_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def _with_master(args: Sequence[str]) -> list[str]:
    argv = list(args)
    if "-h" in argv or "--help" in argv:
        return argv
    if not any(a == "--master" or a.startswith("--master=") for a in argv):
        argv += ["--master", DEFAULT_MASTER]
    return argv


def _run(main: Callable[[list[str]], int], argv: list[str]) -> None:
    code = main(argv)
    if code:
        sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def tune() -> None:
    """Learn quotas from Sluice's access logs with Spark, and apply them.

    \b
    report     usage per quota entity and client: rates, percentiles, throttling, top talkers, plots
    recommend  a plan of current and recommended quotas per entity, with the reason for each
    simulate   replay the recorded traffic through a plan: who it throttles, how often, how long
    apply      send the plan to Sluice with AlterClientQuotas (dry run unless --apply)
    run        all three, one Spark session
    describe   print the configured quotas as JSON

    Spark jobs run on local[*] unless --master says otherwise. `sluice tune COMMAND --help` lists
    a command's options.
    """


@tune.command(context_settings=_PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def report(args: tuple[str, ...]) -> None:
    """Usage report (spark_analytics/jobs/usage_report.py)."""
    from spark_analytics.jobs import usage_report

    _run(usage_report.main, _with_master(args))


@tune.command(context_settings=_PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def recommend(args: tuple[str, ...]) -> None:
    """Quota plan (spark_analytics/jobs/recommend.py)."""
    from spark_analytics.jobs import recommend as job

    _run(job.main, _with_master(args))


@tune.command(context_settings=_PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def simulate(args: tuple[str, ...]) -> None:
    """What a plan would do to the recorded traffic (spark_analytics/jobs/simulate.py)."""
    from spark_analytics.jobs import simulate as job

    _run(job.main, _with_master(args))


@tune.command(context_settings=_PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def apply(args: tuple[str, ...]) -> None:
    """Apply a plan (spark_analytics/jobs/apply.py); no Spark."""
    from spark_analytics.jobs import apply as job

    _run(job.main, list(args))


@tune.command(context_settings=_PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(args: tuple[str, ...]) -> None:
    """Report, recommend and apply (spark_analytics/jobs/tune.py)."""
    from spark_analytics.jobs import tune as job

    _run(job.main, _with_master(args))


@tune.command(context_settings=_PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def describe(args: tuple[str, ...]) -> None:
    """Configured quotas as JSON (the --current-quotas format)."""
    from spark_analytics.jobs import apply as job

    _run(job.describe_main, list(args))


if __name__ == "__main__":
    tune()

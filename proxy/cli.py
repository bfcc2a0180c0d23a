"""The `sluice` command line."""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import sys
from pathlib import Path
from typing import Any

import click

from proxy.config import ConfigError, ProxyConfig, load_config


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sluice")
def main() -> None:
    """Sluice: a Kafka-protocol throttling proxy with Kafka's quota semantics."""


@main.command()
@click.option("--upstream", metavar="HOST:PORT[,HOST:PORT...]", help="bootstrap brokers behind Sluice")
@click.option("--listen", metavar="HOST:PORT", help="bootstrap listener for clients [127.0.0.1:9092]")
@click.option("--advertised-host", metavar="HOST", help="host clients are told to connect to")
@click.option("--broker-port-base", type=int, help="per-broker listener port = base + node id")
@click.option("--metrics-port", type=int, help="Prometheus /metrics and /healthz port")
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="YAML configuration file")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@click.option("--reseed", is_flag=True, help="replace the quota store's contents with the YAML quotas")
@click.option("--workers", metavar="N|auto", help="worker processes sharing every listener [1]")
def proxy(upstream: str | None, listen: str | None, advertised_host: str | None,
          broker_port_base: int | None, metrics_port: int | None, config_file: Path | None,
          log_level: str | None, reseed: bool = False, workers: str | None = None) -> None:
    """Run the proxy in front of the brokers."""
    overrides: dict[str, Any] = {}
    if upstream:
        overrides["upstream"] = {"bootstrap": upstream}
    if listen:
        overrides["listen"] = listen
    if advertised_host:
        overrides["advertised_host"] = advertised_host
    if broker_port_base is not None:
        overrides["broker_port_base"] = broker_port_base
    if metrics_port is not None:
        overrides["metrics"] = {"port": metrics_port}
    if log_level:
        overrides["log_level"] = log_level
    if workers is not None:
        overrides["workers"] = workers  # validated with the rest: `auto`, or an integer >= 1
    if reseed:
        overrides["store"] = {"reseed": True}  # at start only: a SIGHUP reload never reseeds
    try:
        config = load_config(config_file, overrides)
    except ConfigError as exc:
        click.echo(f"sluice: {exc}", err=True)
        sys.exit(2)
    from proxy.app import run

    # `kill -USR1 <pid>`: every thread's stack on stderr, to see where a stuck process is (not
    # where there is no stderr file, e.g. under a test runner that captures it)
    if sys.__stderr__ is not None:
        with contextlib.suppress(ValueError, OSError):
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)

    def reload() -> ProxyConfig:
        return load_config(config_file, overrides)

    sys.exit(run(config, reload if config_file is not None else None))


def _register_plugins() -> None:
    """Commands other packages add to `sluice` (the `sluice.commands` entry-point group), e.g.
    `sluice tune` from `spark_analytics`, so the proxy never imports the analytics package."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="sluice.commands"):
        main.add_command(ep.load(), ep.name)


_register_plugins()


def _register_quotas() -> None:
    """`sluice quotas ...`: list, describe, alter over the Kafka protocol."""
    from proxy.admin.cli import quotas

    main.add_command(quotas)


_register_quotas()


def _register_connections() -> None:
    """`sluice connections`: the open client connections, from the metrics port's /connections."""
    from proxy.ops.connections_cli import connections

    main.add_command(connections)


_register_connections()

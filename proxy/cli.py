"""The `sluice` command line."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sluice")
def main() -> None:
    """Sluice: a Kafka-protocol throttling proxy with Kafka's quota semantics."""

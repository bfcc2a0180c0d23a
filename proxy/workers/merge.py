"""One `/metrics` for the instance: every worker's exposition merged, each sample labelled `worker`.

A pure function over texts so that it can be tested without processes. Families keep the order in
which they first appear; each is written once (one HELP and one TYPE), with the samples of every
worker in worker order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

WORKER_LABEL = "worker"


def merge_expositions(expositions: Mapping[int, str]) -> list[Metric]:
    """Worker index -> its Prometheus text exposition  =>  merged metric families."""
    merged: dict[str, Metric] = {}
    for index in sorted(expositions):
        for family in text_string_to_metric_families(expositions[index]):
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(family.name, family.documentation, family.type,
                                                      family.unit)
            for sample in family.samples:
                labels = {**sample.labels, WORKER_LABEL: str(index)}
                target.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
    return list(merged.values())


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def render(families: Iterable[Metric], *registries: CollectorRegistry) -> bytes:
    """Prometheus text of `families` followed by what `registries` hold."""
    out = CollectorRegistry(auto_describe=False)
    out.register(_Families(families))
    text = generate_latest(out)
    return text + b"".join(generate_latest(r) for r in registries)

"""/metrics for per-broker listeners whose deterministic port could not be bound (issue 14).

``sluice_broker_listener_bind_failed{broker, wanted_port}`` is 1 for such a broker, and
``sluice_broker_listener_port{broker}`` is the port it is served on instead (0: none yet).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.pumps.upstreams import BrokerRegistry


class BrokerListenerCollector(Collector):
    def __init__(self, registry: BrokerRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        failed = GaugeMetricFamily("sluice_broker_listener_bind_failed",
                                   "1 for a broker whose per-broker port could not be bound",
                                   labels=["broker", "wanted_port"])
        instead = GaugeMetricFamily("sluice_broker_listener_port",
                                    "The port a broker is served on instead of its per-broker port (0: none)",
                                    labels=["broker"])
        for f in list(self._registry.bind_failures.values()):
            failed.add_metric([str(f.node_id), str(f.wanted_port)], 1.0)
            instead.add_metric([str(f.node_id)], f.port_in_use)
        yield failed
        yield instead

"""What the quota engine needs of the ``quotas:`` section's pluggable parts, once loaded: the
scope, a factory for the callback (None: Kafka's `DefaultQuotaCallback`) and ``cluster_entries``.

The proxy loads the callback class (`proxy.stages.callbacks.QuotaPlugins.load`, a subclass that
adds the loader); the engine only calls the factory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quotas.callback import QuotaCallback
from quotas.config import QuotaConfig
from quotas.section import DEFAULT_CALLBACK, Scope

CallbackFactory = Callable[[int | None], QuotaCallback]


@dataclass(frozen=True)
class Plugins:
    """The loaded scope, callback and ``cluster_entries``."""

    scope: Scope = "broker"
    class_path: str = DEFAULT_CALLBACK
    config: Mapping[str, Any] = field(default_factory=dict)
    factory: CallbackFactory | None = None  # None: Kafka's DefaultQuotaCallback, the fast path
    cluster_entries: QuotaConfig | None = None  # the draft's `bps`: one budget across all brokers

    @property
    def is_default(self) -> bool:
        return self.factory is None

    def same_callback(self, other: Plugins) -> bool:
        return self.class_path == other.class_path and dict(self.config) == dict(other.config)

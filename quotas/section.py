"""The whole ``quotas:`` section, typed and parsed once.

One pydantic model (`QuotasModel`) checks the section's structure; `QuotasSection.parse` turns it
into the frozen values every part of Sluice reads: the client entries (`QuotaConfig`), KIP-612's
per-IP ``connection_creation_rate`` entries, the quota ``scope``, the callback's class path and
config (a `CallbackSpec`: a name, never an imported class), and ``cluster_entries`` (the
quota-native draft's ``bps``: one budget across every broker). Every problem is reported at once,
each named by its full key path (``quotas.entries[2].producer_byte_rate: must be > 0``).

Parsing never imports the callback class: the proxy loads it once at start and once per reload
(`proxy.stages.callbacks.QuotaPlugins.load`), so a configuration can be checked without running
the user's code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from quotas.config import QuotaConfig, _pydantic_problems
from quotas.connection_limits import CONNECTION_CREATION_RATE, split_ip_entries
from quotas.errors import QuotaConfigError

DEFAULT_CALLBACK = "quotas.callback:DefaultQuotaCallback"
Scope = Literal["broker", "cluster"]


class CallbackModel(BaseModel):
    """The quota callback (KIP-257's ClientQuotaCallback in Python): what shares a rate and its limit."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    class_: str = Field(default=DEFAULT_CALLBACK, alias="class", pattern=r"^[\w.]+:[\w.]+$",
                        description="\"package.module:Class\", any importable class")
    config: dict[str, Any] = Field(default={}, description="keyword arguments of the class")


class QuotasModel(BaseModel):
    """The structure of the ``quotas:`` section. Entries stay plain here: ip entries and client
    entries share the list and are told apart by `QuotasSection.parse`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    shadow: bool = False
    window: dict[str, Any] = {}
    rate_model: Literal["windowed", "token_bucket"] = "windowed"
    burst_ms: int | None = None
    entries: list[Any] = []
    scope: Scope = Field(default="broker", description="broker: a budget per broker (Kafka's); cluster: one "
                                                       "across every broker behind Sluice")
    callback: CallbackModel = CallbackModel()
    cluster_entries: list[Any] = Field(default=[], description="entries shaped as quotas.entries, each a "
                                                               "budget across all brokers, beside the "
                                                               "per-broker entries")


@dataclass(frozen=True)
class CallbackSpec:
    """Which `QuotaCallback` class to use and its keyword config (not imported here)."""

    class_path: str = DEFAULT_CALLBACK
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_default(self) -> bool:
        return self.class_path == DEFAULT_CALLBACK and not self.config


@dataclass(frozen=True)
class QuotasSection:
    """The ``quotas:`` section, parsed: what enforcement, the store seed, the connection limiter
    and the callback loader read."""

    entries: QuotaConfig = field(default_factory=QuotaConfig)
    ip_connection_rates: Mapping[str, float] = field(default_factory=dict)
    scope: Scope = "broker"
    callback: CallbackSpec = field(default_factory=CallbackSpec)
    cluster_entries: QuotaConfig | None = None

    @classmethod
    def parse(cls, data: object, path: str = "quotas") -> QuotasSection:
        """Raises `QuotaConfigError` naming every bad key of the section."""
        try:
            model = QuotasModel.model_validate({} if data is None else data)
        except pydantic.ValidationError as exc:
            raise QuotaConfigError.of(_pydantic_problems(exc, path)) from None
        raw = model.model_dump(exclude={"scope", "callback", "cluster_entries"}, exclude_unset=True)
        problems: list[tuple[str, str]] = []
        rates: dict[str, float] = {}
        entries = QuotaConfig()
        try:
            rates, raw = split_ip_entries(raw, path=path)
        except QuotaConfigError as exc:  # the client entries are still checked, for one full report
            problems.extend(exc.problems)
            raw = {**raw, "entries": [e for e in raw.get("entries", []) if not _is_ip_entry(e)]}
        try:
            entries = QuotaConfig.from_dict(raw, path=path)
        except QuotaConfigError as exc:
            problems.extend(exc.problems)
        cluster: QuotaConfig | None = None
        if model.cluster_entries:
            # the section's window and rate model: one rate model per budget, whatever its entry list
            data_cluster: dict[str, Any] = {"entries": model.cluster_entries}
            for key in ("window", "rate_model", "burst_ms"):
                if key in raw:
                    data_cluster[key] = raw[key]
            try:
                cluster = QuotaConfig.from_dict(data_cluster, path=path)
            except QuotaConfigError as exc:
                problems.extend((key.replace(f"{path}.entries", f"{path}.cluster_entries", 1), reason)
                                for key, reason in exc.problems)
        if problems:
            raise QuotaConfigError.of(problems)
        spec = CallbackSpec(model.callback.class_, dict(model.callback.config))
        return cls(entries, rates, model.scope, spec, cluster)


def _is_ip_entry(entry: object) -> bool:
    return isinstance(entry, Mapping) and ("ip" in entry or CONNECTION_CREATION_RATE in entry)

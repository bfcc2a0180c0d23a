"""Pluggable quota logic: the callback class path, the quota scope, and cluster metadata for
callbacks that want it.

YAML (``quotas:`` section, beside ``entries``)::

    scope: broker                 # broker (Kafka's: one budget per broker) | cluster (one for all)
    callback:
      class: "quotas.builtin:GroupQuotaCallback"     # "package.module:Class"
      config: {groups: [{name: payments, users: [alice, bob], producer_byte_rate: 1048576}]}

The class is instantiated as ``cls(broker_id=..., **config)`` once per quota manager. SIGHUP with
a different class or config swaps the callback on every manager (`QuotaManager.set_callback`);
a class that cannot be imported or rejects its config keeps the running one, with an error line.

Metadata responses are decoded only while the active callback declares
``wants_cluster_metadata = True``, after the response has been passed on (``call_soon``), and only
when its bytes (past the correlation id) differ from the last ones seen: a client polling
metadata of an unchanged cluster costs a hash of the response per poll.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from protocol.apis import ApiKey
from protocol.encode import decode_response_body
from protocol.errors import ProtocolError
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, ResponseOutcome, StageBase
from quotas.callback import DefaultQuotaCallback, QuotaCallback
from quotas.cluster import ClusterView
from quotas.config import QuotaConfig, _pydantic_problems
from quotas.errors import QuotaConfigError

log = logging.getLogger("sluice.quotas")

DEFAULT_CALLBACK = "quotas.callback:DefaultQuotaCallback"
PLUGIN_KEYS = ("callback", "scope", "cluster_entries")

CallbackFactory = Callable[[int | None], QuotaCallback]

_UNKNOWN_TOPIC_OR_PARTITION = 3


class _CallbackModel(BaseModel):
    """The quota callback (KIP-257's ClientQuotaCallback in Python): what shares a rate and its limit."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    class_: str = Field(default=DEFAULT_CALLBACK, alias="class", pattern=r"^[\w.]+:[\w.]+$",
                        description="\"package.module:Class\", any importable class")
    config: dict[str, Any] = Field(default={}, description="keyword arguments of the class")


class _PluginsModel(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    scope: Literal["broker", "cluster"] = Field(default="broker", description="broker: a budget per broker "
                                                "(Kafka's); cluster: one across every broker behind Sluice")
    callback: _CallbackModel = _CallbackModel()
    cluster_entries: list[Any] = Field(default=[], description="entries shaped as quotas.entries, each a "
                                                               "budget across all brokers, beside the "
                                                               "per-broker entries")


@dataclass(frozen=True)
class QuotaPlugins:
    """The ``scope`` and ``callback`` of the ``quotas`` section, validated (class imported and
    instantiated once)."""

    scope: Literal["broker", "cluster"] = "broker"
    class_path: str = DEFAULT_CALLBACK
    config: Mapping[str, Any] = field(default_factory=dict)
    factory: CallbackFactory | None = None  # None: Kafka's DefaultQuotaCallback, the fast path
    cluster_entries: QuotaConfig | None = None  # the draft's `bps`: one budget across all brokers

    @property
    def is_default(self) -> bool:
        return self.factory is None

    def same_callback(self, other: QuotaPlugins) -> bool:
        return self.class_path == other.class_path and dict(self.config) == dict(other.config)

    @classmethod
    def from_dict(cls, quotas: Mapping[str, Any], path: str = "quotas") -> QuotaPlugins:
        try:
            model = _PluginsModel.model_validate(dict(quotas))
        except pydantic.ValidationError as exc:
            problems = [(k, r) for k, r in _pydantic_problems(exc, path)
                        if k.startswith((f"{path}.scope", f"{path}.callback"))]
            raise QuotaConfigError.of(problems or _pydantic_problems(exc, path)) from None
        spec = model.callback
        cluster_entries = _cluster_entries(quotas, path) if model.cluster_entries else None
        if spec.class_ == DEFAULT_CALLBACK and not spec.config:
            return cls(model.scope, spec.class_, {}, None, cluster_entries)
        klass = load_class(spec.class_, f"{path}.callback.class")
        config = dict(spec.config)

        def factory(broker_id: int | None) -> QuotaCallback:
            callback: QuotaCallback = klass(broker_id=broker_id, **config)
            return callback

        try:
            probe = factory(None)
        except QuotaConfigError:
            raise
        except TypeError as exc:
            raise QuotaConfigError(f"{path}.callback.config", f"{spec.class_} rejects it: {exc}") from None
        if not isinstance(probe, QuotaCallback):
            raise QuotaConfigError(f"{path}.callback.class",
                                   f"{spec.class_} is not a QuotaCallback (see quotas.callback)")
        probe.close()
        if isinstance(probe, DefaultQuotaCallback):
            return cls(model.scope, spec.class_, config, None, cluster_entries)
        return cls(model.scope, spec.class_, config, factory, cluster_entries)


def _cluster_entries(quotas: Mapping[str, Any], path: str) -> QuotaConfig:
    """``cluster_entries``: entries in the draft's `bps` unit (one budget per entity across every
    broker behind this Sluice), enforced beside ``entries`` (`broker_bps`, Kafka's per broker);
    whichever limit is hit first throttles. Same shape as ``entries``; the same window."""
    data: dict[str, Any] = {"entries": quotas["cluster_entries"]}
    if "window" in quotas:
        data["window"] = quotas["window"]
    try:
        return QuotaConfig.from_dict(data, path=path)
    except QuotaConfigError as exc:
        raise QuotaConfigError.of([(key.replace(f"{path}.entries", f"{path}.cluster_entries", 1), reason)
                                   for key, reason in exc.problems]) from None


def load_class(class_path: str, where: str) -> Any:
    module_name, _, attr = class_path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise QuotaConfigError(where, f"cannot import {module_name}: {exc}") from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise QuotaConfigError(where, f"{module_name} has no {attr}")
    if not callable(target):
        raise QuotaConfigError(where, f"{class_path} is not a class")
    return target


class ClusterMetadataFeed:
    """Turns Metadata responses into `ClusterView`s for the quota managers."""

    def __init__(self, apply: Callable[[ClusterView], None], wanted: Callable[[], bool],
                 recent: int = 64) -> None:
        self._apply = apply
        self._wanted = wanted
        self._recent: OrderedDict[bytes, None] = OrderedDict()
        self._limit = recent
        self.view = ClusterView()
        self.decoded = 0

    def seen(self, api_version: int, payload: bytes) -> bool:
        """Hash `payload`; True (and remembered) if it is new, i.e. worth decoding."""
        digest = hashlib.blake2b(memoryview(payload)[4:], digest_size=16).digest()
        if digest in self._recent:
            self._recent.move_to_end(digest)
            return False
        self._recent[digest] = None
        if len(self._recent) > self._limit:
            self._recent.popitem(last=False)
        return True

    def feed(self, api_version: int, payload: bytes) -> None:
        """Decode one Metadata response and apply the merged view if it changed."""
        if not self._wanted():
            return
        try:
            body = decode_response_body(payload, ApiKey.METADATA, api_version)
        except ProtocolError as exc:
            log.warning("cannot read Metadata v%d response for the quota callback: %s", api_version, exc)
            return
        self.decoded += 1
        seen: dict[str, list[tuple[int, int]]] = {}
        gone: list[str] = []
        for topic in body.topics:
            name = topic.name
            if name is None:
                continue
            if topic.error_code == _UNKNOWN_TOPIC_OR_PARTITION:
                gone.append(str(name))
            elif topic.error_code == 0:
                seen[str(name)] = [(int(p.partition_index), int(p.leader_id)) for p in topic.partitions]
        view = self.view.merged(seen, gone)
        if view is not self.view:
            self.view = view
            self._apply(view)

    def forget(self) -> None:
        """Decode the next responses again (a new callback must be told the cluster)."""
        self._recent.clear()


class ClusterMetadataStage(StageBase):
    """Feeds Metadata responses to `ClusterMetadataFeed`, after the response has gone on."""

    def __init__(self, feed: ClusterMetadataFeed, wanted: Callable[[], bool]) -> None:
        self._feed = feed
        self._wanted = wanted

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        if entry.api_key != ApiKey.METADATA or not self._wanted():
            return None
        if self._feed.seen(entry.api_version, payload):
            asyncio.get_running_loop().call_soon(self._feed.feed, entry.api_version, bytes(payload))
        return None

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
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from protocol.apis import ApiKey
from protocol.encode import decode_response_body
from protocol.errors import ProtocolError
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, ResponseOutcome, StageBase
from quotas.callback import DefaultQuotaCallback, QuotaCallback
from quotas.cluster import ClusterView
from quotas.errors import QuotaConfigError
from quotas.plugins import CallbackFactory as CallbackFactory
from quotas.plugins import Plugins
from quotas.section import DEFAULT_CALLBACK as DEFAULT_CALLBACK
from quotas.section import QuotasSection

log = logging.getLogger("sluice.quotas")






@dataclass(frozen=True)
class QuotaPlugins(Plugins):
    """`quotas.plugins.Plugins` with its loader: the callback class imported and instantiated
    once, at start and at each reload (`load`)."""

    @classmethod
    def from_dict(cls, quotas: Mapping[str, Any], path: str = "quotas") -> QuotaPlugins:
        """Parse the section and load its callback (`QuotasSection.parse`, then `load`)."""
        return cls.load(QuotasSection.parse(dict(quotas), path), path)

    @classmethod
    def load(cls, section: QuotasSection, path: str = "quotas") -> QuotaPlugins:
        """Import the section's callback class and check it by building one instance: at start and
        at each reload, never when a configuration is only validated."""
        spec = section.callback
        cluster_entries = section.cluster_entries
        if spec.is_default:
            return cls(section.scope, spec.class_path, {}, None, cluster_entries)
        klass = load_class(spec.class_path, f"{path}.callback.class")
        config = dict(spec.config)

        def factory(broker_id: int | None) -> QuotaCallback:
            callback: QuotaCallback = klass(broker_id=broker_id, **config)
            return callback

        try:
            probe = factory(None)
        except QuotaConfigError:
            raise
        except TypeError as exc:
            raise QuotaConfigError(f"{path}.callback.config",
                                   f"{spec.class_path} rejects it: {exc}") from None
        if not isinstance(probe, QuotaCallback):
            raise QuotaConfigError(f"{path}.callback.class",
                                   f"{spec.class_path} is not a QuotaCallback (see quotas.callback)")
        probe.close()
        if isinstance(probe, DefaultQuotaCallback):
            return cls(section.scope, spec.class_path, config, None, cluster_entries)
        return cls(section.scope, spec.class_path, config, factory, cluster_entries)


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
            if topic.error_code == ErrorCode.unknown_topic_or_partition:
                gone.append(str(name))
            elif topic.error_code == ErrorCode.none:
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

    def handles(self, hook: str, api_key: int, api_version: int) -> bool:
        return api_key == ApiKey.METADATA  # whether it is `wanted` changes at run time: asked per response

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        if entry.api_key != ApiKey.METADATA or not self._wanted():
            return None
        if self._feed.seen(entry.api_version, payload):
            asyncio.get_running_loop().call_soon(self._feed.feed, entry.api_version, bytes(payload))
        return None

"""Control-plane response rewrites: broker addresses and ApiVersions caps.

Only these responses are walked (by `protocol.rewrite`, `protocol.share` and `protocol.fetch_tail`,
which re-encode just the host and port of each broker entry and copy every other byte, unknown
tagged fields included); everything else passes through as bytes. A response Sluice cannot decode
is forwarded unchanged with a warning: never dropped, never fatal to the connection.

Where brokers tell clients of other brokers, all rewritten:

- Metadata, FindCoordinator (v4+ batched), DescribeCluster;
- Produce v10+ and Fetch v16+: the new leader's endpoint after NOT_LEADER_OR_FOLLOWER (KIP-951).
  A Fetch response small enough to be buffered is rewritten here; a large one streams and its
  tag section is rewritten at the end, to its own length (`proxy.pumps.connection`,
  `protocol.fetch_tail`);
- ShareFetch and ShareAcknowledge (KIP-932): their node_endpoints.

ApiVersions advertises, per API, what `protocol.versions.API_POLICIES` says (and why): APIs whose
responses Sluice must rewrite, read, answer or patch are capped at the versions whose layout it
knows; the rest pass in every version the broker offers. An API or version Sluice has never seen
is logged once and passed through, never removed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from contracts.compiled import choose
from protocol.apis import ApiKey, api_name
from protocol.errors import ProtocolError
from protocol.fastpath import FetchTailFinder, node_endpoints_absent
from protocol.fetch_tail import fit_tail
from protocol.rewrite import (
    AddressMapper,
    BrokerAddress,
    cap_api_versions_response,
    read_api_versions_entries,
    rewrite_describe_cluster_response,
    rewrite_fetch_response_node_endpoints,
    rewrite_find_coordinator_response,
    rewrite_metadata_response,
    rewrite_produce_response_node_endpoints,
)
from protocol.share import rewrite_share_acknowledge_response, rewrite_share_fetch_response
from protocol.versions import VERSION_CAPS, unverified_versions
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, ResponseOutcome, StageBase
from proxy.pumps.upstreams import BrokerRegistry

log = logging.getLogger("sluice.rewrite")

_CHOICE: Final = choose("proxy.stages._speedups", ("RewriteHooks",))
RewriteHooksImpl: Final = None if _CHOICE.active is None else _CHOICE.active.RewriteHooks
"""The compiled response hook (`proxy/stages/_speedups.pyx`) a stage installs in place of its own, or None."""
describe: Final = _CHOICE.describe

AddressRewrite = Callable[[bytes, int, AddressMapper], tuple[bytes, list[BrokerAddress]]]

_ADDRESS_REWRITES: dict[int, AddressRewrite] = {
    ApiKey.METADATA: rewrite_metadata_response,
    ApiKey.FIND_COORDINATOR: rewrite_find_coordinator_response,
    ApiKey.DESCRIBE_CLUSTER: rewrite_describe_cluster_response,
    ApiKey.PRODUCE: rewrite_produce_response_node_endpoints,
    ApiKey.FETCH: rewrite_fetch_response_node_endpoints,
    ApiKey.SHARE_FETCH: rewrite_share_fetch_response,
    ApiKey.SHARE_ACKNOWLEDGE: rewrite_share_acknowledge_response,
}

REWRITTEN_APIS = frozenset({*_ADDRESS_REWRITES, ApiKey.API_VERSIONS})

DEFAULT_VERSION_CAPS: dict[int, int] = dict(VERSION_CAPS)
_FETCH_NODE_ENDPOINTS_SINCE = 16
_PRODUCE_NODE_ENDPOINTS_SINCE = 10


class ResponseRewriter:
    def __init__(self, registry: BrokerRegistry, version_caps: dict[int, int] | None = None,
                 on_failure: Callable[[], None] | None = None) -> None:
        self._registry = registry
        self._caps = dict(DEFAULT_VERSION_CAPS if version_caps is None else version_caps)
        self._on_failure = on_failure
        # ApiVersions answers from one cluster are all alike but for the correlation id: cap once
        self._api_versions_cache: dict[tuple[int, bytes], bytes] = {}
        self._noted: set[tuple[int, int]] = set()

    def outcome(self, entry: InFlight, payload: bytes) -> ResponseOutcome:
        """The rewritten response; for the head of a streamed Fetch v16+, the head as it is and the
        `tail` that rewrites its end."""
        if len(payload) < entry.upstream_response_bytes:  # the head of a streamed response
            tail = self.streamed_fetch(entry.api_version) if entry.api_key == ApiKey.FETCH else None
            return ResponseOutcome(payload, tail=tail)
        return ResponseOutcome(self.rewrite(entry.api_key, entry.api_version, payload))

    def rewrite(self, api_key: int, api_version: int, payload: bytes, whole: bool = True) -> bytes:
        """The response to send; `whole` is False for the head of a streamed Fetch response, whose
        tag section is rewritten when it arrives (`StreamedFetchTail`)."""
        try:
            if api_key == ApiKey.API_VERSIONS:
                return self._cap_api_versions(payload, api_version)
            rewrite = _ADDRESS_REWRITES.get(api_key)
            if rewrite is None or not whole:
                return payload
            new_payload, _original = rewrite(payload, api_version, self._registry.advertise)
            return new_payload
        except ProtocolError as exc:
            if self._on_failure is not None:
                self._on_failure()
            log.warning("forwarding %s v%d response unchanged: %s", api_name(api_key), api_version, exc)
            return payload

    def _cap_api_versions(self, payload: bytes, api_version: int) -> bytes:
        key = (api_version, payload[4:])
        capped = self._api_versions_cache.get(key)
        if capped is None:
            self._note_unverified(payload, api_version)
            capped = cap_api_versions_response(payload, api_version, self._caps)[4:]
            if len(self._api_versions_cache) >= 64:
                self._api_versions_cache.clear()
            self._api_versions_cache[key] = capped
        return payload[:4] + capped

    def _note_unverified(self, payload: bytes, api_version: int) -> None:
        """Log once per (API, version range) what passes through without Sluice knowing it."""
        try:
            entries = read_api_versions_entries(payload, api_version)
        except ProtocolError:
            return  # cap_api_versions_response reports it
        for api_key, _min_version, max_version in entries:
            note = unverified_versions(api_key, max_version)
            if note is not None and (api_key, max_version) not in self._noted:
                self._noted.add((api_key, max_version))
                log.info("ApiVersions: %s: %s", api_name(api_key), note)

    def streamed_fetch(self, api_version: int) -> StreamedFetchTail | None:
        """The tail rewrite of a Fetch response that streams, or None if its version has no
        leader endpoints (before v16)."""
        if api_version < _FETCH_NODE_ENDPOINTS_SINCE:
            return None
        return StreamedFetchTail(self, api_version)

    def fit_fetch_tail(self, tail: bytes) -> bytes:
        try:
            fitted, original, kept = fit_tail(tail, self._registry.advertise)
        except ProtocolError as exc:
            if self._on_failure is not None:
                self._on_failure()
            log.warning("forwarding the tags of a streamed Fetch response unchanged: %s", exc)
            return tail
        if not kept:
            log.info("streamed Fetch response: the leader endpoints of %s do not fit in place; left out "
                     "(the client asks for Metadata instead)", ", ".join(str(a.node_id) for a in original))
        return fitted


class StreamedFetchTail:
    """One Fetch v16+ response on its way through: everything but the top-level tag section goes
    out as it arrives; the tag section is held, then rewritten to its own length, so the size
    prefix already sent stays right (`protocol.fetch_tail` says how)."""

    __slots__ = ("_finder", "_rewriter", "feed")

    def __init__(self, rewriter: ResponseRewriter, api_version: int) -> None:
        self._rewriter = rewriter
        self._finder = FetchTailFinder(api_version)
        # how many leading bytes of a chunk may go to the client now (the rest is held): the
        # finder's own `feed`, bound once, so that a chunk costs no call of this object's own
        self.feed: Callable[[bytes | bytearray | memoryview], int] = self._finder.feed

    def finish(self) -> bytes:
        """The held bytes, rewritten: to be sent after the last chunk."""
        tail = bytes(self._finder.tail)
        if not self._finder.found:
            return tail  # malformed: what was held (nothing) goes as it is
        return self._rewriter.fit_fetch_tail(tail)


class RewriteStage(StageBase):
    """The pipeline's stage for the rewrites above: broker addresses and ApiVersions caps in
    control-plane responses; every other response passes untouched."""

    def __init__(self, rewriter: ResponseRewriter) -> None:
        self._rewriter = rewriter
        if RewriteHooksImpl is not None:  # the same hook compiled, for the responses it leaves alone
            self.on_response = RewriteHooksImpl(self, RewriteStage).on_response  # type: ignore[method-assign]

    def handles(self, hook: str, api_key: int, api_version: int) -> bool:
        """Only the responses above; Produce before v10 and Fetch before v16 carry no leader
        endpoints (their rewrites return the payload as it is)."""
        if api_key == ApiKey.PRODUCE:
            return api_version >= _PRODUCE_NODE_ENDPOINTS_SINCE
        if api_key == ApiKey.FETCH:
            return api_version >= _FETCH_NODE_ENDPOINTS_SINCE
        return api_key in REWRITTEN_APIS

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        api_key = entry.api_key
        if api_key not in REWRITTEN_APIS:
            return None
        if ((api_key == ApiKey.PRODUCE or api_key == ApiKey.FETCH)
                and len(payload) == entry.upstream_response_bytes
                and node_endpoints_absent(payload, api_key, entry.api_version)):
            return None  # a whole response with no leader endpoints, nearly every one: nothing to map
        return self._rewriter.outcome(entry, payload)

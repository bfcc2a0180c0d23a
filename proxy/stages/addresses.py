"""Control-plane response rewrites: broker addresses and ApiVersions caps.

Only these responses are walked (by `protocol.rewrite`, which re-encodes just the host and port
of each broker entry and copies every other byte, unknown tagged fields included); everything
else passes through as bytes. A response Sluice cannot decode is forwarded unchanged with a
warning: never dropped, never fatal to the connection.

Where brokers tell clients of other brokers:

- Metadata, FindCoordinator (v4+ batched), DescribeCluster: rewritten;
- Produce v10+: the new leader's endpoint after NOT_LEADER_OR_FOLLOWER (KIP-951): rewritten;
- Fetch v16+ carries the same; Sluice advertises Fetch up to v15 instead, so Fetch responses
  (the bulk of the bytes) never need walking and can be streamed;
- ShareFetch / ShareAcknowledge (KIP-932) carry endpoints Sluice does not rewrite: they are
  removed from ApiVersions, so clients do not use share groups through Sluice.

ApiVersions is also capped at the versions Sluice can parse, so a newer broker never sends it a
version it cannot read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from protocol.apis import ApiKey, api_name
from protocol.errors import ProtocolError
from protocol.rewrite import (
    PARSEABLE_MAX_VERSIONS,
    AddressMapper,
    BrokerAddress,
    cap_api_versions_response,
    rewrite_describe_cluster_response,
    rewrite_find_coordinator_response,
    rewrite_metadata_response,
    rewrite_produce_response_node_endpoints,
)
from proxy.pumps.upstreams import BrokerRegistry

log = logging.getLogger("sluice.rewrite")

AddressRewrite = Callable[[bytes, int, AddressMapper], tuple[bytes, list[BrokerAddress]]]

_ADDRESS_REWRITES: dict[int, AddressRewrite] = {
    ApiKey.METADATA: rewrite_metadata_response,
    ApiKey.FIND_COORDINATOR: rewrite_find_coordinator_response,
    ApiKey.DESCRIBE_CLUSTER: rewrite_describe_cluster_response,
    ApiKey.PRODUCE: rewrite_produce_response_node_endpoints,
}

REWRITTEN_APIS = frozenset({*_ADDRESS_REWRITES, ApiKey.API_VERSIONS})

FETCH_MAX_ADVERTISED = 15           # v16+ may carry leader endpoints inside the records response
REMOVED = -1                        # a cap below every min_version drops the API from the list

DEFAULT_VERSION_CAPS: dict[int, int] = {
    **PARSEABLE_MAX_VERSIONS,
    ApiKey.FETCH: FETCH_MAX_ADVERTISED,
    ApiKey.SHARE_FETCH: REMOVED,
    ApiKey.SHARE_ACKNOWLEDGE: REMOVED,
}


class ResponseRewriter:
    def __init__(self, registry: BrokerRegistry, version_caps: dict[int, int] | None = None,
                 on_failure: Callable[[], None] | None = None) -> None:
        self._registry = registry
        self._caps = dict(DEFAULT_VERSION_CAPS if version_caps is None else version_caps)
        self._on_failure = on_failure
        # ApiVersions answers from one cluster are all alike but for the correlation id: cap once
        self._api_versions_cache: dict[tuple[int, bytes], bytes] = {}

    def rewrite(self, api_key: int, api_version: int, payload: bytes) -> bytes:
        try:
            if api_key == ApiKey.API_VERSIONS:
                return self._cap_api_versions(payload, api_version)
            rewrite = _ADDRESS_REWRITES.get(api_key)
            if rewrite is None:
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
            capped = cap_api_versions_response(payload, api_version, self._caps)[4:]
            if len(self._api_versions_cache) >= 64:
                self._api_versions_cache.clear()
            self._api_versions_cache[key] = capped
        return payload[:4] + capped

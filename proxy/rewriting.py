"""Control-plane response rewrites: broker addresses and ApiVersions caps.

Only these responses are decoded (with kio, through `protocol.rewrite`); everything else passes
through as bytes. A response Sluice cannot decode (an unknown tagged field, a version kio lacks) is
forwarded unchanged with a warning: never dropped, never fatal to the connection.
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
)
from proxy.brokers import BrokerRegistry

log = logging.getLogger("sluice.rewrite")

AddressRewrite = Callable[[bytes, int, AddressMapper], tuple[bytes, list[BrokerAddress]]]

_ADDRESS_REWRITES: dict[int, AddressRewrite] = {
    ApiKey.METADATA: rewrite_metadata_response,
    ApiKey.FIND_COORDINATOR: rewrite_find_coordinator_response,
    ApiKey.DESCRIBE_CLUSTER: rewrite_describe_cluster_response,
}

REWRITTEN_APIS = frozenset({*_ADDRESS_REWRITES, ApiKey.API_VERSIONS})


class ResponseRewriter:
    def __init__(self, registry: BrokerRegistry, version_caps: dict[int, int] | None = None,
                 on_failure: Callable[[], None] | None = None) -> None:
        self._registry = registry
        self._caps = dict(PARSEABLE_MAX_VERSIONS if version_caps is None else version_caps)
        self._on_failure = on_failure

    def rewrite(self, api_key: int, api_version: int, payload: bytes) -> bytes:
        try:
            if api_key == ApiKey.API_VERSIONS:
                return cap_api_versions_response(payload, api_version, self._caps)
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

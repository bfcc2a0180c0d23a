"""What a connection tells about its client: the software name and version (KIP-511).

Clients send them in ApiVersions v3+, the first request on a connection; they are kept on the
connection context for the access log.
"""

from __future__ import annotations

import logging

from protocol.apis import ApiKey
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader
from protocol.rewrite import read_api_versions_request_client_software
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, RequestOutcome, StageBase

log = logging.getLogger("sluice.client_info")


class ClientSoftwareStage(StageBase):
    def handles(self, hook: str, api_key: int, api_version: int) -> bool:
        return api_key == ApiKey.API_VERSIONS and api_version >= 3

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None:
        if header.api_key == ApiKey.API_VERSIONS and header.api_version >= 3:
            try:
                name, version = read_api_versions_request_client_software(payload, header)
            except ProtocolError as exc:
                log.debug("connection %d: unreadable ApiVersions client software: %s", ctx.connection_id, exc)
                return None
            ctx.client_software_name, ctx.client_software_version = name, version
        return None

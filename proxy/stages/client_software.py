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


#: How many distinct ApiVersions request bodies a stage remembers what it read from (then it starts over).
_REMEMBERED = 64


class ClientSoftwareStage(StageBase):
    def __init__(self) -> None:
        self._read: dict[tuple[int, bytes], tuple[str | None, str | None]] = {}

    def handles(self, hook: str, api_key: int, api_version: int) -> bool:
        return api_key == ApiKey.API_VERSIONS and api_version >= 3

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None:
        if header.api_key == ApiKey.API_VERSIONS and header.api_version >= 3:
            # a client's ApiVersions requests are alike but for the header: read each body once
            key = (header.api_version, payload[header.body_offset:])
            software = self._read.get(key)
            if software is None:
                try:
                    software = read_api_versions_request_client_software(payload, header)
                except ProtocolError as exc:
                    log.debug("connection %d: unreadable ApiVersions client software: %s",
                              ctx.connection_id, exc)
                    return None
                if len(self._read) >= _REMEMBERED:
                    self._read.clear()
                self._read[key] = software
            ctx.client_software_name, ctx.client_software_version = software
        return None

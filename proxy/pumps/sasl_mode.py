"""SASL on one connection: the principal from SaslHandshake/SaslAuthenticate, and the raw-token mode.

`proxy.pumps.principals.SaslInspector` follows the exchange and sets the principal once the broker
accepts. After a SaslHandshake v0 the SASL tokens travel raw (a size prefix and the token, no
Kafka header) in both directions until the exchange ends. Each client frame must be read the way
the broker reads it, so after the v0 handshake and after each raw client token the next client
frames are held until the broker has answered, then handed back to the splitter.

The mode switches the connection's frame handlers (`SaslHost.set_frame_handlers`), so connections
that never see raw tokens pay nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from protocol.apis import ApiKey
from protocol.headers import RequestHeader
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext
from proxy.pumps.principals import RAW_TOKENS, AuthSettings, SaslInspector

FrameHandler = Callable[[bytes], None]


class SaslHost(Protocol):
    """What the SASL mode needs of its client connection."""

    ctx: ConnectionContext

    def set_frame_handlers(self, client: FrameHandler | None, broker: FrameHandler | None) -> None:
        """None: read Kafka requests (client) or responses (broker) again."""
        ...

    def unread(self, frames: list[bytes]) -> None: ...

    def send_upstream(self, payload: bytes) -> None: ...

    def send_client(self, payload: bytes) -> None: ...

    def read_on(self) -> None: ...

    def close(self, reason: str | None = None) -> None: ...

    def sasl_began(self) -> None:
        """A SaslHandshake was sent: an exchange is open."""
        ...

    def sasl_succeeded(self) -> None:
        """The broker accepted an exchange."""
        ...


class SaslMode:
    """One connection's SASL exchanges; created at its first SaslHandshake or SaslAuthenticate."""

    __slots__ = ("_held", "_held_bytes", "_host", "_inspector", "_max_held_bytes")

    def __init__(self, host: SaslHost, auth: AuthSettings, max_held_bytes: int) -> None:
        self._host = host
        self._inspector = SaslInspector(host.ctx, auth, host.sasl_succeeded)
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._max_held_bytes = max_held_bytes

    @property
    def held_frames(self) -> int:
        return len(self._held)

    def on_request(self, header: RequestHeader, payload: bytes, entry: InFlight) -> None:
        self._inspector.on_request(header, payload, entry)
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            self._host.sasl_began()
            if header.api_version == 0:
                self._host.set_frame_handlers(self._hold, None)  # raw tokens may follow: wait for the answer

    def on_response(self, entry: InFlight, payload: bytes) -> None:
        said = self._inspector.on_response(entry, payload)
        if entry.api_key != ApiKey.SASL_HANDSHAKE or entry.api_version != 0:
            return
        if said == RAW_TOKENS:
            self._host.set_frame_handlers(self._raw_client_token, self._raw_server_token)
        elif said is not None:
            self._host.close(said)
            return
        else:
            self._host.set_frame_handlers(None, None)
        self._release_held()  # read on after this response has been flushed

    def _hold(self, payload: bytes) -> None:
        self._held.append(payload)
        self._held_bytes += len(payload)
        if self._held_bytes > self._max_held_bytes:
            self._host.close("client sent more than max_frame_bytes while a SASL answer was awaited")

    def _release_held(self) -> None:
        if self._held:
            self._host.unread(self._held)
            self._held = []
            self._held_bytes = 0

    def _raw_client_token(self, payload: bytes) -> None:
        self._inspector.raw_client_token(payload)
        self._host.send_upstream(payload)
        self._host.set_frame_handlers(self._hold, self._raw_server_token)

    def _raw_server_token(self, payload: bytes) -> None:
        self._host.send_client(payload)
        if self._inspector.raw_server_token(payload):  # authenticated: Kafka requests from now on
            self._host.set_frame_handlers(None, None)
        else:
            self._host.set_frame_handlers(self._raw_client_token, self._raw_server_token)
        self._release_held()
        self._host.read_on()

"""Naming topic ids this process has not seen named: its own Metadata request to the broker.

Produce v13 and Fetch v13+ carry topic ids, not names. Sluice learns names from the Metadata
responses it forwards (`TopicNames.learn`), but a client whose Metadata went through another
instance or worker never shows this process one. `TopicIdResolver.want` is called (from the hot
path, so it only queues) with every id `TopicNames.name` cannot name and the client connection it
came on; a background task asks for the queued ids in one Metadata v12 request by id
(`protocol.topic_ids`):

1. of a bootstrap broker, over its own connection with the upstream TLS settings (and the upstream
   client certificate, if one is configured). Sluice holds no SASL credential, so against a broker
   that requires SASL from every client this fails; it is then not tried again for `retry_ms`.
2. for the ids step 1 did not name (it failed, or the broker did not name them: unknown to
   ANONYMOUS, say), on the upstream connection of the client that used the id
   (`ConnectionContext.send_own`). That connection is already authenticated as that client, who
   is allowed to describe the topic: it writes it or reads it by that id. The request has a
   correlation id Sluice owns (negative: clients count up from 0), takes its place among the
   client's requests in flight, and its response is consumed here, never forwarded: the client's
   responses keep their order. It is sent only when the last request forwarded on that connection
   was one the broker takes only once authenticated, so it never lands inside a SASL exchange
   (`ClientConnection.send_own`).

The broker's answer is `add`ed to the names. An id the broker was asked for and did not name
(unknown, or not authorized), or a failed lookup, is asked again only after `retry_ms`; an id that
could not be asked at all (no connection could carry the request now) is asked again the next time
a request uses it. The ids waiting and the ids that failed are bounded. Until an id is named its
bytes count against its hex form, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
import struct
import time
from collections.abc import Callable, Sequence

from protocol.errors import ProtocolError
from protocol.topic_ids import metadata_by_id_frame, parse_topic_names
from proxy.stages.topic_usage import SendOwn, TopicNames

log = logging.getLogger("sluice.quotas")

#: The most ids one Metadata request asks for, ids waiting, and failed ids remembered.
MAX_IDS_PER_REQUEST = 100
MAX_PENDING = 1_000
MAX_FAILED = 10_000
_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
_LOOKUP_ERRORS = (OSError, TimeoutError, ProtocolError, ValueError, struct.error, asyncio.IncompleteReadError)


class TopicIdResolver:
    def __init__(self, names: TopicNames, bootstrap: Sequence[tuple[str, int]],
                 ssl_context: ssl.SSLContext | None = None, *, timeout_s: float = 5.0,
                 retry_ms: int = 30_000, clock_s: Callable[[], float] = time.monotonic) -> None:
        self._names = names
        self._bootstrap = list(bootstrap)
        self._ssl = ssl_context
        self._timeout_s = timeout_s
        self._retry_s = retry_ms / 1000
        self._clock_s = clock_s
        # id -> the client connection that used it last (None: none offered one); insertion-ordered
        self._pending: dict[bytes, SendOwn | None] = {}
        self._failed_until: dict[bytes, float] = {}  # id -> when it may be asked again
        self._bootstrap_until = float("-inf")         # the bootstrap lookup failed: not before this
        self._task: asyncio.Task[None] | None = None
        self._correlation = itertools.count(1)
        self._warned = False
        self.requests = 0       # Metadata requests to a bootstrap broker
        self.own_requests = 0   # ... and on a client's upstream connection
        self.resolved = 0
        self.unresolved = 0
        self.failures = 0

    @property
    def waiting(self) -> int:
        """Ids queued for a lookup."""
        return len(self._pending)

    def attach(self) -> None:
        """Be told of every id `names` cannot name."""
        self._names.resolver = self.want

    def want(self, topic_id: bytes, via: SendOwn | None = None) -> None:
        """Queue `topic_id` for a lookup, `via` the client connection it came on (returns at once;
        called on the hot path)."""
        if topic_id in self._pending:
            if via is not None:
                self._pending[topic_id] = via  # the latest connection to use it: the likeliest open
            return
        if len(self._pending) >= MAX_PENDING:
            return
        until = self._failed_until.get(topic_id)
        if until is not None:
            if self._clock_s() < until:
                return
            del self._failed_until[topic_id]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the event loop (a tool decoding offline): nothing to ask with
            return
        self._pending[topic_id] = via
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="topic-id-resolver")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._pending:
            batch = list(itertools.islice(self._pending.items(), MAX_IDS_PER_REQUEST))
            names, asked = await self._resolve(batch)
            self._names.add(names)
            self.resolved += len(names)
            retry_at = self._clock_s() + self._retry_s
            for raw, _ in batch:
                self._pending.pop(raw, None)
                if raw not in names and raw in asked:
                    self.unresolved += 1
                    self._failed_until[raw] = retry_at
            while len(self._failed_until) > MAX_FAILED:
                del self._failed_until[next(iter(self._failed_until))]

    async def _resolve(self, batch: list[tuple[bytes, SendOwn | None]]
                       ) -> tuple[dict[bytes, str], set[bytes]]:
        """The names the broker gave for `batch`, and the ids it was asked for (an id asked and not
        named waits `retry_ms`; one not asked is asked again when a request next uses it)."""
        names: dict[bytes, str] = {}
        asked: set[bytes] = set()
        if self._clock_s() >= self._bootstrap_until:
            ids = [raw for raw, _ in batch]
            try:
                names = await asyncio.wait_for(self._lookup(ids), self._timeout_s)
            except _LOOKUP_ERRORS as exc:
                self.failures += 1
                self._bootstrap_until = self._clock_s() + self._retry_s
                level = logging.DEBUG if self._warned else logging.WARNING
                self._warned = True
                log.log(level, "topic ids: Metadata by id to the bootstrap brokers failed (%s: %s); ids "
                        "are asked on the upstream connection of the client that used them (bootstrap "
                        "tried again after %.0f s)", type(exc).__name__, exc, self._retry_s)
            else:
                asked.update(ids)
                _log_named(names, "")
        by_connection: dict[SendOwn, list[bytes]] = {}
        for raw, via in batch:
            if raw not in names and via is not None:
                by_connection.setdefault(via, []).append(raw)
        for via, ids in by_connection.items():
            try:
                got = await self._ask_on(via, ids)
            except _LOOKUP_ERRORS as exc:
                self.failures += 1
                log.debug("topic ids: Metadata by id on a client's connection failed (%s: %s)",
                          type(exc).__name__, exc)
                continue
            if got is None:
                continue  # that connection cannot carry it now
            asked.update(ids)
            names.update(got)
            _log_named(got, " on the client's connection")
        return names, asked

    async def _ask_on(self, via: SendOwn, ids: list[bytes]) -> dict[bytes, str] | None:
        """Ask on a client's upstream connection; None when it cannot carry a request now."""
        corr = -1 - next(self._correlation) % 0x7FFFFFFF  # negative: never one of the client's
        future = via(metadata_by_id_frame(corr, ids)[4:])
        if future is None:
            return None
        self.own_requests += 1
        return parse_topic_names(await asyncio.wait_for(future, self._timeout_s), corr)

    async def _lookup(self, ids: list[bytes]) -> dict[bytes, str]:
        errors = []
        for host, port in self._bootstrap:
            try:
                return await self._call(host, port, ids)
            except (OSError, ProtocolError, asyncio.IncompleteReadError) as exc:
                errors.append(f"{host}:{port}: {exc}")
        raise OSError("no bootstrap server answered: " + "; ".join(errors))

    async def _call(self, host: str, port: int, ids: list[bytes]) -> dict[bytes, str]:
        corr = next(self._correlation)
        self.requests += 1
        reader, writer = await asyncio.open_connection(host, port, ssl=self._ssl)
        try:
            writer.write(metadata_by_id_frame(corr, ids))
            await writer.drain()
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            if not 0 < size <= _MAX_RESPONSE_BYTES:
                raise OSError(f"a response of {size} bytes")
            return parse_topic_names(await reader.readexactly(size), corr)
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()


def _log_named(names: dict[bytes, str], how: str) -> None:
    if names:
        shown = sorted(names.values())
        log.info("topic ids: named %d by the broker (%s)%s", len(names),
                 ", ".join(shown[:5]) + (" ..." if len(shown) > 5 else ""), how)

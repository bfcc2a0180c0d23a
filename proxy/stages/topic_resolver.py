"""Naming topic ids this process has not seen named: its own Metadata request to the broker.

Produce v13 and Fetch v13+ carry topic ids, not names. Sluice learns names from the Metadata
responses it forwards (`TopicNames.learn`), but a client whose Metadata went through another
instance or worker never shows this process one. `TopicIdResolver.want` is called (from the hot
path, so it only queues) with every id `TopicNames.name` cannot name; a background task asks a
bootstrap broker for the queued ids in one Metadata v12 request by id (`protocol.topic_ids`) over
its own connection with the upstream TLS settings, and `add`s what the broker named. An id the
broker does not name (unknown, or not authorized), or a failed lookup, is asked again only after
`retry_ms`; the ids waiting and the ids that failed are bounded. Until an id is named its bytes
count against its hex form, as before.
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
from proxy.stages.topic_usage import TopicNames

log = logging.getLogger("sluice.quotas")

#: The most ids one Metadata request asks for, ids waiting, and failed ids remembered.
MAX_IDS_PER_REQUEST = 100
MAX_PENDING = 1_000
MAX_FAILED = 10_000
_MAX_RESPONSE_BYTES = 64 * 1024 * 1024


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
        self._pending: dict[bytes, None] = {}        # insertion-ordered set
        self._failed_until: dict[bytes, float] = {}  # id -> when it may be asked again
        self._task: asyncio.Task[None] | None = None
        self._correlation = itertools.count(1)
        self._warned = False
        self.requests = 0
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

    def want(self, topic_id: bytes) -> None:
        """Queue `topic_id` for a lookup (returns at once; called on the hot path)."""
        if topic_id in self._pending or len(self._pending) >= MAX_PENDING:
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
        self._pending[topic_id] = None
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="topic-id-resolver")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._pending:
            batch = list(itertools.islice(self._pending, MAX_IDS_PER_REQUEST))
            names: dict[bytes, str] = {}
            try:
                names = await asyncio.wait_for(self._lookup(batch), self._timeout_s)
            except (OSError, TimeoutError, ProtocolError, ValueError, struct.error) as exc:
                self.failures += 1
                level = logging.DEBUG if self._warned else logging.WARNING
                self._warned = True
                log.log(level, "topic ids: Metadata by id failed (%s: %s); their bytes count against "
                        "the ids' hex form until a lookup succeeds (retried after %.0f s)",
                        type(exc).__name__, exc, self._retry_s)
            self._names.add(names)
            self.resolved += len(names)
            retry_at = self._clock_s() + self._retry_s
            for raw in batch:
                self._pending.pop(raw, None)
                if raw not in names:
                    self.unresolved += 1
                    self._failed_until[raw] = retry_at
            while len(self._failed_until) > MAX_FAILED:
                del self._failed_until[next(iter(self._failed_until))]
            if names:
                log.info("topic ids: named %d by the broker (%s)", len(names),
                         ", ".join(sorted(names.values())[:5]) + (" ..." if len(names) > 5 else ""))

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

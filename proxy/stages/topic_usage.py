"""What a Produce request or a Fetch response carries per topic, for topic and records/s quotas.

Produce bytes are attributed per topic from the request, Fetch bytes from the response (issue 13):
a topic's share is the size of its record sets (the rest of the frame, headers and partition
fields, is not any one topic's). Records are the sum of the record-batch header counts
(`protocol.records`; a legacy message set counts 0). Requests that name topics by id (Produce
v13, Fetch v13+) are mapped to names from the Metadata responses Sluice forwarded and, for an id
none of them named (the client's Metadata went through another instance or worker), from the
process's own Metadata request by id (`TopicNames.resolver`, `proxy.stages.topic_resolver`), sent
to a bootstrap broker or on the upstream connection of the client that used the id (`via`). Until
the answer comes an id is reported by its hex form, so its bytes still count against a quota on
that form and never against another topic's.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol import fastpath, records
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader
from protocol.log_walks import LogPart
from protocol.share import share_fetch_response_partitions

log = logging.getLogger("sluice.quotas")


@dataclass(frozen=True, slots=True)
class TopicUsage:
    """Per topic: record-set bytes and records; `records` is the total over every topic."""

    bytes_by_topic: dict[str, int] = field(default_factory=dict)
    records_by_topic: dict[str, int] = field(default_factory=dict)
    records: int = 0


NO_USAGE = TopicUsage()

#: Sends Sluice's own request on a client's upstream connection (`ConnectionContext.send_own`).
SendOwn = Callable[[bytes], "asyncio.Future[bytes] | None"]
#: Told of an id `TopicNames.name` cannot name, with the connection it came on (or None).
Resolver = Callable[[bytes, "SendOwn | None"], None]


#: Topic ids a process remembers (the oldest learned is forgotten first).
MAX_TOPIC_IDS = 100_000


class TopicNames:
    """Topic id -> name, from Metadata responses v10+ (decoded only when their bytes are new), at
    most `max_ids` of them. `resolver`, when set, is told of every id `name` cannot name and of the
    client connection it came on (it must return at once; `proxy.stages.topic_resolver.TopicIdResolver`
    asks the broker in the background and `add`s the answer)."""

    __slots__ = ("_max_ids", "_names", "_seen", "resolver")

    def __init__(self, max_ids: int = MAX_TOPIC_IDS) -> None:
        self._names: dict[bytes, str] = {}
        self._seen: set[bytes] = set()
        self._max_ids = max_ids
        self.resolver: Resolver | None = None

    def __len__(self) -> int:
        return len(self._names)

    def add(self, names: dict[bytes, str]) -> None:
        """Learn `names` (id -> name); beyond `max_ids` the oldest learned are forgotten."""
        known = self._names
        for raw, topic in names.items():
            known.pop(raw, None)
            known[raw] = topic
        while len(known) > self._max_ids:
            del known[next(iter(known))]

    def learn(self, payload: bytes, api_version: int) -> None:
        if api_version < 10:
            return
        digest = hashlib.blake2b(payload[4:], digest_size=16).digest()  # past the correlation id
        if digest in self._seen:
            return
        self._seen.add(digest)
        if len(self._seen) > 1024:
            self._seen.clear()
        try:
            self.add(records.topic_ids_from_metadata_response(payload, api_version))
        except ProtocolError as exc:
            log.debug("metadata v%d: topic ids not read: %s", api_version, exc)

    def name(self, topic: str | None, topic_id: bytes | None, via: SendOwn | None = None) -> str:
        """The topic's name; an id not known yet is told to the resolver (with `via`, the client
        connection it came on) and answered by its hex form."""
        if topic is not None:
            return topic
        raw = topic_id or b""
        name = self._names.get(raw)
        if name is not None:
            return name
        if self.resolver is not None and raw:
            self.resolver(raw, via)
        return raw.hex()


def _usage(parts: list[records.PartitionTraffic], names: TopicNames, via: SendOwn | None) -> TopicUsage:
    by_topic: dict[str, int] = {}
    records_by_topic: dict[str, int] = {}
    total = 0
    for p in parts:
        name = names.name(p.topic, p.topic_id, via)
        by_topic[name] = by_topic.get(name, 0) + p.bytes
        count = p.records or 0
        records_by_topic[name] = records_by_topic.get(name, 0) + count
        total += count
    return TopicUsage(by_topic, records_by_topic, total)


def produce_usage(parts: tuple[LogPart, ...] | None, payload: bytes, header: RequestHeader,
                  names: TopicNames, via: SendOwn | None = None) -> TopicUsage | None:
    """Per-topic usage of a Produce request from its partitions (`InFlight.produce_parts`, the
    walk the access log reads too); None when its layout could not be read (`parts` None: then no
    topic or records quota is charged for it, and it is logged with the reference walk's reason).
    `via`: the connection it came on."""
    if parts is None:
        try:
            records.produce_request_partitions(payload, header)
            reason = "unreadable"
        except (ProtocolError, ValueError) as exc:
            reason = str(exc)
        log.warning("produce v%d: topics and records not read, not charged to topic or records quotas: %s",
                    header.api_version, reason)
        return None
    by_topic: dict[str, int] = {}
    records_by_topic: dict[str, int] = {}
    total = 0
    for topic, topic_id, _partition, count, size in parts:
        name = names.name(topic, topic_id, via)
        by_topic[name] = by_topic.get(name, 0) + size
        count = count if count > 0 else 0  # -1: a legacy or impossible record set, counted as none
        records_by_topic[name] = records_by_topic.get(name, 0) + count
        total += count
    return TopicUsage(by_topic, records_by_topic, total)


def fetch_usage(payload: bytes, api_version: int, names: TopicNames,
                via: SendOwn | None = None) -> TopicUsage | None:
    """Per-topic usage of a whole Fetch response; None when its layout cannot be read."""
    try:
        _error, parts = fastpath.fetch_response_partitions(payload, api_version)
    except (ProtocolError, ValueError) as exc:
        log.warning("fetch v%d: topics and records not read, not charged to topic or records quotas: %s",
                    api_version, exc)
        return None
    return _usage(parts, names, via)


def share_fetch_usage(payload: bytes, api_version: int, names: TopicNames,
                      via: SendOwn | None = None) -> TopicUsage | None:
    """Per-topic usage of a ShareFetch response (topic ids only); None when its layout cannot be read."""
    try:
        return _usage(share_fetch_response_partitions(payload, api_version), names, via)
    except (ProtocolError, ValueError) as exc:
        log.warning("share fetch v%d: topics and records not read, not charged to topic or records "
                    "quotas: %s", api_version, exc)
        return None

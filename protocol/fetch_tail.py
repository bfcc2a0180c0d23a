"""Fetch v16+ responses while they stream: find the top-level tag section, rewrite it in place.

KIP-951 puts `node_endpoints` (tag 0) in the tag section at the very end of a Fetch response v16+:
the current leader of each partition answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH.
Sluice must map those addresses to its own listeners. A small response is rewritten whole
(`protocol.rewrite.rewrite_fetch_response_node_endpoints`); a large one is streamed to the client
as it arrives (`proxy.pumps.connection`), and its size prefix has already gone out when the tail
arrives. The choice made here, to keep streaming:

* `FetchTailFinder` follows the response as it streams: it parses only the structure (topic and
  partition headers, a few dozen bytes each) and lets the records through by their length, so
  every byte before the top-level tag section can be forwarded at once; only the tag section (a
  few bytes, or some 30 bytes per endpoint) is held back;
* `fit_tail` rewrites the held tag section **to exactly its original length**, so the size prefix
  already sent stays right: a shorter result is padded with an unknown tagged field (tag
  `PADDING_TAG`, zero bytes, ignored by every client, as KIP-482 requires of unknown tags); a
  longer one (Sluice's host name longer than the broker's) cannot fit, so the endpoints are left
  out and the rest padded: the client then finds the new leader with a Metadata request, which
  Sluice rewrites. A real broker address never reaches the client either way.
"""

from __future__ import annotations

from typing import Final

from protocol._wire import (
    encode_uvarint,
    read_array_len,
    read_uvarint,
    skip,
    skip_string,
)
from protocol.errors import DecodeError
from protocol.rewrite import _NODE_ENDPOINT, AddressMapper, BrokerAddress, _Found, _splice, _walk_array

NODE_ENDPOINTS_TAG: Final = 0
PADDING_TAG: Final = 127   # Fetch defines tags 0 (v16+) at the top level; 127 is one varint byte

# One step per stage, and no step that grows with the response: a step split across chunks is
# re-parsed whole from a buffer at every chunk, so a step as large as 50,000 aborted transactions
# (fed in 1,448-byte chunks) cost 2.6 s of CPU when the partition header was one step, and a tag
# section of many fields grew the same way. Each aborted transaction and each tagged field (of the
# response header, aborted transaction, partition and topic tag sections) is now a step of its own.
(_HEAD, _HEAD_REST, _TOPIC, _PARTITION, _ABORTED, _PARTITION_REST, _PARTITION_TAGS, _TOPIC_TAGS, _TAG_FIELD,
 _TAIL, _FAILED) = range(11)
_WINDOW_BYTES: Final = 256
# The largest real step is a v12 topic name (a compact string, at most 32,767 bytes) or one aborted
# transaction with tags; a step still incomplete past this is malformed: give up, forward as is.
# (A buffered step is re-parsed at every chunk, so this also bounds that work.)
_MAX_STEP_BYTES: Final = 64 * 1024


class FetchTailFinder:
    """Follows one Fetch response (v12+, flexible) chunk by chunk; holds back its top-level tags.

    `feed(chunk)` returns how many leading bytes of `chunk` may be forwarded now; the rest of the
    chunk belongs to the tag section and is kept. After the last chunk, `tail` is the held tag
    section (when `found` is True). Structure bytes are buffered only until parsed; records pass
    through without copying. A malformed response never reaches `found`: the caller then forwards
    what was held unchanged.
    """

    __slots__ = ("_buf", "_fields", "_left", "_partitions", "_skip", "_stage", "_then", "_topic_id_bytes",
                 "_topics", "tail")

    def __init__(self, api_version: int) -> None:
        if api_version < 12:
            raise ValueError(f"Fetch v{api_version} is not flexible: no top-level tag section")
        self._topic_id_bytes = 16 if api_version >= 13 else 0  # v12 has a topic name instead
        self._stage = _HEAD
        self._buf = bytearray()       # structure bytes of the step being parsed
        self._skip = 0                # record bytes still to let through
        self._topics = 0
        self._partitions = 0
        self._left = 0                # aborted transactions still to parse
        self._fields = 0              # tagged fields still to parse ...
        self._then = _HEAD_REST       # ... in the section that `_after_tags` then completes
        self.tail = bytearray()

    @property
    def found(self) -> bool:
        return self._stage == _TAIL and not self._skip

    def feed(self, chunk: bytes | bytearray | memoryview) -> int:
        """Take the next bytes of the response payload (correlation id first); returns how many of
        them, from the start of `chunk`, precede the tag section (all of them until it is found)."""
        n = len(chunk)
        pos = 0
        while pos < n:
            if self._skip:  # records and tagged-field data: straight through
                step = min(self._skip, n - pos)
                self._skip -= step
                pos += step
                continue
            stage = self._stage
            if stage == _TAIL:
                self.tail += chunk[pos:]
                return pos
            if stage == _FAILED:
                return n
            if not self._buf:  # the usual case: parse whole steps in place
                if not isinstance(chunk, bytes):
                    chunk = bytes(chunk)  # the _wire readers take bytes
                after = self._parse(chunk, pos)
                if after > pos:
                    pos = after
                    continue
            # a step split across chunks: buffer a window (doubling while it does not fit)
            take = min(n - pos, max(_WINDOW_BYTES, len(self._buf)))
            self._buf += chunk[pos:pos + take]
            consumed = self._parse(bytes(self._buf), 0)
            if consumed == 0:  # still not whole: everything taken stays buffered
                pos += take
                if len(self._buf) > _MAX_STEP_BYTES:
                    self._stage = _FAILED  # no real step is this large: give up, forward as is
                continue
            # the bytes after the last whole step go back to the chunk (records, tail or a part step)
            leftover = len(self._buf) - consumed
            self._buf.clear()
            pos += take - leftover
        return n

    def _parse(self, buf: bytes, at: int) -> int:
        """Parse the whole steps from `at`; returns where they end (`at` if none is whole)."""
        while self._stage not in (_TAIL, _FAILED) and not self._skip:
            try:
                at = self._step(buf, at)
            except DecodeError:
                break
        return at

    def _step(self, buf: bytes, at: int) -> int:
        stage = self._stage
        if stage == _HEAD:  # correlation_id, then the response header's tag section
            return self._tags(buf, skip(buf, at, 4, "correlation_id"), _HEAD_REST)
        if stage == _HEAD_REST:
            pos = skip(buf, at, 10, "fetch throttle_time_ms, error_code, session_id")
            self._topics, pos = read_array_len(buf, pos, True, "fetch responses", 0)
            self._stage = _TOPIC if self._topics else _TAIL
            return pos
        if stage == _TOPIC:
            if self._topic_id_bytes:
                pos = skip(buf, at, self._topic_id_bytes, "fetch topic_id")
            else:
                pos = skip_string(buf, at, True, "fetch topic")
            self._partitions, pos = read_array_len(buf, pos, True, "fetch partitions", 0)
            self._stage = _PARTITION if self._partitions else _TOPIC_TAGS
            return pos
        if stage == _PARTITION:
            # partition_index, error_code, high_watermark, last_stable_offset, log_start_offset
            pos = skip(buf, at, 30, "fetch partition")
            self._left, pos = read_array_len(buf, pos, True, "fetch aborted_transactions", 0)
            self._stage = _ABORTED if self._left else _PARTITION_REST
            return pos
        if stage == _ABORTED:  # one aborted transaction: producer_id, first_offset, then its tags
            return self._tags(buf, skip(buf, at, 16, "fetch aborted_transaction"), _ABORTED)
        if stage == _PARTITION_REST:
            pos = skip(buf, at, 4, "fetch preferred_read_replica")
            length, pos = read_uvarint(buf, pos, "fetch records length")  # compact: N + 1, 0 = null
            self._skip = max(0, length - 1)
            self._stage = _PARTITION_TAGS
            return pos
        if stage in (_PARTITION_TAGS, _TOPIC_TAGS):
            return self._tags(buf, at, stage)
        # _TAG_FIELD: tag and size; the data passes through like records (never buffered)
        _, pos = read_uvarint(buf, at, "fetch tag")
        self._skip, pos = read_uvarint(buf, pos, "fetch tag size")
        self._fields -= 1
        if not self._fields:
            self._after_tags(self._then)
        return pos

    def _tags(self, buf: bytes, at: int, then: int) -> int:
        """A tag section's field count; its fields follow as `_TAG_FIELD` steps, then `then`."""
        count, pos = read_uvarint(buf, at, "fetch tag count")
        if count:
            self._fields, self._then, self._stage = count, then, _TAG_FIELD
        else:
            self._after_tags(then)
        return pos

    def _after_tags(self, then: int) -> None:
        if then == _ABORTED:
            self._left -= 1
            self._stage = _ABORTED if self._left else _PARTITION_REST
        elif then == _PARTITION_TAGS:
            self._partitions -= 1
            self._stage = _PARTITION if self._partitions else _TOPIC_TAGS
        elif then == _TOPIC_TAGS:
            self._topics -= 1
            self._stage = _TOPIC if self._topics else _TAIL
        else:
            self._stage = then


def _read_tags(section: bytes, what: str) -> list[tuple[int, bytes]]:
    count, pos = read_uvarint(section, 0, f"{what} tag count")
    fields: list[tuple[int, bytes]] = []
    for _ in range(count):
        tag, pos = read_uvarint(section, pos, f"{what} tag")
        size, start = read_uvarint(section, pos, f"{what} tag size")
        pos = skip(section, start, size, f"{what} tag data")
        fields.append((tag, section[start:pos]))
    if pos != len(section):
        raise DecodeError(f"{what}: {len(section) - pos} trailing bytes", pos)
    return fields


def _encode_tags(fields: list[tuple[int, bytes]]) -> bytes:
    out = [encode_uvarint(len(fields))]
    for tag, data in fields:
        out += (encode_uvarint(tag), encode_uvarint(len(data)), data)
    return b"".join(out)


def _padded(fields: list[tuple[int, bytes]], size: int) -> bytes | None:
    """`fields` plus unknown padding field(s) so that the section is exactly `size` bytes."""
    base = _encode_tags(fields)
    if len(base) == size:
        return base
    deficit = size - len(base)
    if deficit < 0:
        return None
    pad_tag = max([PADDING_TAG, *(tag + 1 for tag, _ in fields)])
    # one field: tag + size varint + n zero bytes; the count varint may grow by a byte too
    for pads in ([n] for n in range(max(0, deficit - 8), deficit)):
        candidate = _encode_tags([*fields, *((pad_tag + i, bytes(n)) for i, n in enumerate(pads))])
        if len(candidate) == size:
            return candidate
    for n in range(max(0, deficit - 12), deficit):  # two fields, for the sizes one cannot hit
        candidate = _encode_tags([*fields, (pad_tag, b""), (pad_tag + 1, bytes(n))])
        if len(candidate) == size:
            return candidate
    return None


def fit_tail(tail: bytes, mapper: AddressMapper) -> tuple[bytes, list[BrokerAddress], bool]:
    """The top-level tag section of a Fetch response v16+, rewritten to exactly `len(tail)` bytes.

    Returns (new section, the original brokers, whether the endpoints were kept). When the mapped
    endpoints do not fit, they are left out (the client then asks for Metadata). Raises
    DecodeError if the section is malformed.
    """
    fields = _read_tags(tail, "fetch tags")
    if not any(tag == NODE_ENDPOINTS_TAG for tag, _ in fields):
        return tail, [], True
    mapped_fields: list[tuple[int, bytes]] = []
    original: list[BrokerAddress] = []
    for tag, data in fields:
        if tag == NODE_ENDPOINTS_TAG:
            found: list[_Found] = []
            walked = _walk_array(data, 0, _NODE_ENDPOINT, True, found, "fetch node_endpoints")
            if walked != len(data):
                raise DecodeError(f"fetch node_endpoints: {len(data) - walked} stray bytes", walked)
            data, original = _splice(data, found, True, mapper)
        mapped_fields.append((tag, data))
    fitted = _padded(mapped_fields, len(tail))
    if fitted is not None:
        return fitted, original, True
    without = [(tag, data) for tag, data in fields if tag != NODE_ENDPOINTS_TAG]
    fitted = _padded(without, len(tail))
    if fitted is None:  # cannot happen: leaving the field out frees at least 2 bytes
        raise DecodeError("fetch tags: cannot keep the section's length", 0)
    return fitted, original, False


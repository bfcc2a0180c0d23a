# cython: language_level=3
"""Inline C helpers the compiled walks share (`protocol._speedups`, `protocol._log_speedups`):
big-endian integer reads, a compact length of up to three varint bytes, a topic's name or id, and
the record count of a record set from its magic-v2 batch headers. Each is the C form of a piece
of `protocol.records` (the readable reference both compiled modules are tested against); a walk
that gets "not the common case" back from one hands the whole input to that reference.

No I/O: part of the sans-IO `protocol` package.
"""

from libc.stdint cimport int16_t, int32_t, uint8_t, uint16_t, uint32_t

# magic-v2 record batch header (`protocol.records`): 61 bytes, batchLength at 8, magic at 16,
# the records count at 57; batchLength does not count the first 12 bytes
cdef enum:
    BATCH_HEADER_BYTES = 61
    LOG_OVERHEAD = 12
    MAGIC_OFFSET = 16
    MAGIC_V2 = 2


cdef inline int32_t read_i32(const uint8_t* p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3])


cdef inline int16_t read_i16(const uint8_t* p) noexcept nogil:
    return <int16_t>((<uint16_t>p[0] << 8) | <uint16_t>p[1])


cdef inline long long count_records(const uint8_t* buf, Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    """`records.count_records`: the sum of the complete magic-v2 batches' counts in buf[start:end]
    (a partial last batch is not counted), or -1 where the reference answers None (a legacy
    message, an impossible length, a negative count)."""
    cdef long long total = 0
    cdef Py_ssize_t pos = start
    cdef int32_t batch_length, count
    while pos < end:
        if end - pos < BATCH_HEADER_BYTES:
            if end - pos > MAGIC_OFFSET and buf[pos + MAGIC_OFFSET] != MAGIC_V2:
                return -1
            return total
        batch_length = read_i32(buf + pos + 8)
        count = read_i32(buf + pos + 57)
        if buf[pos + MAGIC_OFFSET] != MAGIC_V2 or batch_length < BATCH_HEADER_BYTES - LOG_OVERHEAD or count < 0:
            return -1
        pos += LOG_OVERHEAD + batch_length
        if pos > end:
            return total
        total += count
    return total


cdef inline Py_ssize_t read_compact_length(const uint8_t* p, Py_ssize_t* pos) noexcept nogil:
    """A compact (length + 1) varint of at most three bytes at `pos[0]` (record sets under 2 MiB),
    moving `pos[0]` past it: the length (0 for null), or -1, `pos[0]` unmoved, for a longer varint.
    The caller has checked that three bytes are there."""
    cdef Py_ssize_t at = pos[0]
    cdef Py_ssize_t length_plus_one
    if p[at] < 0x80:
        length_plus_one = p[at]
        pos[0] = at + 1
    elif p[at + 1] < 0x80:
        length_plus_one = (p[at] & 0x7F) | (p[at + 1] << 7)
        pos[0] = at + 2
    elif p[at + 2] < 0x80:
        length_plus_one = (p[at] & 0x7F) | ((p[at + 1] & 0x7F) << 7) | (p[at + 2] << 14)
        pos[0] = at + 3
    else:
        return -1
    return length_plus_one - 1 if length_plus_one else 0


cdef inline object read_topic_name(bytes payload, const uint8_t* p, Py_ssize_t n, Py_ssize_t* pos):
    """A flexible topic name at `pos[0]` with a one-byte compact length, moving `pos[0]` past it;
    None, `pos[0]` unmoved, when it is not that (truncated, null, a longer length): the reference
    then says what it means."""
    cdef Py_ssize_t at = pos[0]
    cdef Py_ssize_t end
    if at >= n or p[at] >= 0x80 or p[at] == 0:
        return None
    end = at + p[at]
    if end > n:
        return None
    pos[0] = end
    return payload[at + 1 : end].decode("utf-8", "replace")


cdef inline object read_topic_id(bytes payload, Py_ssize_t n, Py_ssize_t* pos):
    """A topic id (16 bytes, as on the wire) at `pos[0]`, moving `pos[0]` past it; None when
    truncated."""
    cdef Py_ssize_t at = pos[0]
    if at + 16 > n:
        return None
    pos[0] = at + 16
    return payload[at : at + 16]
